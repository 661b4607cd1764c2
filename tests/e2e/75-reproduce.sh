#!/bin/sh
# kiln reproduce as a model-risk reviewer runs it (issue 32): a tiny model trained on 2 threads,
# stopped by SIGTERM and by SIGKILL and resumed, released to a registry on a loopback port (its
# dataset published beside it, signed and named by its digest), then rebuilt from its signed
# lineage on 1 thread in a fresh directory: byte-identical, exit 0. And a release of an earlier
# step reproduced with the dataset deleted here (pulled by digest; the trainer stopped short of
# the config's steps); a dataset whose stored bytes changed refused by the pull; one signed by a
# key that is no release key refused by the registry; --no-data (the card says so); a dataset
# with one changed byte refused by digest before any training; a card whose config was altered and
# re-signed rebuilt to another model (exit 1, naming the first differing tensor, the run id the
# config does not give, the first step whose loss differs); a run started from --init; a model
# kiln.torch trained and a GPU-trained one on a host without a GPU refused in one line (exit
# 2). Then a channel that requires an independent reproduction (the policy's reproduced_by): a
# promote refused until a signed record exists, a record by a key outside the policy refused,
# provenance, the version's web page and a mirror showing and carrying the record, and a pull
# refused once the record is gone.
. "$(dirname "$0")/lib.sh"
cd "$T"
rel_prom_trust
$KILN data synth --seed 5 --rows 3000 --features 6 --outputs 2 --out d.st >/dev/null 2>&1 || fail "synth"
CFG="--set steps=400 --set ckpt_every=4 --set eval_every=8 --set keep=0 --set d_model=16
     --set d_ff=32 --set seq_len=16 --set attn_window=8 --set threads=2"
# newest: the step of the run's newest checkpoint (0 for none).
newest() {
    ls run/ckpt 2>/dev/null | sed -n 's/^step-0*\([0-9][0-9]*\)\.safetensors$/\1/p' | sort -n | tail -1 | grep . || echo 0
}
# wait_ckpt N: until the run has written a checkpoint of step N or later (20 s at most).
wait_ckpt() {
    _w=0
    while [ "$(newest)" -lt "$1" ]; do
        _w=$((_w + 1)); [ $_w -lt 400 ] || fail "no checkpoint of step $1 or later"; sleep 0.05
    done
}
$KILN train --data d.st --run-dir run $CFG >/dev/null 2>train1.log &
tp=$!
wait_ckpt 40
kill -TERM $tp; wait $tp || true
n=$(newest)
$KILN train --resume run >/dev/null 2>train2.log &
tp=$!
wait_ckpt $((n + 40))
kill -KILL $tp; wait $tp 2>/dev/null || true
$KILN train --resume run >/dev/null 2>train3.log || { cat train3.log >&2; fail "last resume"; }

PUB=$($KILN registry token create --root reg --name ci --scope publish)
serve_registry reg --trust trust.json
R="--name market --registry $URL --key rel.key --trust trust.json --token $PUB --state st --windows 8"
$KILN release run $R --version 1.0.0 --out-dir r1 >rel1.out || fail "release 1.0.0: $(cat rel1.out)"
[ "$(grep -o '"kind":"resume"' r1/model/run_summary.json | wc -l)" -ge 2 ] ||
    fail "the released run was not resumed twice: $(grep -o '"events":\[[^]]*' r1/model/run_summary.json)"
d1=$(sha256sum r1/market-1.0.0.kiln | cut -d' ' -f1)
Q="--registry $URL --trust trust.json --state st"

# Rebuilt on 1 thread in a fresh directory: the same bytes.
set +e; $KILN reproduce market@1.0.0 $Q --data d.st --threads 1 --workdir w1 >out 2>err; rc=$?; set -e
[ $rc -eq 0 ] || { cat out err >&2; fail "reproduce 1.0.0 exited $rc"; }
grep -qx "reproduced market@1.0.0: model.safetensors and the archive are byte-identical (sha256:$d1)" out ||
    fail "reproduce 1.0.0 said: $(cat out)"
cmp -s w1/model/model.safetensors r1/model/model.safetensors || fail "model.safetensors differs from the release's"
cmp -s w1/market-1.0.0.kiln r1/market-1.0.0.kiln || fail "the archive differs from the release's"
grep -q "training step .*ETA" err || fail "no progress with an ETA: $(cat err)"
grep -q "trained 400 steps from scratch in 'w1/run' (cpu, 1 thread)" err || fail "training line: $(cat err)"

