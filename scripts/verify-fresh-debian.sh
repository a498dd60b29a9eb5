#!/usr/bin/env bash
# Proves the README's two commands on a fresh Debian 12. Makes a bookworm
# root with debootstrap (minbase: the base system and nothing else, so no
# CUDA, no toolkit, no Node.js), copies the committed tree into it (git
# archive HEAD: what a clone has) and there, as root:
#   1. runs ./scripts/run.sh in the background until the daemon answers
#      `gpuexec devices` on 127.0.0.1:50051 (with no GPU: no devices, health
#      NOT_SERVING), then stops it with SIGTERM and checks it exited cleanly;
#   2. runs ./scripts/test.sh.
# Prints both results, ctest's count and every test that did not run, with
# its reason. Fails when either command failed or when a test that needs no
# GPU did not run: only the GPU tier (label `gpu`) may report SKIPPED here.
#
#   sudo scripts/verify-fresh-debian.sh [--root=DIR] [--reuse] [--keep] [--log=FILE] [--mirror=URL]
#
#   --root=DIR    the root (default /var/tmp/gpuexec-fresh-debian); a root an
#                 earlier run made there is deleted first, unless --reuse
#   --reuse       use the root at DIR as it is, skipping debootstrap (what an
#                 earlier run installed in it stays: only a new root is fresh)
#   --keep        keep the root afterwards (default: unmount and delete it)
#   --log=FILE    the whole log: debootstrap, both commands, the summary
#                 (default /var/tmp/gpuexec-fresh-debian.log); ctest's own
#                 LastTest.log, every test's output, is kept beside it as
#                 FILE.ctest (and the sanitizer run's as FILE.ctest-asan)
#   --mirror=URL  the Debian mirror (default: the host's bookworm source,
#                 else http://deb.debian.org/debian)
# FUZZ_SECONDS and SANITIZE reach test.sh as they are set here.
#
# Needs root, git and debootstrap (installed with apt-get when missing). The
# root shares the host's network, so nothing here may listen on port 50051;
# it gets the host's resolv.conf and its site CAs (/usr/local/share/
# ca-certificates), as a new machine on the same network would have them.
# On 2 cores it takes about half an hour: debootstrap 1-2 minutes, run.sh
# ~10 (packages, then the build), test.sh ~17 (ctest, fuzz, sanitizers).
# Idempotent: each run starts from a new root (or the reused one) and a new
# copy of the tree, and whatever it mounted is unmounted on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

ROOT=/var/tmp/gpuexec-fresh-debian
LOG=/var/tmp/gpuexec-fresh-debian.log
MIRROR=""
REUSE=0
KEEP=0
for arg in "$@"; do
  case "$arg" in
    --root=*) ROOT="${arg#--root=}" ;;
    --log=*) LOG="${arg#--log=}" ;;
    --mirror=*) MIRROR="${arg#--mirror=}" ;;
    --reuse) REUSE=1 ;;
    --keep) KEEP=1 ;;
    -h | --help) sed -n '2,/^set -euo/{/^set -euo/d;s/^# \{0,1\}//;p}' "$0"; exit 0 ;;
    *) echo "verify-fresh-debian: unknown argument '$arg' (--help)" >&2; exit 2 ;;
  esac
done

say() { echo "verify-fresh-debian: $*" | tee -a "$LOG"; }
die() { say "FAILED: $*"; exit 1; }

