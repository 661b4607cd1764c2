#!/bin/sh
# kiln release as a release engineer runs it: a real registry on a loopback port, a tiny
# trained run, release v1 (no baseline: production is empty) and promote it, release v2
# validated against v1 pulled from production, then releases that must stop before
# publishing: a worse model (validation fails against the baseline), a key the policy does
# not trust (sign), a version the registry holds (check). Each names its stage. Then the
# example service follows production (kiln_watch): a promotion swapped in between ticks, a
# restart with the registry down on the model it kept, a changed kept file refused.
. "$(dirname "$0")/lib.sh"
cd "$T"
for k in root rel rel2 prom stranger; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"root","pubkey":"$(tail -1 root.pub)","roles":["root"]},
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1},"production":{"threshold":1}}}
JSON
tiny_run 3

PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
ADM=$($KILN registry token create --root reg --name ops --scope admin)
serve_registry reg --trust trust.json
R="--name market --registry $URL --key rel.key --trust trust.json --token $PUB --state st --windows 8"
P="--promote production --promote-key prom.key --promote-token $PROM"

# v1: production is empty, so no baseline; published and promoted.
$KILN release run --step 20 --version 1.0.0 $R $P --out-dir r1 >out1 || fail "release v1: $(cat out1)"
for s in check export golden baseline validate pack sign publish promote; do
    grep -q "^\[[0-9]/9\] $s " out1 || fail "stage $s not printed: $(cat out1)"
done
grep -q "channel 'production' of 'market' is empty: no baseline" out1 || fail "baseline v1: $(cat out1)"
grep -q "^\[9/9\] promote .*market/production -> 1.0.0 seq 1" out1 || fail "promote v1: $(cat out1)"
d1=$(sha256sum r1/market-1.0.0.kiln | cut -d' ' -f1)
grep -q "^released market@1.0.0 sha256:$d1\$" out1 || fail "final digest: $(cat out1)"
grep -q '"passed": true' r1/model/validation.json || fail "v1 validation report"
$KILN verify r1/market-1.0.0.kiln --trust trust.json >/dev/null || fail "v1 archive does not verify"
$KILN pull market@production --registry "$URL" --trust trust.json --state st --out prod >pull.out || fail "pull v1"
grep -q "pulled market@1.0.0 (channel production, seq 1) sha256:$d1" pull.out || fail "pulled: $(cat pull.out)"
grep -q "validation passed" pull.out || fail "pulled verdict: $(cat pull.out)"

# v2: validated against v1, pulled from production and verified first.
$KILN release run --step 40 --version 2.0.0 $R $P --out-dir r2 >out2 || fail "release v2: $(cat out2)"
grep -q "^\[4/9\] baseline  market@1.0.0 (channel production, seq 1) sha256:$d1" out2 || fail "baseline v2: $(cat out2)"
grep -q "^released market@2.0.0 sha256:[0-9a-f]\{64\}, validated against 1.0.0\$" out2 || fail "v2: $(cat out2)"
grep -q '"status": "passed"' r2/model/validation.json || fail "v2 report"
ls -a r2 | grep -q '^\.baseline' && fail "the baseline's temporary directory was left in r2"
$KILN pull market@production --registry "$URL" --trust trust.json --state st --out prod | grep -q 'market@2.0.0 (channel production, seq 2)' ||
    fail "production is not v2"

# A model directory whose card.json or model.safetensors is a symlink to a file elsewhere:
# refused at the check stage (as kiln pack refuses it), nothing copied, packed or published,
# the secret the link reached in no file the release made. (r1/model is a good one: a copy
# of it with the links put in.)
printf 'SECRET-9f3a outside the model directory\n' >outside-secret
for f in card.json model.safetensors; do
    rm -rf lm && cp -r r1/model lm
    sed 's/"lineage"/"secret": "SECRET-9f3a", "lineage"/' r1/model/card.json >outside-card.json
    cp r1/model/model.safetensors outside.safetensors
    case $f in card.json) ln -sf "$T/outside-card.json" lm/card.json ;;
        *) ln -sf "$T/outside.safetensors" lm/model.safetensors ;; esac
    expect_fail 2 $KILN release --model lm --data d.st --version 6.0.0 $R --baseline-channel '' \
        --out-dir r-link
    grep -q "release stopped at stage 'check': 'lm/$f': is a symlink" err ||
        fail "a linked $f was not refused at the check: $(cat err)"
    [ ! -e r-link ] || fail "a refused release ($f linked) left '$(ls -R r-link)'"
    expect_fail 2 $KILN pull market@6.0.0 --registry "$URL" --trust trust.json --state st --out x6
    grep -q 'HTTP 404' err || fail "6.0.0 reached the registry with $f linked: $(cat err)"
