#!/bin/sh
# The layering check passes on the tree, and fails, naming the file, on a copy of it where
# core/ includes a registry header, the export module includes the runtime's, one side of the
# registry includes the other's internal header (the client the server's, and back), registry/
# includes validate's or train's (kiln release, which uses them, is a layer above: release/),
# or data/ includes train's (datasets sit below the trainer); and every module of the table is
# on the picture of the floors.
. "$(dirname "$0")/lib.sh"
root=$(cd "$(dirname "$0")/../.." && pwd)
sh "$root/tests/layering.sh" "$root" >"$T/out" 2>&1 || { cat "$T/out"; fail "layering check on the tree"; }
mkdir "$T/tree"
mods=$(awk '/^## Layering check/ {on = 1; next} on && /^## / {exit}
            on && /^\| `[a-z][a-z\/]*` \|/ {gsub(/`/, ""); print $2}' "$root/docs/architecture.md")
# The picture of the floors ("## The house in one picture") shows every module of the table.
pic=$(awk '/^## The house in one picture/ {on = 1; next} on && /^## / {exit}
           on && /^```/ {inside = !inside; next} on && inside' "$root/docs/architecture.md")
[ -n "$pic" ] || fail "docs/architecture.md has no picture of the layers"
for m in $mods; do
    echo "$pic" | grep -q "[[:space:]]$m/" || fail "docs/architecture.md: the picture of the layers lacks $m/"
done
(cd "$root" && tar cf - docs/architecture.md tests/layering.sh \
    $(find $mods -name '*.[ch]' -o -name '*.cu' -o -name '*.cuh')) | tar xf - -C "$T/tree"
# registry/'s first source file, wherever in registry/ it is
reg=$(cd "$root" && find registry -name '*.c' | sort | head -n 1)
for bad in 'core/err.c:registry.h' 'export/pack.c:runtime.h' 'registry/client/models.c:server_int.h' \
           'registry/server/ui.c:client_int.h' "$reg:validate.h" "$reg:train.h" 'data/dataset.c:train.h'; do
    f=${bad%%:*} h=${bad#*:}
    cp -r "$T/tree" "$T/t2"
    printf '#include "%s"\n' "$h" >>"$T/t2/$f"
    set +e; sh "$T/t2/tests/layering.sh" "$T/t2" >"$T/out" 2>&1; got=$?; set -e
    [ "$got" -eq 1 ] || fail "layering check with $f including $h exited $got, expected 1"
    grep -q "$f includes \"$h\"" "$T/out" || { cat "$T/out"; fail "no line naming $f and $h"; }
    rm -rf "$T/t2"
done
# A table that names a folder that is not there is refused, not passed.
sed 's/^| `web` |/| `webx` |/' "$T/tree/docs/architecture.md" >"$T/a.md" && mv "$T/a.md" "$T/tree/docs/architecture.md"
set +e; sh "$T/tree/tests/layering.sh" "$T/tree" >"$T/out" 2>&1; got=$?; set -e
[ "$got" -eq 2 ] && grep -q "webx" "$T/out" || fail "a table naming no folder: exit $got, $(cat "$T/out")"

# One name, one file (issue 33): no two source files of the product share a base name (the
# fuzz targets are named after what they fuzz), and no two end-to-end scripts share a number.
same_names() { # the base names that appear twice among the paths on stdin
    sed 's|.*/||' | sort | uniq -d
}
srcs() { (cd "$root" && { git ls-files '*.c' '*.h' '*.cu' 2>/dev/null ||
    find . -path ./build -prune -o \( -name '*.[ch]' -o -name '*.cu' \) -print | sed 's|^\./||'; }); }
dup=$(srcs | grep -v '^tests/' | same_names)
[ -z "$dup" ] || fail "source files share a name: $(for n in $dup; do (cd "$root" && git ls-files "*/$n" "$n" | tr '\n' ' '); done)"
printf 'core/x.c\nweb/x.c\nweb/y.c\n' | same_names | grep -qx x.c || fail "the name check misses a shared name"
nums=$(cd "$root/tests/e2e" && ls [0-9]*.sh | sed 's/-.*//' | sort | uniq -d)
[ -z "$nums" ] || fail "end-to-end scripts share a number: $nums"
echo "layering check: passes on the tree, fails on forbidden includes; names and numbers unique"
