#!/usr/bin/env bash
# Builds a self-contained bundle for a GPU host that has the NVIDIA driver
# but none of gRPC, Protobuf or Abseil: the daemon, the test and benchmark
# programs, the sm_90 test kernels, and every shared library they need
# except glibc's own and libcuda (which the host provides).
#
#   scripts/gpu-bundle.sh [OUT_DIR]      (default .bundle)
#   then on the GPU host: OUT_DIR/run-gpu-tests.sh
# With BEFORE_DAEMON=path it also carries an earlier build's gpuexecd, which
# the tier measures against this one (gpuexec_bench --ab_daemon).
# With TRACE=1 it also builds the daemon and benchmark with
# -DGPUEXEC_LATENCY_TRACE=ON (in build-trace) into OUT_DIR/trace, for
# OUT_DIR/latency-diagnosis.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-.bundle}"
BUILD_DIR="${BUILD_DIR:-build}"
./scripts/setup.sh >/dev/null

rm -rf "$OUT"
mkdir -p "$OUT/bin" "$OUT/lib" "$OUT/kernels"
programs=("$BUILD_DIR/server/gpuexecd" "$BUILD_DIR/client/cpp/cli/gpuexec"
  "$BUILD_DIR/client/cpp/gpuexec-saxpy")
for t in service_test daemon_test fault_test metrics_endpoint_test tenants_test cli_test \
  host_memory_test shm_socket_test shm_attack_test tenant_bounds_test command_ring_test \
  command_ring_client_test command_ring_hostile_test compile_module_test graphs_test \
  standard_metrics_test drain_test; do
  f=$(find "$BUILD_DIR/tests" -name "$t" -type f -executable | head -1)
  [[ -n "$f" ]] && programs+=("$f")
done
for b in $(find "$BUILD_DIR" -path '*/bench/*' -type f -executable -name '*bench*' 2>/dev/null); do
  programs+=("$b")
done
for p in "${programs[@]}"; do
  cp "$p" "$OUT/bin/"
  strip --strip-debug "$OUT/bin/$(basename "$p")"
done
# BEFORE_DAEMON=path: an earlier build's gpuexecd, which the tier measures
# against this one (gpuexec_bench --ab_daemon) on the same host.
if [[ -n ${BEFORE_DAEMON:-} ]]; then
  cp "$BEFORE_DAEMON" "$OUT/bin/gpuexecd.before"
  strip --strip-debug "$OUT/bin/gpuexecd.before"
fi
# Libraries: everything ldd resolves, except glibc's and the driver.
for p in "${programs[@]}"; do ldd "$p"; done | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|ld-linux[^/]*|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$OUT/lib/"; done
strip --strip-unneeded "$OUT"/lib/*.so* 2>/dev/null || true
cp -r "$BUILD_DIR/tests/kernels/sm_90" "$OUT/kernels/"
# The README's walk-through kernel as shipped (saxpy.cubin and saxpy.ptx,
# built from saxpy.cu by client/cpp/examples/regenerate_modules.sh), the
# simulator beside the daemon (bin/../lib: gpuexecd --simulator), and the
# Python package with its tests and examples (the GPU host's own python3
# has grpcio, numpy and Triton).
cp client/cpp/examples/saxpy.cubin client/cpp/examples/saxpy.ptx "$OUT/kernels/"
# The source compile_module_test compiles (GPUEXEC_TEST_NVRTC_KERNELS).
cp tests/kernels/gx_nvrtc_kernels.cu "$OUT/kernels/"
cp "$BUILD_DIR/tests/fake_cuda/libgpuexec_fakecuda.so" "$OUT/lib/"
# The README and what its commands use, for tests/docs/readme_test.py
# (run-gpu-tests.sh lays a build/ of links to bin/ beside them).
mkdir -p "$OUT/readme/client/cpp" "$OUT/readme/client/python/examples"
cp README.md "$OUT/readme/"
cp -r client/cpp/examples "$OUT/readme/client/cpp/"
cp -r client/python/examples "$OUT/readme/client/python/"
cp tests/docs/readme_test.py "$OUT/"
mkdir -p "$OUT/python"
cp -r "$BUILD_DIR/client/python/gpuexec" "$OUT/python/"
cp "$BUILD_DIR/client/python/pyproject.toml" "$OUT/python/"
# The examples where the Python tests look for them (python-tests/../examples).
mkdir -p "$OUT/examples"
cp client/python/examples/saxpy.py "$OUT/examples/"
cp -r client/python/tests "$OUT/python-tests"
# The Triton metadata files both loaders are tested on, where the Python
# tests look for them beside themselves (data/triton).
mkdir -p "$OUT/python-tests/data"
cp -r tests/data/triton "$OUT/python-tests/data/"
cp client/python/examples/saxpy.py client/python/examples/triton/run_triton_kernels.py "$OUT/"
cp client/python/examples/triton/programs.py "$OUT/triton_programs.py"
cp bench/triton_launch_bench.py "$OUT/"
find "$OUT" -name __pycache__ -prune -exec rm -rf {} +
cp scripts/run-gpu-tests.sh scripts/soak.py scripts/soak_client.py scripts/soak_proc.py \
  scripts/device_memory_probe.py "$OUT/"
# The benchmark's Python rows: its script beside it (it finds the package
# in python/).
cp bench/python_bench.py "$OUT/bin/"
# Measuring tools (latency-diagnosis.sh), and with TRACE=1 their build.
cp scripts/latency-diagnosis.sh scripts/latency_trace.py scripts/thread_load.py \
  server/common/trace.h "$OUT/"
if [[ ${TRACE:-0} == 1 ]]; then
  TRACE_DIR="${TRACE_BUILD_DIR:-build-trace}"
  if [[ ! -f "$TRACE_DIR/build.ninja" ]]; then
    cmake -S . -B "$TRACE_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCUDAToolkit_ROOT="${CUDA_ROOT:-/usr/local/cuda}" -DGPUEXEC_LATENCY_TRACE=ON \
      -DGPUEXEC_BUILD_TESTS=OFF
  fi
  cmake --build "$TRACE_DIR" --target gpuexecd gpuexec_bench
  mkdir -p "$OUT/trace"
  cp "$TRACE_DIR/server/gpuexecd" "$TRACE_DIR/bench/gpuexec_bench" "$OUT/trace/"
  strip --strip-debug "$OUT"/trace/*
fi
du -sh "$OUT"
