#!/usr/bin/env bash
# Prints the flags `gpuexecd --help` lists, one per line ("--listen"), sorted;
# fails when it lists none. The deployment checks compare against this.
#
#   gpuexecd_flags.sh GPUEXECD
set -euo pipefail
# --help exits non-zero (absl's convention); its text is what counts.
flags=$( ("$1" --help 2>&1 || true) | grep -oE '^ +--[a-z_]+' | tr -d ' ' | sort -u)
[[ -n $flags ]] || { echo "FAIL: $1 --help lists no flags" >&2; exit 1; }
echo "$flags"
