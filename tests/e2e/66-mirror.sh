#!/bin/sh
# A registry and its mirror, as an operator runs them in two data centres: kiln registry serve
# for both, kiln registry mirror --once copying the primary's versions and channel records into
# the mirror's store (verified, incremental), a service that pulls with --registry PRIMARY
# --registry MIRROR and keeps getting its model while the primary is down, a rollback on the
# primary that the service follows through the mirror, a stale mirror that never wins over the
# primary's newer record, and the mirror refusing writes. docs/registry.md, "Mirrors".
. "$(dirname "$0")/lib.sh"
rel_prom_trust
for v in 1.0.0 2.0.0; do
    mkdir -p "$T/m-$v"
    printf 'weights %s' "$v" >"$T/m-$v/model.safetensors"
    printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}' >"$T/m-$v/card.json"
    $KILN pack "$T/m-$v" --name demo --version $v --out "$T/a-$v.kiln" >/dev/null
    $KILN sign "$T/a-$v.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null
done
PUB=$($KILN registry token create --root "$T/primary" --name ci --scope publish)
PROM=$($KILN registry token create --root "$T/primary" --name rm --scope promote)

# serve ROOT NAME [LISTEN]: start kiln registry serve, set URL and NAME_PID.
serve() {
    : >"$T/$2.out" # a restart's serve_url must not read the last server's address
    $KILN registry serve --root "$1" --listen "${3:-127.0.0.1:0}" --trust "$T/trust.json" \
        >"$T/$2.out" 2>"$T/$2.err" &
    eval "${2}_PID=$!"
    serve_url "$T/$2.out" "$T/$2.err"
}
primary_PID= mirror_PID=
trap 'kill $primary_PID $mirror_PID 2>/dev/null || true; rm -rf "$T"' EXIT
serve "$T/primary" primary
P=$URL
$KILN publish "$T/a-1.0.0.kiln" --registry "$P" --token "$PUB" >/dev/null
$KILN publish "$T/a-2.0.0.kiln" --registry "$P" --token "$PUB" >/dev/null
$KILN promote demo 1.0.0 --channel production --key "$T/prom.key" --registry "$P" --token "$PROM" >/dev/null
$KILN promote demo 2.0.0 --channel production --key "$T/prom.key" --registry "$P" --token "$PROM" >/dev/null

# The mirror: a first sync copies everything, a second nothing.
M=$T/mirror
$KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --once >"$T/sync1.out" ||
    fail "first sync: $(cat "$T/sync1.out")"
grep -q '^copied demo@1.0.0 sha256:' "$T/sync1.out" || fail "sync 1: $(cat "$T/sync1.out")"
grep -q '^copied demo/production seq 2 -> 2.0.0$' "$T/sync1.out" || fail "sync 1 records: $(cat "$T/sync1.out")"
grep -q "^mirror of $P: copied 0 trust versions, 2 versions ([0-9]* bytes downloaded), 2 channel records; 0 problems" \
    "$T/sync1.out" || fail "sync 1 summary: $(cat "$T/sync1.out")"
$KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --once >"$T/sync2.out"
grep -q "copied 0 trust versions, 0 versions (0 bytes downloaded), 0 channel records; 0 problems" \
    "$T/sync2.out" || fail "sync 2 copied again: $(cat "$T/sync2.out")"
# A mirror of one registry is not made a mirror of another, nor a primary a mirror.
expect_fail 2 $KILN registry mirror --root "$M" --from http://127.0.0.1:9 --trust "$T/trust.json" --once
grep -q "is a mirror of $P, not of http://127.0.0.1:9" "$T/err" || fail "other URL: $(cat "$T/err")"
expect_fail 2 $KILN registry mirror --root "$T/primary" --from "$P" --trust "$T/trust.json" --once
grep -q "is a registry store that is not a mirror (a primary: it holds 2 versions" "$T/err" ||
    fail "primary as a mirror: $(cat "$T/err")"

# Serve the mirror: reads as the primary's, writes refused, its sync in /healthz.
serve "$M" mirror
MU=$URL
[ "$(curl -s "$P/v1/models/demo/channels/production")" = "$(curl -s "$MU/v1/models/demo/channels/production")" ] ||
    fail "the mirror's record differs from the primary's"
