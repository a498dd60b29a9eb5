#!/usr/bin/env bash
# Where a launch spends its time, on a GPU host, from a bundle made by
#   TRACE=1 scripts/gpu-bundle.sh
# (TRACE=1 adds trace/: the daemon and benchmark of a build with
# -DGPUEXEC_LATENCY_TRACE=ON). Prints, over TCP and over a Unix socket:
#   - the median of each step of a launch + synchronize (the timestamping
#     build; scripts/latency_trace.py), and through a command ring,
#   - how busy each thread of the daemon, its worker and the client was
#     while one client queued launches, while it waited for each, and while
#     16 clients did both (the ordinary build; scripts/thread_load.py).
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)"
export LD_LIBRARY_PATH="$HERE/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
KERNELS="${KERNELS:-$HERE/kernels/sm_90}"
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; rm -rf "$work"' EXIT

PORT=${PORT:-50777}
tcp="127.0.0.1:$PORT"
# start_daemon BIN ARGS...: starts it on $tcp and $work/g.sock, sets $daemon.
start_daemon() {
  local bin=$1; shift
  rm -f "$work/g.sock"
  "$bin" --listen="$tcp" --unix_socket="$work/g.sock" --log_level=warning "$@" &
  daemon=$!
  for _ in $(seq 100); do [[ -S $work/g.sock ]] && break; sleep 0.1; done
  sleep 0.5  # its workers
}
stop_daemon() { kill -TERM "$daemon"; wait "$daemon" 2>/dev/null; }
workers() { pgrep -P "$daemon" | paste -sd, -; }

# ring: the same Unix socket, the daemon serving command rings on its host
# memory socket (the client then posts its launches through one).
for transport in tcp unix ring; do
  dir="$work/trace-$transport"
  mkdir -p "$dir"
  export GPUEXEC_TRACE_DIR="$dir"
  if [[ $transport == ring ]]; then
    rm -f "$work/shm.sock"
    start_daemon "$HERE/trace/gpuexecd" --shm_socket="$work/shm.sock"
  else
    start_daemon "$HERE/trace/gpuexecd"
  fi
  target=$([[ $transport == tcp ]] && echo "$tcp" || echo "unix:$work/g.sock")
  "$HERE/trace/gpuexec_bench" --target="$target" --figures=launch --kernels="$KERNELS"
  stop_daemon
  unset GPUEXEC_TRACE_DIR
  echo "== launch + synchronize over $transport, step by step"
  python3 "$HERE/latency_trace.py" "$dir"
  rm -rf "$dir"
done

start_daemon "$HERE/bin/gpuexecd"
for figure in async answered clients; do
  echo "== thread load: $figure, TCP"
  python3 "$HERE/thread_load.py" "$daemon,$(workers)" -- \
    "$HERE/bin/gpuexec_bench" --target="$tcp" --figures="$figure" --repeat=3 --kernels="$KERNELS"
done
stop_daemon
