#!/bin/sh
# Stands in for NVIDIA's nvidia-cuda-mps-control in the daemon's tests
# (gpuexecd --mps=own --mps_control=THIS): it serves no GPU, only the part
# the daemon talks to. With -f it makes the control pipe in
# $CUDA_MPS_PIPE_DIRECTORY and takes commands from it until "quit";
# without, it passes the command on its stdin to the one serving. Each
# step is appended to $GPUEXEC_TEST_MPS_RECORD when that is set.
set -eu
pipes=${CUDA_MPS_PIPE_DIRECTORY:?}
: "${CUDA_MPS_LOG_DIRECTORY:?}"
record() { if [ -n "${GPUEXEC_TEST_MPS_RECORD:-}" ]; then echo "$*" >> "$GPUEXEC_TEST_MPS_RECORD"; fi; }
if [ "${1:-}" = "-f" ]; then
  if [ -n "${GPUEXEC_TEST_MPS_FAIL:-}" ]; then
    echo "stand-in: told to fail" >> "$CUDA_MPS_LOG_DIRECTORY/control.log"
    exit 3
  fi
  mkfifo -m 600 "$pipes/control"
  record "started $pipes $(stat -c %a "$pipes")"
  if [ -n "${GPUEXEC_TEST_MPS_RECORD:-}" ]; then echo $$ > "$GPUEXEC_TEST_MPS_RECORD.pid"; fi
  while :; do
    while read -r line; do
      record "$line"
      if [ "$line" = "quit" ]; then
        rm -f "$pipes/control"
        exit 0
      fi
    done < "$pipes/control"
  done
fi
read -r line
[ -p "$pipes/control" ] || { echo "no control daemon serves $pipes" >&2; exit 1; }
echo "$line" > "$pipes/control"