expect_fail 2 $KILN publish "$T/a-1.0.0.kiln" --registry "$MU" --token "$PUB"
grep -q "HTTP 405: this registry is a mirror of $P: publish there" "$T/err" || fail "publish to mirror: $(cat "$T/err")"
curl -s "$MU/healthz" | grep -q "^mirror of $P, last synced " || fail "healthz: $(curl -s "$MU/healthz")"
curl -s "$MU/metrics" | grep -q '^kiln_registry_mirror_lag_seconds [0-9]' || fail "metrics"

# The primary goes down: the service pulls from the mirror and says so.
S="--trust $T/trust.json --state $T/svc-state --out $T/svc"
kill "$primary_PID"; wait "$primary_PID" 2>/dev/null || true
$KILN pull demo@production --registry "$P" --registry "$MU" $S >"$T/pull1.out" 2>"$T/pull1.err" ||
    fail "pull with the primary down: $(cat "$T/pull1.err")"
grep -q "^pulled demo@2.0.0 (channel production, seq 2) sha256:.* from $MU\$" "$T/pull1.out" ||
    fail "pulled line: $(cat "$T/pull1.out")"
grep -q "^kiln: registry '$P/.*; trying $MU\$" "$T/pull1.err" || fail "failover message: $(cat "$T/pull1.err")"

# The primary back on its address: a rollback (seq 3) the mirror has not seen yet. The
# service asks both; the primary's newer record wins over the stale mirror in either order,
# and the archive (1.0.0, which the mirror holds) may come from the mirror.
serve "$T/primary" primary "${P#http://}"
$KILN rollback demo --channel production --key "$T/prom.key" --registry "$P" --token "$PROM" >/dev/null
$KILN pull demo@production --registry "$MU" --registry "$P" $S >"$T/pull2.out" 2>"$T/pull2.err" ||
    fail "pull after the rollback: $(cat "$T/pull2.err")"
grep -q "^pulled demo@1.0.0 (channel production, seq 3) .* from $MU (record from $P)\$" "$T/pull2.out" ||
    fail "stale mirror first: $(cat "$T/pull2.out") $(cat "$T/pull2.err")"
grep -q "has demo@production at seq 2, $P has seq 3: using the newer" "$T/pull2.err" ||
    fail "stale mirror note: $(cat "$T/pull2.err")"
# Sync, primary down again: the service follows the rollback through the mirror alone.
$KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --once >"$T/sync3.out"
grep -q '^copied demo/production seq 3 -> 1.0.0$' "$T/sync3.out" || fail "sync 3: $(cat "$T/sync3.out")"
kill "$primary_PID"; wait "$primary_PID" 2>/dev/null || true
$KILN pull demo@production --registry "$P" --registry "$MU" $S >"$T/pull3.out" 2>"$T/pull3.err" ||
    fail "pull through the mirror after the rollback: $(cat "$T/pull3.err")"
grep -q "^pulled demo@1.0.0 (channel production, seq 3) .* from $MU\$" "$T/pull3.out" ||
    fail "followed: $(cat "$T/pull3.out")"
[ "$(cat "$T/svc/model.safetensors")" = "weights 1.0.0" ] || fail "the service runs another model"

# A primary that hangs (SIGSTOP: connections taken, nothing answered) is passed over within
# --timeout, not the minute a lone registry gets; and a bad --timeout is refused.
serve "$T/primary" primary "${P#http://}"
kill -STOP "$primary_PID"
s0=$(date +%s)
$KILN pull demo@production --registry "$P" --registry "$MU" $S --timeout 1s >"$T/pull4.out" 2>"$T/pull4.err" ||
    { kill -CONT "$primary_PID"; fail "pull with the primary frozen: $(cat "$T/pull4.err")"; }
el=$(($(date +%s) - s0))
# A sync from the frozen primary gives up within its --timeout (each of its tries).
s0=$(date +%s)
expect_fail 2 $KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --once --timeout 500ms
el2=$(($(date +%s) - s0))
kill -CONT "$primary_PID"
grep -q "Operation timed out after [0-9]* milliseconds" "$T/err" || fail "sync from a frozen primary: $(cat "$T/err")"
[ $el2 -lt 20 ] || fail "the frozen primary held the sync for $el2 s"
grep -q "^kiln: registry '$P/.*: Operation timed out after 1[0-9][0-9][0-9] milliseconds.*; trying $MU\$" "$T/pull4.err" ||
    fail "frozen primary: $(cat "$T/pull4.err")"
