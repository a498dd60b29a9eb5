#!/usr/bin/env bash
# Runs the GPU tier from a bundle made by gpu-bundle.sh, on a host with an
# NVIDIA GPU and driver: the service suite, the daemon tests, the example,
# any benchmarks, and the fault test (faulting and hanging kernels; each
# device's worker restarts). Logs go to stdout and, when $OUT is set, to
# files there.
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
failed=()
run() {  # run NAME CMD...: tee to a log, remember failures
  local name=$1; shift
  echo "== $name"
  "$@" 2>&1 | grep -vE '^[0-9T:.-]+Z I session [0-9a-f]+ (opened|closed)' | tee "$LOG_DIR/$name.log"
  [[ ${PIPESTATUS[0]} -eq 0 ]] || { echo "== $name FAILED"; status=1; failed+=("$name"); }
}
# Green contexts on the driver itself: a part of 16 SMs beside a neighbour
# on the rest (the facts the shared worker's compute shares rest on).
run green_contexts "$(ls "$HERE"/bin/*bench* | head -1)" --green_only=16 --neighbour_kernel_us=1000
# The device layer alone: what a worker's own work adds to each async
# launch, against the driver's launches in the same process.
run device_layer "$(ls "$HERE"/bin/*bench* | head -1)" --device_only
# A bundle made with BEFORE_DAEMON: that build against this one, in turn.
if [[ -x $HERE/bin/gpuexecd.before ]]; then
  run daemon_ab "$(ls "$HERE"/bin/*bench* | head -1)" --ab_daemon="$HERE/bin/gpuexecd.before"
fi
# Kernels from source on the toolkit's NVRTC (GPUEXEC_TEST_NVRTC, or the
# first found): the service's tests, and CompileModule against NVRTC in
# this process.
if [[ -z ${GPUEXEC_TEST_NVRTC:-} ]]; then
  for c in /usr/local/cuda/lib64/libnvrtc.so.13 /usr/local/cuda/lib64/libnvrtc.so.12 \
    $(ldconfig -p 2>/dev/null | awk '/libnvrtc\.so\.1[0-9] /{print $NF}'); do
    [[ -f $c ]] && { export GPUEXEC_TEST_NVRTC=$c; break; }
  done
fi
if [[ -n ${GPUEXEC_TEST_NVRTC:-} ]]; then
  GPUEXEC_TEST_NVRTC_KERNELS="$HERE/kernels/gx_nvrtc_kernels.cu" \
    run compile_module_test "$HERE/bin/compile_module_test"
  run bench_compile "$(ls "$HERE"/bin/*bench* | head -1)" --compile_only \
    --nvrtc="$GPUEXEC_TEST_NVRTC"
else
  echo "== no NVRTC on this host: kernels from source not tested"
fi
run service_test "$HERE/bin/service_test"
run daemon_test "$HERE/bin/daemon_test"
run metrics_endpoint_test "$HERE/bin/metrics_endpoint_test"
# The operator's view on the real driver: process_* and build info (the
# driver's version as the workers report it), and a drain with open sessions.
run standard_metrics_test "$HERE/bin/standard_metrics_test"
run drain_test "$HERE/bin/drain_test"
run tenants_test "$HERE/bin/tenants_test"
run host_memory_test "$HERE/bin/host_memory_test"
run shm_socket_test "$HERE/bin/shm_socket_test"
run shm_attack_test "$HERE/bin/shm_attack_test"
run tenant_bounds_test "$HERE/bin/tenant_bounds_test"
run command_ring_test "$HERE/bin/command_ring_test"
run command_ring_client_test "$HERE/bin/command_ring_client_test"
run command_ring_hostile_test "$HERE/bin/command_ring_hostile_test"
run graphs_test "$HERE/bin/graphs_test"
GPUEXEC_CLI="$HERE/bin/gpuexec" run cli_test "$HERE/bin/cli_test"
export PYTHONPATH="$HERE/python" PYTHONDONTWRITEBYTECODE=1 GPUEXEC_DAEMON="$HERE/bin/gpuexecd"
GPUEXEC_CLI="$HERE/bin/gpuexec" run python_client python3 -m pytest -q -rs -p no:cacheprovider "$HERE/python-tests"

