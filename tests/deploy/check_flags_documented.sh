#!/usr/bin/env bash
# Every flag `gpuexecd --help` lists is documented in the README's
# configuration table, and the README documents no flag the daemon lacks.
#
#   check_flags_documented.sh README GPUEXECD
set -euo pipefail
readme=$1 daemon=$2
flags=$("$(dirname "$0")/gpuexecd_flags.sh" "$daemon")
table=$(sed -n '/^## Configuration/,/^## /p' "$readme" | grep -oE '`--[a-z_]+`' | tr -d '`' | sort -u)
status=0
for f in $flags; do
  grep -qx -- "$f" <<<"$table" || { echo "FAIL: $f is not in the README's configuration table" >&2; status=1; }
done
for f in $table; do
  grep -qx -- "$f" <<<"$flags" || { echo "FAIL: the README documents $f, which gpuexecd lacks" >&2; status=1; }
done
((status == 0)) && echo "all $(wc -w <<<"$flags") flags of gpuexecd are documented in the README"
exit $status