grep -q "^pulled demo@1.0.0 (channel production, seq 3) .* from $MU\$" "$T/pull4.out" ||
    fail "frozen primary: $(cat "$T/pull4.out")"
[ $el -lt 20 ] || fail "the frozen primary held the pull for $el s"
expect_fail 2 $KILN pull demo@production --registry "$P" --registry "$MU" $S --timeout 5 
grep -q "timeout '5' is not a duration like 500ms, 5s or 1m" "$T/err" || fail "--timeout 5: $(cat "$T/err")"
kill "$primary_PID"; wait "$primary_PID" 2>/dev/null || true

# A sync killed with SIGKILL leaves the store resumable: the next one runs.
$KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --interval 1s >/dev/null 2>&1 &
K=$!
sleep 0.3
kill -9 $K; wait $K 2>/dev/null || true
serve "$T/primary" primary "${P#http://}"
$KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --once >/dev/null ||
    fail "sync after a SIGKILL"
$KILN registry fsck --root "$M" --trust "$T/trust.json" >/dev/null || fail "fsck of the mirror"

# Datasets (kiln data publish; kiln release publishes a version's): copied, each checked as
# kiln data pull checks it (sha256, a release key's signature naming it), so that kiln
# reproduce against the mirror finds the data; a second sync copies none. Bytes the primary
# serves wrong are a problem said, not copied.
$KILN data synth --seed 3 --rows 300 --features 4 --outputs 1 --out "$T/d1.st" >/dev/null 2>&1
$KILN data synth --seed 4 --rows 300 --features 4 --outputs 1 --out "$T/d2.st" >/dev/null 2>&1
D1=$($KILN data inspect --json "$T/d1.st" | sed -n 's/.*"sha256": "\([0-9a-f]*\)".*/\1/p' | head -1)
D2=$($KILN data inspect --json "$T/d2.st" | sed -n 's/.*"sha256": "\([0-9a-f]*\)".*/\1/p' | head -1)
[ ${#D1} = 64 ] && [ ${#D2} = 64 ] || fail "dataset digests: '$D1' '$D2'"
$KILN data publish "$T/d1.st" --name market --registry "$P" --key "$T/rel.key" --token "$PUB" >/dev/null ||
    fail "data publish"
$KILN data publish "$T/d2.st" --name bad --registry "$P" --key "$T/rel.key" --token "$PUB" >/dev/null ||
    fail "data publish 2"
B2=$T/primary/blobs/sha256/$(echo "$D2" | cut -c1-2)/$D2
[ -f "$B2" ] || fail "no blob at $B2"
chmod u+w "$B2"
printf 'X' | dd of="$B2" bs=1 seek=100 conv=notrunc 2>/dev/null
$KILN registry mirror --root "$M" --from "$P" --trust "$T/trust.json" --once >"$T/sync5.out" 2>"$T/sync5.err" &&
    fail "a dataset served wrong was not a problem: $(cat "$T/sync5.out")"
grep -q "^copied dataset market@sha256:$D1 ([0-9]* bytes, signed by rel)\$" "$T/sync5.out" ||
    fail "dataset sync: $(cat "$T/sync5.out") $(cat "$T/sync5.err")"
grep -q "copied 0 trust versions, 0 versions ([0-9]* bytes downloaded), 0 channel records, 1 dataset; 1 problem" \
    "$T/sync5.out" || fail "dataset sync summary: $(cat "$T/sync5.out")"
grep -q "^problem: dataset bad@sha256:$D2: .*sha256" "$T/sync5.out" || fail "dataset served wrong: $(cat "$T/sync5.out")"
$KILN data pull "market@sha256:$D1" --registry "$MU" --trust "$T/trust.json" --out "$T/d1-pulled.st" >/dev/null ||
    fail "data pull from the mirror"
cmp -s "$T/d1.st" "$T/d1-pulled.st" || fail "the mirror's dataset differs"
expect_fail 2 $KILN data pull "bad@sha256:$D2" --registry "$MU" --trust "$T/trust.json" --out "$T/d2-pulled.st"
grep -q "HTTP 404: dataset .bad@sha256:$D2. not found" "$T/err" && [ ! -e "$T/d2-pulled.st" ] || fail "a dataset not copied was pulled: $(cat "$T/err")"
$KILN registry fsck --root "$M" --trust "$T/trust.json" >/dev/null || fail "fsck of the mirror with a dataset"
