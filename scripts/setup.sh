#!/usr/bin/env bash
# Installs what gpuexec needs on Debian 12 (as root, or with sudo) and builds
# it into ./build. Idempotent: installed packages and a configured build are
# reused.
set -euo pipefail
cd "$(dirname "$0")/.."

PACKAGES=(build-essential cmake ninja-build pkg-config
  libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler libabsl-dev
  libgtest-dev libgmock-dev libbenchmark-dev
  python3-grpcio python3-protobuf python3-numpy python3-pytest python3-grpc-tools
  python3-prometheus-client python3-yaml openssl
  clang clang-format-14 libfuzzer-14-dev libclang-rt-14-dev)

missing=()
for p in "${PACKAGES[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  SUDO=""
  [[ $(id -u) -ne 0 ]] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi

# The CUDA Driver API header is a build requirement (the driver itself is
# opened at run time). Debian 12 packages no CUDA 12.4+ toolkit.
CUDA_ROOT="${CUDA_ROOT:-${CUDAToolkit_ROOT:-/usr/local/cuda}}"
if [[ ! -f "$CUDA_ROOT/include/cuda.h" ]]; then
  echo "setup: the CUDA toolkit (12.4 or newer) is needed for cuda.h and nvcc;" >&2
  echo "       install it from NVIDIA and set CUDA_ROOT to its directory (looked in $CUDA_ROOT)." >&2
  exit 1
fi

BUILD_DIR="${BUILD_DIR:-build}"
if [[ ! -f "$BUILD_DIR/build.ninja" ]]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCUDAToolkit_ROOT="$CUDA_ROOT"
fi
cmake --build "$BUILD_DIR" -j"$(nproc)"
