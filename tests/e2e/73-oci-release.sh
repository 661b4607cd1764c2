#!/bin/sh
# kiln release, kiln_watch and a key rotation with an OCI registry as the only registry
# (Debian's docker-registry on loopback): release v1 (production empty: no baseline) and
# promote it, release v2 validated against v1 pulled from production, a version the
# registry holds refused at check; trust version 2 retires the release key (a release with
# it stops at sign); the example service follows production (kiln_watch): a promotion
# swapped in between two ticks; a rollback; the registry down and the service restarted on
# the model it kept. 65-release.sh is the same walk on kiln's own server.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci.sh"
cd "$T"
for k in root rel rel2 prom; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"root","pubkey":"$(tail -1 root.pub)","roles":["root"]},
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1},"production":{"threshold":1}}}
JSON
tiny_run 3
oci_registry a
U=oci+http://$OCI_ADDR/desk/models
$KILN trust put trust.json --registry "$U" >/dev/null || fail "trust put"
R="--name market --registry $U --key rel.key --trust trust.json --state st --windows 8"
P="--promote production --promote-key prom.key"

$KILN release run --step 20 --version 1.0.0 $R $P --out-dir r1 >out1 || fail "release v1: $(cat out1)"
# An OCI registry stores no datasets: the release says so and the card says the dataset was
# withheld (kiln reproduce then needs --data), as with --no-data.
grep -q "dataset .*not published: an OCI registry stores no datasets" out1 || fail "release v1's dataset line: $(cat out1)"
grep -q '"dataset_withheld": true' r1/model/card.json || fail "the card does not say the dataset was withheld"
grep -q "channel 'production' of 'market' is empty: no baseline" out1 || fail "baseline v1: $(cat out1)"
grep -q "^\[9/9\] promote .*market/production -> 1.0.0 seq 1" out1 || fail "promote v1: $(cat out1)"
d1=$(sha256sum r1/market-1.0.0.kiln | cut -d' ' -f1)
grep -q "^released market@1.0.0 sha256:$d1\$" out1 || fail "final digest: $(cat out1)"
manifest "$OCI_ADDR" desk/models/market 1.0.0 | grep -q '"mediaType":"application/vnd.kiln.validation.v1+json"' ||
    fail "validation.json is not a layer of the version"

$KILN release run --step 40 --version 2.0.0 $R $P --out-dir r2 >out2 || fail "release v2: $(cat out2)"
grep -q "^\[4/9\] baseline  market@1.0.0 (channel production, seq 1) sha256:$d1" out2 || fail "baseline v2: $(cat out2)"
grep -q "^released market@2.0.0 sha256:[0-9a-f]\{64\}, validated against 1.0.0\$" out2 || fail "v2: $(cat out2)"
$KILN provenance market@production --registry "$U" --trust trust.json --state st >prov.txt ||
    fail "provenance: $(cat prov.txt)"

expect_fail 2 $KILN release run --version 1.0.0 $R --out-dir r5
grep -q "release stopped at stage 'check'.*immutable" err || fail "existing version: $(cat err)"
expect_fail 2 $KILN pull market@3.0.0 --registry "$U" --trust trust.json --state st --out x3
grep -q "version 'market@3.0.0' not found" err || fail "absent version: $(cat err)"

# Trust version 2 retires rel (rel2 takes its place): rel stops at sign.
sed -e 's/"keys":\[/"version":2,"keys":[/' -e "s|\"name\":\"rel\",\"pubkey\":\"[^\"]*\"|\"name\":\"rel2\",\"pubkey\":\"$(tail -1 rel2.pub)\"|" \
    trust.json >v2.json
$KILN trust sign v2.json --key root.key --out v2.signed.json >/dev/null || fail "trust sign v2"
$KILN trust put v2.signed.json --registry "$U" >/dev/null || fail "trust put v2"
expect_fail 1 $KILN release run --step 40 --version 4.0.1 $R --baseline-channel '' --out-dir r6
grep -q "release stopped at stage 'sign'.*not in the trust policy 'trust v2 from " err ||
    fail "a key retired in trust v2 released: $(cat err)"
