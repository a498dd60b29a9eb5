#!/usr/bin/env bash
# Runs the GPU tier from a bundle made by gpu-bundle.sh, on a host with an
# NVIDIA GPU and driver: the service suite, the daemon tests, the example,
# any benchmarks, and last the fault test (it leaves its process without a
# usable device). Logs go to stdout and, when $OUT is set, to files there.
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export GPUEXEC_TEST_DRIVER=libcuda.so.1
export GPUEXEC_TEST_KERNELS="$HERE/kernels/sm_90"
export GPUEXEC_TEST_DAEMON="$HERE/bin/gpuexecd"
LOG_DIR="${OUT:-$HERE/results}"
mkdir -p "$LOG_DIR"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader || true
status=0
run() {  # run NAME CMD...: tee to a log, remember failures
  local name=$1; shift
  echo "== $name"
  "$@" 2>&1 | grep -vE '^[0-9T:.-]+Z I session [0-9a-f]+ (opened|closed)' | tee "$LOG_DIR/$name.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "== $name FAILED"; status=1; }
}
run service_test "$HERE/bin/service_test"
run daemon_test "$HERE/bin/daemon_test"

# The README's walk-through against a daemon process.
sock="/tmp/gpuexec-walkthrough-$$.sock"
"$HERE/bin/gpuexecd" --listen= --unix_socket="$sock" --log_level=warning &
daemon=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
run saxpy_example "$HERE/bin/gpuexec-saxpy" --target="unix:$sock" \
  --cubin="$GPUEXEC_TEST_KERNELS/gx_kernels.cubin" --kernel=gx_saxpy
kill -TERM $daemon; wait $daemon || { echo "== gpuexecd exit status $?"; status=1; }

for b in "$HERE"/bin/*bench*; do
  [[ -x "$b" ]] && run "$(basename "$b")" "$b"
done
run fault_test "$HERE/bin/fault_test"
exit $status
