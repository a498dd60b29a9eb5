#!/usr/bin/env bash
# Regenerates the saxpy modules shipped beside saxpy.cu, so that running the
# walk-through on a GPU needs no CUDA toolkit:
#   saxpy.cubin  sm_90 (H100/H200) machine code
#   saxpy.ptx    PTX for sm_90, which the driver compiles for newer GPUs too
# Needs nvcc (CUDA 12.4 or newer): $NVCC, else nvcc under $CUDA_PATH,
# /usr/local/cuda or on PATH. The layout test (image_reader_test) checks the
# shipped files still match saxpy.cu's signature; run this after changing it.
set -euo pipefail
cd "$(dirname "$0")"
nvcc=${NVCC:-}
for candidate in "${CUDA_PATH:-}/bin/nvcc" /usr/local/cuda/bin/nvcc "$(command -v nvcc || true)"; do
  [[ -z "$nvcc" && -x "$candidate" ]] && nvcc=$candidate
done
if [[ -z "$nvcc" ]]; then
  echo "regenerate_modules: no nvcc found (set NVCC or CUDA_PATH to a CUDA toolkit)" >&2
  exit 1
fi
"$nvcc" -cubin -arch=sm_90 -o saxpy.cubin saxpy.cu
"$nvcc" -ptx -arch=sm_90 -o saxpy.ptx saxpy.cu
echo "saxpy.cubin ($(wc -c <saxpy.cubin) bytes) and saxpy.ptx ($(wc -c <saxpy.ptx) bytes) from $nvcc"
