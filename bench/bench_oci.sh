#!/bin/bash
# bench_oci.sh [BUILD_DIR] - the OCI rows of bench/bench_registry.sh on their own, for a
# machine without its nginx baseline: kiln pull from Debian's docker-registry (oci+http://) vs
# curl of the same blob from it vs kiln pull from kiln registry serve, medians of REPS runs
# (default 5) of a kiln pack of MB MiB (default 256) of random f32 weights. Loopback only;
# every server started here is stopped and the temporary directory removed on exit.
set -euo pipefail
KILN=$(realpath "${1:-build}/kiln") MB=${MB:-256} REPS=${REPS:-5}
T=$(mktemp -d /tmp/oci-bench.XXXXXX)
PIDS=
trap 'for p in $PIDS; do kill $p 2>/dev/null; done; rm -rf "$T"' EXIT
cd "$T"
mkdir m; head -c $((MB * 1048576)) /dev/urandom > raw
python3 - <<PY
import json, struct
n = ($MB * 1048576) // 4
hdr = json.dumps({"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, n * 4]}}).encode()
hdr += b" " * ((8 - len(hdr) % 8) % 8)
with open("m/model.safetensors", "wb") as f, open("raw", "rb") as r:
    f.write(struct.pack("<Q", len(hdr))); f.write(hdr); f.write(r.read(n * 4))
PY
rm raw
printf '%s' '{"name":"bench","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}' >m/card.json
$KILN pack m --name bench --version 1.0.0 --out a.kiln >/dev/null
for k in rel prom; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[{"name":"rel","pubkey":"$(sed -n 2p rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(sed -n 2p prom.pub)","roles":["promote"]}],"channels":{"production":{"threshold":1}},"accept_unvalidated":true}
JSON
$KILN sign a.kiln --key rel.key --allow-unvalidated >/dev/null
D=$(sha256sum a.kiln | cut -d' ' -f1)
PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
$KILN registry serve --root reg --listen 127.0.0.1:0 --trust trust.json >serve.out 2>serve.err & PIDS="$PIDS $!"
for i in $(seq 100); do grep -q http serve.out && break; sleep 0.05; done
URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' serve.out)
$KILN publish a.kiln --registry $URL --token $PUB >/dev/null
$KILN promote bench 1.0.0 --channel production --key prom.key --registry $URL --token $PROM >/dev/null
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\nlog:\n  level: error\n' "$T/oci" "$PORT" >oci.yml
docker-registry serve oci.yml >oci.log 2>&1 & PIDS="$PIDS $!"
for i in $(seq 100); do curl -s -o /dev/null http://127.0.0.1:$PORT/v2/ && break; sleep 0.05; done
O=oci+http://127.0.0.1:$PORT/bench
$KILN trust put trust.json --registry $O >/dev/null
t0=$(date +%s%N); $KILN publish a.kiln --registry $O >/dev/null; t1=$(date +%s%N)
echo "publish to docker-registry: $(( (t1 - t0) / 1000000 )) ms"
$KILN promote bench 1.0.0 --channel production --key prom.key --registry $O >/dev/null
t() { local t0=$(date +%s%N); "$@" >/dev/null 2>&1 || { echo "FAILED: $*" >&2; exit 1; }; echo $(( ($(date +%s%N) - t0) / 1000000 )); }
K=() O1=() C=()
for r in $(seq $REPS); do
    rm -rf p s; sync; K+=($(t $KILN pull bench@production --registry $URL --trust trust.json --state s --out p))
    rm -rf p s; sync; O1+=($(t $KILN pull bench@production --registry $O --trust trust.json --state s --out p))
    rm -f dl; sync; C+=($(t curl -sSf -o dl http://127.0.0.1:$PORT/v2/bench/bench/blobs/sha256:$D))
done
med() { printf '%s\n' "$@" | sort -n | awk '{v[NR]=$1} END {print v[int((NR+1)/2)]}'; }
k=$(med "${K[@]}") o=$(med "${O1[@]}") c=$(med "${C[@]}")
echo "archive $(stat -c %s a.kiln) bytes; median of $REPS runs (ms); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "kiln pull from kiln registry serve:   $k   (runs: ${K[*]})"
echo "kiln pull from docker-registry (OCI): $o   (runs: ${O1[*]})"
echo "curl -o of the blob from docker-registry: $c   (runs: ${C[*]})"
awk -v o=$o -v k=$k -v c=$c 'BEGIN { printf "OCI pull / kiln-server pull: %.2f; OCI pull / curl from docker-registry: %.2f\n", o/k, o/c }'