R2="--name market --registry $U --key rel2.key --trust trust.json --state st --windows 8"
$KILN release run --step 40 --version 4.0.2 $R2 --baseline-channel '' --out-dir r7 >out7 || fail "release with rel2: $(cat out7)"
$KILN promote market 4.0.2 --channel production --key prom.key --registry "$U" >/dev/null || fail "promote 4.0.2"

# The example service following production (kiln_watch) on the OCI registry.
svc=$(dirname "$KILN")/stream_service
$KILN data export "$T/d.st" --rows 40 | tail -n +2 | cut -d, -f1-6 >ticks.csv
"$svc" --watch market@production --registry "$U" --trust trust.json --state wst --dir wsvc <ticks.csv >p1.csv 2>svc1.err ||
    fail "stream_service --watch: $(cat svc1.err)"
grep -q '^watch: serving market@4\.0\.2 (production seq [0-9]*)$' svc1.err || fail "watch: $(cat svc1.err)"
$KILN release run --step 20 --version 4.0.3 $R2 --baseline-channel '' --out-dir r8 >out8 || fail "release 4.0.3: $(cat out8)"
mkfifo tf
"$svc" --watch market@production --registry "$U" --trust trust.json --state wst2 --dir wsvc2 <tf >p4.csv 2>svc4.err &
spid=$!
exec 5>tf
head -n 20 ticks.csv >&5
i=0
until [ "$(wc -l <p4.csv)" -ge 20 ]; do
    i=$((i + 1)); [ $i -lt 400 ] || { kill $spid; fail "the service predicted $(wc -l <p4.csv) of 20 ticks: $(cat svc4.err)"; }
    sleep 0.05
done
$KILN promote market 4.0.3 --channel production --key prom.key --registry "$U" >/dev/null || fail "promote 4.0.3"
i=0
until grep -q '^watch: now serving market@4\.0\.3 ' svc4.err; do
    i=$((i + 1)); [ $i -lt 300 ] || { kill $spid; fail "the service never heard 4.0.3: $(cat svc4.err)"; }
    sleep 0.05
done
tail -n 20 ticks.csv >&5
exec 5>&-
wait $spid || fail "the service exited $?: $(cat svc4.err)"
[ "$(wc -l <p4.csv)" -eq 40 ] || fail "$(wc -l <p4.csv) predictions for 40 ticks"
head -n 20 p1.csv >p1-20.csv
head -n 20 p4.csv | cmp -s - p1-20.csv || fail "the ticks before the swap were not 4.0.2's predictions"

# Roll production back to 4.0.2 (verified history, digest pinned); the service follows.
$KILN rollback market --channel production --trust trust.json --state st --key prom.key --registry "$U" >rb.out ||
    fail "rollback: $(cat rb.out)"
grep -q "4.0.2 .*reason 'rollback'" rb.out || fail "rollback said: $(cat rb.out)"
"$svc" --watch market@production --registry "$U" --trust trust.json --state wst --dir wsvc <ticks.csv >p5.csv 2>svc5.err ||
    fail "watch after rollback: $(cat svc5.err)"
cmp -s p1.csv p5.csv || fail "after the rollback the service does not predict as 4.0.2 did"

# The registry goes down: the service restarts on the model it kept, verified offline.
oci_stop a
"$svc" --watch market@production --registry "$U" --trust trust.json --state wst --dir wsvc <ticks.csv >p6.csv 2>svc6.err ||
    fail "stream_service --watch without the registry: $(cat svc6.err)"
grep -q "serving market@4.0.2 .* as kept in 'wsvc/gen-" svc6.err || fail "offline: $(cat svc6.err)"
cmp -s p1.csv p6.csv || fail "offline predictions differ"
echo "73-oci-release: passed"