[[ $(id -u) -eq 0 ]] || { echo "verify-fresh-debian: run it as root (debootstrap, chroot, mount)" >&2; exit 1; }
ROOT=$(realpath -m "$ROOT")
[[ $ROOT == /?*/* && $ROOT != *[[:space:]]* ]] ||
  { echo "verify-fresh-debian: --root=$ROOT: want an absolute path two levels deep, no spaces" >&2; exit 2; }
mkdir -p "$(dirname "$LOG")"
: >"$LOG"
MARKER="$ROOT/.gpuexec-fresh-debian"   # says a run of this script made the root
TREE=/root/gpuexec                     # the checkout, inside the root
BUILD="$ROOT$TREE/build"
start=$SECONDS

# ---------------------------------------------------------------- cleanup

MOUNTS=()       # what this run mounted, in order
DAEMON_PID=""   # run.sh, then gpuexecd: a session of its own
mounted_under() { awk -v r="$1" '$5 == r || index($5, r "/") == 1 {print $5}' /proc/self/mountinfo; }
kill_root_processes() {  # whatever still runs inside the root: only this run starts any
  local p
  for p in /proc/[0-9]*; do
    [[ $(readlink "$p/root" 2>/dev/null) == "$ROOT" ]] && kill -KILL "${p#/proc/}" 2>/dev/null
  done
  return 0
}
remove_root() {  # $1: a root this script made, with nothing mounted in it
  [[ -n $(mounted_under "$1") ]] && { say "not deleting $1: still mounted: $(mounted_under "$1")"; return 1; }
  rm -rf --one-file-system "$1"
}
cleanup() {
  local rc=$? i
  if [[ -n $DAEMON_PID ]] && kill -0 "$DAEMON_PID" 2>/dev/null; then
    kill -TERM -- "-$DAEMON_PID" 2>/dev/null || true
    sleep 2
  fi
  kill_root_processes
  for ((i = ${#MOUNTS[@]} - 1; i >= 0; i--)); do
    umount "${MOUNTS[i]}" 2>/dev/null || umount --lazy "${MOUNTS[i]}" ||
      say "cannot unmount ${MOUNTS[i]}"
  done
  if [[ -f $MARKER ]]; then
    if ((KEEP)); then
      say "the root is kept in $ROOT (--reuse uses it again)"
    else
      remove_root "$ROOT" && say "deleted the root $ROOT (--keep keeps it)"
    fi
  fi
  exit "$rc"
}
trap cleanup EXIT
trap 'say "FAILED: status $? at line $LINENO: $BASH_COMMAND"' ERR
trap 'exit 130' INT TERM

# ------------------------------------------------------------- the root

# The mirror the host uses for bookworm (deb822 .sources stanzas, then
# one-line .list entries), else Debian's own; the same for its security suite.
host_uri() {  # $1: suite
  local f
  {
    for f in /etc/apt/sources.list.d/*.sources; do
      [[ -f $f ]] || continue
      awk -v s="$1" '
      function done_stanza() { if (uri ~ /^https?:/ && (" " suites " ") ~ (" " s " ")) { print uri; uri = ""; exit 0 } uri = ""; suites = "" }
      FNR == 1 || /^[ \t]*$/ { done_stanza() }
      /^URIs:/ { uri = $2 }
      /^Suites:/ { $1 = ""; suites = $0 }
      END { done_stanza() }' "$f"
    done
    cat /etc/apt/sources.list /etc/apt/sources.list.d/*.list 2>/dev/null |
      awk -v s="$1" '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i < NF && $i !~ /\]$/) i++; i++ }
                                   if ($(i + 1) == s && $i ~ /^https?:/) print $i }' || true
  } | sed -n 1p
}
[[ -n $MIRROR ]] || MIRROR=$(host_uri bookworm)
MIRROR="${MIRROR:-http://deb.debian.org/debian}"
SECURITY=$(host_uri bookworm-security)
SECURITY="${SECURITY:-http://deb.debian.org/debian-security}"

for tool in git chroot mount; do
  command -v "$tool" >/dev/null || die "$tool not found"
done
if ! command -v debootstrap >/dev/null; then
  say "installing debootstrap"
  if ! { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq \
    --no-install-recommends debootstrap debian-archive-keyring; } >>"$LOG" 2>&1; then
    die "cannot install debootstrap (see $LOG)"
  fi
fi
# The chroot shares the host's network: run.sh's daemon needs the port.
if (exec 3<>/dev/tcp/127.0.0.1/50051) 2>/dev/null; then
  die "something on this host listens on 127.0.0.1:50051, which the root's daemon needs"
fi

commit=$(git rev-parse --short HEAD)
[[ -z $(git status --porcelain --untracked-files=no) ]] ||
  say "note: the checkout has uncommitted changes; only commit $commit is checked"
FRESH="a fresh Debian 12"
((REUSE)) && [[ -f $MARKER ]] && FRESH="a reused (not fresh) Debian 12 root"
say "checking commit $commit on $FRESH at $ROOT (log: $LOG)"

debootstrap_s="reused"
if ((REUSE)) && [[ -f $MARKER ]]; then
  [[ -z $(mounted_under "$ROOT") ]] || die "$ROOT has mounts left: $(mounted_under "$ROOT")"
  say "reusing the root in $ROOT: not fresh, it holds what earlier runs installed"
else
  for d in "$ROOT" "$ROOT.partial"; do
    [[ -e $d ]] || continue
    [[ -f $d/.gpuexec-fresh-debian || $d == "$ROOT.partial" ]] ||
      die "$d exists and is not a root this script made; remove it or pick another --root"
    say "deleting the earlier root $d"
    remove_root "$d" || die "cannot delete $d"
  done
  keyring=()
  [[ -f /usr/share/keyrings/debian-archive-keyring.gpg ]] &&
    keyring=(--keyring=/usr/share/keyrings/debian-archive-keyring.gpg)
  say "debootstrap --variant=minbase bookworm from $MIRROR"
  t=$SECONDS
  mkdir -p "$(dirname "$ROOT")"
  debootstrap --variant=minbase "${keyring[@]}" bookworm "$ROOT.partial" "$MIRROR" >>"$LOG" 2>&1 ||
    die "debootstrap failed (see $LOG)"
  # What a fresh installation's apt sees: the release, its updates and
  # security. No policy-rc.d: nothing the setup installs starts a service.
  printf 'deb %s bookworm main\ndeb %s bookworm-updates main\ndeb %s bookworm-security main\n' \
    "$MIRROR" "$MIRROR" "$SECURITY" >"$ROOT.partial/etc/apt/sources.list"
  [[ -s $ROOT.partial/etc/hosts ]] ||
    printf '127.0.0.1\tlocalhost\n::1\t\tlocalhost ip6-localhost ip6-loopback\n' >"$ROOT.partial/etc/hosts"
  date -u +%FT%TZ >"$ROOT.partial/.gpuexec-fresh-debian"
  mv "$ROOT.partial" "$ROOT"
  debootstrap_s=$((SECONDS - t))
  say "debootstrap: $debootstrap_s s"
fi
for banned in /usr/local/cuda /usr/bin/node /usr/bin/nvcc; do
  if ((!REUSE)) && [[ -e $ROOT$banned ]]; then die "the new root already has $banned"; fi
done
# The host's network as a machine beside it sees it: its resolver, and the
# site's own CAs (an HTTPS proxy's, say; npm reaches its registry over
# HTTPS), which the ca-certificates that setup.sh installs then trusts.
cp -L /etc/resolv.conf "$ROOT/etc/resolv.conf"
if [[ -n $(ls -A /usr/local/share/ca-certificates 2>/dev/null) ]]; then
  mkdir -p "$ROOT/usr/local/share/ca-certificates"
  cp -a /usr/local/share/ca-certificates/. "$ROOT/usr/local/share/ca-certificates/"
  if [[ -x $ROOT/usr/sbin/update-ca-certificates ]]; then
    chroot "$ROOT" /usr/sbin/update-ca-certificates >>"$LOG" 2>&1
  fi
fi

# The committed tree, as a clone has it.
rm -rf --one-file-system "${ROOT:?}$TREE"
mkdir -p "$ROOT$TREE"
git archive HEAD | tar -x -C "$ROOT$TREE"

# /proc, /sys, /dev (a private bind, so that what is mounted below it stays
# in the root), /dev/pts and a /dev/shm of the root's own.
mount_in_root() {  # DIR, then mount's arguments before the target
  local dir="$ROOT$1"
  shift
  mkdir -p "$dir"
  mount "$@" "$dir"
  MOUNTS+=("$dir")
}
mount_in_root /proc -t proc proc
mount_in_root /sys -t sysfs sysfs
mount_in_root /dev --bind /dev
mount --make-private "$ROOT/dev"
mount_in_root /dev/pts --bind /dev/pts
mount --make-private "$ROOT/dev/pts"
mount_in_root /dev/shm -t tmpfs -o mode=1777,nosuid,nodev shm

# A command in the root, as root, in a login's bare environment.
passthrough=()
for v in FUZZ_SECONDS SANITIZE; do
  [[ -n ${!v:-} ]] && passthrough+=("$v=${!v}")
done
ENVIRONMENT=(HOME=/root USER=root LOGNAME=root SHELL=/bin/bash TERM=dumb
  PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin "${passthrough[@]}")
in_root() { chroot "$ROOT" /usr/bin/env -i "${ENVIRONMENT[@]}" "$@"; }

# ----------------------------------------------------- 1. ./scripts/run.sh

say "1/2: ./scripts/run.sh (install, build, serve)"
offset=$(($(stat -c %s "$LOG") + 1))
in_log() { grep -q -- "$1" < <(tail -c "+$offset" "$LOG"); }
t=$SECONDS
# In a session of its own (setsid does not fork here: a background job of a
# script leads no process group), so that its pid is run.sh's, then
# gpuexecd's, and its process group is everything it started.
setsid chroot "$ROOT" /usr/bin/env -i "${ENVIRONMENT[@]}" \
  /bin/bash -c "cd $TREE && exec ./scripts/run.sh" >>"$LOG" 2>&1 &
DAEMON_PID=$!
packages_s="" answered=""
deadline=$((SECONDS + 3 * 3600))
while :; do
  if [[ -z $packages_s ]] && in_log '^-- The CXX compiler identification'; then
    packages_s=$((SECONDS - t))
    say "run.sh: packages installed in $packages_s s; building"
  fi
  if in_log 'gpuexecd serving gpuexec.v1 on 127.0.0.1:50051' &&
    answered=$(in_root "$TREE/build/client/cpp/cli/gpuexec" --target=127.0.0.1:50051 --timeout=5s devices 2>&1); then
    break
  fi
  kill -0 "$DAEMON_PID" 2>/dev/null || { wait "$DAEMON_PID" || true; die "run.sh ended before the daemon answered (see $LOG)"; }
  ((SECONDS < deadline)) || die "the daemon did not answer within 3 hours (see $LOG)"
  sleep 5
done
run_s=$((SECONDS - t))
build_s=$((run_s - ${packages_s:-0}))
serving=$(grep -o 'gpuexecd serving gpuexec.v1 on 127.0.0.1:50051.*' < <(tail -c "+$offset" "$LOG") | head -1)
say "run.sh: $serving"
say "run.sh: gpuexec devices: $answered"
cmdline=$(tr '\0' ' ' <"/proc/$DAEMON_PID/cmdline")
[[ $cmdline == ./build/server/gpuexecd* ]] || die "run.sh's process is '$cmdline', not gpuexecd"
kill -TERM "$DAEMON_PID"
for _ in $(seq 100); do kill -0 "$DAEMON_PID" 2>/dev/null || break; sleep 0.1; done
daemon_rc=0
wait "$DAEMON_PID" || daemon_rc=$?
DAEMON_PID=""
((daemon_rc == 0)) || die "gpuexecd exited with status $daemon_rc on SIGTERM (see $LOG)"
in_log 'gpuexecd stopped' || die "gpuexecd did not log that it stopped (see $LOG)"
run_result="served after $run_s s (packages ${packages_s:-?} s, build $build_s s); exit 0 on SIGTERM"
say "run.sh: $run_result"

# ---------------------------------------------------- 2. ./scripts/test.sh

say "2/2: ./scripts/test.sh${passthrough[*]:+ with ${passthrough[*]}}"
offset=$(($(stat -c %s "$LOG") + 1))
t=$SECONDS
test_rc=0
in_root /bin/bash -c "cd $TREE && ./scripts/test.sh" >>"$LOG" 2>&1 || test_rc=$?
test_s=$((SECONDS - t))
test_out=$(tail -c "+$offset" "$LOG")
# ctest's own logs, every test's output (the reasons to skip are there),
# kept before anything else runs ctest in these trees.
rm -f "$LOG.ctest" "$LOG.ctest-asan"
for f in "$BUILD:$LOG.ctest" "$ROOT$TREE/build-asan:$LOG.ctest-asan"; do
  if [[ -f ${f%%:*}/Testing/Temporary/LastTest.log ]]; then
    cp "${f%%:*}/Testing/Temporary/LastTest.log" "${f#*:}"
  fi
done

# Tests that did not run, from each of ctest's "did not run" lists (the main
# run's and the sanitizer run's), and the tests allowed to skip here.
mapfile -t not_run < <(awk '
  /^The following tests did not run:/ { p = 1; next }
  p && /^[ \t]+[0-9]+ - / { sub(/^[ \t]+[0-9]+ - /, ""); print; next }
  { p = 0 }' <<<"$test_out" | sort -u)
mapfile -t failed < <(awk '
  /^The following tests FAILED:/ { p = 1; next }
  p && /^[ \t]+[0-9]+ - / { sub(/^[ \t]+[0-9]+ - /, ""); print; next }
  { p = 0 }' <<<"$test_out" | sort -u)
mapfile -t gpu_tests < <(in_root ctest --test-dir "$TREE/build" -N -L '^gpu$' 2>/dev/null |
  sed -n 's/^ *Test *#[0-9]*: //p')
reason_of() {  # $1: a test; its reason to skip, as its output says it
  local f
  for f in "$LOG.ctest" "$LOG.ctest-asan"; do
    [[ -f $f ]] || continue
    awk -v t="$1" '
      $2 == "Testing:" && $3 == t { p = 1; next }
      p && index($0, "\"" t "\" end time:") == 1 { exit }
      p && prev ~ /: Skipped$/ { print; exit }
      p && match($0, /(GPUEXEC NODE CLIENT SKIPPED|gpuexec-tests-skipped): .*/) { print substr($0, RSTART); exit }
      { prev = $0 }' "$f" | head -1 | grep . && return 0
  done
  echo "(no reason in its output)"
}
bad_skips=()
skip_lines=()
for entry in "${not_run[@]}"; do
  name=${entry% (*}
  why=$(reason_of "$name")
  if printf '%s\n' "${gpu_tests[@]}" | grep -x -- "$name" >/dev/null; then
    skip_lines+=("  $entry [gpu]: $why")
  else
    skip_lines+=("  $entry [needs no GPU: not allowed]: $why")
    bad_skips+=("$name")
  fi
done

# ------------------------------------------------------------------ summary

ctest_lines=$(grep -E '^[0-9]+% tests passed, [0-9]+ tests? failed out of [0-9]+' <<<"$test_out" || true)
counts() {  # ctest's "P% tests passed, M tests failed out of T" as "N passed, M failed out of T"
  sed -E 's/^[0-9]+% tests passed, ([0-9]+) tests? failed out of ([0-9]+).*/\2 \1/' <<<"$1" |
    { read -r total failed; echo "$((total - failed)) tests passed, $failed failed out of $total"; }
}
{
  echo
  echo "==== verify-fresh-debian: commit $commit on $FRESH (minbase)"
  if [[ $debootstrap_s == reused ]]; then
    echo "debootstrap:  none (--reuse: the root was not fresh)"
  else
    echo "debootstrap:  $debootstrap_s s from $MIRROR"
  fi
  echo "run.sh:       $run_result"
  echo "              $serving"
  echo "              gpuexec devices: $answered"
  echo "test.sh:      exit $test_rc after $test_s s${passthrough[*]:+ (${passthrough[*]})}"
  if [[ -n $ctest_lines ]]; then
    echo "ctest:        $(counts "$(head -1 <<<"$ctest_lines")")  [$(head -1 <<<"$ctest_lines")]"
    if (($(wc -l <<<"$ctest_lines") > 1)); then
      echo "sanitizers:   $(counts "$(tail -1 <<<"$ctest_lines")")"
    fi
  else
    echo "ctest:        no summary line (see $LOG)"
  fi
  grep -E '^Total Test time|^fuzz: [0-9]+ executions|^fuzz: built|^sanitize: (built|done)' <<<"$test_out" |
    sed 's/^/              /' || true
  echo "failed:       ${#failed[@]} test(s)"
  ((${#failed[@]} == 0)) || printf '  %s\n' "${failed[@]}"
  echo "did not run:  ${#not_run[@]} test(s)"
  printf '%s\n' "${skip_lines[@]}"
  notes=$(grep -hE 'not installed|not checked' "$LOG.ctest" 2>/dev/null |
    sed -E 's/^SKIPPED \[[0-9]+\] ([^:]*\/)?([^/:]+):[0-9]+: /\2: /' | sort -u || true)
  [[ -z $notes ]] || { echo "checks done in part (a tool missing):"; echo "  ${notes//$'\n'/$'\n'  }"; }
  echo "wall time:    $((SECONDS - start)) s in all; log $LOG, ctest's log $LOG.ctest"
} | tee -a "$LOG"

((test_rc == 0)) || die "./scripts/test.sh exited with status $test_rc (see $LOG)"
[[ -n $ctest_lines ]] || die "ctest printed no summary (see $LOG)"
((${#bad_skips[@]} == 0)) || die "tests that need no GPU did not run: ${bad_skips[*]}"
say "PASSED: both commands work on $FRESH"
