#!/bin/sh
# kiln provenance as an auditor runs it, on real releases: a tiny run released as v1 and
# promoted to production, v2 validated against v1 and promoted, then a rollback to v1. The
# channel shows the rollback and the records before it, each signed; v2's report names v1
# (version and archive digest) as its baseline; the report's checks are shown verified without
# the archive (the registry keeps validation.json byte for byte, hashed against the signed
# manifest); --json holds the same; a dead registry before the live one is passed over and
# named; a client whose policy asks for two release keys gets exit 1 with the failure named and
# everything else shown.
. "$(dirname "$0")/lib.sh"
cd "$T"
for k in rel rel2 prom; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"production":{"threshold":1}}}
JSON
tiny_run 3
PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
serve_registry reg --trust trust.json
R="--name market --registry $URL --key rel.key --trust trust.json --token $PUB --state rst --windows 8"
P="--promote production --promote-key prom.key --promote-token $PROM"
$KILN release run --step 20 --version 1.0.0 $R $P --out-dir r1 >out1 || fail "release v1: $(cat out1)"
$KILN release run --step 40 --version 2.0.0 $R $P --out-dir r2 >out2 || fail "release v2: $(cat out2)"
$KILN rollback market --channel production --key prom.key --registry "$URL" --token "$PROM" >/dev/null ||
    fail "rollback"
d1=$(sha256sum r1/market-1.0.0.kiln | cut -d' ' -f1)
d2=$(sha256sum r2/market-2.0.0.kiln | cut -d' ' -f1)

# The channel: the rollback, who signed it, the records before it; the archive checked over
# the signed comment (not downloaded); the lineage, the card's config and the report's checks
# verified.
$KILN provenance market@production --registry "$URL" --trust trust.json --state st >p1 ||
    { cat p1 >&2; fail "provenance of production"; }
grep -q "^market@production -> market@1.0.0, checked " p1 || fail "resolution: $(head -1 p1)"
grep -q "^channel     production seq 3 -> 1.0.0 sha256:$d1 (rollback from 2.0.0)\$" p1 || fail "current record: $(cat p1)"
grep -q "^              signed by prom [0-9A-F]\{16\}; the channel needs 1  \[verified: 1 of 1 promote key of trust policy v1\]" p1 ||
    fail "record signers: $(cat p1)"
grep -q "put by rm at .*\[registry's word" p1 || fail "put by: $(cat p1)"
grep -q "^  history   seq 2 -> 2.0.0 (promote from 1.0.0) 'release', signed by prom .*\[verified" p1 || fail "history seq 2: $(cat p1)"
grep -q "^            seq 1 -> 1.0.0 (first)" p1 || fail "history seq 1: $(cat p1)"
grep -q "^archive     sha256:$d1, [0-9]* bytes  \[verified: the signed channel record names it\]" p1 || fail "archive: $(cat p1)"
grep -q "signature checked over the comment; archive bytes not downloaded: use --download\]" p1 || fail "no-download note: $(cat p1)"
grep -q "^lineage     run [0-9a-f]\{32\}, step 20, .*\[verified: from the signed manifest" p1 || fail "lineage: $(cat p1)"
grep -q "config d_model 16, n_layers 2, .*\[verified: card.json" p1 || fail "config: $(cat p1)"
grep -q "^              golden                   passed   share outside 0 (max 0), max relative error" p1 ||
    fail "v1's checks without the archive: $(cat p1)"
grep -q "^              baseline none: validated without one\$" p1 || fail "v1's baseline: $(cat p1)"
grep -q "^              checks  \[verified: validation.json as the registry keeps it, byte for byte: [0-9]* bytes hashing to the signed manifest's sha256:[0-9a-f]\{12\}… (the archive not downloaded)\]" p1 ||
    fail "checks without the archive: $(cat p1)"
grep -q "^result      verified: every check passed" p1 || fail "result: $(cat p1)"

