#!/bin/sh
# filecycles.sh [OBJDIR [ROOT]] - no circle of files: file A uses file B when A's object has
# an undefined symbol that B's object defines (nm); the check fails when the uses of the
# library's and the CLI's files (OBJDIR/**/*.o; tests/, bench/ and examples/ are not read)
# go round in a circle, and prints the files of each one (each strongly connected part of
# the graph). An object counts only while its source (ROOT/X.c for OBJDIR/X.o, ROOT/X.cu for
# OBJDIR/X.cu.o) exists, so a moved file's stale object is not read. Exit 1 on a circle, 2
# when OBJDIR holds no object. OBJDIR defaults to ROOT/build/obj, ROOT to the repository.
set -u
root=${2:-$(cd "$(dirname "$0")/.." && pwd)}
obj=${1:-$root/build/obj}
[ -d "$obj" ] || { echo "filecycles: no object folder '$obj'" >&2; exit 2; }
syms=$(mktemp) && list=$(mktemp) && trap 'rm -f "$syms" "$list"' EXIT
# OBJECT SOURCE, for each object of a source
(cd "$obj" && find . -name '*.o' ! -path './tests/*' ! -path './bench/*' ! -path './examples/*') |
    sed 's|^\./||' | sort | while read -r o; do
    base=${o%.o}
    if [ -f "$root/$base.c" ]; then echo "$o $base.c"
    elif [ -f "$root/$base" ]; then echo "$o $base"; fi # X.cu.o of X.cu
done >"$list"
# D SOURCE SYMBOL for what an object defines, U SOURCE SYMBOL for what it uses: one nm for all
if [ -s "$list" ]; then
    (cd "$obj" && nm -A -g $(awk '{print $1}' "$list")) | awk -v list="$list" '
        BEGIN {while ((getline l < list) > 0) {split(l, a, " "); src[a[1]] = a[2]}}
        {i = index($1, ":"); o = substr($1, 1, i - 1); if (!(o in src)) next
         # "OBJ: U SYM" (no address: used), "OBJ:ADDR T SYM" (defined)
         print ($1 ~ /:$/ ? "U" : "D"), src[o], $NF}' >"$syms"
fi
[ -s "$syms" ] || { echo "filecycles: no object of a source of '$root' in '$obj'" >&2; exit 2; }
awk -v syms="$syms" '
# Tarjan: the strongly connected parts of the uses graph; a part of two files or more is a
# circle.
function visit(v,    k, w) {
    idx[v] = low[v] = ++count
    stack[++top] = v; on[v] = 1
    for (k = 1; k <= deg[v]; k++) {
        w = adj[v, k]
        if (!(w in idx)) { visit(w); if (low[w] < low[v]) low[v] = low[w] }
        else if (on[w] && idx[w] < low[v]) low[v] = idx[w]
    }
    if (low[v] == idx[v]) {
        n = 0
        do { w = stack[top--]; on[w] = 0; part[++n] = w } while (w != v)
        if (n > 1) report()
    }
}
function report(    i, j, t, s) {
    for (i = 2; i <= n; i++)
        for (j = i; j > 1 && part[j - 1] > part[j]; j--) {
            t = part[j]; part[j] = part[j - 1]; part[j - 1] = t
        }
    s = part[1]; for (i = 2; i <= n; i++) s = s " " part[i]
    print "filecycles: circle of files: " s; bad = 1
}
BEGIN {
    while ((getline line < syms) > 0) {
        split(line, a, " ")
        files[a[2]] = 1
        if (a[1] == "D") { if (!(a[3] in def)) def[a[3]] = a[2] }
        else { nu++; ufile[nu] = a[2]; usym[nu] = a[3] }
    }
    for (i = 1; i <= nu; i++) {
        if (!(usym[i] in def)) continue
        f = ufile[i]; g = def[usym[i]]
        if (f == g || ((f, g) in edge)) continue
        edge[f, g] = 1; adj[f, ++deg[f]] = g
    }
    for (f in files) if (!(f in idx)) visit(f)
    exit bad
}'
