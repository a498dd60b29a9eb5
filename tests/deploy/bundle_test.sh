#!/usr/bin/env bash
# The relocatable bundle works from wherever it is unpacked, with nothing
# from the build tree or the environment: it is built by scripts/bundle.sh
# from the build under test, unpacked from its tarball into a fresh
# directory, and run under `env -i` (no LD_LIBRARY_PATH, no PATH).
#
#   bundle_test.sh SOURCE_DIR BUILD_DIR FAKE_DRIVER
set -euo pipefail
src=$1 build=$2 driver=$3
work=$(mktemp -d)
daemon=""
cleanup() {
  [[ -n $daemon ]] && kill "$daemon" 2>/dev/null && wait "$daemon" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

BUILD_DIR=$build "$src/scripts/bundle.sh" "$work/dist" >/dev/null
tarball=$(ls "$work"/dist/gpuexec-*-linux-*.tar.gz)
mkdir "$work/elsewhere"
tar -C "$work/elsewhere" -xzf "$tarball"
rm -rf "$work/dist"  # only the unpacked copy is left
root=$(readlink -f "$(ls -d "$work"/elsewhere/gpuexec-*)")
echo "bundle: $(basename "$tarball"), $(du -sh "$root" | cut -f1) unpacked"

for p in gpuexecd gpuexec; do
  bin="$root/bin/$p"
  [[ -x $bin ]] || fail "bin/$p is missing"
  # grep reads all of readelf's output (no -q): under pipefail, a grep that
  # quits at the first match can end readelf with SIGPIPE and fail the check.
  readelf -d "$bin" | grep 'RPATH.*\$ORIGIN/../lib' >/dev/null ||
    fail "bin/$p has no \$ORIGIN/../lib rpath"
  # Every library resolves inside the bundle, except the C library's own.
  env -i "$(command -v ldd)" "$bin" >"$work/ldd" || fail "ldd $p"
  if grep -q "not found" "$work/ldd"; then cat "$work/ldd"; fail "bin/$p: a library is missing"; fi
  outside=$(awk '/=> \//{print $3}' "$work/ldd" | xargs -r readlink -f | grep -v "^$root/lib/" |
    grep -Ev '/(libc|libm|libpthread|libdl|librt|libresolv|ld-linux[^/]*)\.so' || true)
  [[ -z $outside ]] || fail "bin/$p loads libraries from outside the bundle: $outside"
done
echo "rpath and libraries: ok"

env -i "$root/bin/gpuexecd" --help >"$work/help" 2>&1 || true
grep -q -- "--metrics_listen" "$work/help" || fail "gpuexecd --help lists no flags"
env -i "$root/bin/gpuexec" --help >"$work/cli-help" 2>&1 || fail "gpuexec --help failed"

# The bundled daemon serves; the bundled CLI and Python package reach it.
sock="$work/d.sock"
env -i "$root/bin/gpuexecd" --listen= --unix_socket="$sock" --driver="$driver" \
  2>"$work/daemon.log" &
daemon=$!
for _ in $(seq 200); do
  [[ -S $sock ]] && break
  kill -0 "$daemon" 2>/dev/null || { cat "$work/daemon.log"; fail "gpuexecd exited"; }
  sleep 0.05
done
[[ -S $sock ]] || fail "gpuexecd did not open its socket within 10 s"
env -i "$root/bin/gpuexec" --target="unix:$sock" devices >"$work/devices" 2>&1 ||
  { cat "$work/devices"; fail "gpuexec devices"; }
grep -q "fake GPU 0" "$work/devices" || { cat "$work/devices"; fail "gpuexec devices: no device 0"; }
env -i PYTHONPATH="$root/python" /usr/bin/python3 -c "
import gpuexec, sys
with gpuexec.connect('unix:$sock') as c:
    d = c.devices()
    assert d and 'fake GPU 0' in d[0].name, d
    with c.session() as s:
        b = s.upload(b'bundle' * 1000)
        assert b.read() == b'bundle' * 1000
print('python from the bundle: ok')
"
echo "daemon, CLI and Python package from the bundle: ok"
