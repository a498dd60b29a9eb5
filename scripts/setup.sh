#!/usr/bin/env bash
# Installs what gpuexec needs on Debian 12 (as root, or with sudo) and builds
# it into ./build. Idempotent: installed packages and a configured build are
# reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev libssl-dev
  libgtest-dev libgmock-dev libbenchmark-dev libcli11-dev libtcmalloc-minimal4
  python3-grpcio python3-protobuf python3-numpy python3-pytest python3-grpc-tools
  python3-prometheus-client python3-yaml openssl ca-certificates nodejs npm tmux
  python3-venv python3-pip python3-setuptools python3-wheel mypy
  clang clang-format-14 libfuzzer-14-dev libclang-rt-14-dev)

# A package counts as installed when it is, or when an installed package
# provides it: NodeSource's nodejs (20 or newer) provides npm, and Debian's
# npm would conflict with it.
installed() {
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed" && return 0
  dpkg-query -W -f='${Status}|${Provides}\n' 2>/dev/null | sed -n 's/^install ok installed|//p' |
    tr ',' '\n' | sed 's/(.*//; s/ //g' | grep -x -- "$1" >/dev/null
}
missing=()
for p in "${PACKAGES[@]}"; do
  installed "$p" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# No CUDA toolkit is needed: the daemon declares the driver API it uses
# (server/cuda/cuda_api.h) and opens the driver at run time. A toolkit (12.4
# or newer) under CUDA_ROOT, if there is one, adds nvcc's GPU test kernels and
# the check of cuda_api.h against its cuda.h.
CUDA_ROOT="${CUDA_ROOT:-${CUDAToolkit_ROOT:-/usr/local/cuda}}"
if [[ ! -x "$CUDA_ROOT/bin/nvcc" ]]; then
  echo "setup: no CUDA toolkit in $CUDA_ROOT: building without it (the GPU tier's" \
    "tests will report SKIPPED; set CUDA_ROOT to a toolkit to build its kernels)"
fi

BUILD_DIR="${BUILD_DIR:-build}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDA_ROOT="$CUDA_ROOT"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
