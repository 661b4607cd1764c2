#!/bin/sh
# A promote key is stolen: the platform engineer's story. A registry serves trust version 1
# (root keys r1 r2, root_threshold 2; promote keys alice bob carol, production threshold 2);
# alice and bob promote, a service pulls. Version 2 removes alice, signed by r1 and r2, and
# goes to the registry with kiln trust put: from the service's next pull a record alice
# co-signed no longer verifies, one by bob and carol does. A version 3 signed by one root key
# is refused by the server and by a client; a hand-made file in a client's state refuses its
# pull; a new service configured with the signed version 2 works. docs/registry.md, "A key
# was stolen".
. "$(dirname "$0")/lib.sh"
R=$T/reg
for k in r1 r2 alice bob carol rel; do $KILN keygen --out "$T/$k" --no-password >/dev/null; done
pk() { sed -n 2p "$T/$1.pub"; }
key() { printf '{"name":"%s","pubkey":"%s","roles":["%s"]}' "$1" "$(pk "$1")" "$2"; }
# policy FILE VERSION PROMOTE-KEYS...
policy() {
    f=$1 v=$2; shift 2
    keys="$(key r1 root),$(key r2 root),$(key rel release)"
    for p; do keys="$keys,$(key "$p" promote)"; done
    printf '{"format":"kiln-trust/1","version":%s,"root_threshold":2,"keys":[%s],"channels":{"production":{"threshold":2}},"accept_unvalidated":true}\n' \
        "$v" "$keys" >"$f"
}
policy "$T/trust.json" 1 alice bob carol
mkdir -p "$T/m"
printf 'weights' >"$T/m/model.safetensors"
printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}' >"$T/m/card.json"
$KILN pack "$T/m" --name demo --version 1.0.0 --out "$T/a.kiln" >/dev/null
$KILN sign "$T/a.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null

ADM=$($KILN registry token create --root "$R" --name ops --scope admin)
PUB=$($KILN registry token create --root "$R" --name ci --scope publish)
PROM=$($KILN registry token create --root "$R" --name rm --scope promote)
serve_registry "$R" --trust "$T/trust.json"
$KILN publish "$T/a.kiln" --registry "$URL" --token "$PUB" >/dev/null
# promote REC SEQ-NOTE KEY1 KEY2: a production record signed by two keys, put.
promote() {
    $KILN promote demo 1.0.0 --channel production --key "$T/$2.key" --registry "$URL" --token "$PROM" --out "$T/$1" >/dev/null
    $KILN channel sign --add "$T/$1" --key "$T/$3.key" >/dev/null
}
promote rec1.json alice bob
$KILN channel put "$T/rec1.json" --registry "$URL" --token "$PROM" >/dev/null
S="--registry $URL --trust $T/trust.json --state $T/svc-state"
$KILN pull demo@production $S --out "$T/svc" >/dev/null || fail "first pull"

# alice's key is stolen: version 2 without her, signed by both root keys.
sed -e 's/"version":1/"version":2/' -e 's/,{"name":"alice"[^}]*}//' "$T/trust.json" >"$T/v2.json"
! grep -q alice "$T/v2.json" || fail "v2 still names alice"
$KILN trust sign "$T/v2.json" --key "$T/r1.key" --out "$T/v2.signed.json" | grep -q '^signed trust policy .* (1 signature' ||
    fail "trust sign"