# The README's walk-through against a daemon process: the CLI, Python, C++,
# then Triton kernels compiled here by Triton and run by the Python package
# and the CLI.
work=$(mktemp -d)
sock="$work/gpuexecd.sock"
"$HERE/bin/gpuexecd" --listen= --unix_socket="$sock" --shm_socket="$work/shm.sock" \
  --log_level=warning &
daemon=$!
for _ in $(seq 100); do [[ -S $sock ]] && break; sleep 0.1; done
export GPUEXEC_TARGET="unix:$sock"
walkthrough() {
  cd "$work" && cp "$HERE/kernels/saxpy.cubin" . && set -x &&
  "$HERE/bin/gpuexec" devices &&
  "$HERE/bin/gpuexec" info saxpy.cubin saxpy &&
  "$HERE/bin/gpuexec" run saxpy.cubin saxpy --grid=4096 --block=256 \
    f32:2.0 fill:f32:1.5:1048576 fill:f32:1:1048576,save=y.bin u64:1048576 &&
  od -A d -t f4 -N 16 y.bin &&
  python3 "$HERE/saxpy.py" --target="$GPUEXEC_TARGET" --cubin=saxpy.cubin &&
  "$HERE/bin/gpuexec-saxpy" --target="$GPUEXEC_TARGET" --cubin=saxpy.cubin --kernel=saxpy &&
  python3 "$HERE/run_triton_kernels.py" --target="$GPUEXEC_TARGET" --out="$work" &&
  "$HERE/bin/gpuexec" run --triton=add_kernel.json add_kernel.cubin --grid=1024 \
    fill:f32:1.5:1048576 fill:f32:2.5:1048576 out:4MiB:sum.bin i32:1048576 &&
  od -A d -t f4 -N 16 sum.bin
}
run walkthrough walkthrough

# Unchanged Triton programs through gpuexec's Triton driver, then the same
# with every import of torch failing and no libcuda in the client; then what
# a kernel[grid](...) call costs against Triton's own launcher here.
run triton_programs python3 "$HERE/triton_programs.py" --target="$GPUEXEC_TARGET"
run triton_programs_no_torch python3 "$HERE/triton_programs.py" --target="$GPUEXEC_TARGET" \
  --no-torch
run triton_launch_bench python3 "$HERE/triton_launch_bench.py" --target="$GPUEXEC_TARGET" --profile

