#!/bin/sh
# kiln models as a platform engineer runs it: a registry's models and channels as the registry
# states them, then each channel's signed record verified on this side with --trust; a store
# edited behind the server's back (a record's bytes, the listing's version) and a policy that
# does not hold the promote key give NOT VERIFIED and exit 1; --expiring names a record
# promoted with a short --expires (exit 1), an unknown model exits 2, --json carries it all,
# a registry down before a good one is passed over; /metrics has each channel's expiry.
# The models are a few bytes signed with --allow-unvalidated, as in 60-registry.sh.
. "$(dirname "$0")/lib.sh"
R=$T/reg
for k in rel p1 stranger; do $KILN keygen --out "$T/$k" --no-password >/dev/null; done
pk() { sed -n 2p "$T/$1.pub"; }
policy() { # FILE PROMOTE-KEY
    cat >"$1" <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(pk rel)","roles":["release"]},
 {"name":"p1","pubkey":"$(pk "$2")","roles":["promote"]}],
 "channels":{"staging":{"threshold":1},"production":{"threshold":1}},"accept_unvalidated":true}
JSON
}
policy "$T/trust.json" p1
policy "$T/other.json" stranger # the same names, another key where p1 was
for v in 1.0.0 1.1.0; do signed_archive "$v" "$v" "$T/a-$v.kiln" "$T/rel.key"; done
PUB=$($KILN registry token create --root "$R" --name ci --scope publish)
PROM=$($KILN registry token create --root "$R" --name release-manager --scope promote)
serve_registry "$R" --trust "$T/trust.json"
for v in 1.0.0 1.1.0; do $KILN publish "$T/a-$v.kiln" --registry "$URL" --token "$PUB" >/dev/null; done
P="--key $T/p1.key --registry $URL --token $PROM"
$KILN promote demo 1.0.0 --channel staging $P >/dev/null
$KILN promote demo 1.1.0 --channel staging $P --expires 2h --reason "nightly validation passed" >/dev/null
$KILN promote demo 1.0.0 --channel production $P >/dev/null

# As the registry states it: said once, each channel with its expiry and reason.
$KILN models --registry "$URL" >"$T/ls" 2>"$T/ls.err" || fail "models: $(cat "$T/ls" "$T/ls.err")"
[ "$(grep -c 'unverified' "$T/ls")" = 1 ] || fail "unverified said once: $(cat "$T/ls")"
grep -q '^demo  2 versions, newest 1.1.0, last change [0-9T:Z-]\{20\}$' "$T/ls" || fail "model line: $(cat "$T/ls")"
grep -q "^  production  1\.0\.0 *1  [0-9T:Z-]\{20\} in [23][09] d *'promote'\$" "$T/ls" || fail "production row: $(cat "$T/ls")"
grep -q "^  staging  *1\.1\.0 *2  [0-9T:Z-]\{20\} expires soon, in [0-9]* \(min\|h\) *'nightly validation passed'\$" "$T/ls" ||
    fail "staging row: $(cat "$T/ls")"
grep -q ' verified$' "$T/ls" && fail "a verdict without --trust: $(cat "$T/ls")"

# With NAME and --trust: the versions, and each record verified on this side.
S="--trust $T/trust.json --state $T/st"
$KILN models demo --registry "$URL" $S >"$T/one" || fail "models demo: $(cat "$T/one")"
grep -q '^records     verified under trust policy version 1' "$T/one" || fail "trust line: $(cat "$T/one")"
grep -q '^  1\.1\.0  *sha256:[0-9a-f]\{12\}  *[0-9]* B  *ci  *[0-9T:Z-]\{20\}  none$' "$T/one" || fail "version row: $(cat "$T/one")"
[ "$(grep -c ' verified$' "$T/one")" = 2 ] || fail "both records verified: $(cat "$T/one")"
sed -n '/^versions/,/^channels/p' "$T/one" | sed -n 3p | grep -q '^  1\.1\.0 ' || fail "newest version first: $(cat "$T/one")"

# A record's bytes edited in the store: its signature no longer verifies.
sqlite3 "$R/registry.db" "UPDATE channel_records SET record = replace(record, 'nightly', 'Nightly') WHERE channel = 'staging' AND seq = 2"
expect_fail 1 $KILN models --registry "$URL" $S
grep -q "^  staging .* NOT VERIFIED: 'channel record demo@staging: signature 1': signature verification failed" "$T/out" ||
    fail "tampered record: $(cat "$T/out")"