done
grep -rl 'SECRET-9f3a' r1 r2 reg 2>/dev/null && fail "the linked card's secret reached a file"

# A worse model (step 4) against v2: validation fails, nothing is packed or published.
expect_fail 1 $KILN release run --step 4 --version 3.0.0 $R $P --out-dir r3
grep -q "release stopped at stage 'validate'" err || fail "validate failure: $(cat err)"
grep -q "baseline" err || fail "the failure does not name the baseline check: $(cat err)"
# What failed on the first line, each reason on its own after it (issue 30).
head -1 err | grep -q "validation failed: 1 check failed: baseline_loss (report 'r3/model/validation.json')$" &&
    sed -n 2p err | grep -q "^baseline_loss: held-out loss" || fail "failure lines: $(cat err)"
grep -q "nothing was published" err || fail "no word on publishing: $(cat err)"
grep -q "^\[4/9\] baseline  market@2.0.0" out || fail "bad release's baseline: $(cat out)"
grep -q "pack\|publish" out && fail "stages after validate ran: $(cat out)"
[ ! -e r3/market-3.0.0.kiln ] || fail "a failed release packed an archive"
grep -q '"passed": false' r3/model/validation.json || fail "the failed report is not kept"
expect_fail 2 $KILN pull market@3.0.0 --registry "$URL" --trust trust.json --state st --out x3
grep -q 'HTTP 404' err || fail "3.0.0 reached the registry: $(cat err)"

# A key the policy does not trust: stops at sign, before publishing.
expect_fail 1 $KILN release run --step 40 --version 4.0.0 --name market --registry "$URL" --key stranger.key \
    --trust trust.json --token "$PUB" --state st --windows 8 --baseline-channel '' --out-dir r4
grep -q "release stopped at stage 'sign'.*not in the trust policy" err || fail "stranger: $(cat err)"
expect_fail 2 $KILN pull market@4.0.0 --registry "$URL" --trust trust.json --state st --out x4

# The release key is retired in trust version 2 (rel2 takes its place): a release walks
# --trust to the registry's newest version first, so rel stops at sign; rel2 releases.
sed -e 's/"keys":\[/"version":2,"keys":[/' -e "s|\"name\":\"rel\",\"pubkey\":\"[^\"]*\"|\"name\":\"rel2\",\"pubkey\":\"$(tail -1 rel2.pub)\"|" \
    trust.json >v2.json
grep -q '"rel2"' v2.json && ! grep -q '"rel"' v2.json || fail "v2 policy: $(cat v2.json)"
$KILN trust sign v2.json --key root.key --out v2.signed.json >/dev/null || fail "trust sign v2"
$KILN trust put v2.signed.json --registry "$URL" --token "$ADM" >/dev/null || fail "trust put v2"
expect_fail 1 $KILN release run --step 40 --version 4.0.1 $R --baseline-channel '' --out-dir r6
grep -q "release stopped at stage 'sign'.*not in the trust policy 'trust v2 from " err ||
    fail "a key retired in trust v2 released: $(cat err)"
$KILN release run --step 40 --version 4.0.2 --name market --registry "$URL" --key rel2.key \
    --trust trust.json --token "$PUB" --state st --windows 8 --baseline-channel '' --out-dir r7 >out7 ||
    fail "release with rel2: $(cat out7)"

# The registry holds 1.0.0: refused before any work.
expect_fail 2 $KILN release run --version 1.0.0 $R --out-dir r5
grep -q "release stopped at stage 'check'.*immutable" err || fail "existing version: $(cat err)"
[ ! -e r5/model ] || fail "work done for an existing version"
expect_fail 2 $KILN release run --version 5.0.0 $R --out-dir r1
grep -q "not empty" err || fail "used output directory: $(cat err)"

# A trading service that follows production itself (examples/stream_service --watch, on
# kiln_watch): pulled, verified and served while the registry is up, a promotion swapped in
# between two ticks ...
# (production moves to 4.0.2: under trust v2 rel's archives no longer verify)
$KILN promote market 4.0.2 --channel production --key prom.key --registry "$URL" --token "$PROM" >/dev/null ||
    fail "promote 4.0.2"
