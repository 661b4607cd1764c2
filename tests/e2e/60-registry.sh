#!/bin/sh
# The registry as an operator and its users drive it: tokens, a real server on a loopback
# port chosen at runtime, refusals, fsck and gc, and a clean stop on SIGTERM.
. "$(dirname "$0")/lib.sh"
R=$T/reg

# Tokens: printed once, stored hashed.
$KILN registry token create --root "$R" --name ci --scope publish >"$T/tok.pub"
$KILN registry token create --root "$R" --name reader --scope read >"$T/tok.read"
grep -q '^kiln_[0-9a-f]\{64\}$' "$T/tok.pub" || fail "token format: $(cat "$T/tok.pub")"
expect_fail 2 $KILN registry token create --root "$R" --name ci --scope read
grep -q "exists already" "$T/err" || fail "duplicate token message: $(cat "$T/err")"
expect_fail 2 $KILN registry token create --root "$R" --name x --scope root
expect_fail 2 $KILN registry token create --root "$R" --name ../x --scope read
if command -v sqlite3 >/dev/null; then
    [ "$(sqlite3 "$R/registry.db" "SELECT count(*) FROM tokens WHERE hash = '$(cat "$T/tok.pub")'")" = 0 ] ||
        fail "a token is stored in the clear"
fi

# Serve on a free port; the first line says where.
$KILN registry serve --root "$R" --listen 127.0.0.1:0 >"$T/serve.out" 2>"$T/serve.err" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
i=0
while ! grep -q 'http://' "$T/serve.out" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "server did not start: $(cat "$T/serve.err")"; sleep 0.05
done
URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$T/serve.out")
[ -n "$URL" ] || fail "no URL in: $(cat "$T/serve.out")"

# A second server on the same store is refused.
expect_fail 2 $KILN registry serve --root "$R" --listen 127.0.0.1:0
grep -q "held by another running server" "$T/err" || fail "second server: $(cat "$T/err")"
# gc refuses while the server holds the store.
expect_fail 2 $KILN registry gc --root "$R"

# Pull of something absent: a clear refusal, nothing at --out.
printf '{}' >"$T/trust.json"
expect_fail 2 $KILN pull nope@production --registry "$URL" --trust "$T/trust.json" --out "$T/model" --state "$T/state"
[ ! -e "$T/model" ] || fail "a failed pull left a model directory"

# SIGTERM: finishes and exits 0.
kill -TERM $PID
wait $PID || fail "server exited non-zero after SIGTERM: $(cat "$T/serve.err")"
grep -q 'stopped' "$T/serve.err" || fail "no clean stop: $(cat "$T/serve.err")"

$KILN registry fsck --root "$R" >"$T/fsck.out" || fail "fsck: $(cat "$T/fsck.out")"
$KILN registry gc --root "$R" | grep -q '^removed 0 unreferenced blobs' || fail "gc"
expect_fail 2 $KILN registry fsck --root "$T/none"
