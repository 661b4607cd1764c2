#!/bin/sh
# Registry tokens as a platform engineer manages them: create with and without an expiry,
# list (never a secret or its hash), revoke while `kiln registry serve` runs (the next
# request is refused with 401 and says when), an expired token refused, refusals counted in
# /metrics and not audited, a revoked name not reused, and a store made before tokens could
# expire (the old tables, by hand) opened, migrated and served.
. "$(dirname "$0")/lib.sh"
R=$T/reg
CI=$($KILN registry token create --root "$R" --name ci --scope publish --expires 90d)
OPS=$($KILN registry token create --root "$R" --name ops --scope admin)
SHORT=$($KILN registry token create --root "$R" --name short --scope read --expires 1s)
echo "$CI" | grep -q '^kiln_[0-9a-f]\{64\}$' || fail "token format: $CI"
# Expiries that are not durations or times, or are past: refused, nothing made.
for bad in soon 0d -5d 12x 2026-13-01T00:00:00Z; do
    expect_fail 2 $KILN registry token create --root "$R" --name later --scope read --expires "$bad"
    grep -q -- "--expires.*'$bad'" "$T/err" || fail "--expires $bad: $(cat "$T/err")"
done
expect_fail 2 $KILN registry token create --root "$R" --name later --scope read --expires 2020-01-01T00:00:00Z
grep -q -- "--expires: '2020-01-01T00:00:00Z' is in the past" "$T/err" || fail "past expiry: $(cat "$T/err")"

$KILN registry token list --root "$R" >"$T/list"
head -1 "$T/list" | grep -q '^name  *scope  *created  *expires  *last used  *state$' || fail "list header: $(cat "$T/list")"
grep -q '^ci  *publish  *20[0-9-]*T[0-9:]*Z  *20[0-9-]*T[0-9:]*Z  *never  *active$' "$T/list" || fail "ci row: $(cat "$T/list")"
grep -q '^ops  *admin  *20[0-9-]*T[0-9:]*Z  *never  *never  *active$' "$T/list" || fail "ops row: $(cat "$T/list")"
$KILN registry token list --root "$R" --json >"$T/list.json"
grep -q '"name": "ops"' "$T/list.json" && grep -q '"expires": null' "$T/list.json" || fail "json: $(cat "$T/list.json")"
! grep -q later "$T/list" || fail "a refused create made a token"
for t in "$CI" "$OPS" "$SHORT"; do
    h=$(printf '%s' "$t" | sha256sum | cut -c1-64)
    ! grep -q -e "${t#kiln_}" -e "$h" "$T/list" "$T/list.json" || fail "list shows a token or its hash"
done

serve_registry "$R" --read-token-required
# req TOKEN PATH: the status; the body in $T/body.
req() { curl -s -o "$T/body" -w '%{http_code}' -H "Authorization: Bearer $1" "$URL$2"; }
[ "$(req "$CI" /v1/models)" = 200 ] || fail "ci before revoke: $(cat "$T/body")"
$KILN registry token list --root "$R" | grep -q '^ci  *publish  *[^ ]*  *[^ ]*  *20[0-9-]*T[0-9:]*Z  *active$' ||
    fail "last used not shown: $($KILN registry token list --root "$R")"

# Revoke while the server runs: the very next request is refused.
$KILN registry token revoke --root "$R" --name ci --reason "leaked in a CI log" >"$T/revoke.out"
grep -q "^revoked token 'ci' at 20[0-9-]*T[0-9:]*Z$" "$T/revoke.out" || fail "revoke output: $(cat "$T/revoke.out")"
AT=$(sed 's/.* at //' "$T/revoke.out")
audit0=$(sqlite3 "$R/registry.db" 'SELECT count(*) FROM audit')
[ "$(req "$CI" /v1/models)" = 401 ] || fail "revoked token accepted: $(cat "$T/body")"
[ "$(cat "$T/body")" = "{\"error\":\"token 'ci' was revoked at $AT\"}" ] || fail "401 body: $(cat "$T/body")"
# A client sees the server's message.
expect_fail 2 $KILN channel history demo --channel staging --registry "$URL" --token "$CI"
grep -q "HTTP 401: token 'ci' was revoked at $AT" "$T/err" || fail "client message: $(cat "$T/err")"
[ "$(req "$OPS" /v1/models)" = 200 ] || fail "other token refused"
$KILN registry token list --root "$R" | grep -q "^ci .* revoked $AT: leaked in a CI log$" || fail "list after revoke: $($KILN registry token list --root "$R")"
[ "$(sqlite3 "$R/registry.db" "SELECT count(*) FROM audit WHERE action = 'token.revoke' AND token = 'ci' AND reason = 'leaked in a CI log'")" = 1 ] ||
    fail "no token.revoke audit row"
