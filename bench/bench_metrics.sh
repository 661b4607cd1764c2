#!/bin/sh
# bench_metrics.sh KILN [CHANNELS] - what GET /metrics costs on a store of CHANNELS channels
# (default 1000: 100 models of 10 channels, 3 records each, so the current record is the
# newest of several), against GET /healthz (the server's cheapest answer) in the same run.
# Rows are inserted with sqlite3 (the records' bytes are not signed: /metrics reads only the
# columns). Medians of KILN_BENCH_REPS requests (default 200), each a new connection (curl).
# Loopback only; the server and the temporary directory are removed on exit.
set -eu
KILN=$(realpath "${1:?usage: bench_metrics.sh KILN [CHANNELS]}")
CHANNELS=${2:-1000}
REPS=${KILN_BENCH_REPS:-200}
for t in sqlite3 curl; do
    command -v $t >/dev/null || { echo "bench_metrics: '$t' is missing" >&2; exit 2; }
done
T=$(mktemp -d /tmp/kiln-bench-metrics.XXXXXX)
PID=
trap '[ -z "$PID" ] || kill -TERM $PID 2>/dev/null; rm -rf "$T"' EXIT
$KILN registry token create --root "$T/reg" --name ops --scope read >/dev/null
now=$(date +%s)
{
    echo "BEGIN;"
    i=0
    while [ $i -lt "$CHANNELS" ]; do
        m=$((i / 10)) c=$((i % 10))
        for s in 1 2 3; do
            echo "INSERT INTO channel_records VALUES('model-$m','ch-$c',$s,'1.$s.0','sha256:00',$((now + i * 60 + s)),'promote','{}','rm',$now);"
        done
        i=$((i + 1))
    done
    echo "COMMIT;"
} | sqlite3 "$T/reg/registry.db"
. "$(dirname "$0")/lib.sh"
serve_store "$T/reg"
# median_ms PATH: the median time of REPS GETs of PATH, in milliseconds; the body's size.
median_ms() {
    n=0
    : >"$T/times"
    while [ $n -lt "$REPS" ]; do
        curl -s -o "$T/body" -w '%{time_total}\n' "$URL$1" >>"$T/times"
        n=$((n + 1))
    done
    printf '%s %s' "$(median "$T/times" 1000)" \
        "$(wc -c <"$T/body")"
}
set -- $(median_ms /metrics)
mm=$1 mb=$2
set -- $(median_ms /healthz)
hm=$1
curl -s -o "$T/body.metrics" "$URL/metrics"
gauges=$(grep -c '^kiln_registry_channel_expiry_timestamp_seconds{' "$T/body.metrics" || true)
echo "store: $CHANNELS channels, $((CHANNELS * 3)) channel records; medians of $REPS GETs (curl, new connection each)"
printf '%-10s %8s ms %8s bytes (%s expiry gauges)\n' /metrics "$mm" "$mb" "$gauges"
printf '%-10s %8s ms (baseline)\n' /healthz "$hm"
