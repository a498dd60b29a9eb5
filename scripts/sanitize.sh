#!/usr/bin/env bash
# Builds the daemon, the libcuda test double and the service, fault, host
# memory socket, worker sandbox, tenant bounds and command ring suites with
# AddressSanitizer (leaks included) and UBSan into
# ./build-asan, and runs those suites on the double. Any report fails the run: UBSan
# halts on its first finding, ASan on its first error, LeakSanitizer when a
# process exits with memory it lost.
#
#   scripts/sanitize.sh [extra ctest arguments]
#
# Idempotent: a configured tree is reused. Needs only what scripts/setup.sh
# installs (g++ carries both sanitizers).
set -euo pipefail
cd "$(dirname "$0")/.."

BUILD_DIR="${SANITIZE_BUILD_DIR:-build-asan}"
CUDA_ROOT="${CUDA_ROOT:-${CUDAToolkit_ROOT:-/usr/local/cuda}}"
FLAGS="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer"
start=$(date +%s)
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT="$CUDA_ROOT" -DGPUEXEC_BUILD_CUBINS=OFF \
    -DCMAKE_C_FLAGS="$FLAGS" -DCMAKE_CXX_FLAGS="$FLAGS" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" \
    -DCMAKE_SHARED_LINKER_FLAGS="-fsanitize=address,undefined" >"$BUILD_DIR.configure.log" 2>&1 ||
    { cat "$BUILD_DIR.configure.log" >&2; exit 1; }
fi
cmake --build "$BUILD_DIR" --target gpuexecd gpuexec_fakecuda service_test fault_test \
  shm_socket_test shm_attack_test sandbox_test tenant_bounds_test command_ring_test command_ring_client_test command_ring_hostile_test \
  command_ring_runner_test command_ring_view_test ring_decode_test -j"$(nproc)"
echo "sanitize: built in $(($(date +%s) - start)) s"

# The test double is dlopen()ed by the daemon's workers, which ASan must
# already be in: every process here is an instrumented executable.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:detect_stack_use_after_return=0${ASAN_OPTIONS:+:$ASAN_OPTIONS}"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1${UBSAN_OPTIONS:+:$UBSAN_OPTIONS}"
export LSAN_OPTIONS="suppressions=$PWD/tests/sanitize/lsan.supp${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
ctest --test-dir "$BUILD_DIR" --output-on-failure \
  -R '^(service_test|fault_test|shm_socket_test|shm_attack_test|sandbox_test|tenant_bounds_test|command_ring_test|command_ring_client_test|command_ring_hostile_test|command_ring_runner_test|command_ring_view_test|ring_decode_test)$' \
  "$@"
echo "sanitize: done in $(($(date +%s) - start)) s"
