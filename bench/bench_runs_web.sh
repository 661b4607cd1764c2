#!/bin/sh
# bench_runs_web.sh KILN OUTDIR: kiln runs serve's run page for a run of 1,000,000 steps
# (metrics.db written by tests/e2e/gen-run.sh, not by training: 1M step rows, 2M layer rows,
# 6M tensor rows, about 750 MB; made once and kept in OUTDIR/runs-web) against the same page
# for 1,000 steps, and against sqlite3 reading the same series (the steps table's columns the
# charts draw) from the same file in the same run. The first load reads every row; a reload
# reads only the rows logged since (kiln_run_cache), so a reload is what a person waits for
# at any length. Target (issue 20): a reload under 200 ms, HTML under 1 MB. Figures on stdout.
set -eu
KILN=$1 OUT=$2
here=$(cd "$(dirname "$0")" && pwd)
GEN="$here/../tests/e2e/gen-run.sh"
D="$OUT/runs-web"
mkdir -p "$D"
[ -s "$D/big/run.json" ] || { rm -rf "$D/big"; sh "$GEN" "$D/big" 1000000 0.001; }
[ -s "$D/small/run.json" ] || { rm -rf "$D/small"; sh "$GEN" "$D/small" 1000 0.001; }
T=$(mktemp -d)
$KILN runs serve "$D" >"$T/out" 2>"$T/err" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
. "$here/lib.sh"
i=0
while ! grep -q 'http://' "$T/out" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || { cat "$T/err" >&2; exit 2; }; sleep 0.05
done
URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$T/out")
N=9
page() { # NAME: first load's seconds in $T/NAME.first, N reloads' in $T/NAME.t, bytes in $T/NAME.bytes
    curl -sf -o "$T/$1.html" -w '%{time_total}\n' "$URL/run?r=$1" >"$T/$1.first"
    : >"$T/$1.t"
    for _ in $(seq $N); do curl -sf -o "$T/$1.html" -w '%{time_total}\n' "$URL/run?r=$1" >>"$T/$1.t"; done
    wc -c <"$T/$1.html" >"$T/$1.bytes"
}
page big
page small
: >"$T/sql.t"
for _ in 1 2 3; do
    s=$(date +%s%N)
    sqlite3 "$D/big/metrics.db" "SELECT step, loss, mse, load_balance, z, lr, grad_norm, val_loss, val_r2,
        tokens_per_s, max_abs_output FROM steps" >/dev/null
    e=$(date +%s%N)
    echo "$(( (e - s) / 1000 ))e-6" >>"$T/sql.t"
done
: >"$T/agg.t"
for _ in 1 2 3; do
    s=$(date +%s%N)
    sqlite3 "$D/big/metrics.db" "SELECT count(step), sum(loss), sum(mse), sum(load_balance), sum(z),
        sum(lr), sum(grad_norm), sum(val_loss), sum(val_r2), sum(tokens_per_s), sum(max_abs_output)
        FROM steps" >/dev/null
    e=$(date +%s%N)
    echo "$(( (e - s) / 1000 ))e-6" >>"$T/agg.t"
done
agg=$(median "$T/agg.t" 1000)
big=$(median "$T/big.t" 1000) small=$(median "$T/small.t" 1000) sql=$(median "$T/sql.t" 1000)
first=$(awk '{ printf "%.0f", 1000 * $1 }' "$T/big.first")
bytes=$(cat "$T/big.bytes")
echo "kiln runs serve: the run page (15 charts, 2 heat maps; median of $N reloads after a first load)"
echo "  1,000,000 steps: ${big} ms a reload, HTML $bytes bytes; first load ${first} ms (every row read once)"
echo "  1,000 steps:     ${small} ms a reload, HTML $(cat "$T/small.bytes") bytes"
echo "  baseline: sqlite3 reading the 11 step columns of the 1M-step run: ${sql} ms (median of 3);"
echo "            the same columns summed in SQLite, nothing printed: ${agg} ms"
awk -v b="$big" -v s="$small" -v q="$sql" -v a="$agg" -v n="$bytes" 'BEGIN {
    printf "  reload at 1M / at 1k steps: %.2fx; sqlite3 read / reload at 1M: %.1fx; summed / reload: %.1fx\n", b / s, q / b, a / b
    printf "  target: reload < 200 ms: %s; HTML < 1 MB: %s\n", b < 200 ? "met" : "NOT met", n < 1048576 ? "met" : "NOT met" }'