expect_fail 1 $KILN trust verify "$T/v2.signed.json" --trust "$T/trust.json"
grep -q "needs 2 distinct root keys of version 1, signed by 1 ('r1')" "$T/err" || fail "one root: $(cat "$T/err")"
expect_fail 1 $KILN trust put "$T/v2.signed.json" --registry "$URL" --token "$ADM"
grep -q 'HTTP 422' "$T/err" || fail "server took one root: $(cat "$T/err")"
$KILN trust sign --add "$T/v2.signed.json" --key "$T/r2.key" >/dev/null
expect_fail 2 $KILN trust sign --add "$T/v2.signed.json" --key "$T/r2.key"
grep -q 'is already signed by key id' "$T/err" || fail "second signature by r2: $(cat "$T/err")"
$KILN trust verify "$T/v2.signed.json" --trust "$T/trust.json" >"$T/verify.out" || fail "verify v2"
grep -q "^  key 'alice' ([0-9A-F]*) removed (promote)$" "$T/verify.out" || fail "changes: $(cat "$T/verify.out")"
grep -q "^root quorum of version 1: 2 of 2 required$" "$T/verify.out" || fail "quorum: $(cat "$T/verify.out")"
expect_fail 2 $KILN trust put "$T/v2.signed.json" --registry "$URL" --token "$PROM"
grep -q 'HTTP 403' "$T/err" || fail "put with a promote token: $(cat "$T/err")"
$KILN trust put "$T/v2.signed.json" --registry "$URL" --token "$ADM" | grep -q '^trust policy version 2 stored' ||
    fail "trust put"

# The attacker signs a record with alice's key and bob's: the registry refuses it, and the
# record alice co-signed before no longer verifies at the service's next pull.
promote rec2.json alice bob
expect_fail 1 $KILN channel put "$T/rec2.json" --registry "$URL" --token "$PROM"
grep -q "HTTP 422.*not in the trust policy" "$T/err" || fail "alice's record put: $(cat "$T/err")"
expect_fail 1 $KILN pull demo@production $S --out "$T/svc"
grep -q "not in the trust policy" "$T/err" || fail "pull of alice's record: $(cat "$T/err")"
[ -f "$T/svc-state/trust/2.json" ] || fail "version 2 not kept in state"
cmp -s "$T/svc-state/trust/2.json" "$T/v2.signed.json" || fail "state holds other bytes"
expect_fail 1 $KILN channel verify "$T/rec2.json" --trust "$T/svc-state/trust/2.json"
$KILN trust update $S >"$T/update.out" || fail "trust update"
grep -q '^trust version 2: accepted before' "$T/update.out" || fail "update: $(cat "$T/update.out")"
# bob and carol promote: that record goes in and the service pulls it.
promote rec3.json bob carol
$KILN channel put "$T/rec3.json" --registry "$URL" --token "$PROM" >/dev/null || fail "bob+carol put"
$KILN pull demo@production $S --out "$T/svc" >/dev/null || fail "pull of bob+carol's record"

# A version 3 (alice back) signed by one root key: refused by the server and by a client
# (served by a compromised registry, here by writing its database).
sed 's/"version":1/"version":3/' "$T/trust.json" >"$T/v3.json"
$KILN trust sign "$T/v3.json" --key "$T/r1.key" --out "$T/v3.signed.json" >/dev/null
expect_fail 1 $KILN trust put "$T/v3.signed.json" --registry "$URL" --token "$ADM"
grep -q "HTTP 422.*needs 2 distinct root keys of version 2, signed by 1 ('r1')" "$T/err" || fail "v3 put: $(cat "$T/err")"
if command -v sqlite3 >/dev/null; then
    sqlite3 "$R/registry.db" "INSERT INTO trust_versions VALUES(3, readfile('$T/v3.signed.json'), 'evil', 0)"
    expect_fail 1 $KILN pull demo@production $S --out "$T/svc"
    grep -q "'trust v3 from $URL': needs 2 distinct root keys of version 2" "$T/err" || fail "client took v3: $(cat "$T/err")"
    [ ! -e "$T/svc-state/trust/3.json" ] || fail "a refused version was saved"
    sqlite3 "$R/registry.db" "DELETE FROM trust_versions WHERE version = 3"
fi
# A file put in the state by hand is checked again: the pull is refused, naming it.
cp "$T/v3.signed.json" "$T/svc-state/trust/3.json"
ls -lR "$T/svc-state" "$T/svc" >"$T/before"
expect_fail 1 $KILN pull demo@production $S --out "$T/svc"
grep -q "$T/svc-state/trust/3.json" "$T/err" || fail "tampered state: $(cat "$T/err")"
ls -lR "$T/svc-state" "$T/svc" >"$T/after"
cmp -s "$T/before" "$T/after" || fail "a refused pull changed the state or the model"
rm "$T/svc-state/trust/3.json"
# A new service is given the signed version 2 as its trust.json.
$KILN pull demo@production --registry "$URL" --trust "$T/v2.signed.json" --state "$T/new-state" --out "$T/new" >/dev/null ||
    fail "a service configured with the signed version 2"
