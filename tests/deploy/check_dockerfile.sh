#!/usr/bin/env bash
# The Dockerfile's promises, checked without a container engine:
#   * there are two stages; the first, the build stage, is plain debian:12
#     and runs scripts/setup.sh, the step the README and CI run, with no CUDA
#     toolkit (no NVIDIA image, nothing from /usr/local/cuda, no CUDA_ROOT),
#     and .dockerignore keeps a build tree of the checkout out of it;
#   * the runtime stage is slim Debian 12, runs as a non-root user, and the
#     packages it installs (with their dependencies) provide every shared
#     library the daemon and the CLI load here, except libcuda, which the
#     NVIDIA container runtime injects;
#   * every flag its CMD passes is one gpuexecd knows;
#   * a CMD that listens beyond loopback passes TLS and tenants files (and
#     never --allow_unauthenticated), in directories the image makes;
#   * the HEALTHCHECK runs the gpuexec tool over the Unix socket that the
#     ENTRYPOINT serves (so a CMD of one's own keeps it), in a directory the
#     image's user owns; a TCP listener needs TLS and a token by now.
#
#   check_dockerfile.sh DOCKERFILE GPUEXECD GPUEXEC
set -euo pipefail
dockerfile=$1 daemon=$2 cli=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

froms=$(grep -E '^FROM ' "$dockerfile")
(($(wc -l <<<"$froms") == 2)) || fail "expected two stages (build, runtime), found: ${froms//$'\n'/; }"
first_from=$(head -1 <<<"$froms")
[[ $first_from =~ ^FROM\ +debian:12\.[0-9]+\ +[Aa][Ss]\ +build\ *$ ]] ||
  fail "the build stage is '$first_from', not 'FROM debian:12.N AS build' (a point release, not the moving 12)"
build=$(awk '/^FROM /{n++} n==1' "$dockerfile")
grep -Eq '^RUN .*\./scripts/setup\.sh' <<<"$build" || fail "the build stage does not run scripts/setup.sh"
# setup.sh reuses a configured build: one from the checkout must not reach it.
grep -qxE '/?build/?' "$(dirname "$dockerfile")/.dockerignore" 2>/dev/null ||
  fail ".dockerignore does not keep the checkout's build/ out of the build stage"
cuda=$(grep -Ev '^[[:space:]]*#' "$dockerfile" | grep -Ei 'nvidia/cuda|/usr/local/cuda|CUDA_ROOT|CUDAToolkit' || true)
[[ -z $cuda ]] || fail "the build brings in a CUDA toolkit, which it needs not: $cuda"
last_from=$(grep -E '^FROM ' "$dockerfile" | tail -1)
[[ $last_from =~ ^FROM\ +debian:12\.[0-9]+-slim ]] ||
  fail "the runtime stage is '$last_from', not debian:12.N-slim (a point release, not the moving 12)"
runtime=$(awk '/^FROM /{stage=""} {stage = stage $0 "\n"} END{printf "%s", stage}' "$dockerfile")
user=$(grep -E '^USER ' <<<"$runtime" | tail -1 | awk '{print $2}')
[[ -n $user && $user != root && $user != 0 ]] || fail "the runtime stage runs as '${user:-root}'"

# The runtime stage's apt-get install list (continued lines joined).
packages=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' <<<"$runtime" | grep -E 'apt-get install' |
  sed -E 's/.*apt-get install//; s/&&.*//' | tr ' ' '\n' | grep -Ev '^(-|$)' || true)
[[ -n $packages ]] || fail "the runtime stage installs no packages"
# Those packages and everything they depend on.
closure=$(apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts \
  --no-breaks --no-replaces --no-enhances $packages 2>/dev/null |
  grep -Ev '^ |^<' | sed 's/:.*//' | sort -u)

