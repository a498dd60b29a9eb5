#!/usr/bin/env bash
# The Dockerfile's promises, checked without a container engine:
#   * the build stage runs scripts/setup.sh, the step the README and CI run;
#   * the runtime stage is slim Debian 12, runs as a non-root user, and the
#     packages it installs (with their dependencies) provide every shared
#     library the daemon and the CLI load here, except libcuda, which the
#     NVIDIA container runtime injects;
#   * every flag its CMD passes is one gpuexecd knows.
#
#   check_dockerfile.sh DOCKERFILE GPUEXECD GPUEXEC
set -euo pipefail
dockerfile=$1 daemon=$2 cli=$3
fail() { echo "FAIL: $*" >&2; exit 1; }

grep -Eq '^RUN .*\./scripts/setup\.sh' "$dockerfile" || fail "the build stage does not run scripts/setup.sh"
last_from=$(grep -E '^FROM ' "$dockerfile" | tail -1)
[[ $last_from == "FROM debian:12-slim"* ]] || fail "the runtime stage is '$last_from', not debian:12-slim"
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
grep -q 'COPY --from=build .*cli/gpuexec ' <<<"$runtime" || fail "the runtime stage does not copy the gpuexec tool"

flags=$("$(dirname "$0")/gpuexecd_flags.sh" "$daemon")
for f in $(grep -E '^(CMD|ENTRYPOINT)' "$dockerfile" | grep -oE -- '--[a-z_]+' | sort -u); do
  grep -qx -- "$f" <<<"$flags" || fail "the Dockerfile passes $f, which gpuexecd does not know"
done
echo "Dockerfile: build stage runs setup.sh; runtime $last_from as $user;" \
  "packages ($(echo $packages)) provide all $(ldd "$daemon" "$cli" | awk '/=> \//{print $3}' | sort -u | wc -l) libraries"
