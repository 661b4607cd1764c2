#!/bin/sh
# libkiln.so exports exactly the functions include/kiln.h declares: no internal symbol is
# reachable through the shared library (the Python package binds it with ctypes), and none
# the header promises is missing.
. "$(dirname "$0")/lib.sh"
lib=$(dirname "$KILN")/libkiln.so
hdr=$(cd "$(dirname "$0")/../.." && pwd)/include/kiln.h
[ -f "$lib" ] || fail "no $lib"
grep -o 'KILN_API[^(]*(' "$hdr" | grep -v __attribute__ | sed 's/ *($//; s/.*[ *]//' | sort -u >"$T/declared"
[ -s "$T/declared" ] || fail "no KILN_API declarations found in $hdr"
# A declaration whose name is not on its KILN_API line would slip past the version script.
n=$(grep -v '^#' "$hdr" | grep -c 'KILN_API')
[ "$n" -eq "$(wc -l <"$T/declared")" ] || fail "$hdr: $n KILN_API lines, $(wc -l <"$T/declared") names read"
nm -D --defined-only "$lib" | awk '$2 ~ /^[TtWwDdBbRrVvi]$/ {print $3}' | sed 's/@.*//' | sort -u >"$T/exported"
extra=$(comm -23 "$T/exported" "$T/declared")
missing=$(comm -13 "$T/exported" "$T/declared")
[ -z "$extra" ] || fail "libkiln.so exports what kiln.h does not declare: $(echo $extra | head -c 400)"
[ -z "$missing" ] || fail "kiln.h declares what libkiln.so does not export: $missing"
echo "libkiln.so exports the $(wc -l <"$T/declared") functions kiln.h declares, nothing else"
