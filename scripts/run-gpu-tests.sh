#!/usr/bin/env bash
# Runs the GPU tier from a bundle made by gpu-bundle.sh, on a host with an
# NVIDIA GPU and driver. Results go to stdout and, when $OUT is set, to files
# under it.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUEXEC_TEST_DRIVER=libcuda.so.1
export GPUEXEC_TEST_KERNELS="$HERE/kernels/sm_90"
LOG_DIR="${OUT:-$HERE/results}"
mkdir -p "$LOG_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0
echo "== service suite on the real driver"
"$HERE/bin/service_test" --gtest_brief=0 2>&1 | tee "$LOG_DIR/service_test_gpu.log" || status=1
for b in "$HERE"/bin/*bench*; do
  [[ -x "$b" ]] || continue
  echo "== $(basename "$b")"
  "$b" 2>&1 | tee "$LOG_DIR/$(basename "$b").log" || status=1
done
exit $status