# A fork: r1 and r2 also signed another version 2 (carol out instead of alice) and the
# registry's copy is swapped for it; the service, holding the first, refuses and says so.
if command -v sqlite3 >/dev/null; then
    sed -e 's/"version":1/"version":2/' -e 's/,{"name":"carol"[^}]*}//' "$T/trust.json" >"$T/v2b.json"
    $KILN trust sign "$T/v2b.json" --key "$T/r1.key" --out "$T/v2b.signed.json" >/dev/null
    $KILN trust sign --add "$T/v2b.signed.json" --key "$T/r2.key" >/dev/null
    sqlite3 "$R/registry.db" "UPDATE trust_versions SET document = readfile('$T/v2b.signed.json') WHERE version = 2"
    expect_fail 1 $KILN pull demo@production $S --out "$T/svc"
    grep -q "is trust version 2, and so is '$T/svc-state/trust/2.json', but they are different policies (key 'carol'" "$T/err" ||
        fail "fork: $(cat "$T/err")"
    sqlite3 "$R/registry.db" "UPDATE trust_versions SET document = readfile('$T/v2.signed.json') WHERE version = 2"
    $KILN pull demo@production $S --out "$T/svc" >/dev/null || fail "pull once the fork is undone"
fi
# The model in production is found harmful: version 3, signed by both root keys, withdraws
# its archive. The registry then refuses it as an upload and as a channel's version; the
# service's next pull and the host's check of what it runs refuse it, naming the reason.
D=$(sha256sum "$T/a.kiln" | cut -d' ' -f1)
$KILN trust withdraw "$T/v2.signed.json" --digest "sha256:$D" --reason "leaks the label into the features" \
    --out "$T/w3.json" >"$T/withdraw.out" || fail "trust withdraw: $(cat "$T/withdraw.out")"
grep -q "^wrote $T/w3.json: trust policy version 3, after version 2 ('$T/v2.signed.json')$" "$T/withdraw.out" &&
    grep -q "^  withdraws sha256:$D: leaks the label into the features$" "$T/withdraw.out" ||
    fail "trust withdraw: $(cat "$T/withdraw.out")"
# Refused, writing nothing: a digest that is not one, an empty reason, an --out that exists.
expect_fail 2 $KILN trust withdraw "$T/v2.signed.json" --digest "sha256:$D" --reason "x" --out "$T/w3.json"
grep -q "'$T/w3.json' exists already" "$T/err" || fail "withdraw over a file: $(cat "$T/err")"
expect_fail 2 $KILN trust withdraw "$T/v2.signed.json" --digest "$D" --reason "x" --out "$T/wbad.json"
grep -q "'digest' must be an archive's" "$T/err" || fail "withdraw a bare hex: $(cat "$T/err")"
expect_fail 2 $KILN trust withdraw "$T/v2.signed.json" --digest "sha256:$D" --reason "" --out "$T/wbad.json"
grep -q "'reason' must be 1 to" "$T/err" || fail "withdraw without a reason: $(cat "$T/err")"
[ ! -e "$T/wbad.json" ] || fail "a refused withdrawal wrote a file"
$KILN trust sign "$T/w3.json" --key "$T/r1.key" --out "$T/w3.signed.json" >/dev/null
$KILN trust sign --add "$T/w3.signed.json" --key "$T/r2.key" >/dev/null
$KILN trust put "$T/w3.signed.json" --registry "$URL" --token "$ADM" >/dev/null || fail "put the withdrawal"
$KILN trust update $S >"$T/update3.out" || fail "trust update to 3: $(cat "$T/update3.out")"
grep -q "withdraws sha256:$D: leaks the label into the features" "$T/update3.out" || fail "update 3: $(cat "$T/update3.out")"
expect_fail 2 $KILN trust withdraw "$T/w3.signed.json" --digest "sha256:$D" --reason "again" --out "$T/w4.json"
grep -q "withdraws sha256:$D already: leaks the label" "$T/err" || fail "withdraw twice: $(cat "$T/err")"
expect_fail 1 $KILN pull demo@production $S --out "$T/svc"
grep -q "sha256:$D, which trust policy version 3 withdrew: leaks the label into the features; refusing" "$T/err" ||
    fail "pull of a withdrawn model: $(cat "$T/err")"
