#!/usr/bin/env bash
# Checks that the C++ and CUDA sources are formatted as .clang-format says
# (clang-format 14, as Debian 12 ships it). Prints each file that is not,
# with what clang-format would change, and exits 1. With --fix, formats them.
#
#   scripts/check_format.sh [--fix]
set -euo pipefail
cd "$(dirname "$0")/.."
CLANG_FORMAT="${CLANG_FORMAT:-clang-format-14}"
if ! command -v "$CLANG_FORMAT" >/dev/null; then
  echo "check_format: $CLANG_FORMAT not found; scripts/setup.sh installs it" >&2
  exit 1
fi
mapfile -t files < <(git ls-files '*.cc' '*.h' '*.cu')
if [[ ${1:-} == --fix ]]; then
  "$CLANG_FORMAT" -i "${files[@]}"
  exit 0
fi
bad=0
for f in "${files[@]}"; do
  if ! diff -u --label "$f" --label "$f (formatted)" "$f" <("$CLANG_FORMAT" "$f") >/tmp/gpuexec-format.$$ 2>&1; then
    echo "check_format: $f is not formatted (scripts/check_format.sh --fix):"
    head -40 /tmp/gpuexec-format.$$
    bad=$((bad + 1))
  fi
done
rm -f /tmp/gpuexec-format.$$
if ((bad)); then
  echo "check_format: $bad of ${#files[@]} files need formatting"
  exit 1
fi
echo "check_format: ${#files[@]} files formatted"
