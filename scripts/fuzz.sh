#!/usr/bin/env bash
# Builds the libFuzzer harnesses (tests/fuzz) into ./build-fuzz with clang,
# AddressSanitizer and UBSan, and runs each for SECONDS_PER_TARGET seconds
# (default 60), one after another. Prints executions and crashes per target;
# exits non-zero when a harness crashed, leaked, hung or ran out of memory
# (the input that did it is named, under build-fuzz/fuzz-artifacts).
#
#   scripts/fuzz.sh [SECONDS_PER_TARGET] [TARGET...]
#
# Idempotent: a configured tree is reused, and what each harness found is
# kept in build-fuzz/fuzz-corpus/<target> for the next run (the committed
# seeds are tests/fuzz/corpus/<target>, which is never written to).
# Needs clang, libfuzzer-14-dev and libclang-rt-14-dev (scripts/setup.sh).
set -euo pipefail
cd "$(dirname "$0")/.."

SECONDS_PER_TARGET="${1:-60}"
shift || true
TARGETS=("$@")
if ((${#TARGETS[@]} == 0)); then
  TARGETS=(wire_fuzz args_fuzz image_check_fuzz compile_request_fuzz metrics_http_fuzz worker_frames_fuzz worker_ring_fuzz
    command_ring_view_fuzz command_ring_record_fuzz tenants_fuzz)
fi
BUILD_DIR="${FUZZ_BUILD_DIR:-build-fuzz}"

if ! command -v clang++ >/dev/null; then
  echo "fuzz: clang++ not found; scripts/setup.sh installs it" >&2
  exit 1
fi
CUDA_ROOT="${CUDA_ROOT:-${CUDAToolkit_ROOT:-/usr/local/cuda}}"
start=$(date +%s)
# Configuring again is cheap and takes in a changed tests/fuzz/config.cmake.
mkdir -p "$BUILD_DIR"
cmake -S . -B "$BUILD_DIR" -G Ninja -C tests/fuzz/config.cmake \
  -DCUDAToolkit_ROOT="$CUDA_ROOT" >"$BUILD_DIR/fuzz-configure.log" 2>&1 ||
  { cat "$BUILD_DIR/fuzz-configure.log" >&2; exit 1; }
# The same clang tree checks the thread-safety annotations of every library
# (-Wthread-safety as errors, tests/fuzz/config.cmake): the harnesses link
# only some, so the others are built here too.
cmake --build "$BUILD_DIR" -j"$(nproc)" --target gpuexec_fuzzers gpuexec_core gpuexec_device \
  gpuexec_worker gpuexec_worker_proxy gpuexec_rpc gpuexec_tenants gpuexec_metrics gpuexec_client
echo "fuzz: built in $(($(date +%s) - start)) s"

# Per-target options: the metrics endpoint's limit is 8 KiB (and it reads
# 2 KiB at a time), so its inputs may be longer than libFuzzer's default.
options_for() {
  case "$1" in
    metrics_http_fuzz) echo "-max_len=12288" ;;
    *) echo "" ;;
  esac
}

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_stack_use_after_return=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"

failed=()
total_execs=0
printf '%-20s %8s %12s %10s %8s  %s\n' target seconds executions exec/s corpus result
for t in "${TARGETS[@]}"; do
  bin="$BUILD_DIR/tests/fuzz/$t"
  work="$BUILD_DIR/fuzz-corpus/$t"
  artifacts="$BUILD_DIR/fuzz-artifacts/$t"
  log="$BUILD_DIR/fuzz-logs/$t.log"
  mkdir -p "$work" "$artifacts" "$(dirname "$log")"
  rc=0
  # shellcheck disable=SC2046  # the options are words
  "$bin" -max_total_time="$SECONDS_PER_TARGET" -timeout=20 -rss_limit_mb=4096 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" $(options_for "$t") \
    "$work" "tests/fuzz/corpus/$t" >"$log" 2>&1 || rc=$?
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  corpus=$(find "$work" -type f | wc -l)
  result="0 crashes"
  if ((rc != 0)); then
    found=$(grep -o "Test unit written to .*" "$log" | tail -1 | sed 's/Test unit written to //')
    result="CRASH (exit $rc): ${found:-see $log}"
    failed+=("$t")
  fi
  total_execs=$((total_execs + ${execs:-0}))
  printf '%-20s %8s %12s %10s %8s  %s\n' "$t" "$SECONDS_PER_TARGET" "${execs:-?}" "${rate:-?}" \
    "$corpus" "$result"
done
echo "fuzz: $total_execs executions in all, ${#failed[@]} targets crashed"

if ((${#failed[@]})); then
  for t in "${failed[@]}"; do
    echo "---- $t: the end of $BUILD_DIR/fuzz-logs/$t.log" >&2
    tail -n 60 "$BUILD_DIR/fuzz-logs/$t.log" >&2
  done
  echo "fuzz: reproduce with $BUILD_DIR/tests/fuzz/<target> <input>" >&2
  exit 1
fi
