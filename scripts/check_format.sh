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
# One clang-format process for every file (a process per file took over two
# minutes on a loaded 2-core host); then what it would change, file by file.
log=$(mktemp)
trap 'rm -f "$log"' EXIT
if "$CLANG_FORMAT" --dry-run --Werror "${files[@]}" 2>"$log"; then
  echo "check_format: ${#files[@]} files formatted"
  exit 0
fi
mapfile -t bad < <(grep -oE '^[^: ]+\.(cc|h|cu):[0-9]+:[0-9]+: error' "$log" | cut -d: -f1 | sort -u)
if ((${#bad[@]} == 0)); then
  cat "$log"
  exit 1
fi
for f in "${bad[@]}"; do
  echo "check_format: $f is not formatted (scripts/check_format.sh --fix):"
  diff -u --label "$f" --label "$f (formatted)" "$f" <("$CLANG_FORMAT" "$f") | head -40
done
echo "check_format: ${#bad[@]} of ${#files[@]} files need formatting"
exit 1
