#!/usr/bin/env bash
# Installs what is needed, builds, and runs every test. Tests labelled `gpu`
# run against the real driver and report SKIPPED where there is no GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
./scripts/setup.sh
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j"$(nproc)" "$@"
# The fuzz harnesses (tests/fuzz), each for FUZZ_SECONDS (20 by default;
# 0 skips them), in a clang tree of their own (build-fuzz).
if [[ "${FUZZ_SECONDS:-20}" != 0 ]]; then
  ./scripts/fuzz.sh "${FUZZ_SECONDS:-20}"
fi
# The daemon, the double and the service and fault suites again, built with
# AddressSanitizer and UBSan (build-asan); SANITIZE=0 skips them.
if [[ "${SANITIZE:-1}" != 0 ]]; then
  ./scripts/sanitize.sh
fi