# The release published the training dataset, signed, named by its digest.
h=$($KILN data inspect d.st | sed -n 's/^sha256 *//p')
grep -q "^\[8/9\] publish .*; dataset sha256:$h published as market\$" rel1.out || fail "dataset not published: $(cat rel1.out)"
$KILN models --registry "$URL" >models.out || fail "kiln models"
grep -q "^  market  *sha256:$h  [0-9]* bytes  published by ci at " models.out || fail "kiln models lists no dataset: $(cat models.out)"
grep -q "^    trained on it: market@1.0.0\$" models.out || fail "kiln models does not name the version trained on it: $(cat models.out)"
curl -sf "$URL/" >home.html || fail "the registry's home page"
grep -q "<h2>Datasets</h2>" home.html && grep -q "<p>market sha256:$h, [0-9]* bytes, published by ci at [0-9TZ:-]*; trained on it: market@1.0.0</p>" home.html ||
    fail "the home page does not list the dataset: $(grep -A2 Datasets home.html)"
$KILN data pull "market@sha256:$h" --registry "$URL" --trust trust.json --out pulled.st >out || fail "data pull"
cmp -s pulled.st d.st || fail "the pulled dataset is not the published one"
grep -q "^signed by rel\$" out || fail "data pull: $(cat out)"

# An earlier checkpoint, its dataset deleted here: pulled by digest, and the trainer stops at
# the card's step, short of the config's 400. The registry holds the dataset: not sent again.
$KILN release run $R --version 1.1.0 --step 40 --out-dir r11 >rel11.out || fail "release 1.1.0: $(cat rel11.out)"
grep -q "; dataset sha256:$h held by the registry already\$" rel11.out || fail "dataset sent again: $(cat rel11.out)"
mv d.st away.st
$KILN reproduce market@1.1.0 $Q >out 2>err || { cat err >&2; fail "reproduce 1.1.0"; }
grep -q "^reproduced market@1.1.0: .* byte-identical (sha256:$(sha256sum r11/market-1.1.0.kiln | cut -d' ' -f1))" out ||
    fail "reproduce 1.1.0 said: $(cat out)"
grep -q "dataset sha256:$h pulled as market, signed by rel" err || fail "the dataset was not pulled: $(cat err)"
mv away.st d.st

# A dataset whose stored bytes were changed: the pull refuses it and writes nothing.
blob=reg/blobs/sha256/$(echo "$h" | cut -c1-2)/$h
cp "$blob" blob.keep && chmod u+w "$blob"
printf '\001' | dd of="$blob" bs=1 seek=100 conv=notrunc 2>/dev/null
expect_fail 1 $KILN data pull "market@sha256:$h" --registry "$URL" --trust trust.json --out tampered.st
grep -q "dataset 'market': its bytes are sha256:[0-9a-f]*, not sha256:$h" err || fail "tampered blob: $(cat err)"
[ ! -e tampered.st ] && [ ! -e tampered.st.partial ] || fail "a refused dataset was left behind"
cp blob.keep "$blob"
# Signed by a key without the release role: the registry refuses it.
cp d.st other.st && printf '\002' | dd of=other.st bs=1 seek=$(($(stat -c %s other.st) - 9)) conv=notrunc 2>/dev/null
set +e; $KILN data publish other.st --name other --registry "$URL" --key prom.key --token "$PUB" >out 2>err; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "HTTP 422" err || fail "a dataset signed by a promote key was accepted ($rc): $(cat out err)"

# --no-data: nothing of the dataset leaves, the card says so, and a reproduction needs --data.
$KILN release run $R --version 1.2.0 --step 20 --no-data --out-dir r12 >rel12.out || fail "release 1.2.0: $(cat rel12.out)"
grep -q "; dataset  withheld (--no-data)\$" rel12.out || fail "--no-data: $(cat rel12.out)"
grep -q '"dataset_withheld": true' r12/model/card.json || fail "the card does not say the dataset was withheld"
expect_fail 2 $KILN reproduce market@1.2.0 $Q
grep -q "released with its dataset withheld (kiln release --no-data): give the dataset of sha256:$h with --data" err ||
    fail "withheld: $(cat err)"
$KILN reproduce market@1.2.0 $Q --data d.st >out 2>/dev/null || fail "reproduce 1.2.0 with --data: $(cat out)"
grep -q "^reproduced market@1.2.0: " out || fail "reproduce 1.2.0: $(cat out)"

# One changed byte of the dataset: refused by its digest, nothing trained.
cp d.st bad.st
printf '\001' | dd of=bad.st bs=1 seek=$(($(stat -c %s bad.st) - 5)) conv=notrunc 2>/dev/null
expect_fail 2 $KILN reproduce market@1.0.0 $Q --data bad.st --workdir w2
grep -q "'bad.st' is sha256:[0-9a-f]\{64\}, but market@1.0.0 was trained on sha256:[0-9a-f]\{64\}: not its dataset" err ||
    fail "tampered dataset: $(cat err)"
[ ! -e w2/run ] || fail "a refused dataset was trained on"

