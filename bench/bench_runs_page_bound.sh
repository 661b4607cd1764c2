#!/bin/sh
# bench_runs_page_bound.sh (KILN=build/kiln, from the repository root): VmHWM of kiln runs serve before and after one request of a run with two 2 MiB messages and a 1 MiB config value
set -eu
T=$(mktemp -d); trap 'kill $P 2>/dev/null; rm -rf $T' EXIT
sh tests/e2e/gen-run.sh $T/s/big 200 0.001
sqlite3 $T/s/big/metrics.db "INSERT INTO events(step, time, kind, message) VALUES (90, 1.7e9, 'spike', hex(zeroblob(1048576))), (95, 1.7e9, 'note', hex(zeroblob(1048576)));"
{ printf '%s' "$(sed 's/"seed": 1}}$/"seed": 1, "note": "/' $T/s/big/run.json)"; head -c 1048576 /dev/zero | tr '\0' y; printf '"}}\n'; } >$T/b.json; mv $T/b.json $T/s/big/run.json
$KILN runs serve $T/s > $T/out 2>&1 & P=$!
sleep 1; URL=$(sed -n 's/.* on \(http:[^ ]*\)/\1/p' $T/out)
a=$(awk '/VmHWM/ {print $2}' /proc/$P/status)
s=$(curl -s -o /dev/null -w '%{size_download} %{time_total}' "${URL}run?r=big")
b=$(awk '/VmHWM/ {print $2}' /proc/$P/status)
echo "page bytes, seconds: $s; VmHWM before $a kB, after $b kB"
