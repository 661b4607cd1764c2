#!/bin/sh
# layering.sh [ROOT] - the layering check: every `#include "X.h"` in a module's sources must
# name a header of that module or of a module its row of docs/architecture.md's table
# ("## Layering check") allows. A module is a folder (`registry/client` too): a file, source
# or header, belongs to the longest module folder that holds it. Prints each offending file
# and include; exit 1 if any, 2 if the table cannot be read. Headers that no module owns
# (generated ones) are not checked.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
doc=docs/architecture.md
rows=$(awk '/^## Layering check/ {on = 1; next} on && /^## / {exit}
            on && /^\| `[a-z][a-z\/]*` \|/ {gsub(/`/, ""); print}' "$doc")
[ -n "$rows" ] || { echo "layering: $doc has no '## Layering check' table" >&2; exit 2; }
mods=$(echo "$rows" | awk -F'|' '{gsub(/ /, "", $2); print $2}')
for mod in $mods; do
    [ -d "$mod" ] || { echo "layering: $doc names module '$mod', which is no folder" >&2; exit 2; }
done
# file -> module, for every file of every module of the table: the longest module folder
# that holds it
owners=$(mktemp) && map=$(mktemp) && trap 'rm -f "$owners" "$map"' EXIT
for mod in $mods; do
    find "$mod" -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh' |
        while read -r f; do echo "$f $mod"; done
done | awk '{if (!($1 in own) || length($2) > length(own[$1])) own[$1] = $2}
            END {for (f in own) print f, own[f]}' | sort >"$owners"
# header -> module
awk '$1 ~ /\.(h|cuh)$/ {n = split($1, p, "/"); print p[n], $2}' "$owners" >"$map"
bad=0
while read -r f mod; do
    allowed=" $mod $(echo "$rows" | awk -F'|' -v m="$mod" '{g = $2; gsub(/ /, "", g)} g == m {gsub(/,/, " ", $3); print $3}') "
    for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
        owner=$(awk -v h="$(basename "$inc")" '$1 == h {print $2; exit}' "$map")
        [ -n "$owner" ] || continue
        case "$allowed" in *" $owner "*) ;; *)
            echo "layering: $f includes \"$inc\" ($owner/), which $mod/ may not use ($doc)"
            bad=1 ;;
        esac
    done
done <"$owners"
exit $bad