# Twice, unknown, bad name: exit 2, nothing changed; a revoked name is not reused.
expect_fail 2 $KILN registry token revoke --root "$R" --name ci
grep -q "token 'ci' in '$R' was revoked already, at $AT" "$T/err" || fail "revoke twice: $(cat "$T/err")"
expect_fail 2 $KILN registry token revoke --root "$R" --name nobody
grep -q "no token named 'nobody'" "$T/err" || fail "revoke unknown: $(cat "$T/err")"
expect_fail 2 $KILN registry token revoke --root "$R" --name ../ops
expect_fail 2 $KILN registry token create --root "$R" --name ci --scope read
grep -q "token name 'ci' .* belongs to a token revoked at $AT; names are not reused" "$T/err" || fail "reuse: $(cat "$T/err")"

# The expired token (1 s): 401 saying when.
i=0
while [ "$(req "$SHORT" /v1/models)" != 401 ]; do i=$((i + 1)); [ $i -lt 40 ] || fail "short token never expired"; sleep 0.1; done
grep -q "^{\"error\":\"token 'short' expired at 20[0-9-]*T[0-9:]*Z\"}$" "$T/body" || fail "expired body: $(cat "$T/body")"
$KILN registry token list --root "$R" | grep -q '^short .* expired$' || fail "list: short not expired"
# Refusals are counted, never audited.
[ "$(sqlite3 "$R/registry.db" 'SELECT count(*) FROM audit')" = "$audit0" ] || fail "refusals were audited"
[ "$(req "$OPS" /metrics)" = 200 ] || fail "metrics"
grep -q '^kiln_registry_auth_refused_total{reason="revoked"} 2$' "$T/body" || fail "metrics revoked: $(grep refused "$T/body")"
grep -q '^kiln_registry_auth_refused_total{reason="expired"} [1-9]' "$T/body" || fail "metrics expired: $(grep refused "$T/body")"
kill -TERM $PID
wait $PID || fail "server exit status"
$KILN registry fsck --root "$R" >/dev/null || fail "fsck after revocations"

# A store the previous kiln made (its tables, by hand, one token): it opens, is migrated in
# place, fsck accepts it and its token is served, listed and revoked like any other.
O=$T/old
mkdir -p "$O"
H=$(printf 'kiln_legacy' | sha256sum | cut -c1-64)
sqlite3 "$O/registry.db" "PRAGMA journal_mode=WAL;
CREATE TABLE versions(model TEXT NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL, size INTEGER NOT NULL, manifest TEXT NOT NULL, signature TEXT NOT NULL, card TEXT, validation TEXT, publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, version));
CREATE TABLE channel_records(model TEXT NOT NULL, channel TEXT NOT NULL, seq INTEGER NOT NULL, version TEXT NOT NULL, digest TEXT NOT NULL, expires INTEGER NOT NULL, reason TEXT, record TEXT NOT NULL, publisher TEXT NOT NULL, created INTEGER NOT NULL, PRIMARY KEY(model, channel, seq));
CREATE TABLE tokens(name TEXT PRIMARY KEY, hash TEXT NOT NULL UNIQUE, scope TEXT NOT NULL, created INTEGER NOT NULL);
CREATE TABLE audit(id INTEGER PRIMARY KEY AUTOINCREMENT, time INTEGER NOT NULL, token TEXT, action TEXT NOT NULL, model TEXT, version TEXT, channel TEXT, digest TEXT);
INSERT INTO tokens VALUES('legacy', '$H', 'read', 1700000000);" >/dev/null
$KILN registry token list --root "$O" >"$T/old.list" || fail "old store: $(cat "$T/old.list")"
grep -q '^legacy  *read  *2023-11-14T22:13:20Z  *never  *never  *active$' "$T/old.list" || fail "old store list: $(cat "$T/old.list")"
[ "$(sqlite3 "$O/registry.db" 'PRAGMA user_version')" -ge 1 ] || fail "old store not migrated"
$KILN registry fsck --root "$O" >/dev/null || fail "fsck of the migrated store"
$KILN registry serve --root "$O" --listen 127.0.0.1:0 --read-token-required >"$T/old.out" 2>"$T/old.err" &
PID=$!
serve_url "$T/old.out" "$T/old.err"
[ "$(req kiln_legacy /v1/models)" = 200 ] || fail "old token: $(cat "$T/body")"
$KILN registry token revoke --root "$O" --name legacy >/dev/null
[ "$(req kiln_legacy /v1/models)" = 401 ] || fail "old token after revoke"
kill -TERM $PID
wait $PID
