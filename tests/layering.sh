#!/bin/sh
# layering.sh [ROOT] - the layering check: every `#include "X.h"` in a module's sources must
# name a header of that module or of a module its row of docs/architecture.md's table
# ("## Layering check") allows. Prints each offending file and include; exit 1 if any, 2 if
# the table cannot be read. Headers that no module owns (generated ones) are not checked.
set -u
root=${1:-$(cd "$(dirname "$0")/.." && pwd)}
cd "$root" || exit 2
doc=docs/architecture.md
rows=$(awk '/^## Layering check/ {on = 1; next} on && /^## / {exit}
            on && /^\| `[a-z]+` \|/ {gsub(/`/, ""); print}' "$doc")
[ -n "$rows" ] || { echo "layering: $doc has no '## Layering check' table" >&2; exit 2; }
# header -> module, for every module of the table
map=$(mktemp) && trap 'rm -f "$map"' EXIT
echo "$rows" | awk -F'|' '{gsub(/ /, "", $2); print $2}' | while read -r mod; do
    [ -d "$mod" ] || { echo "layering: $doc names module '$mod', which is no folder" >&2; exit 2; }
    find "$mod" -name '*.h' | while read -r h; do echo "$(basename "$h") $mod"; done
done >"$map" || exit 2
bad=0
for mod in $(echo "$rows" | awk -F'|' '{gsub(/ /, "", $2); print $2}'); do
    allowed=" $mod $(echo "$rows" | awk -F'|' -v m="$mod" '{g = $2; gsub(/ /, "", g)} g == m {gsub(/,/, " ", $3); print $3}') "
    for f in $(find "$mod" -name '*.c' -o -name '*.h' -o -name '*.cu' -o -name '*.cuh'); do
        for inc in $(sed -n 's/^[[:space:]]*#[[:space:]]*include[[:space:]]*"\([^"]*\)".*/\1/p' "$f"); do
            owner=$(awk -v h="$(basename "$inc")" '$1 == h {print $2; exit}' "$map")
            [ -n "$owner" ] || continue
            case "$allowed" in *" $owner "*) ;; *)
                echo "layering: $f includes \"$inc\" ($owner/), which $mod/ may not use ($doc)"
                bad=1 ;;
            esac
        done
    done
done
exit $bad
