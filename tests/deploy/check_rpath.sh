#!/usr/bin/env bash
# The programs as built load nothing from where they are run, and are
# linked hardened:
#   * every RPATH / RUNPATH entry is $ORIGIN-relative or absolute: no empty
#     entry (the loader reads one as the working directory, and DT_RPATH is
#     searched before the system's directories) and no relative one;
#   * all symbols are bound at start (BIND_NOW) behind a read-only GOT
#     (GNU_RELRO), and the stack protector is in.
#
#   check_rpath.sh PROGRAM...
set -euo pipefail
status=0
fail() { echo "FAIL: $*" >&2; status=1; }
for program in "$@"; do
  name=$(basename "$program")
  dynamic=$(readelf -d "$program")
  while read -r path; do
    [[ -z $path ]] && continue
    IFS=':' read -r -a entries <<<"$path:"
    for e in "${entries[@]}"; do
      case $e in
        '') fail "$name: an empty entry in its search path [$path] (the working directory)"; break ;;
        '$ORIGIN'* | /*) ;;
        *) fail "$name: a relative entry '$e' in its search path [$path]"; break ;;
      esac
    done
  done < <(grep -E '\((RPATH|RUNPATH)\)' <<<"$dynamic" | sed -E 's/.*\[(.*)\].*/\1/')
  grep -Eq '\(FLAGS\).*BIND_NOW|\(FLAGS_1\).*NOW' <<<"$dynamic" ||
    fail "$name: not linked with -z now (symbols are bound lazily)"
  segments=$(readelf -lW "$program")
  grep -q GNU_RELRO <<<"$segments" || fail "$name: no RELRO segment"
  symbols=$(readelf -W --dyn-syms "$program")
  grep -q '__stack_chk_fail' <<<"$symbols" ||
    fail "$name: no stack protector (__stack_chk_fail is never called)"
  ((status == 0)) && echo "$name: search path [$(grep -E '\((RPATH|RUNPATH)\)' <<<"$dynamic" |
    sed -E 's/.*\[(.*)\].*/\1/' | paste -sd' ')], BIND_NOW, RELRO, stack protector"
done
exit $status
