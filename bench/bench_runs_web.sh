#!/bin/sh
# bench_runs_web.sh KILN OUTDIR: kiln runs serve's run page for a run of 1,000,000 steps
# (metrics.db written by tests/e2e/gen-run.sh, not by training: 1M step rows, 2M layer rows,
# 6M tensor rows, about 750 MB; made once and kept in OUTDIR/runs-web), its steps table
# summed up by the trainer's code (kiln_run_metrics_summarize, through bench_metrics_log beside
# KILN), against the same page for 1,000 steps, and against sqlite3 reading the same series
# (the steps table's columns the charts draw) from the same file in the same run. The first
# view (a server just started) reads step_sums and the rows after them; a reload reads only
# the rows logged since (kiln_run_cache). Target (issue 20): the page under 200 ms, HTML
# under 1 MB. Figures on stdout.
set -eu
KILN=$1 OUT=$2
here=$(cd "$(dirname "$0")" && pwd)
GEN="$here/../tests/e2e/gen-run.sh"
SUM="$(dirname "$KILN")/bench_metrics_log"
D="$OUT/runs-web"
mkdir -p "$D"
[ -s "$D/big/run.json" ] || { rm -rf "$D/big"; sh "$GEN" "$D/big" 1000000 0.001; }
[ -s "$D/small/run.json" ] || { rm -rf "$D/small"; sh "$GEN" "$D/small" 1000 0.001; }
# A big run made before step_sums: summed up now (once), as a trainer resuming it would.
s=$(date +%s%N)
"$SUM" summarize "$D/big/metrics.db"
"$SUM" summarize "$D/small/metrics.db"
e=$(date +%s%N)
sumtime=$(( (e - s) / 1000000 ))
T=$(mktemp -d)
PID=
trap '[ -z "$PID" ] || kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
. "$here/lib.sh"
start() { # a new server (no cache): PID, URL
    [ -z "$PID" ] || { kill $PID; wait $PID 2>/dev/null || true; }
    $KILN runs serve "$D" >"$T/out" 2>"$T/err" &
    PID=$!
    wait_url
}
get() { curl -sf -o "$T/$2.html" -w '%{time_total}\n' "$URL$1"; }
N=9
# First views: each from a server just started; the sweep page first, as a person comes.
: >"$T/big.first"; : >"$T/sweep.first"
for _ in 1 2 3 4 5; do
    start
    get / sweep >>"$T/sweep.first"
    get "/run?r=big" big >>"$T/big.first"
done
page() { # NAME: N reloads' seconds in $T/NAME.t, bytes in $T/NAME.bytes
    get "/run?r=$1" "$1" >/dev/null
    : >"$T/$1.t"
    for _ in $(seq $N); do get "/run?r=$1" "$1" >>"$T/$1.t"; done
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
agg=$(median "$T/agg.t" 1000) sql=$(median "$T/sql.t" 1000)
big=$(median "$T/big.t" 1000) small=$(median "$T/small.t" 1000)
first=$(median "$T/big.first" 1000) sweep=$(median "$T/sweep.first" 1000)
bytes=$(cat "$T/big.bytes")
echo "kiln runs serve: the run page (15 charts, 2 heat maps)"
echo "  1,000,000 steps: first view ${first} ms (median of 5, each a server just started), a reload ${big} ms (median of $N); HTML $bytes bytes"
echo "  1,000 steps:     ${small} ms a reload, HTML $(cat "$T/small.bytes") bytes"
echo "  the sweep page (both runs), first view: ${sweep} ms (median of 5)"
echo "  step_sums of both runs summed up afterwards (bench_metrics_log summarize): ${sumtime} ms"
echo "  baseline: sqlite3 reading the 11 step columns of the 1M-step run: ${sql} ms (median of 3);"
echo "            the same columns summed in SQLite, nothing printed: ${agg} ms"
awk -v f="$first" -v b="$big" -v s="$small" -v q="$sql" -v a="$agg" -v n="$bytes" 'BEGIN {
    printf "  first view / reload at 1M: %.2fx; reload at 1M / at 1k steps: %.2fx\n", f / b, b / s
    printf "  sqlite3 read / first view at 1M: %.1fx; summed / first view: %.1fx\n", q / f, a / f
    printf "  target: first view < 200 ms: %s; reload < 200 ms: %s; HTML < 1 MB: %s\n", f < 200 ? "met" : "NOT met", b < 200 ? "met" : "NOT met", n < 1048576 ? "met" : "NOT met" }'