owner() {  # the package that owns a library file (usrmerge: try both paths)
  local f=$1 real p o
  real=$(readlink -f "$f")
  for p in "$f" "$real" "${real#/usr}" "/usr$f"; do
    o=$(dpkg -S "$p" 2>/dev/null | head -1 | cut -d: -f1) || true
    [[ -n $o ]] && { echo "$o"; return 0; }
  done
  return 1
}
missing=()
for lib in $(ldd "$daemon" "$cli" | awk '/=> \//{print $3}' | sort -u); do
  [[ $lib == *libcuda.so* ]] && continue
  pkg=$(owner "$lib") || fail "no package owns $lib"
  grep -qx "$pkg" <<<"$closure" || missing+=("$lib ($pkg)")
done
((${#missing[@]} == 0)) || fail "the runtime stage lacks: ${missing[*]}"

grep -q 'COPY --from=build .*gpuexecd' <<<"$runtime" || fail "the runtime stage does not copy gpuexecd"
grep -q 'COPY --from=build .*bin/gpuexec ' <<<"$runtime" || fail "the runtime stage does not copy the gpuexec tool"
# Installed programs (cmake --install), whose only search path is $ORIGIN/../lib.
grep -q 'COPY --from=build .*/src/build/' <<<"$runtime" &&
  fail "the runtime stage copies from the build tree, not from cmake --install's prefix"

# The runtime stage's instructions, continued lines joined.
joined=$(sed -e ':a' -e '/\\$/N; s/\\\n//; ta' <<<"$runtime")
entrypoint=$(grep -E '^ENTRYPOINT' <<<"$joined" | tail -1)
cmd=$(grep -E '^CMD' <<<"$joined" | tail -1)
healthcheck=$(grep -E '^HEALTHCHECK' <<<"$joined" | tail -1)
# The quoted words of an exec-form instruction, one per line.
words() { grep -oE '"[^"]*"' <<<"$1" | tr -d '"'; }
# The value of --NAME=... among the words on stdin (the last one wins, as in
# gpuexecd).
value() { { grep -E "^--$1=" || true; } | tail -1 | cut -d= -f2-; }

flags=$("$(dirname "$0")/gpuexecd_flags.sh" "$daemon")
for f in $(printf '%s\n' "$entrypoint" "$cmd" | grep -oE -- '--[a-z_]+' | sort -u); do
  grep -qx -- "$f" <<<"$flags" || fail "the Dockerfile passes $f, which gpuexecd does not know"
done

args=$( (words "$entrypoint" | tail -n +2; words "$cmd") )
! grep -q -- '^--allow_unauthenticated' <<<"$args" || fail "the image passes --allow_unauthenticated"
listen=127.0.0.1:50051   # gpuexecd's default; --listen= is none
grep -q -- '^--listen=' <<<"$args" && listen=$(value listen <<<"$args")
case $listen in
  ""|127.*|localhost:*|"[::1]:"*) ;;
  *)
    for f in tls_cert tls_key tenants; do
      file=$(value $f <<<"$args")
      [[ -n $file ]] || fail "the image listens on $listen without --$f"
      grep -qE "(^|[ =])$(dirname "$file")( |\$)" <<<"$joined" ||
        fail "--$f=$file: the runtime stage does not make $(dirname "$file")"
    done ;;
esac

sock=$(words "$entrypoint" | value unix_socket)
[[ -n $sock ]] || fail "the ENTRYPOINT serves no --unix_socket for the HEALTHCHECK"
check=$(words "$healthcheck")
[[ $(head -1 <<<"$check") == */gpuexec ]] || fail "the HEALTHCHECK does not run the gpuexec tool: $healthcheck"
grep -qx -- "--target=unix:$sock" <<<"$check" ||
  fail "the HEALTHCHECK does not use the ENTRYPOINT's socket $sock: $healthcheck"
grep -qE "install -d -o $user .*$(dirname "$sock")( |\$)" <<<"$joined" ||
  fail "the runtime stage does not make $(dirname "$sock") for user $user"
echo "Dockerfile: build stage debian:12 runs setup.sh, no CUDA toolkit; runtime $last_from as $user;" \
  "listens on $listen, healthcheck over unix:$sock;" \
  "packages ($(echo $packages)) provide all $(ldd "$daemon" "$cli" | awk '/=> \//{print $3}' | sort -u | wc -l) libraries"