# v2 without the archive: its baseline, v1 with its digest, from the registry's copy.
$KILN provenance market@2.0.0 --registry "$URL" --trust trust.json --state st >p2r ||
    { cat p2r >&2; fail "provenance of 2.0.0 without the archive"; }
grep -q "^              baseline market@1.0.0 sha256:$d1, from channel production seq 1, weights sha256:" p2r ||
    fail "v2's baseline without the archive: $(cat p2r)"
grep -q "^              baseline_loss            passed   held-out loss [0-9.]* (limit [0-9.]*)\$" p2r ||
    fail "v2's baseline_loss without the archive: $(cat p2r)"

# Two registries, the first dead: the live one answers, and the line says so.
$KILN provenance market@production --registry http://127.0.0.1:1 --registry "$URL" --trust trust.json \
    --state st >pm 2>pm.err || { cat pm pm.err >&2; fail "provenance over two registries"; }
grep -q "^market@production -> market@1.0.0, checked .* against $URL\$" pm || fail "answered by: $(cat pm)"
grep -q "^registries  $URL answered, of http://127.0.0.1:1, $URL\$" pm || fail "registries: $(cat pm)"
grep -q "^              registry 'http://127.0.0.1:1/.*; trying $URL\$" pm || fail "failover note: $(cat pm)"
grep -q "checks  \[verified: validation.json as the registry keeps it" pm || fail "checks over two: $(cat pm)"

# v2 downloaded: its report's checks and its baseline, v1 with its digest.
$KILN provenance market@2.0.0 --registry "$URL" --trust trust.json --state st --download >p2 ||
    { cat p2 >&2; fail "provenance of 2.0.0"; }
grep -q "^archive     sha256:$d2, .*\[verified: the downloaded archive hashes to it" p2 || fail "v2 archive: $(cat p2)"
grep -q "^              download  \[verified: downloaded into 'st/downloads' and removed after" p2 || fail "download: $(cat p2)"
grep -q "baseline_loss            passed   held-out loss [0-9.]* (limit [0-9.]*)" p2 || fail "baseline_loss: $(cat p2)"
grep -q "^              baseline market@1.0.0 sha256:$d1, from channel production seq 1, weights sha256:" p2 ||
    fail "v2's baseline is not v1 with its digest: $(cat p2)"
ls -a st/downloads | grep -q 'provenance\|partial' && fail "the download was left behind: $(ls -a st/downloads)"
grep -q "\"digest\": \"sha256:$d1\"" r2/model/validation.json || fail "v2's report lacks v1's digest"

# JSON: the same facts, for compliance systems.
$KILN provenance market@production --registry "$URL" --trust trust.json --state st --json >p.json || fail "json"
head -2 p.json | grep -q '"format": "kiln-provenance/1"' || fail "json format: $(head -3 p.json)"
for k in '"verified": true' '"problems": \[\]' '"change": "rollback"' "\"digest\": \"sha256:$d1\"" \
    '"signature_check": {' '"status": "registry"'; do
    grep -q "$k" p.json || fail "json lacks $k"
done

# A stricter client (two release keys): exit 1, the failure named, the rest still shown.
# '|' delimits: a base64 key may hold '/'.
sed 's|"roles":\["release"\]},|"roles":["release"]},{"name":"rel2","pubkey":"'"$(tail -1 rel2.pub)"'","roles":["release"]},|; s|"channels"|"release_threshold":2,"channels"|' \
    trust.json >strict.json
grep -q rel2 strict.json || fail "strict policy"
expect_fail 1 $KILN provenance market@production --registry "$URL" --trust strict.json --state st2
grep -q "release signatures: rel .*\[FAILED: .*needs 2 distinct release keys" out || fail "strict: $(cat out)"
grep -q "^lineage     run .*\[FAILED" out || fail "lineage not flagged under a failed signature: $(cat out)"
grep -q "^channel     production seq 3 -> 1.0.0" out || fail "the rest is not shown: $(cat out)"
grep -q "^result      FAILED: [0-9]* checks did not pass" out || fail "result: $(cat out)"
grep -q "did not pass" err || fail "error line: $(cat err)"
