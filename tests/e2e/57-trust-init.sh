#!/bin/sh
# kiln trust init writes a policy that the verifiers accept (an archive signed by its release
# key verifies; a stranger's does not), names keys by their files, merges a key given under two
# roles, and refuses what no verifier would accept without writing anything (issue 30).
. "$(dirname "$0")/lib.sh"
cd "$T"
for k in root-a rel alice bob stranger; do $KILN keygen --out $k --no-password >/dev/null; done
$KILN trust init --out trust.json --root-key root-a.pub --release-key rel.pub --promote-key alice.pub \
    --promote-key bob=bob.pub --release-key bob=bob.pub --channel production:2 --accept-unvalidated >out ||
    fail "trust init: $(cat out)"
grep -q "^wrote trust.json: trust policy version 1, 4 keys, root threshold 1, production needs 2$" out || fail "summary: $(cat out)"
/usr/bin/python3 - <<'PY' || fail "the policy: $(cat trust.json)"
import json
p = json.load(open("trust.json"))
keys = {k["name"]: sorted(k["roles"]) for k in p["keys"]}
assert keys == {"root-a": ["root"], "rel": ["release"], "alice": ["promote"], "bob": ["promote", "release"]}, keys
assert p["channels"] == {"production": {"threshold": 2}} and p["version"] == 1 and p["accept_unvalidated"] is True
PY
signed_archive one 1.0.0 "$T/a.kiln" rel.key
$KILN verify "$T/a.kiln" --trust trust.json >/dev/null || fail "an archive signed by the release key does not verify"
signed_archive two 1.0.1 "$T/b.kiln" stranger.key
expect_fail 1 $KILN verify "$T/b.kiln" --trust trust.json
# Refused, nothing written.
expect_fail 2 $KILN trust init --out t2.json --release-key rel.pub --promote-key alice.pub --channel production:3
grep -q "threshold 3 can never be met" err || fail "threshold: $(cat err)"
expect_fail 2 $KILN trust init --out t2.json --release-key rel.pub --channel production
grep -q "expected NAME:THRESHOLD" err || fail "channel: $(cat err)"
expect_fail 2 $KILN trust init --out t2.json --release-key rel.key
grep -q "'rel.key' is a secret key file: give its public key" err || fail "a secret key file: $(cat err)"
expect_fail 2 $KILN trust init --out t2.json --release-key rel.pub --promote-key rel=alice.pub
grep -q "two keys are named 'rel'" err || fail "name clash: $(cat err)"
[ ! -e t2.json ] || fail "a refused policy was written"
cp trust.json before.json
expect_fail 2 $KILN trust init --out trust.json --release-key rel.pub
cmp -s trust.json before.json || fail "an existing policy was replaced"
echo "57-trust-init: ok"