# A card whose config says another seed, re-signed by the release key: it is rebuilt, and
# the rebuilt model is another one.
mkdir alt && cp -r r1/model/. alt/
sed -i 's/"seed": 1,/"seed": 2,/' alt/card.json
grep -q '"seed": 2,' alt/card.json || fail "could not alter the card"
$KILN pack alt --name market --version 2.0.0 --out alt.kiln >/dev/null && $KILN sign alt.kiln --key rel.key >/dev/null &&
    $KILN publish alt.kiln --registry "$URL" --token "$PUB" >/dev/null || fail "publish the altered card"
set +e; $KILN reproduce market@2.0.0 $Q --data d.st --workdir w3 >out 2>err; rc=$?; set -e
[ $rc -eq 1 ] || { cat err >&2; fail "an altered config exited $rc, not 1"; }
grep -q "^not reproduced market@2.0.0: model.safetensors differs" out || fail "verdict: $(cat out)"
grep -q "^  model     tensor '[a-z0-9._]*' first differs at index [0-9]*: released [-0-9.e]*, rebuilt [-0-9.e]*" out ||
    fail "no first differing tensor: $(cat out)"
grep -q "do not give its run id" out || fail "the run id is not named: $(cat out)"
grep -q "config key 'seed' is 2 in the card, 1 in the run it claims (run_summary.json)" out ||
    fail "the altered config key is not named: $(cat out)"
grep -q "^  training  the loss first differs at step 1: released" out || fail "no first differing loss: $(cat out)"
[ -d w3/model ] || fail "the work directory of a different model was not kept"

# A run started from a model (kiln train --init): the card names that model by digest, and a
# reproduction needs it, refused without it.
$KILN export run --step 40 --out init-model >/dev/null 2>&1 || fail "export the init model"
$KILN train --data d.st --run-dir run2 --init init-model/model.safetensors $CFG --set steps=24 >/dev/null 2>train4.log ||
    { cat train4.log >&2; fail "train --init"; }
$KILN release run2 $R --version 5.0.0 --out-dir r5 >rel5.out || fail "release 5.0.0: $(cat rel5.out)"
ih=$(sha256sum init-model/model.safetensors | cut -d' ' -f1)
grep -A1 '"init"' r5/model/card.json | grep -q "\"sha256\": \"$ih\"" || fail "the card does not name the init model: $(grep -A2 init r5/model/card.json)"
expect_fail 2 $KILN reproduce market@5.0.0 $Q --data d.st
grep -q "market@5.0.0 started from a model (kiln train --init) of sha256:$ih: give that model with --init" err ||
    fail "no --init: $(cat err)"
$KILN reproduce market@5.0.0 $Q --data d.st --init init-model/model.safetensors >out 2>err ||
    { cat err >&2; fail "reproduce 5.0.0 with --init: $(cat out)"; }
grep -q "^reproduced market@5.0.0: .* byte-identical" out || fail "reproduce 5.0.0: $(cat out)"

# A model kiln.torch trained: one line, exit 2.
mkdir torch && cp -r r1/model/. torch/
sed -i 's/"lineage": {/"lineage": {"source": "kiln.torch", "framework": "torch 2.1",/' torch/card.json
$KILN pack torch --name market --version 3.0.0 --out torch.kiln >/dev/null && $KILN sign torch.kiln --key rel.key >/dev/null &&
    $KILN publish torch.kiln --registry "$URL" --token "$PUB" >/dev/null || fail "publish the torch card"
expect_fail 2 $KILN reproduce market@3.0.0 $Q --data d.st
grep -q "market@3.0.0 was trained outside kiln (lineage.source 'kiln.torch', framework torch 2.1): kiln reproduce rebuilds only models kiln's trainer made" err ||
    fail "torch model: $(cat err)"

# A GPU-trained model on a host without a GPU: refused before any training.
if ! ls /dev/nvidia0 >/dev/null 2>&1; then
    mkdir gpu && cp -r r1/model/. gpu/
    sed -i 's/"numerics": "cpu kiln-gemm\/1"/"numerics": "cuda cublas"/' gpu/card.json
    $KILN pack gpu --name market --version 4.0.0 --out gpu.kiln >/dev/null && $KILN sign gpu.kiln --key rel.key >/dev/null &&
        $KILN publish gpu.kiln --registry "$URL" --token "$PUB" >/dev/null || fail "publish the gpu card"
    expect_fail 2 $KILN reproduce market@4.0.0 $Q --data d.st
    grep -q "was trained on a GPU (lineage.numerics 'cuda cublas') and this host has no usable CUDA device" err ||
        fail "gpu model: $(cat err)"
