#!/bin/sh
# bench_audit.sh KILN [ENTRIES] - what kiln registry audit costs on a store whose audit log
# holds ENTRIES rows (default 1000000: a busy registry's years), against sqlite3 answering the
# same question from the same database file in the same run (the baseline: no HTTP, no JSON).
# Three questions: the last hour (--since 1h: a few rows at the end), one action
# (--action token.revoke: a few rows spread out) and the whole log as JSON Lines. Medians of
# KILN_BENCH_REPS runs (default 3). Loopback only; everything is removed on exit.
set -eu
KILN=$(realpath "${1:?usage: bench_audit.sh KILN [ENTRIES]}")
N=${2:-1000000}
REPS=${KILN_BENCH_REPS:-3}
command -v sqlite3 >/dev/null || { echo "bench_audit: 'sqlite3' is missing" >&2; exit 2; }
T=$(mktemp -d /tmp/kiln-bench-audit.XXXXXX)
PID=
trap '[ -z "$PID" ] || kill -TERM $PID 2>/dev/null; rm -rf "$T"' EXIT
ADM=$($KILN registry token create --root "$T/reg" --name ops --scope admin)
# Old rows a year back, every 64th a revocation; then the admin token's row (now) is the hour.
old=$(($(date +%s) - 365 * 86400))
sqlite3 "$T/reg/registry.db" "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < $N)
    INSERT INTO audit(time, token, action, model, version, digest, reason)
    SELECT $old + i / 100, 'ci', CASE WHEN i % 64 = 0 THEN 'token.revoke' ELSE 'publish' END,
           'alpha', '1.' || i, 'sha256:' || printf('%064d', i), NULL FROM n;"
$KILN registry token create --root "$T/reg" --name late --scope read >/dev/null
. "$(dirname "$0")/lib.sh"
serve_store "$T/reg"
# median_s CMD...: the median wall time of REPS runs of CMD (stdout to a file), in seconds.
median_s() {
    n=0
    : >"$T/times"
    while [ $n -lt "$REPS" ]; do
        a=$(date +%s.%N)
        "$@" >"$T/stdout" 2>/dev/null
        b=$(date +%s.%N)
        awk -v a="$a" -v b="$b" 'BEGIN { printf "%.6f\n", b - a }' >>"$T/times"
        n=$((n + 1))
    done
    median "$T/times" 1
}
A="--registry $URL --token $ADM"
hour=$(($(date +%s) - 3600))
DB=$T/reg/registry.db
Q="SELECT id, time, token, action, model, version, channel, digest, reason FROM audit"
k1=$(median_s $KILN registry audit $A --since 1h); r1=$(wc -l <"$T/stdout")
s1=$(median_s sqlite3 "$DB" "$Q WHERE time >= $hour ORDER BY id")
k2=$(median_s $KILN registry audit $A --action token.revoke); r2=$(($(wc -l <"$T/stdout") - 1))
s2=$(median_s sqlite3 "$DB" "$Q WHERE action = 'token.revoke' ORDER BY id")
k3=$(median_s $KILN registry audit $A --json); r3=$(wc -l <"$T/stdout")
s3=$(median_s sqlite3 -json "$DB" "$Q ORDER BY id")
echo "store: $N audit entries (and the tokens'); medians of $REPS runs; baseline: sqlite3 on the same file"
printf '%-34s %9s %10s s %10s s %8s\n' question rows "kiln" "sqlite3" ratio
row() { printf '%-34s %9s %10s s %10s s %8.1f\n' "$1" "$2" "$3" "$4" "$(awk -v k="$3" -v s="$4" 'BEGIN { print k / s }')"; }
row "--since 1h" "$r1" "$k1" "$s1"
row "--action token.revoke" "$r2" "$k2" "$s2"
row "--json (the whole log)" "$r3" "$k3" "$s3"
