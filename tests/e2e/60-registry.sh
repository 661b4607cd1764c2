#!/bin/sh
# The registry as its operator and users drive it: tokens, a real server on a loopback port
# chosen at runtime, publish, promote, pull, rollback and co-signing with keys from kiln
# keygen and archives from kiln pack signed with kiln sign; refusals; fsck, gc, SIGTERM.
# The models here are a few bytes, not validated: this script is about the registry, so they
# are signed with --allow-unvalidated and the policy accepts that; a client whose policy does
# not refuses them. Validated models go through the registry in 65-release.sh.
. "$(dirname "$0")/lib.sh"
R=$T/reg
for k in rel p1 p2 stranger; do $KILN keygen --out "$T/$k" --no-password >/dev/null; done
pk() { sed -n 2p "$T/$1.pub"; }
# policy FILE EXTRA: the registry's keys and channels; EXTRA adds top-level fields.
policy() {
    cat >"$1" <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(pk rel)","roles":["release"]},
 {"name":"p1","pubkey":"$(pk p1)","roles":["promote"]},
 {"name":"p2","pubkey":"$(pk p2)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1},"production":{"threshold":2}}$2}
JSON
}
policy "$T/trust.json" ', "accept_unvalidated": true'
policy "$T/strict.json" '' # the same keys, validated archives only (the default)
# archive CONTENT VERSION OUT [KEY]: lib.sh's signed_archive, by rel.key unless KEY is named.
archive() { signed_archive "$1" "$2" "$3" "$T/${4:-rel}.key"; }
archive one 1.0.0 "$T/a1.kiln"
archive two 1.1.0 "$T/a2.kiln"
archive other 1.0.0 "$T/a3.kiln"
archive evil 6.6.6 "$T/a4.kiln" stranger
# A version must look like one (a digit, or v and a digit, first): one named like a channel
# would make demo@production ambiguous. kiln pack says so; the server refuses it too
# (tests/test_registry_names.c).
mkdir -p "$T/m-prod" && printf 'w' >"$T/m-prod/model.safetensors" && printf '{}' >"$T/m-prod/card.json"
expect_fail 2 $KILN pack "$T/m-prod" --name demo --version production --out "$T/prod.kiln"
grep -q "version name 'production' does not look like a version" "$T/err" || fail "pack --version production: $(cat "$T/err")"
[ ! -e "$T/prod.kiln" ] || fail "a refused pack wrote its archive"

PUB=$($KILN registry token create --root "$R" --name ci --scope publish)
PROM=$($KILN registry token create --root "$R" --name release-manager --scope promote)
echo "$PUB" | grep -q '^kiln_[0-9a-f]\{64\}$' || fail "token format: $PUB"
expect_fail 2 $KILN registry token create --root "$R" --name ci --scope read
grep -q "exists already" "$T/err" || fail "duplicate token message: $(cat "$T/err")"
expect_fail 2 $KILN registry token create --root "$R" --name x --scope root
expect_fail 2 $KILN registry token create --root "$R" --name ../x --scope read
if command -v sqlite3 >/dev/null; then
    [ "$(sqlite3 "$R/registry.db" "SELECT count(*) FROM tokens WHERE hash = '$PUB'")" = 0 ] ||
        fail "a token is stored in the clear"
fi
serve_registry "$R" --trust "$T/trust.json"
# One server per store; gc waits for it to stop.
expect_fail 2 $KILN registry serve --root "$R" --listen 127.0.0.1:0
grep -q "held by another running server" "$T/err" || fail "second server: $(cat "$T/err")"
expect_fail 2 $KILN registry gc --root "$R"
# An address in use, or a directory that is not a store: refused before anything is made.
expect_fail 2 $KILN registry serve --root "$T/new-store" --listen "${URL#http://}"
grep -q "cannot listen on '${URL#http://}': Address already in use" "$T/err" || fail "address in use: $(cat "$T/err")"
[ ! -e "$T/new-store" ] || fail "a refused listen address left a store behind"
# Connection limits out of range: refused before anything is made.
expect_fail 2 $KILN registry serve --root "$T/new-store" --listen 127.0.0.1:0 --max-connections 0
grep -q "max-connections must be between 1 and 1000000" "$T/err" || fail "--max-connections 0: $(cat "$T/err")"
expect_fail 2 $KILN registry serve --root "$T/new-store" --listen 127.0.0.1:0 --per-ip-connections -1
grep -q "per-ip-connections must be between 0 (no limit)" "$T/err" || fail "--per-ip-connections -1: $(cat "$T/err")"
[ ! -e "$T/new-store" ] || fail "refused connection limits left a store behind"
mkdir "$T/not-a-store" && echo keep >"$T/not-a-store/notes.txt"
expect_fail 2 $KILN registry serve --root "$T/not-a-store" --listen 127.0.0.1:0
grep -q "'$T/not-a-store' is not a registry store (no registry.db) and is not empty" "$T/err" || fail "non-store root: $(cat "$T/err")"
[ "$(ls "$T/not-a-store")" = notes.txt ] || fail "a refused root was written into"

expect_fail 2 $KILN publish "$T/a1.kiln" --registry "$URL"
grep -q 'HTTP 401' "$T/err" || fail "publish without a token: $(cat "$T/err")"
expect_fail 2 $KILN publish "$T/a1.kiln" --registry "$URL" --token "$PROM"
grep -q 'HTTP 403' "$T/err" || fail "publish with a promote token: $(cat "$T/err")"
$KILN publish "$T/a1.kiln" --registry "$URL" --token "$PUB" | grep -q "^published: sha256:$(sha256sum "$T/a1.kiln" | cut -d' ' -f1) " ||
    fail "publish did not report the archive's digest"
$KILN publish "$T/a1.kiln" --registry "$URL" --token "$PUB" | grep -q '^already stored' || fail "idempotent publish"
expect_fail 2 $KILN publish "$T/a3.kiln" --registry "$URL" --token "$PUB"
grep -q 'HTTP 409' "$T/err" || fail "overwrite: $(cat "$T/err")"
expect_fail 1 $KILN publish "$T/a4.kiln" --registry "$URL" --token "$PUB"
grep -q 'not in the trust policy' "$T/err" || fail "stranger's archive: $(cat "$T/err")"
KILN_REGISTRY_TOKEN=$PUB $KILN publish "$T/a2.kiln" --registry "$URL" >/dev/null

# staging: promote, pull, promote, pull, rollback, pull.
S="--registry $URL --trust $T/trust.json --state $T/state"
$KILN promote demo 1.0.0 --channel staging --key "$T/p1.key" --registry "$URL" --token "$PROM" | grep -q 'seq 1' || fail "promote"
$KILN pull demo@staging $S --out "$T/svc" | grep -q 'seq 1' || fail "pull"
[ "$(cat "$T/svc/model.safetensors")" = "weights one" ] || fail "pulled bytes"
$KILN promote demo 1.1.0 --channel staging --key "$T/p1.key" --registry "$URL" --token "$PROM" >/dev/null
$KILN pull demo@staging $S --out "$T/svc" >/dev/null
[ "$(cat "$T/svc/model.safetensors")" = "weights two" ] || fail "pull after promote"
$KILN rollback demo --channel staging --key "$T/p1.key" --registry "$URL" --token "$PROM" | grep -q "1.0.0 .* seq 3, reason 'rollback'" ||
    fail "rollback"
$KILN pull demo@staging $S --out "$T/svc" >/dev/null
[ "$(cat "$T/svc/model.safetensors")" = "weights one" ] || fail "pull after rollback"
grep -q '"seq": 3' "$T/state/channels/demo/staging.json" || fail "state not kept"
# --out naming a directory of someone's files: refused (exit 2) before anything is fetched,
# every file kept. Only a model directory kiln installed (manifest.json and the files it
# lists, nothing else) or an empty one is replaced.
mkdir -p "$T/positions/sub"
printf 'sym,qty\nES,3\n' >"$T/positions/positions.csv"
printf '[risk]\nlimit=5\n' >"$T/positions/sub/config.ini"
expect_fail 2 $KILN pull demo@staging $S --out "$T/positions"
grep -q "'$T/positions' is not a model directory as kiln installs one: it has no manifest.json; a pull replaces only" "$T/err" ||
    fail "pull --out over other files: $(cat "$T/err")"
[ "$(cd "$T/positions" && find . | sort | tr '\n' ' ')" = ". ./positions.csv ./sub ./sub/config.ini " ] &&
    [ "$(cat "$T/positions/positions.csv")" = "$(printf 'sym,qty\nES,3')" ] &&
    [ "$(cat "$T/positions/sub/config.ini")" = "$(printf '[risk]\nlimit=5')" ] || fail "pull --out changed the directory"
expect_fail 1 $KILN installed demo@staging --dir "$T/positions" --trust "$T/trust.json" --state "$T/state"
grep -q "is not a model directory as kiln installs one" "$T/err" || fail "installed on other files: $(cat "$T/err")"
# A channel the registry does not have is an error, never a version of that name.
expect_fail 2 $KILN pull demo@canary $S --out "$T/canary"
grep -q "the registry has no channel 'canary' of 'demo'.*never read as a version" "$T/err" || fail "missing channel: $(cat "$T/err")"
[ ! -e "$T/canary" ] || fail "a refused pull left its directory"
# kiln installed: the host's own check, with no registry asked (the URL is not given).
$KILN installed demo@staging --dir "$T/svc" --trust "$T/trust.json" --state "$T/state" >"$T/inst" ||
    fail "installed: $(cat "$T/inst")"
grep -q "^installed   demo@1.0.0 in '$T/svc'" "$T/inst" && grep -q '^channel     staging seq 3,' "$T/inst" &&
    grep -q '^files       .* as manifest sha256:[0-9a-f]\{64\} says' "$T/inst" || fail "installed: $(cat "$T/inst")"
cp "$T/svc/model.safetensors" "$T/weights.bak"
printf 'weights 1ne' >"$T/svc/model.safetensors"
expect_fail 1 $KILN installed demo@staging --dir "$T/svc" --trust "$T/trust.json" --state "$T/state"
grep -q "model.safetensors': sha256 differs from the manifest" "$T/err" || fail "a changed file: $(cat "$T/err")"
cp "$T/weights.bak" "$T/svc/model.safetensors"
cp "$T/state/channels/demo/staging.json" "$T/staging.bak"
sed -i 's/"seq": 3/"seq": 4/' "$T/state/channels/demo/staging.json"
expect_fail 1 $KILN installed demo@staging --dir "$T/svc" --trust "$T/trust.json" --state "$T/state"
grep -q "seq 3, lower than 4 accepted before" "$T/err" || fail "a newer seq accepted: $(cat "$T/err")"
cp "$T/staging.bak" "$T/state/channels/demo/staging.json"
expect_fail 2 $KILN installed demo@production --dir "$T/svc" --trust "$T/trust.json" --state "$T/state"
grep -q "no pull of demo@production recorded in '$T/state'" "$T/err" || fail "no such pull: $(cat "$T/err")"
$KILN installed demo@staging --dir "$T/svc" --trust "$T/trust.json" --state "$T/state" >/dev/null || fail "restored"
$KILN channel history demo --channel staging --registry "$URL" >"$T/hist"
[ "$(grep -c 'release-manager' "$T/hist")" = 3 ] || fail "history: $(cat "$T/hist")"
grep -q '^3 *1\.0\.0 *sha256:[0-9a-f]\{12\} *1 *release-manager *[0-9T:Z-]\{20\} *rollback$' "$T/hist" || fail "history rollback row: $(cat "$T/hist")"
ls -a "$T" | grep -q '\.svc\.pull-' && fail "a temporary directory was left beside --out"

# production needs two promote keys: one is refused, the co-signed record goes in.
expect_fail 1 $KILN promote demo 1.1.0 --channel production --key "$T/p1.key" --registry "$URL" --token "$PROM"
grep -q 'needs 2 distinct promote keys' "$T/err" || fail "threshold: $(cat "$T/err")"
$KILN promote demo 1.1.0 --channel production --key "$T/p1.key" --registry "$URL" --token "$PROM" --out "$T/rec.json" >/dev/null
$KILN channel sign --add "$T/rec.json" --key "$T/p2.key" >/dev/null
$KILN channel put "$T/rec.json" --registry "$URL" --token "$PROM" | grep -q '2 signatures' || fail "co-signed put"
expect_fail 2 $KILN channel put "$T/rec.json" --registry "$URL" --token "$PROM"
grep -q 'HTTP 409' "$T/err" || fail "replayed put: $(cat "$T/err")"
$KILN pull demo@production $S --out "$T/prod" >/dev/null
[ "$(cat "$T/prod/model.safetensors")" = "weights two" ] || fail "pull production"
$KILN pull demo@1.0.0 $S --out "$T/byver" >"$T/pull.out"
grep -q '^pulled demo@1.0.0 sha256:' "$T/pull.out" || fail "pull by version: $(cat "$T/pull.out")"
grep -q '^signed by rel (1 of 1 release key; validation absent, signed with allow-unvalidated)$' "$T/pull.out" ||
    fail "pull does not say who signed: $(cat "$T/pull.out")"
# A client whose policy takes validated models only refuses them, whatever the server took.
expect_fail 1 $KILN pull demo@1.0.0 --registry "$URL" --trust "$T/strict.json" --state "$T/state" --out "$T/strict"
grep -q "allow-unvalidated.*does not accept unvalidated archives (accept_unvalidated)" "$T/err" || fail "strict client: $(cat "$T/err")"
[ ! -e "$T/strict" ] || fail "a refused pull left its directory"

# Audit and metrics over plain HTTP are the client's JSON reads; the log names the tokens.
if command -v sqlite3 >/dev/null; then
    [ "$(sqlite3 "$R/registry.db" "SELECT count(*) FROM audit WHERE token = 'release-manager' AND action IN ('promote', 'rollback')")" = 4 ] ||
        fail "audit rows for the promote token"
fi

# A rollback prepared in advance: right after a promotion, while both promote keys are at
# hand, the record back to the version before (seq + 1) is signed and kept off the registry;
# later one command, with a promote token only, puts it. Once the channel has moved past its
# seq it is refused, saying why.
$KILN promote demo 1.0.0 --channel production --key "$T/p1.key" --registry "$URL" --out "$T/rec2.json" >/dev/null
$KILN channel sign --add "$T/rec2.json" --key "$T/p2.key" >/dev/null
$KILN channel put "$T/rec2.json" --registry "$URL" --token "$PROM" >/dev/null
$KILN rollback demo --channel production --key "$T/p1.key" --registry "$URL" --out "$T/rb.json" >"$T/rb.out" || fail "prepare a rollback"
grep -q "^wrote $T/rb.json: demo/production -> 1.1.0 (sha256:[0-9a-f]\{64\}) seq 3, 1 signature$" "$T/rb.out" ||
    fail "prepare a rollback: $(cat "$T/rb.out")"
$KILN channel sign --add "$T/rb.json" --key "$T/p2.key" >/dev/null
$KILN channel put "$T/rb.json" --registry "$URL" --token "$PROM" >"$T/rb.put" || fail "put the prepared rollback"
grep -q '^demo/production -> 1.1.0 seq 3 (2 signatures)$' "$T/rb.put" || fail "prepared rollback: $(cat "$T/rb.put")"
$KILN pull demo@production $S --out "$T/prod" >/dev/null
[ "$(cat "$T/prod/model.safetensors")" = "weights two" ] || fail "pull after the prepared rollback"
$KILN rollback demo --channel production --key "$T/p1.key" --registry "$URL" --out "$T/rb2.json" >/dev/null
$KILN channel sign --add "$T/rb2.json" --key "$T/p2.key" >/dev/null
$KILN promote demo 1.0.0 --channel production --key "$T/p1.key" --registry "$URL" --out "$T/rec4.json" >/dev/null
$KILN channel sign --add "$T/rec4.json" --key "$T/p2.key" >/dev/null
$KILN channel put "$T/rec4.json" --registry "$URL" --token "$PROM" >/dev/null
expect_fail 2 $KILN channel put "$T/rb2.json" --registry "$URL" --token "$PROM"
grep -q 'HTTP 409: channel record for demo/production has seq 4, but the next must be 5' "$T/err" ||
    fail "a stale prepared rollback: $(cat "$T/err")"
# kiln renew: the current version re-signed with a new expiry, its record verified first.
$KILN renew demo --channel production --key "$T/p1.key" --registry "$URL" --trust "$T/trust.json" \
    --state "$T/state" --out "$T/renew.json" >"$T/renew.out" || fail "renew: $(cat "$T/renew.out")"
grep -q "^demo/production -> 1.0.0 (sha256:[0-9a-f]\{64\}) seq 5, reason 'renew' (the record it renews, seq 4, expires 20" "$T/renew.out" ||
    fail "renew said: $(cat "$T/renew.out")"
$KILN channel sign --add "$T/renew.json" --key "$T/p2.key" >/dev/null
$KILN channel put "$T/renew.json" --registry "$URL" --token "$PROM" | grep -q '^demo/production -> 1.0.0 seq 5 (2 signatures)$' ||
    fail "put the renewal"
$KILN pull demo@production $S --out "$T/prod" | grep -q 'seq 5' || fail "pull after renew"
$KILN channel history demo --channel production --registry "$URL" | grep -q '^5 *1\.0\.0 .* renew$' || fail "history: renew"
# Refused: a current record below the seq this client accepted (a registry serving an old
# record to get it renewed), and one the trust policy does not back; nothing is signed.
cp "$T/state/channels/demo/production.json" "$T/prod-state.bak"
sed -i 's/"seq": 5/"seq": 9/' "$T/state/channels/demo/production.json"
expect_fail 1 $KILN renew demo --channel production --key "$T/p1.key" --registry "$URL" --trust "$T/trust.json" \
    --state "$T/state" --out "$T/renew2.json"
grep -q "the current record of demo/production is seq 5, lower than 9 this client accepted: the registry serves an older record; refusing to renew it" "$T/err" ||
    fail "renew below the state: $(cat "$T/err")"
cp "$T/prod-state.bak" "$T/state/channels/demo/production.json"
cat >"$T/others.json" <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(pk rel)","roles":["release"]},
 {"name":"stranger","pubkey":"$(pk stranger)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1},"production":{"threshold":1}}}
JSON
expect_fail 1 $KILN renew demo --channel production --key "$T/p1.key" --registry "$URL" --trust "$T/others.json" \
    --state "$T/state2" --out "$T/renew2.json"
grep -q "the current record of demo/production" "$T/err" || fail "renew under another policy: $(cat "$T/err")"
[ ! -e "$T/renew2.json" ] || fail "a refused renewal wrote a record"
expect_fail 2 $KILN renew demo --channel nosuch --key "$T/p1.key" --registry "$URL" --trust "$T/trust.json" --state "$T/state"
grep -q "demo/nosuch has no record to renew: promote a version" "$T/err" || fail "renew a missing channel: $(cat "$T/err")"
# kiln rollback --trust: the version before from the verified history, its digest pinned.
$KILN rollback demo --channel production --trust "$T/trust.json" --state "$T/state" --key "$T/p1.key" \
    --registry "$URL" --out "$T/rbv.json" >"$T/rbv.out" || fail "verified rollback: $(cat "$T/rbv.out")"
grep -q "^wrote $T/rbv.json: demo/production -> 1.1.0 (sha256:$(sha256sum "$T/a2.kiln" | cut -d' ' -f1)) seq 6, 1 signature$" "$T/rbv.out" ||
    fail "verified rollback: $(cat "$T/rbv.out")"
expect_fail 1 $KILN rollback demo --channel production --trust "$T/others.json" --state "$T/state3" --key "$T/p1.key" \
    --registry "$URL" --out "$T/rbv2.json"
grep -q "the channel's current record does not verify" "$T/err" || fail "rollback under another policy: $(cat "$T/err")"
[ ! -e "$T/rbv2.json" ] || fail "a refused rollback wrote a record"
# --to with --trust: the named version's digest from a verified record of the channel; a
# version no verified record named, or the current one, is refused and nothing is written.
$KILN rollback demo --channel production --to 1.1.0 --trust "$T/trust.json" --state "$T/state" --key "$T/p1.key" \
    --registry "$URL" --out "$T/rbt.json" >"$T/rbt.out" || fail "rollback --to --trust: $(cat "$T/rbt.out")"
grep -q "^wrote $T/rbt.json: demo/production -> 1.1.0 (sha256:$(sha256sum "$T/a2.kiln" | cut -d' ' -f1)) seq 6, 1 signature$" "$T/rbt.out" ||
    fail "rollback --to --trust: $(cat "$T/rbt.out")"
expect_fail 2 $KILN rollback demo --channel production --to 9.9.9 --trust "$T/trust.json" --state "$T/state" \
    --key "$T/p1.key" --registry "$URL" --out "$T/rbt2.json"
grep -q "never pointed at 9.9.9 in a record that verifies" "$T/err" || fail "rollback --to unknown: $(cat "$T/err")"
expect_fail 2 $KILN rollback demo --channel production --to 1.0.0 --trust "$T/trust.json" --state "$T/state" \
    --key "$T/p1.key" --registry "$URL" --out "$T/rbt2.json"
grep -q "1.0.0 is the current version of demo/production" "$T/err" || fail "rollback --to current: $(cat "$T/err")"
[ ! -e "$T/rbt2.json" ] || fail "a refused rollback wrote a record"

kill -TERM $PID
wait $PID || fail "server exit status after SIGTERM"
grep -q 'stopped' "$T/serve.err" || fail "no clean stop: $(cat "$T/serve.err")"
$KILN registry fsck --root "$R" --trust "$T/trust.json" >"$T/fsck.out" || fail "fsck: $(cat "$T/fsck.out")"
$KILN registry gc --root "$R" | grep -q '^removed 0 unreferenced blobs' || fail "gc"

# A byte changed on the server's disk: fsck finds it, pull refuses it.
blob=$(find "$R/blobs" -type f | head -1)
printf 'X' | dd of="$blob" bs=1 seek=40 conv=notrunc 2>/dev/null
expect_fail 1 $KILN registry fsck --root "$R" --trust "$T/trust.json"
grep -q 'problem: .*hashes to' "$T/out" || fail "fsck output: $(cat "$T/out")"
$KILN registry serve --root "$R" --listen 127.0.0.1:0 --trust "$T/trust.json" >"$T/serve2.out" 2>/dev/null &
PID=$!
i=0
while ! grep -q 'http://' "$T/serve2.out" 2>/dev/null; do i=$((i + 1)); [ $i -lt 100 ] || fail "restart"; sleep 0.05; done
URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$T/serve2.out")
v=$(sqlite3 "$R/registry.db" "SELECT version FROM versions WHERE digest = 'sha256:$(basename "$blob")'" 2>/dev/null || echo 1.0.0)
expect_fail 1 $KILN pull "demo@$v" --registry "$URL" --trust "$T/trust.json" --state "$T/state" --out "$T/tampered"
grep -q 'hashes to' "$T/err" || fail "tampered pull: $(cat "$T/err")"
[ ! -e "$T/tampered" ] || fail "a refused pull left its directory"
kill -TERM $PID
wait $PID
expect_fail 2 $KILN registry fsck --root "$T/none"
# A full disk: the upload is answered 507 (which clients do not retry), nothing is left in
# tmp, the store stays consistent and the server serves on. It needs a small filesystem: a
# tmpfs in a private mount namespace (root with unshare, as CI runs); elsewhere skipped, said so.
if unshare -m true 2>/dev/null; then
    mkdir -p "$T/big" "$T/full"
    head -c 1500000 /dev/urandom >"$T/big/model.safetensors"
    cp "$T/m-1.0.0-one/card.json" "$T/big/"
    $KILN pack "$T/big" --name demo --version 9.0.0 --out "$T/big.kiln" >/dev/null
    $KILN sign "$T/big.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null
    cat >"$T/full.sh" <<'SCRIPT'
mount -t tmpfs -o size=1m tmpfs "$T/full" || exit 3
tok=$($KILN registry token create --root "$T/full/reg" --name ci --scope publish) || exit 4
$KILN registry serve --root "$T/full/reg" --listen 127.0.0.1:0 --trust "$T/trust.json" >"$T/full.out" 2>"$T/full.err" &
pid=$!
i=0
while ! grep -q 'http://' "$T/full.out"; do i=$((i + 1)); [ $i -lt 100 ] || exit 5; sleep 0.05; done
url=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$T/full.out")
$KILN publish "$T/big.kiln" --registry "$url" --token "$tok" >"$T/full.pub" 2>&1
echo "publish $?" >"$T/full.rc"
curl -s "$url/healthz" >"$T/full.health"
kill $pid
wait $pid
ls -A "$T/full/reg/tmp" >"$T/full.tmp"
$KILN registry fsck --root "$T/full/reg" --trust "$T/trust.json" >"$T/full.fsck" 2>&1
echo "fsck $?" >>"$T/full.rc"
SCRIPT
    T="$T" KILN="$KILN" unshare -m sh "$T/full.sh" || fail "the full-disk case could not run: exit $?"
    grep -q '^publish 2$' "$T/full.rc" || fail "a publish to a full disk: $(cat "$T/full.rc" "$T/full.pub")"
    grep -q "HTTP 507: cannot write an upload's temporary file in .*: No space left on device" "$T/full.pub" ||
        fail "a publish to a full disk: $(cat "$T/full.pub")"
    [ "$(cat "$T/full.health")" = ok ] || fail "the server after a full disk: $(cat "$T/full.health")"
    [ ! -s "$T/full.tmp" ] || fail "a full disk left $(cat "$T/full.tmp") in tmp"
    grep -q '^fsck 0$' "$T/full.rc" || fail "fsck after a full disk: $(cat "$T/full.fsck")"
else
    echo "60-registry: no mount namespace here: the full-disk case is skipped"
fi