svc=$(dirname "$KILN")/stream_service
$KILN data export "$T/d.st" --rows 40 | tail -n +2 | cut -d, -f1-6 >ticks.csv
W="--watch market@production --registry $URL --trust trust.json --state wst --dir wsvc"
"$svc" $W <ticks.csv >p1.csv 2>svc1.err || fail "stream_service --watch: $(cat svc1.err)"
[ "$(wc -l <p1.csv)" -eq 40 ] || fail "stream_service --watch: $(wc -l <p1.csv) predictions for 40 ticks"
grep -q '^watch: serving market@4\.0\.2 (production seq [0-9]*)$' svc1.err ||
    fail "the service did not say what it serves (kiln_watch_serving): $(cat svc1.err)"
# A promotion while another such service runs: swapped in between two ticks, its streams
# reopened on the new model (4.0.3, the run's step 20): the ticks after the swap are predicted
# as a fresh stream on 4.0.3 predicts them.
$KILN release run --step 20 --version 4.0.3 --name market --registry "$URL" --key rel2.key \
    --trust trust.json --token "$PUB" --state st --windows 8 --baseline-channel '' --out-dir r8 >out8 ||
    fail "release 4.0.3: $(cat out8)"
mkfifo tf
"$svc" --watch market@production --registry "$URL" --trust trust.json --state wst2 --dir wsvc2 \
    <tf >p4.csv 2>svc4.err &
spid=$!
exec 5>tf
head -n 20 ticks.csv >&5
i=0
until [ "$(wc -l <p4.csv)" -ge 20 ]; do
    i=$((i + 1)); [ $i -lt 400 ] || { kill $spid; fail "the service predicted $(wc -l <p4.csv) of 20 ticks: $(cat svc4.err)"; }
    sleep 0.05
done
$KILN promote market 4.0.3 --channel production --key prom.key --registry "$URL" --token "$PROM" >/dev/null ||
    fail "promote 4.0.3"
i=0
until grep -q '^watch: now serving market@4\.0\.3 ' svc4.err; do
    i=$((i + 1)); [ $i -lt 200 ] || { kill $spid; fail "the service never heard 4.0.3: $(cat svc4.err)"; }
    sleep 0.05
done
tail -n 20 ticks.csv >&5
exec 5>&-
wait $spid || fail "the service exited $?: $(cat svc4.err)"
[ "$(wc -l <p4.csv)" -eq 40 ] || fail "$(wc -l <p4.csv) predictions for 40 ticks"
head -n 20 p1.csv >p1-20.csv
head -n 20 p4.csv | cmp -s - p1-20.csv || fail "the ticks before the swap were not 4.0.2's predictions"
$KILN pull market@4.0.3 --registry "$URL" --trust trust.json --state st3 --out m403 >/dev/null ||
    fail "pull 4.0.3"
tail -n 20 ticks.csv | "$svc" m403 >p403.csv 2>/dev/null || fail "stream_service on 4.0.3"
tail -n 20 p4.csv | cmp -s - p403.csv || fail "the ticks after the swap were not a fresh 4.0.3 stream's"
tail -n 20 p1.csv | cmp -s - p403.csv && fail "4.0.2 and 4.0.3 predict alike: the swap check proves nothing"

kill -TERM $PID
wait $PID || fail "server exit status"
$KILN registry fsck --root reg --trust trust.json >/dev/null || fail "fsck after releases"

# ... and restarted while it is down: the model it kept, checked again, the same predictions.
"$svc" $W <ticks.csv >p2.csv 2>svc2.err || fail "stream_service --watch without a registry: $(cat svc2.err)"
grep -q "^watch: registry '$URL/v1/trust/[0-9]*': .*; serving market@[0-9.]* (production seq [0-9]*, expires .*) as kept in 'wsvc/gen-1'" svc2.err ||
    fail "the offline start was not said: $(cat svc2.err)"
cmp -s p1.csv p2.csv || fail "the restarted service predicted otherwise"
$KILN installed market@production --dir wsvc/gen-1 --trust trust.json --state wst >inst || fail "installed: $(cat inst)"
printf 'x' | dd of=wsvc/gen-1/card.json bs=1 seek=3 conv=notrunc 2>/dev/null
set +e; "$svc" $W <ticks.csv >p3.csv 2>svc3.err; rc=$?; set -e
[ $rc -eq 2 ] && grep -q "cannot serve: 'wsvc/gen-1/card.json': sha256 differs" svc3.err ||
    fail "a changed kept model was served (exit $rc): $(cat svc3.err)"