expect_fail 1 $KILN pull demo@1.0.0 $S --out "$T/byversion"
grep -q "demo@1.0.0 is sha256:$D, which trust policy version 3 withdrew" "$T/err" || fail "pull by version: $(cat "$T/err")"
[ ! -e "$T/byversion" ] || fail "a refused pull installed a model"
expect_fail 1 $KILN installed demo@production --dir "$T/svc" --trust "$T/trust.json" --state "$T/svc-state"
grep -q "which trust policy version 3 withdrew" "$T/err" || fail "installed: $(cat "$T/err")"
# An auditor's and a platform engineer's view: each says the channel names a withdrawn model.
set +e
$KILN provenance demo@production $S >"$T/prov3" 2>&1; pst=$?
$KILN models --registry "$URL" --trust "$T/trust.json" --state "$T/svc-state" >"$T/models3" 2>&1; mst=$?
set -e
[ $pst = 1 ] && grep -q "withdrawn: trust policy version 3 withdrew sha256:$D: leaks the label" "$T/prov3" ||
    fail "provenance of a withdrawn model (exit $pst): $(cat "$T/prov3")"
[ $mst = 1 ] && grep -q "which trust policy v3 withdrew: leaks the label" "$T/models3" ||
    fail "models (exit $mst): $(cat "$T/models3")"
promote rec4.json bob carol
expect_fail 1 $KILN channel put "$T/rec4.json" --registry "$URL" --token "$PROM"
grep -q "HTTP 422.*which trust policy version 3 withdrew" "$T/err" || fail "put naming a withdrawn archive: $(cat "$T/err")"
expect_fail 1 $KILN publish "$T/a.kiln" --registry "$URL" --token "$PUB"
grep -q "HTTP 422.*the archive is sha256:$D, which trust policy version 3 withdrew" "$T/err" || fail "publish: $(cat "$T/err")"
# Two root keys and no root_threshold: refused, since one key alone would do.
sed 's/"root_threshold":2,//' "$T/v2.json" >"$T/nothreshold.json"
expect_fail 2 $KILN trust sign "$T/nothreshold.json" --key "$T/r1.key" --out "$T/x.json"
grep -q "2 keys hold the \"root\" role but 'root_threshold' is missing" "$T/err" || fail "no threshold: $(cat "$T/err")"
[ ! -e "$T/x.json" ] || fail "a refused sign wrote its output"

kill -TERM $PID
wait $PID
# A registry started from version 2 over a store without it warns: clients below cannot walk
# to it.
$KILN registry serve --root "$T/reg2" --listen 127.0.0.1:0 --trust "$T/v2.signed.json" >"$T/serve2.out" 2>"$T/serve2.err" &
PID=$!
serve_url "$T/serve2.out" "$T/serve2.err"
kill -TERM $PID
wait $PID || true
grep -q "is trust version 2, which the store does not hold: clients that trust an older version cannot walk to it" "$T/serve2.err" ||
    fail "no warning: $(cat "$T/serve2.err")"
# fsck checks the stored chain from version 1, and each record under it: one problem, the
# channel whose current record names the archive version 3 withdrew.
set +e
$KILN registry fsck --root "$R" --trust "$T/trust.json" >"$T/fsck.out" 2>&1
fst=$?
set -e
[ $fst = 1 ] && [ "$(grep -c '^problem: ' "$T/fsck.out")" = 1 ] &&
    grep -q "^problem: demo channel production seq 2: the channel's current record names demo@1.0.0 (sha256:$D), which trust policy version 3 withdrew: leaks the label into the features (no client installs it: move the channel)$" "$T/fsck.out" ||
    fail "fsck (exit $fst): $(cat "$T/fsck.out")"
grep -q 'trust policy version 2 in force' "$T/serve.err" || fail "serve log: $(cat "$T/serve.err")"
