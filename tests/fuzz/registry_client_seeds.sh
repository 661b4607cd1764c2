#!/bin/sh
# registry_client_seeds.sh - record the seeds of tests/fuzz/registry_client.c from a real
# registry: a store with two versions of "demo" (a model of 8 dimensions after one and two
# training steps, 5 KB packed, signed by the vector key), production promoted to 1.0.0 then
# 1.1.0 and staging to 1.0.0 (records that expire in ten years), and trust version 2 signed by
# the same key; then each operation of the harness
# runs once through a proxy in front of it (ops 10-12 in front of the same store in Debian's
# docker-registry), which writes the input that replays it to
# tests/fuzz/corpus/registry_client/op-N, and the input is replayed with nothing but itself.
# Run from the repository root after `make`: sh tests/fuzz/registry_client_seeds.sh
set -eu
KILN=${KILN:-build/kiln}
KEY=${KILN_VECTORS:-tests/vectors}/minisign/test.key
RUN=build/fuzz-run-registry_client
OUT=tests/fuzz/corpus/registry_client
make --no-print-directory "$RUN" >/dev/null
. tests/e2e/lib.sh
# The harness's policy (tests/fuzz/registry_client.c): one key in every role.
PUB=$(sed -n 2p "${KEY%.key}.pub")
policy() { # FILE VERSION
    printf '{"format":"kiln-trust/1","version":%s,"keys":[{"name":"vector","pubkey":"%s","roles":["root","release","promote"]}],"channels":{"production":{"threshold":1},"staging":{"threshold":1}},"accept_unvalidated":true}\n' \
        "$1" "$PUB"
}
policy 1 >"$T/trust.json"
# A model the runtime loads (the watch's operation loads what it pulls): two steps of the
# smallest model, each exported (the card as kiln writes it) and packed as a version.
$KILN data synth --seed 1 --rows 400 --features 4 --outputs 1 --out "$T/d.st" >/dev/null 2>&1
$KILN train --data "$T/d.st" --run-dir "$T/run" --set steps=2 --set ckpt_every=1 --set keep=0 \
    --set d_model=8 --set n_layers=1 --set n_heads=2 --set d_ff=8 --set n_experts=2 --set top_k=1 \
    --set seq_len=8 --set attn_window=8 --set batch_size=2 >/dev/null 2>"$T/train.log" ||
    { cat "$T/train.log" >&2; fail "train"; }
step=1
for v in 1.0.0 1.1.0; do
    $KILN export "$T/run" --step $step --out "$T/m-$v" --name demo >/dev/null
    $KILN pack "$T/m-$v" --name demo --version "$v" --out "$T/a-$v.kiln" >/dev/null
    $KILN sign "$T/a-$v.kiln" --key "$KEY" --allow-unvalidated >/dev/null
    step=2
done
R=$T/reg
ADM=$($KILN registry token create --root "$R" --name ops --scope admin)
serve_registry "$R" --trust "$T/trust.json"
for v in 1.0.0 1.1.0; do $KILN publish "$T/a-$v.kiln" --registry "$URL" --token "$ADM" >/dev/null; done
P="--key $KEY --registry $URL --token $ADM --expires 3650d"
$KILN promote demo 1.0.0 --channel production $P >/dev/null
$KILN promote demo 1.1.0 --channel production $P --reason "weekly retrain" >/dev/null
$KILN promote demo 1.0.0 --channel staging $P >/dev/null
policy 2 | sed 's/"staging":{"threshold":1}/"staging":{"threshold":1},"canary":{"threshold":1}/' >"$T/v2.json"
$KILN trust sign "$T/v2.json" --key "$KEY" --out "$T/v2.signed.json" >/dev/null
$KILN trust put "$T/v2.signed.json" --registry "$URL" --token "$ADM" >/dev/null

# The same store in Debian's docker-registry (oci+http://ADDR/fz), published by kiln, for the
# OCI operations 10-12.
. tests/e2e/oci.sh
oci_registry fz
O=oci+http://$OCI_ADDR/fz
$KILN trust put "$T/trust.json" --registry "$O" >/dev/null
for v in 1.0.0 1.1.0; do $KILN publish "$T/a-$v.kiln" --registry "$O" >/dev/null; done
PO="--key $KEY --registry $O --expires 3650d"
$KILN promote demo 1.0.0 --channel production $PO >/dev/null
$KILN promote demo 1.1.0 --channel production $PO --reason "weekly retrain" >/dev/null
$KILN promote demo 1.0.0 --channel staging $PO >/dev/null
$KILN trust put "$T/v2.signed.json" --registry "$O" >/dev/null

mkdir -p "$OUT"
op=0
while [ $op -lt 13 ]; do
    printf "\\$(printf %o $op)" >"$T/op"
    up=$URL
    [ $op -lt 10 ] || up=http://$OCI_ADDR
    # The replay asks what the recording asked and ends as it did. The mirror (op 7) has two
    # versions in flight, so its requests' order may differ from run to run: up to 5 tries.
    try=1
    while :; do
        KILN_FUZZ_UPSTREAM=$up KILN_FUZZ_RECORD=$OUT/op-$op KILN_FUZZ_VERBOSE=1 "$RUN" "$T/op" 2>"$T/rec.log" ||
            { cat "$T/rec.log" >&2; fail "recording op $op"; }
        KILN_FUZZ_VERBOSE=1 "$RUN" "$OUT/op-$op" 2>"$T/replay.log" || { cat "$T/replay.log" >&2; fail "replaying op $op"; }
        grep '^  fuzz' "$T/rec.log" >"$T/a"
        grep '^  fuzz' "$T/replay.log" >"$T/b"
        cmp -s "$T/a" "$T/b" && break
        [ $try -lt 5 ] || { diff "$T/a" "$T/b" >&2 || true; fail "op $op replays otherwise"; }
        try=$((try + 1))
    done
    echo "op-$op: $(grep -c 'fuzz registry' "$T/a") requests, $(wc -c <"$OUT/op-$op") bytes; $(tail -n 1 "$T/a" | sed 's/^  fuzz //')"
    op=$((op + 1))
done