grep -q "^  production .* verified\$" "$T/out" || fail "the other record: $(cat "$T/out")"
grep -q '^kiln: error: 1 channel record did not verify: demo/staging' "$T/err" || fail "error line: $(cat "$T/err")"
sqlite3 "$R/registry.db" "UPDATE channel_records SET record = replace(record, 'Nightly', 'nightly') WHERE channel = 'staging' AND seq = 2"
# The listing lies about production's version: the signed record's is shown, and flagged.
sqlite3 "$R/registry.db" "UPDATE channel_records SET version = '1.1.0' WHERE channel = 'production'"
expect_fail 1 $KILN models --registry "$URL" $S
grep -q "^  production  1\.0\.0 .*NOT VERIFIED: the registry lists 1\.1\.0 (sha256:.*) at seq 1, but the signed record says 1\.0\.0" "$T/out" ||
    fail "a lying listing: $(cat "$T/out")"
sqlite3 "$R/registry.db" "UPDATE channel_records SET version = '1.0.0' WHERE channel = 'production'"
# A policy that does not hold the promote key.
expect_fail 1 $KILN models --registry "$URL" --trust "$T/other.json" --state "$T/st2"
[ "$(grep -c "NOT VERIFIED: .*which is not in the trust policy '$T/other.json'" "$T/out")" = 2 ] ||
    fail "another policy: $(cat "$T/out")"
$KILN models --registry "$URL" $S >/dev/null || fail "the store restored"

# --expiring: staging's record (2 h) within a day, nothing within an hour.
expect_fail 1 $KILN models --registry "$URL" $S --expiring 1d
grep -q '^1 of 2 channel records expires within 1d' "$T/out" || fail "expiring count: $(cat "$T/out")"
grep -q "^  demo/staging  1\.1\.0  seq 2  .* expires soon, in .*  'nightly validation passed'  verified\$" "$T/out" ||
    fail "expiring row: $(cat "$T/out")"
grep -q 'production' "$T/out" && fail "production listed as expiring: $(cat "$T/out")"
grep -q '^kiln: error: 1 channel record expires within 1d (or expired): demo/staging$' "$T/err" || fail "expiring error: $(cat "$T/err")"
$KILN models --registry "$URL" --expiring 1h >"$T/none" || fail "nothing within an hour: $(cat "$T/none")"
grep -q '^0 of 2 channel records expire within 1h' "$T/none" || fail "none expiring: $(cat "$T/none")"

# An unknown model, and usage errors.
expect_fail 2 $KILN models nosuch --registry "$URL"
grep -q "registry '$URL' has no model 'nosuch'" "$T/err" || fail "unknown model: $(cat "$T/err")"
expect_fail 2 $KILN models --registry "$URL" --expiring soon
grep -q "expiring 'soon' is not a duration" "$T/err" || fail "bad --expiring: $(cat "$T/err")"
expect_fail 2 $KILN models --registry "$URL" --state "$T/st"
grep -q 'give --trust too' "$T/err" || fail "--state alone: $(cat "$T/err")"

# --json: every field, the verdicts, RFC 3339 times (checked with grep: no JSON tool is in
# the Makefile's packages).
$KILN models --registry "$URL" $S --json >"$T/json" || fail "json: $(cat "$T/json")"
for want in '"format": "kiln-models/1"' '"verified": true' '"name": "demo"' '"version_count": 2' \
    '"latest": "1.1.0"' '"expiry": "expires soon"' '"source": "record"' '"signed_by": \[' \
    '"status": "verified"' '"validation": "none"' '"put_by": "release-manager"'; do
    grep -q "$want" "$T/json" || fail "json lacks $want: $(cat "$T/json")"
done
grep -q '"expires": "[0-9]\{4\}-[0-9][0-9]-[0-9][0-9]T[0-9][0-9]:[0-9][0-9]:[0-9][0-9]Z"' "$T/json" || fail "json times"

# A registry down before a good one: passed over, said so.
$KILN models --registry http://127.0.0.1:1 --registry "$URL" $S >"$T/fo" 2>"$T/fo.err" || fail "failover: $(cat "$T/fo.err")"
grep -q "^registries  $URL answered, of http://127.0.0.1:1, $URL\$" "$T/fo" || fail "failover line: $(cat "$T/fo")"
grep -q "trying $URL" "$T/fo.err" || fail "failover note: $(cat "$T/fo.err")"

# /metrics: each channel's current record's expiry.
exp=$(sqlite3 "$R/registry.db" "SELECT expires FROM channel_records WHERE channel = 'staging' ORDER BY seq DESC LIMIT 1")
curl -s "$URL/metrics" >"$T/metrics"
grep -q "^kiln_registry_channel_expiry_timestamp_seconds{model=\"demo\",channel=\"staging\"} $exp\$" "$T/metrics" ||
    fail "expiry gauge: $(grep expiry "$T/metrics")"