# The README's commands as written, on the real driver (readme_test --gpu:
# exit statuses only; the figures and the device differ from the
# simulator's, which CI checks line by line).
readme="$HERE/readme"
mkdir -p "$readme/build/server" "$readme/build/client/cpp/cli"
ln -sfn "$HERE/bin/gpuexecd" "$readme/build/server/gpuexecd"
ln -sfn "$HERE/bin/gpuexec" "$readme/build/client/cpp/cli/gpuexec"
ln -sfn "$HERE/bin/gpuexec-saxpy" "$readme/build/client/cpp/gpuexec-saxpy"
ln -sfn "$HERE/python" "$readme/build/client/python"
run readme_test python3 "$HERE/readme_test.py" "$readme/README.md" --build "$readme/build" --gpu
kill -TERM $daemon; wait $daemon || { echo "== gpuexecd exit status $?"; status=1; failed+=("walk-through daemon exit"); }
cp "$work"/*.json "$LOG_DIR/" 2>/dev/null
rm -rf "$work"
unset GPUEXEC_TARGET

for b in "$HERE"/bin/*bench*; do
  [[ -x "$b" ]] && run "$(basename "$b")" "$b"
done
run fault_test "$HERE/bin/fault_test"
# What holds device memory once every session has gone, one kind of work at
# a time.
run device_memory_probe python3 "$HERE/device_memory_probe.py" --daemon "$HERE/bin/gpuexecd" \
  --driver libcuda.so.1 --kernels "$HERE/kernels/sm_90" --python_package "$HERE/python"

# Under MPS, where the host has its control daemon and none serves yet: one
# of our own, for the tenants' figures with kernels of two tenants running
# at once, and the fault tests of tenants under MPS (a fatal fault in one
# client reaches every client of the GPU; the tests that promise more skip
# there). GPUEXEC_MPS=0 skips this part.
if [[ ${GPUEXEC_MPS:-1} != 0 && -z ${CUDA_MPS_PIPE_DIRECTORY:-} ]] &&
  command -v nvidia-cuda-mps-control >/dev/null; then
  mps=$(mktemp -d)
  export CUDA_MPS_PIPE_DIRECTORY="$mps/pipe" CUDA_MPS_LOG_DIRECTORY="$mps/log"
  mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
  if nvidia-cuda-mps-control -d; then
    # What the control daemon made of its directory (the daemon takes it by
    # its files' kinds, owners and modes), and of the host's default one.
    sleep 1
    echo "== MPS pipe directory:"
    stat -c '   %n: %F, uid %u, mode %a' "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_PIPE_DIRECTORY"/* \
      /tmp/nvidia-mps 2>&1 | sed 's/^stat: /   /'
    bench=$(ls "$HERE"/bin/*bench* | head -1)
    run bench_tenants_mps "$bench" --tenants_only
    # The tests of the implicit tenant's strikes expect charges at once, which
    # MPS settles at its fault window's end: not theirs to run here.
    run fault_test_mps "$HERE/bin/fault_test" --gtest_filter='*Tenant*:*Mps*:-*WithoutTenants*'
    echo quit | nvidia-cuda-mps-control
    sleep 1
    cat "$CUDA_MPS_LOG_DIRECTORY"/control.log 2>/dev/null | tail -20
  else
    echo "== MPS: nvidia-cuda-mps-control -d failed"
  fi
  unset CUDA_MPS_PIPE_DIRECTORY CUDA_MPS_LOG_DIRECTORY
fi

# Compute shares with one worker for both tenants: green contexts (no MPS).
# And a worker each without MPS (time-sliced), for the difference.
bench=$(ls "$HERE"/bin/*bench* | head -1)
for us in 1000 2000; do
  for share in 0.1 ""; do
    run "bench_tenants_green${share:+_$share}_${us}us" "$bench" --tenants_only \
      --tenants_isolation=device --tenants_mps=off --tenant_share="$share" --neighbour_blocks=528 \
      --neighbour_kernel_us=$us
  done
done
run bench_tenants_timesliced_1000us "$bench" --tenants_only --tenants_mps=off \
  --neighbour_blocks=528 --neighbour_kernel_us=1000

# Compute shares: the measured tenant with a tenth of the SMs beside a
# neighbour's kernels that fill the GPU (1 ms and 2 ms), both workers held
# by the daemon's own MPS control daemon (--mps=own); then the same without
# a share, for the difference.
if [[ ${GPUEXEC_MPS:-1} != 0 && -z ${CUDA_MPS_PIPE_DIRECTORY:-} ]] &&
  command -v nvidia-cuda-mps-control >/dev/null; then
  bench=$(ls "$HERE"/bin/*bench* | head -1)
  for us in 1000 2000; do
    for share in 0.1 ""; do
      run "bench_tenants_share${share:+_$share}_${us}us" "$bench" --tenants_only \
        --tenants_mps=own --tenant_share="$share" --neighbour_blocks=528 --neighbour_kernel_us=$us
    done
  done
fi
# Last, so that the end of the output says it (a long run's logs may not
# all come back).
if [[ $status -eq 0 ]]; then
  echo "== the GPU tier passed"
else
  echo "== the GPU tier FAILED: ${failed[*]:-a step outside run} (logs in $LOG_DIR)"
fi
exit $status