fi
# A channel that requires an independent reproduction: the policy's production channel names
# the auditor's key (role reproduce) in reproduced_by. A promote is refused until a valid
# record exists, one signed by a key outside the policy is refused by the registry, and a
# client pulling the channel refuses the version once its record is gone.
for k in auditor outsider; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust-r.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(sed -n 2p rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(sed -n 2p prom.pub)","roles":["promote"]},
 {"name":"auditor","pubkey":"$(sed -n 2p auditor.pub)","roles":["reproduce"]}],
 "channels":{"production":{"threshold":1,"reproduced_by":{"keys":["auditor"],"threshold":1}}},
 "accept_unvalidated": true}
JSON
kill "$PID"; wait "$PID" 2>/dev/null || true
PUB2=$($KILN registry token create --root reg2 --name ci --scope publish)
PROM2=$($KILN registry token create --root reg2 --name rm --scope promote)
serve_registry reg2 --trust trust-r.json
$KILN release run --name market --registry "$URL" --key rel.key --trust trust-r.json --token "$PUB2" \
    --state st2 --windows 8 --version 1.0.0 --step 40 --out-dir q1 >q1.out || fail "release to reg2: $(cat q1.out)"
P2="market 1.0.0 --channel production --key prom.key --registry $URL --token $PROM2"
expect_fail 1 $KILN promote $P2
grep -q "channel 'production' requires 1 reproduction record of market@1.0.0 (sha256:[0-9a-f]*) with the verdict identical, signed by 'auditor'; 0 valid" err ||
    fail "promote without a reproduction: $(cat err)"
RQ="market@1.0.0 --registry $URL --trust trust-r.json --state st2 --data d.st --token $PUB2"
set +e; $KILN reproduce $RQ --sign outsider.key >out 2>err; rc=$?; set -e
[ $rc -eq 2 ] || fail "a record by a key outside the policy: exit $rc"
grep -q "^reproduced market@1.0.0 (its reproduction record was not stored)" out || fail "outsider: $(cat out)"
grep -q "which the trust policy does not hold with the reproduce role" err || fail "outsider: $(cat err)"
expect_fail 1 $KILN promote $P2
$KILN reproduce $RQ --sign auditor.key >out 2>err || { cat err >&2; fail "reproduce --sign auditor.key"; }
grep -q "^reproduction record (identical) signed by 'auditor.key' put to the registry\$" out || fail "auditor: $(cat out)"
$KILN promote $P2 >out 2>err || fail "promote after the reproduction: $(cat err)"
$KILN provenance market@production --registry "$URL" --trust trust-r.json --state st5 >prov.out 2>&1 || fail "provenance: $(cat prov.out)"
grep -q "^reproduced  identical by auditor on .* at 20[0-9-]*T[0-9:]*Z, kiln 0\.1\.0 .*\[verified\]\$" prov.out ||
    fail "provenance does not list the reproduction: $(cat prov.out)"
$KILN pull market@production --registry "$URL" --trust trust-r.json --state st3 --out svc >out 2>err ||
    fail "pull of a reproduced version: $(cat err)"
# A mirror copies the records (verified under its policy), so a client with this policy can
# pull through it.
$KILN registry mirror --root mir --from "$URL" --trust trust-r.json --once >mir.out 2>&1 || fail "mirror: $(cat mir.out)"
grep -q "market@1.0.0: reproduction record by auditor" mir.out || fail "the mirror copied no record: $(cat mir.out)"
PURL=$URL
: >mserve.out
$KILN registry serve --root mir --listen 127.0.0.1:0 >mserve.out 2>mserve.err &
MPID=$!
trap 'kill $PID $MPID 2>/dev/null || true; rm -rf "$T"' EXIT
serve_url mserve.out mserve.err
MURL=$URL
URL=$PURL
$KILN pull market@production --registry "$MURL" --trust trust-r.json --state st6 --out svc3 >out 2>err ||
    fail "pull through the mirror: $(cat err)"
curl -sf "$URL/ui/models/market/versions/1.0.0" >page.html || fail "the version's web page"
grep -q "<h2>Reproductions</h2>" page.html && grep -q "<p>identical by auditor on .* (verified)</p>" page.html ||
    fail "the version's web page does not list the reproduction: $(grep -A3 Reproductions page.html)"
sqlite3 reg2/registry.db "DELETE FROM reproductions" || fail "sqlite3"
expect_fail 1 $KILN pull market@production --registry "$URL" --trust trust-r.json --state st4 --out svc2
grep -q "refusing the pull: channel 'production' requires 1 reproduction record" err || fail "pull without the record: $(cat err)"
[ ! -e svc2 ] || fail "a refused pull installed the model"
set +e; $KILN provenance market@production --registry "$URL" --trust trust-r.json --state st5 >prov.out 2>&1; rc=$?; set -e
[ $rc -eq 1 ] && grep -q "^reproduced  \[FAILED: reproduced_by: channel 'production' requires 1 reproduction record" prov.out ||
    fail "provenance without the record ($rc): $(cat prov.out)"

echo "75-reproduce: ok"
