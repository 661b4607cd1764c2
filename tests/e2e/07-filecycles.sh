#!/bin/sh
# No circle of files (tests/filecycles.sh): the check passes on the objects of this build, and
# on a tree of tiny objects it fails naming the files of a circle (and only those), reads no
# object whose source is gone, and refuses a folder without objects.
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
obj=$(dirname "$KILN")/obj
[ -d "$obj" ] || fail "no object folder $obj"
sh "$root/tests/filecycles.sh" "$obj" "$root" >"$T/out" 2>&1 ||
    { cat "$T/out"; fail "file circles in the tree"; }
# m/a.c uses m/b.c and m/b.c uses m/a.c: a circle; m/c.c uses m/a.c, outside it.
mkdir -p "$T/src/m" "$T/obj/m"
printf 'int kb(int);\nint ka(int x) { return x ? kb(x - 1) : 0; }\n' >"$T/src/m/a.c"
printf 'int ka(int);\nint kb(int x) { return x ? ka(x - 1) : 1; }\n' >"$T/src/m/b.c"
printf 'int ka(int);\nint kc(int x) { return ka(x); }\n' >"$T/src/m/c.c"
for f in a b c; do cc -c -o "$T/obj/m/$f.o" "$T/src/m/$f.c" || fail "cannot compile $f.c"; done
set +e; sh "$root/tests/filecycles.sh" "$T/obj" "$T/src" >"$T/out" 2>&1; got=$?; set -e
[ "$got" -eq 1 ] || { cat "$T/out"; fail "a circle of two files: exit $got, expected 1"; }
grep -qx 'filecycles: circle of files: m/a.c m/b.c' "$T/out" ||
    { cat "$T/out"; fail "no line naming m/a.c and m/b.c"; }
! grep -q 'c\.c' "$T/out" || { cat "$T/out"; fail "m/c.c named, which is in no circle"; }
# An object whose source is gone (a moved file's) is not read: no circle.
rm "$T/src/m/b.c"
sh "$root/tests/filecycles.sh" "$T/obj" "$T/src" >"$T/out" 2>&1 ||
    { cat "$T/out"; fail "a stale object was read"; }
# No object at all is an error, not a pass.
mkdir "$T/empty"
set +e; sh "$root/tests/filecycles.sh" "$T/empty" "$T/src" >"$T/out" 2>&1; got=$?; set -e
[ "$got" -eq 2 ] || fail "a folder without objects: exit $got, expected 2"
echo "file circles: none in the tree; a circle is found and named"
