#!/usr/bin/env bash
# Makes the relocatable bundle for hosts without containers: the daemon, the
# gpuexec tool, the Python package and every shared library they need
# except glibc's own and libcuda (the host's NVIDIA driver provides it).
# lib/ also holds the simulator (libgpuexec_fakecuda.so, installed with the
# runtime component), so that `bin/gpuexecd --simulator` runs without a GPU.
# The programs find lib/ through an $ORIGIN rpath, so the directory works
# wherever it is unpacked; nothing needs LD_LIBRARY_PATH.
#
#   scripts/setup.sh && scripts/bundle.sh [OUT_DIR]     (default: dist)
#
# Writes OUT_DIR/gpuexec-<version>-linux-<arch>/ and a .tar.gz of it.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT_DIR="${1:-dist}"
BUILD_DIR="${BUILD_DIR:-build}"
if [[ ! -x "$BUILD_DIR/server/gpuexecd" ]]; then
  echo "bundle: no build in $BUILD_DIR; run scripts/setup.sh first" >&2
  exit 1
fi
version=$(sed -n 's/^project(gpuexec VERSION \([0-9.]*\).*/\1/p' CMakeLists.txt)
name="gpuexec-$version-linux-$(uname -m)"
root="$OUT_DIR/$name"
rm -rf "$root" "$root.tar.gz"
mkdir -p "$OUT_DIR"
cmake --install "$BUILD_DIR" --prefix "$root" --component runtime >/dev/null

# Every library the programs load, resolved as this host resolves them,
# except the C library's own and the driver.
mkdir -p "$root/lib"
for p in "$root"/bin/*; do ldd "$p"; done | awk '/=> \//{print $3}' | sort -u |
  grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*|libcuda)\.so' |
  while read -r lib; do cp -L "$lib" "$root/lib/"; done
strip --strip-unneeded "$root"/bin/* "$root"/lib/*.so* 2>/dev/null || true

mkdir -p "$root/share/gpuexec"
cp README.md "$root/share/gpuexec/"
cp deploy/systemd/gpuexecd.service "$root/share/gpuexec/"
cp deploy/bundle/README "$root/README"
tar -C "$OUT_DIR" -czf "$root.tar.gz" "$name"
echo "$root.tar.gz ($(du -sh "$root" | cut -f1) unpacked)"
