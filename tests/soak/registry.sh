#!/bin/sh
# The registry soak (tests/soak/soak.sh runs it; docs/soak.md): a `kiln registry serve` (the
# primary) and a mirror of it (`kiln registry mirror --interval`, beside a `kiln registry serve`
# of the mirror's store) on loopback ports under SECONDS of publish, promote, rollback and pull
# traffic plus bad requests; the servers' (and a long-lived client's) resident memory and fds
# sampled whenever the traffic pauses. Meanwhile the primary is stopped now and then (the
# clients must carry on through the mirror), the trust policy is rotated (a promote key
# replaced) and a token is revoked. At the end both stores must pass fsck, the mirror must hold
# exactly what the primary holds, and each audit log must hold exactly the rows the traffic
# should have written.
#
#   registry.sh WORKDIR SECONDS SEED     ($KILN: kiln; $SOAK_BIN: soak_pull's directory)
#
# Two phases. grow (the first 60%), each iteration: pack and sign the next version
# soak@1.0.I (eight trained models in turn), publish it (every fifth twice: the second answer
# is 'already stored'), promote it on staging (every third is then rolled back). steady (the
# rest): no new version; each iteration publishes an existing version again (200, nothing
# written) and reads the channel's whole history, the largest answer the server gives. Both:
# bad requests with curl (a bad token, a bad name, an unknown blob, a bad Range, a replayed
# channel record, a digest that does not match its body, a write to the mirror, and every
# fourth iteration an upload cut off halfway), one `kiln pull --registry PRIMARY --registry
# MIRROR` whose predictions (`kiln infer`) must equal the published model's, then a round of
# soak_pull: THREADS threads pull ROUND times each with kiln_pull (primary first, mirror
# second; checking predictions and that each channel pull gives the current record) while its
# kiln_watch follows the channel over both registries.
#
# Events, each at its time (an iteration of its own, before that iteration's traffic):
#   outage (OUTAGES of them, spread over the run): once the mirror holds the primary's current
#     record, a round starts and the primary gets SIGTERM in its middle (it must exit 0); for
#     OUTAGE_S seconds CLI pulls and rounds go on, each pull passing over the primary and
#     served by the mirror; then the primary restarts on its address. Of each three outages
#     the second is a crash instead: a version of the model 'crash' is uploading slowly (curl
#     --limit-rate, about two seconds) when the primary gets SIGKILL at a random moment of
#     it (or just after). After the restart the store must pass fsck, an upload that was
#     answered 2xx must be there, one that was not must be there whole or not at all, and
#     kiln publish of it must then say 'published' or 'already stored' accordingly. And every
#     third is a freeze: SIGSTOP, the traffic (each pull passing over the primary after its
#     5 s deadline, the default with several registries), then SIGCONT, the same process
#     serving on.
#     After a SIGTERM or SIGKILL outage's traffic the service restarts (soak_pull's
#     `restart`: a new kiln_watch on its directory and state) through the mirror alone, then
#     again with the mirror's server stopped too, so that no registry answers: it must start
#     on the model it kept, the record its state accepted last.
#   mirror outage (MOUTAGES): the mirror's server stops (SIGTERM, exit 0) for OUTAGE_S
#     seconds while the primary runs: every pull passes over it and carries on, and the
#     service restarts once; then it restarts on its address.
#   rotation (ROTATIONS): trust policy version N+1, the promote key replaced by a new one,
#     signed by both root keys (root_threshold 2), `kiln trust put` on the primary; the
#     current record (signed by the removed key) must then fail `kiln channel verify`, the
#     primary must refuse a record the removed key signs (422), the watch must hear version
#     N+1 and refuse its record in service, and every thread's pull must be refused; then the
#     current version is promoted again with the new key and everything carries on.
#   revocation (once, at 40%): the token 'ci-old', used for every other publish until then,
#     is revoked with `kiln registry token revoke`; its next use and every one after is 401
#     naming the revocation, while the other tokens keep working.
#
# After each iteration the traffic has stopped: each server's and the mirror sync's fds (the
# fewest of ten readings 20 ms apart) must equal their first such sample's, as must the
# client's; the mirror's lag (its /metrics) must stay within LAG_MAX seconds and its sync must
# have reported no problem. Resident memory is judged against the maximum over the warm-up
# (the first fifth) of each phase, and for the primary of each of its lives (a restart starts
# a new warm-up, of at least 10 s):
#   steady: SLACK_KB (1 MiB). The data no longer grows, so nothing should: what glibc keeps
#     (per-thread tcache and fastbins filling, arenas' high-water marks) has mostly settled
#     in the warm-up. On a fixed store, batches of 300 requests raised idle RSS by 780, 176,
#     76, 4, 0, 0 kB; with the tcache disabled (GLIBC_TUNABLES=glibc.malloc.tcache_count=0)
#     malloc_stats' "in use" stayed exactly flat (docs/soak.md).
#   grow: GROW_SLACK_KB (8 MiB). Every version adds rows and every record lengthens the
#     history a rollback reads (120 kB of JSON after 180 records), and each worker thread's
#     arena keeps the peak of the largest answer it built: 1.7 MB over 140 versions in a
#     200 s run. At 51 requests/s (the default run) a leak crosses 8 MiB in the grow phase
#     from about 1.7 kB per request, 1 MiB in the steady phase from about 300 bytes.
# Leaks smaller than that are LeakSanitizer's to find: SOAK_SAN=1 runs every process under
# ASan (RSS is not judged then: the quarantine grows on purpose) and any leak fails its exit.
set -u
: "${KILN:?set KILN to the kiln binary}" "${SOAK_BIN:?set SOAK_BIN to the soak drivers}"
W=$1 SECS=$2 SEED=$3
THREADS=8 ROUND=2
SLACK_KB=${SOAK_REGISTRY_SLACK_KB:-1024}
GROW_SLACK_KB=${SOAK_REGISTRY_GROW_SLACK_KB:-8192}
MIRROR_EVERY=${SOAK_MIRROR_INTERVAL:-2}  # seconds between the mirror's syncs
OUTAGE_S=${SOAK_OUTAGE_SECONDS:-3}       # how long the primary stays down each time
OUTAGES=${SOAK_OUTAGES:-$((SECS / 50))}
[ "$OUTAGES" -ge 2 ] || OUTAGES=2
ROTATIONS=${SOAK_ROTATIONS:-3}
MOUTAGES=${SOAK_MIRROR_OUTAGES:-2}
# The lag: a sync every MIRROR_EVERY, none while the primary is down, a restart, a slow sync.
LAG_MAX=${SOAK_MIRROR_LAG_MAX:-$((3 * MIRROR_EVERY + OUTAGE_S + 5))}
CATCHUP_S=$((3 * MIRROR_EVERY + 10)) # how long the mirror may take to copy the newest record
CHECK_RSS=1
[ -n "${SOAK_SAN:-}" ] && CHECK_RSS=0
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 2
PID= MPID= YPID= DPID=
cleanup() {
    for p in $DPID $YPID $MPID $PID; do kill $p 2>/dev/null; done
    return 0
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -s pull.err ] && grep -v '^note' pull.err | sed 's/^/  soak_pull: /' | tail -20; exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
X=$SEED
rnd() { X=$(((X * 1103515245 + 12345) % 2147483648)); R=$(((X / 65536) % $1)); }
PAGE_KB=$(($(getconf PAGESIZE) / 1024))
rss_of() { echo $(($(cut -d' ' -f2 /proc/$1/statm) * PAGE_KB)); }

# Keys: release, root-a and root-b (the policy's root quorum, 2 of 2), and the promote key of
# each trust version (prom1 for version 1, promN for version N). policy FILE VERSION PROMOTE.
for k in rel prom1 root-a root-b; do $KILN keygen --out $k --no-password >/dev/null || fail "keygen"; done
policy() {
    cat >"$1" <<JSON
{"format":"kiln-trust/1","version":$2,"root_threshold":2,"keys":[
 {"name":"root-a","pubkey":"$(tail -1 root-a.pub)","roles":["root"]},
 {"name":"root-b","pubkey":"$(tail -1 root-b.pub)","roles":["root"]},
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"$3","pubkey":"$(tail -1 "$3.pub")","roles":["promote"]}],
 "channels":{"staging":{"threshold":1}}, "accept_unvalidated": true}
JSON
}
policy trust.json 1 prom1
PROMKEY=prom1 TV=1
# Eight models from a tiny training run (steps 1..8), and what each predicts on x.st.
$KILN data synth --seed 3 --rows 2000 --features 6 --outputs 2 --out d.st >/dev/null 2>&1 || fail "synth"
$KILN data synth --seed 4 --rows 200 --features 6 --outputs 2 --out x.st >/dev/null 2>&1 || fail "synth"
$KILN train --data d.st --run-dir run --set steps=8 --set ckpt_every=1 --set keep=0 --set d_model=16 \
    --set d_ff=32 --set seq_len=16 --set attn_window=8 >/dev/null 2>train.log || { cat train.log; fail "train"; }
mkdir -p pub seqs
for k in 1 2 3 4 5 6 7 8; do
    $KILN export run --step $k --out m$k --name soak >/dev/null || fail "export step $k"
    $KILN infer --model m$k --input x.st --out ref$k.st >/dev/null || fail "infer m$k"
done
PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
ADMIN=$($KILN registry token create --root reg --name ops --scope admin)
OLD=$($KILN registry token create --root reg --name ci-old --scope publish)
tokens=4

# serve_wait NAME: the URL kiln registry serve printed into NAME.out, into U; 1 if it exited.
serve_wait() {
    i=0
    while ! grep -q 'http://' "$1.out" 2>/dev/null; do
        kill -0 "$2" 2>/dev/null || return 1
        i=$((i + 1)); [ $i -lt 400 ] || fail "$1 did not start: $(cat "$1.err")"; sleep 0.05
    done
    U=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' "$1.out")
}
# start_primary LISTEN: the primary's life number L (its output in serve-L.out, .err), PID.
lives=0
start_primary() {
    tries=0
    while :; do
        lives=$((lives + 1))
        # (Not holding soak_pull's pipes, 3 and 4, which the first life did not have either.)
        $KILN registry serve --root reg --listen "$1" --trust trust.json >serve-$lives.out 2>serve-$lives.err 3>&- 4<&- &
        PID=$!
        serve_wait serve-$lives $PID && break
        wait $PID
        # Restarting on its address: another process may hold the port for a moment.
        grep -q 'Address already in use' serve-$lives.err && [ $tries -lt 40 ] ||
            fail "the primary did not start: $(cat serve-$lives.err)"
        tries=$((tries + 1)); sleep 0.25
    done
}
start_primary 127.0.0.1:0
URL=$U
# stop NAME PID: SIGTERM, which the process must exit 0 from, saying it stopped.
stop() {
    kill -TERM $2
    wait $2 || fail "$1 exit status after SIGTERM: $? ($(tail -3 "$1.err"))"
    grep -q 'stopped' "$1.err" || fail "$1: no clean stop: $(tail -3 "$1.err")"
}

# expect_status CODE CURL_ARGS...: curl's answer code must be CODE.
bad=0
expect_status() {
    want=$1; shift
    got=$(curl -s -o bad.out -w '%{http_code}' "$@")
    [ "$got" = "$want" ] || fail "curl $*: HTTP $got, expected $want: $(cat bad.out)"
    bad=$((bad + 1))
}
# refused WHAT OUT CMD...: CMD must fail as kiln fails (exit 1 or 2: not a sanitizer's exit
# or a crash), its output in OUT.
refused() {
    what=$1 out=$2; shift 2
    "$@" >"$out" 2>&1
    rc=$?
    [ $rc = 0 ] && fail "$what was taken: $(cat "$out")"
    [ $rc = 1 ] || [ $rc = 2 ] || fail "$what: exit $rc: $(tail -5 "$out")"
}
# note_record FILE: the channel record kiln promote/rollback printed; SEQ, CUR, seqs/SEQ.
note_record() {
    SEQ=$(sed -n 's/^soak\/staging -> [^ ]* (.*) seq \([0-9]*\), reason .*/\1/p' "$1")
    CUR=$(sed -n 's/^soak\/staging -> \([^ ]*\) (.*) seq [0-9]*, reason .*/\1/p' "$1")
    [ -n "$SEQ" ] && [ -n "$CUR" ] || fail "no channel record in: $(cat "$1")"
    echo "$CUR" >seqs/$SEQ.tmp && mv seqs/$SEQ.tmp seqs/$SEQ # whole when soak_pull reads it
}

publishes=0 promotes=0 rollbacks=0 republished=0 cut=0 cli_pulls=0 old_publishes=0
revoked=0 revoked_at= revoked_uses=0 revoked_life=0
# publish_next I: pack, sign, publish soak@1.0.I, promote it; returns the model index in K.
# Until 'ci-old' is revoked every other version goes up with it.
publish_next() {
    K=$((($1 - 1) % 8 + 1)) v=1.0.$1
    tok=$PUB
    [ $revoked = 0 ] && [ $(($1 % 2)) = 0 ] && tok=$OLD old_publishes=$((old_publishes + 1))
    rm -f a.kiln a.kiln.minisig
    $KILN pack m$K --name soak --version $v --out a.kiln >/dev/null || fail "pack $v"
    $KILN sign a.kiln --key rel.key --allow-unvalidated >/dev/null || fail "sign $v"
    $KILN publish a.kiln --registry "$URL" --token "$tok" >pub.out || fail "publish $v"
    grep -q '^published: ' pub.out || fail "publish $v: $(cat pub.out)"
    publishes=$((publishes + 1))
    ln -s ../m$K pub/$v
    $KILN promote soak $v --channel staging --key $PROMKEY.key --registry "$URL" --token "$PROM" >rec.out ||
        fail "promote $v"
    note_record rec.out
    promotes=$((promotes + 1))
}

publish_next 1
# The mirror: its sync every MIRROR_EVERY s, and its store served once the first sync made it.
$KILN registry mirror --root mirror --from "$URL" --trust trust.json --interval ${MIRROR_EVERY}s \
    >mirror.out 2>mirror.err &
YPID=$!
i=0
while ! grep -q '^mirror of ' mirror.out; do
    kill -0 $YPID 2>/dev/null || fail "kiln registry mirror exited: $(cat mirror.err)"
    i=$((i + 1)); [ $i -lt 400 ] || fail "no first sync: $(cat mirror.err)"; sleep 0.05
done
# start_mirror_server LISTEN: the mirror's server, its life number MLIVES, MPID, U.
mlives=0
start_mirror_server() {
    tries=0
    while :; do
        mlives=$((mlives + 1))
        $KILN registry serve --root mirror --listen "$1" --trust trust.json >mserve.out 2>mserve.err 3>&- 4<&- &
        MPID=$!
        serve_wait mserve $MPID && break
        wait $MPID
        grep -q 'Address already in use' mserve.err && [ $tries -lt 40 ] ||
            fail "the mirror's server did not start: $(cat mserve.err)"
        tries=$((tries + 1)); sleep 0.25
    done
}
start_mirror_server 127.0.0.1:0
MURL=$U

mkfifo cmd ans
"$SOAK_BIN/soak_pull" "$URL" "$MURL" "$W/trust.json" "$W" $THREADS <cmd >ans 2>pull.err &
DPID=$!
exec 3>cmd 4<ans

# round_send CMD, round_read: a soak_pull command and its answer, checked: no failure, every
# client's state at the registry's trust version, the watch never above the newest record.
round_send() { echo "$1" >&3; }
round_read() {
    read -r ok dpulls dfail drss dfd dswaps ddown dwdown dtrust dwseq <&4 || fail "soak_pull stopped"
    [ "$ok" = ok ] && [ "$dfail" = 0 ] || fail "soak_pull: $ok $dpulls $dfail"
    [ "$dtrust" = $TV ] || fail "a client's state holds trust version $dtrust, the registry's is $TV"
    [ "$dwseq" -le "$SEQ" ] || fail "the watch serves seq $dwseq, above the newest record put ($SEQ)"
}
# cli_pull [primary|mirror]: kiln pull over both registries; the current record, its version's
# predictions, the state at the registry's trust version; with the primary (mirror) down,
# from the other and saying it passed over the stopped one.
cli_lat=
cli_pull() {
    ts=$(now_ms)
    $KILN pull soak@staging --registry "$URL" --registry "$MURL" --trust trust.json --state st-cli \
        --out cli-out >cli.out 2>cli.err || fail "kiln pull: $(cat cli.err)"
    cli_lat="$cli_lat $(($(now_ms) - ts))"
    cli_pulls=$((cli_pulls + 1))
    v=$(sed -n 's/^pulled soak@\([^ ]*\) (channel staging, seq [0-9]*) .*/\1/p' cli.out)
    s=$(sed -n 's/^pulled soak@[^ ]* (channel staging, seq \([0-9]*\)) .*/\1/p' cli.out)
    [ "$s" = "$SEQ" ] && [ "$v" = "$CUR" ] ||
        fail "kiln pull: seq ${s:-?} ($v), the current record is seq $SEQ ($CUR): $(cat cli.out)"
    if [ "${1:-}" = primary ]; then
        grep -q " from $MURL\$" cli.out || fail "kiln pull with the primary down: $(cat cli.out)"
        grep -q "; trying $MURL\$" cli.err || fail "kiln pull did not say it passed over the primary: $(cat cli.err)"
    elif [ "${1:-}" = mirror ]; then
        grep -q " from $URL\$" cli.out || fail "kiln pull with the mirror down: $(cat cli.out)"
        grep -q "$MURL" cli.err || fail "kiln pull did not say it passed over the mirror: $(cat cli.err)"
    fi
    [ $TV = 1 ] || [ -f st-cli/trust/$TV.json ] || fail "kiln pull: its state lacks trust version $TV"
    k=$(((${v#1.0.} - 1) % 8 + 1))
    $KILN infer --model cli-out --input x.st --out cli-pred.st >/dev/null || fail "infer on the pulled $v"
    cmp -s cli-pred.st ref$k.st || fail "kiln pull of $v: predictions differ from the published model's"
}
# mirror_lag [EXTRA]: the mirror's lag from its /metrics into LAG, kept in lags; over LAG_MAX
# (+ EXTRA seconds: a frozen primary lets no sync finish, so the lag grows by the freeze)
# fails.
lags=
mirror_lag() {
    LAG=$(curl -s "$MURL/metrics" | sed -n 's/^kiln_registry_mirror_lag_seconds //p')
    [ -n "$LAG" ] && [ "$LAG" -ge 0 ] || fail "the mirror's /metrics has no lag: '$LAG'"
    lags="$lags $LAG"
    [ "$LAG" -le $((LAG_MAX + ${1:-0})) ] ||
        fail "the mirror's lag is $LAG s, more than $((LAG_MAX + ${1:-0})) s ($(tail -2 mirror.err))"
}
# catch_up: wait until the mirror serves the primary's current record and newest trust version
# (so that clients can carry on through it alone, and a sync never meets a record its policy
# does not know yet).
catchups=0 catchup_max=0
catch_up() {
    ts=$(now_ms)
    curl -s "$URL/v1/models/soak/channels/staging" >cu.p
    curl -s "$URL/v1/trust" >cu.pt
    while :; do
        curl -s "$MURL/v1/models/soak/channels/staging" >cu.m
        curl -s "$MURL/v1/trust" >cu.mt
        cmp -s cu.p cu.m && cmp -s cu.pt cu.mt && break
        [ $(($(now_ms) - ts)) -lt $((CATCHUP_S * 1000)) ] ||
            fail "the mirror did not copy the primary's seq $SEQ (trust version $TV) in $CATCHUP_S s: $(tail -3 mirror.err)"
        sleep 0.05
    done
    ts=$(($(now_ms) - ts))
    [ $ts -gt $catchup_max ] && catchup_max=$ts
    catchups=$((catchups + 1))
}
# primary_requests: add the primary's answered requests (its /metrics) before it stops.
requests=0
primary_requests() {
    curl -s "$URL/metrics" >metrics.txt
    requests=$((requests + $(awk '/^kiln_registry_requests_total/ { s += $NF } END { print s + 0 }' metrics.txt)))
    n=$(sed -n 's/^kiln_registry_auth_refused_total{reason="revoked"} //p' metrics.txt)
    [ "${n:-0}" = $revoked_life ] ||
        fail "the primary counted ${n:-0} requests with the revoked token, $revoked_life were sent"
}

# down_rounds WHAT: for OUTAGE_S seconds, CLI pulls and rounds, each pull passing over the
# stopped server WHAT (primary or mirror) and carrying on; counts into down_*.
down_ms=0 down_rounds=0 down_pulls=0 down_cli=0
down_traffic() {
    t_down=$(now_ms)
    while [ $(($(now_ms) - t_down)) -lt $((OUTAGE_S * 1000)) ]; do
        cli_pull $1
        down_cli=$((down_cli + 1))
        p0=$dpulls d0=$ddown
        round_send "round $ROUND $SEQ"
        round_read
        [ $((ddown - d0)) -ge $((dpulls - p0)) ] ||
            fail "with the $1 down, $((dpulls - p0)) pulls passed over it only $((ddown - d0)) times"
        down_pulls=$((down_pulls + dpulls - p0))
        down_rounds=$((down_rounds + 1))
    done
    down_ms=$((down_ms + $(now_ms) - t_down))
}

# outage term|kill|freeze: the primary stops in the middle of a round (SIGTERM, SIGKILL while a
# version uploads, or SIGSTOP) and stays down OUTAGE_S seconds; every pull meanwhile must pass
# over it and be served by the mirror, the watch too.
outages=0 kills=0 freezes=0 crash_acked=0 crash_kept=0 crash_lost=0 crash_pubs=0
restarts=0 offline_restarts=0
outage() {
    catch_up
    [ $1 = freeze ] || primary_requests
    w0=$dwdown
    if [ $1 = freeze ]; then
        rnd 10
        round_send "round $ROUND $SEQ"
        sleep 0.0$R
        kill -STOP $PID
        t_frozen=$(now_ms)
        round_read
    elif [ $1 = kill ]; then
        # The next version of 'crash', uploading at half its size a second.
        cv=1.0.$((kills + 1))
        rm -f c.kiln c.kiln.minisig
        $KILN pack m1 --name crash --version $cv --out c.kiln >/dev/null || fail "pack crash@$cv"
        $KILN sign c.kiln --key rel.key --allow-unvalidated >/dev/null || fail "sign crash@$cv"
        csize=$(wc -c <c.kiln)
        curl -s -o crash.out -w '%{http_code}' --limit-rate $((csize / 2 + 1)) -X PUT \
            -H "Authorization: Bearer $PUB" -H "X-Kiln-Signature: $(base64 -w0 c.kiln.minisig)" \
            -H "X-Kiln-Digest: sha256:$(sha256sum c.kiln | cut -d' ' -f1)" -H 'Expect:' \
            --data-binary @c.kiln "$URL/v1/models/crash/versions/$cv" >crash.code 2>/dev/null 3>&- 4<&- &
        CPID=$!
        round_send "round $ROUND $SEQ"
        rnd 2300
        sleep $((R / 1000)).$(printf %03d $((R % 1000)))
        kill -KILL $PID
        wait $PID
        st=$?
        [ $st = 137 ] || fail "the primary's exit status after SIGKILL: $st"
        PID=
        round_read
        wait $CPID
        ccode=$(cat crash.code)
    else
        rnd 10
        round_send "round $ROUND $SEQ"
        sleep 0.0$R
        stop serve-$lives $PID
        PID=
        round_read
    fi
    down_traffic primary
    expect_status 000 --max-time 2 "$URL/healthz"
    if [ $1 = freeze ]; then mirror_lag $((($(now_ms) - t_frozen) / 1000 + 1)); else mirror_lag; fi
    [ $dwdown -gt $w0 ] || fail "the watch never passed over the stopped primary"
    if [ $1 != freeze ]; then
        # The service restarts through the mirror alone (which may be a record behind) ...
        round_send "restart $SEQ"
        round_read
        # ... and with no registry up at all: on the model it kept.
        stop mserve $MPID
        MPID=
        round_send "restart $SEQ"
        round_read
        start_mirror_server "${MURL#http://}"
        restarts=$((restarts + 2)) offline_restarts=$((offline_restarts + 1))
    fi
    outages=$((outages + 1))
    if [ $1 = freeze ]; then
        kill -CONT $PID
        freezes=$((freezes + 1))
        expect_status 200 --max-time 10 "$URL/healthz"
        return 0
    fi
    start_primary "${URL#http://}"
    revoked_life=0
    [ $1 = kill ] || return 0
    # What the killed upload left: answered 2xx, it is there; else there whole or not at all.
    kills=$((kills + 1))
    got=$(curl -s -o cv.json -w '%{http_code}' "$URL/v1/models/crash/versions/$cv")
    case $ccode in 2??) crash_acked=$((crash_acked + 1)); [ $got = 200 ] ||
        fail "crash@$cv was answered $ccode before the SIGKILL, and is gone after it (HTTP $got)" ;; esac
    if [ $got = 200 ]; then
        grep -q "sha256:$(sha256sum c.kiln | cut -d' ' -f1)" cv.json || fail "crash@$cv kept with another digest: $(cat cv.json)"
        curl -s "$URL/v1/blobs/sha256/$(sha256sum c.kiln | cut -d' ' -f1)" | cmp -s - c.kiln ||
            fail "crash@$cv: the stored blob is not the archive's bytes"
        crash_kept=$((crash_kept + 1)) want='^already stored'
    else
        [ $got = 404 ] || fail "crash@$cv after the SIGKILL: HTTP $got: $(cat cv.json)"
        crash_lost=$((crash_lost + 1)) want='^published: '
    fi
    $KILN registry fsck --root reg --trust trust.json >kfsck.out 2>&1 || fail "fsck after the SIGKILL: $(cat kfsck.out)"
    $KILN publish c.kiln --registry "$URL" --token "$PUB" >cpub.out 2>&1 || fail "publish crash@$cv again: $(cat cpub.out)"
    grep -q "$want" cpub.out || fail "publish crash@$cv again (HTTP $got after the crash): $(cat cpub.out)"
    crash_pubs=$((crash_pubs + 1))
}

# mirror_outage: the mirror's server stops (SIGTERM) for OUTAGE_S seconds while the primary
# runs; every pull passes over it and carries on; then it restarts on its address.
moutages=0 mdown_ms=0
mirror_outage() {
    stop mserve $MPID
    MPID=
    ms0=$down_ms
    down_traffic mirror
    mdown_ms=$((mdown_ms + down_ms - ms0))
    # The service restarts with the primary up: its kept model, no download.
    round_send "restart $SEQ"
    round_read
    restarts=$((restarts + 1))
    expect_status 000 --max-time 2 "$MURL/healthz"
    moutages=$((moutages + 1))
    start_mirror_server "${MURL#http://}"
}

# rotate: trust version TV+1 replaces the promote key; everything the old key signed stops
# verifying at the primary, in kiln channel verify and at every client; the current version is
# promoted again with the new key.
rotations=0 trust_puts=0 keys_removed=
rotate() {
    catch_up
    old=$PROMKEY k=$((TV + 1))
    new=prom$k prev=trust.json
    [ $TV -gt 1 ] && prev=v$TV.signed.json
    $KILN keygen --out $new --no-password >/dev/null || fail "keygen $new"
    policy v$k.json $k $new
    $KILN trust sign v$k.json --key root-a.key --out v$k.signed.json >/dev/null || fail "trust sign v$k"
    $KILN trust sign --add v$k.signed.json --key root-b.key >/dev/null || fail "trust sign --add v$k"
    $KILN trust verify v$k.signed.json --trust $prev >tv.out 2>&1 || fail "trust verify v$k: $(cat tv.out)"
    grep -q "^  key '$old' ([0-9A-F]*) removed (promote)\$" tv.out || fail "trust verify v$k: $(cat tv.out)"
    curl -s "$URL/v1/models/soak/channels/staging" >old-rec.json
    $KILN channel verify old-rec.json --trust $prev >cv.out 2>&1 || fail "the current record under version $TV: $(cat cv.out)"
    # The watch may hear version $k at its next poll: the refusal it will report is expected.
    echo "window $k $SEQ" >&3
    read -r ok <&4 && [ "$ok" = ok ] || fail "soak_pull: window: $ok"
    $KILN trust put v$k.signed.json --registry "$URL" --token "$ADMIN" >tp.out 2>&1 || fail "trust put v$k: $(cat tp.out)"
    grep -q "^trust policy version $k stored by $URL" tp.out || fail "trust put v$k: $(cat tp.out)"
    TV=$k trust_puts=$((trust_puts + 1))
    refused "a record signed by the removed key '$old', under trust version $k," cv.out \
        $KILN channel verify old-rec.json --trust v$k.signed.json
    grep -q 'not in the trust policy' cv.out || fail "kiln channel verify of $old's record: $(cat cv.out)"
    refused "a record signed by the removed key '$old', put to the primary," rp.out \
        $KILN promote soak $CUR --channel staging --key $old.key --registry "$URL" --token "$PROM"
    grep -q 'HTTP 422.*not in the trust policy' rp.out || fail "promote with $old: $(cat rp.out)"
    round_send "refused $k $SEQ"
    round_read
    $KILN promote soak $CUR --channel staging --key $new.key --registry "$URL" --token "$PROM" >rec.out ||
        fail "promote $CUR with $new"
    note_record rec.out
    promotes=$((promotes + 1))
    PROMKEY=$new
    rotations=$((rotations + 1))
    keys_removed="$keys_removed $old"
}

# revoke: 'ci-old' revoked while the primary runs; its next use is 401 and names why.
revoke() {
    $KILN registry token revoke --root reg --name ci-old --reason 'soak: revoked mid-run' >rv.out 2>&1 ||
        fail "token revoke: $(cat rv.out)"
    grep -q "^revoked token 'ci-old' at " rv.out || fail "token revoke: $(cat rv.out)"
    revoked=1 revoked_at=$((($(now_ms) - t0) / 1000))
    refused "a publish with the revoked token" rv.out $KILN publish a.kiln --registry "$URL" --token "$OLD"
    grep -q "HTTP 401: token 'ci-old' was revoked at " rv.out || fail "publish with the revoked token: $(cat rv.out)"
    revoked_uses=$((revoked_uses + 1)) revoked_life=$((revoked_life + 1))
}

t0=$(now_ms)
deadline=$((t0 + SECS * 1000)) steady_at=$((t0 + SECS * 600)) next_print=0
it=1 samples=0 phase=grow history_reads=0
next_outage=$((t0 + SECS * 1000 / (2 * OUTAGES))) n_out=0
next_rotation=$((t0 + SECS * 1000 / (2 * ROTATIONS))) n_rot=0
revoke_at=$((t0 + SECS * 400))
# Mirror outages at 3/4 of their slots, away from the primary's (at 1/2 of theirs).
next_moutage=$((t0 + SECS * 1000 * 3 / (4 * MOUTAGES))) n_mout=0
[ $MOUTAGES -gt 0 ] || next_moutage=$((deadline + 1))
[ $ROTATIONS -gt 0 ] || next_rotation=$((deadline + 1))
FD0= MFD0= YFD0= DFD0= SFIRST= MFIRST= YFIRST= DFIRST=
# Resident memory, per process (S the primary, M the mirror's server, Y its sync, D soak_pull):
# X_WU the end of its warm-up, X_WM the warm-up's maximum, X_MX the maximum after it, X_GM
# the largest growth past a warm-up's maximum in this phase.
slack=$GROW_SLACK_KB
seg() { eval "${1}_WU=$2 ${1}_WM=0 ${1}_MX=0"; }
for x in S M Y D; do seg $x $((t0 + SECS * 120)); eval "${x}_GM=0"; done
# track X RSS NAME: one sample of X, judged once X is past its warm-up.
track() {
    eval "wu=\$${1}_WU wm=\$${1}_WM mx=\$${1}_MX gm=\$${1}_GM"
    if [ $now -lt $wu ] || [ $wm = 0 ]; then
        [ $2 -gt $wm ] && wm=$2
    else
        [ $2 -gt $mx ] && mx=$2
        [ $(($2 - wm)) -gt $gm ] && gm=$(($2 - wm))
        [ $CHECK_RSS = 1 ] && [ $2 -gt $((wm + slack)) ] && verdict="FAIL $3 resident $2 kB > $wm + $slack ($phase)"
    fi
    eval "${1}_WM=$wm ${1}_MX=$mx ${1}_GM=$gm"
}
rss_summary() {
    echo "$phase: primary growth $S_GM at most over $((lives - lives0 + 1)) lives (slack $slack); mirror server $M_WM, max after $M_MX (growth $M_GM); mirror sync $Y_WM, $Y_MX (growth $Y_GM); client $D_WM, $D_MX (growth $D_GM)"
}
lives0=$lives
GROW_SUMMARY=
echo "registry soak: $SECS s, seed $SEED; primary $URL, mirror $MURL (sync every ${MIRROR_EVERY} s, lag at most $LAG_MAX s); $THREADS pulling threads x $ROUND pulls per round; $OUTAGES primary outages of $OUTAGE_S s, $ROTATIONS trust rotations, a token revoked at 40%; grow for $((SECS * 6 / 10)) s (RSS slack $GROW_SLACK_KB kB), then steady (RSS slack $SLACK_KB kB), each after a warm-up of a fifth$([ $CHECK_RSS = 1 ] || echo '; RSS not judged under sanitizers')"
while :; do
    # One pull with the CLI, its predictions against the published model's.
    cli_pull
    # The pullers' round, then the idle samples.
    round_send "round $ROUND $SEQ"
    round_read
    SFD=1000000 MFD=1000000 YFD=1000000
    for j in 1 2 3 4 5 6 7 8 9 10; do
        n=$(ls /proc/$PID/fd | wc -l); [ "$n" -lt $SFD ] && SFD=$n
        n=$(ls /proc/$MPID/fd | wc -l); [ "$n" -lt $MFD ] && MFD=$n
        n=$(ls /proc/$YPID/fd | wc -l); [ "$n" -lt $YFD ] && YFD=$n
        sleep 0.02
    done
    # A sync holds its lock and the store's files while it runs, and one that met the
    # primary down retries with backoff for seconds: the sync's count is read until it is
    # between two syncs (3 s at most; a leaked fd stays).
    j=0
    while [ $YFD -gt "${YFD0:-0}" ] && [ -n "$YFD0" ] && [ $j -lt 150 ]; do
        n=$(ls /proc/$YPID/fd | wc -l); [ "$n" -lt $YFD ] && YFD=$n
        j=$((j + 1)); sleep 0.02
    done
    SRSS=$(rss_of $PID) MRSS=$(rss_of $MPID) YRSS=$(rss_of $YPID)
    mirror_lag
    ! grep -q '^problem' mirror.out || fail "the mirror's sync: $(grep '^problem' mirror.out | head -3)"
    now=$(now_ms)
    samples=$((samples + 1))
    [ -n "$FD0" ] || { FD0=$SFD MFD0=$MFD YFD0=$YFD DFD0=$dfd SFIRST=$SRSS MFIRST=$MRSS YFIRST=$YRSS DFIRST=$drss; }
    verdict=ok
    track S $SRSS "primary"
    track M $MRSS "mirror server"
    track Y $YRSS "mirror sync"
    track D $drss "client"
    [ $SFD = $FD0 ] || verdict="FAIL primary fds $SFD, $FD0 at the first idle sample"
    [ $MFD = $MFD0 ] || verdict="FAIL mirror server fds $MFD, $MFD0 at the first idle sample"
    [ $YFD = $YFD0 ] || verdict="FAIL mirror sync fds $YFD, $YFD0 at the first idle sample"
    [ $dfd = $DFD0 ] || verdict="FAIL client fds $dfd, $DFD0 at the first idle sample"
    if [ $now -ge $next_print ] || [ "$verdict" != ok ] || [ $now -ge $deadline ]; then
        echo "registry t=$(((now - t0) / 1000))s $phase v=1.0.$it seq=$SEQ trust=$TV pulls=$dpulls swaps=$dswaps primary rss=${SRSS}kB ($((SRSS - S_WM))) fds=$SFD mirror rss=${MRSS}kB ($((MRSS - M_WM))) fds=$MFD lag=${LAG}s sync rss=${YRSS}kB fds=$YFD client rss=${drss}kB ($((drss - D_WM))) fds=$dfd $verdict"
        next_print=$((now + 5000))
    fi
    if [ "$verdict" != ok ]; then
        # What each process holds, now and a moment later: a leak stays, a transfer passes.
        for p in $PID $MPID $YPID $DPID; do
            echo "  fds of $p ($(tr '\0' ' ' </proc/$p/cmdline | cut -c1-60)):"
            ls -l /proc/$p/fd | sed -n 's/.* \([0-9]* -> .*\)/    \1/p'
        done
        sleep 2
        echo "  2 s later: primary $(ls /proc/$PID/fd | wc -l), mirror server $(ls /proc/$MPID/fd | wc -l), mirror sync $(ls /proc/$YPID/fd | wc -l)"
        fail "${verdict#FAIL }"
    fi
    [ $now -lt $deadline ] || break
    if [ $phase = grow ] && [ $now -ge $steady_at ]; then
        GROW_SUMMARY=$(rss_summary)
        phase=steady slack=$SLACK_KB lives0=$lives
        for x in S M Y D; do seg $x $((now + (deadline - now) / 5)); eval "${x}_GM=0"; done
    fi

    if [ $now -ge $next_outage ]; then
        case $((n_out % 3)) in 0) outage term ;; 1) outage kill ;; 2) outage freeze ;; esac
        # The new primary's warm-up: a fifth of its life in this phase, 10 s at least.
        n_out=$((n_out + 1))
        next_outage=$((t0 + SECS * 1000 * (2 * n_out + 1) / (2 * OUTAGES)))
        end=$next_outage
        [ $phase = grow ] && [ $steady_at -lt $end ] && end=$steady_at
        [ $deadline -lt $end ] && end=$deadline
        now=$(now_ms)
        wu=$((now + (end - now) / 5))
        [ $wu -lt $((now + 10000)) ] && wu=$((now + 10000))
        seg S $wu
        continue
    fi
    if [ $now -ge $next_moutage ]; then
        mirror_outage
        n_mout=$((n_mout + 1))
        next_moutage=$((t0 + SECS * 1000 * (4 * n_mout + 3) / (4 * MOUTAGES)))
        [ $n_mout -lt $MOUTAGES ] || next_moutage=$((deadline + 1))
        now=$(now_ms)
        wu=$((now + 10000))
        seg M $wu
        continue
    fi
    if [ $now -ge $next_rotation ]; then
        rotate
        n_rot=$((n_rot + 1))
        next_rotation=$((t0 + SECS * 1000 * (2 * n_rot + 1) / (2 * ROTATIONS)))
        [ $n_rot -lt $ROTATIONS ] || next_rotation=$((deadline + 1))
    fi
    [ $revoked = 0 ] && [ $now -ge $revoke_at ] && revoke

    if [ $phase = grow ]; then
        # The next version, and what a release manager does.
        it=$((it + 1))
        publish_next $it
        if [ $((it % 5)) = 0 ]; then
            $KILN publish a.kiln --registry "$URL" --token "$PUB" | grep -q '^already stored' || fail "republish of 1.0.$it"
            republished=$((republished + 1))
        fi
        if [ $((it % 3)) = 0 ]; then
            $KILN rollback soak --channel staging --key $PROMKEY.key --registry "$URL" --token "$PROM" >rec.out ||
                fail "rollback after 1.0.$it"
            note_record rec.out
            rollbacks=$((rollbacks + 1))
        fi
    else
        # Nothing new: an existing version again, the whole history read.
        rnd $it; j=$((R + 1)) K=$((R % 8 + 1))
        rm -f a.kiln a.kiln.minisig
        $KILN pack m$K --name soak --version 1.0.$j --out a.kiln >/dev/null || fail "pack 1.0.$j"
        $KILN sign a.kiln --key rel.key --allow-unvalidated >/dev/null || fail "sign 1.0.$j"
        $KILN publish a.kiln --registry "$URL" --token "$PUB" | grep -q '^already stored' || fail "republish of 1.0.$j"
        republished=$((republished + 1))
        $KILN channel history soak --channel staging --registry "$URL" >hist.out || fail "channel history"
        [ "$(grep -c ' promote$\| rollback$' hist.out)" = $((promotes + rollbacks)) ] ||
            fail "channel history lists $(grep -c ' promote$\| rollback$' hist.out) records, $((promotes + rollbacks)) were put"
        history_reads=$((history_reads + 1))
    fi
    # What the odd bad client sends.
    size=$(wc -c <a.kiln)
    sig=$(base64 -w0 a.kiln.minisig)
    digest=$(sha256sum a.kiln | cut -d' ' -f1)
    rnd 1000000
    expect_status 401 -X PUT -H "Authorization: Bearer kiln_$(printf %064d $R)" --data-binary @a.kiln \
        "$URL/v1/models/soak/versions/9.9.$it"
    expect_status 400 "$URL/v1/models/..%2Fetc/versions/1.0.1"
    expect_status 404 "$URL/v1/blobs/sha256/$(printf %064d $R)"
    expect_status 416 -H 'Range: bytes=x-' "$URL/v1/blobs/sha256/$digest"
    curl -s "$URL/v1/models/soak/channels/staging" >rec.json
    expect_status 409 -X PUT -H "Authorization: Bearer $PROM" --data-binary @rec.json \
        "$URL/v1/models/soak/channels/staging"
    expect_status 422 -X PUT -H "Authorization: Bearer $PUB" -H "X-Kiln-Signature: $sig" \
        -H "X-Kiln-Digest: sha256:$(printf %064d 0)" --data-binary @a.kiln "$URL/v1/models/soak/versions/8.8.$it"
    expect_status 405 -X PUT -H "Authorization: Bearer $PUB" -H "X-Kiln-Signature: $sig" \
        -H "X-Kiln-Digest: sha256:$digest" --data-binary @a.kiln "$MURL/v1/models/soak/versions/1.0.$it"
    if [ $revoked = 1 ]; then
        expect_status 401 -X PUT -H "Authorization: Bearer $OLD" -H "X-Kiln-Signature: $sig" \
            -H "X-Kiln-Digest: sha256:$digest" --data-binary @a.kiln "$URL/v1/models/soak/versions/6.6.$it"
        grep -q "token 'ci-old' was revoked at" bad.out || fail "the revoked token's answer: $(cat bad.out)"
        revoked_uses=$((revoked_uses + 1)) revoked_life=$((revoked_life + 1))
    fi
    if [ $(((it + samples) % 4)) = 0 ]; then
        # Half the body, then the client gives up: the server must drop the upload.
        head -c $((size / 2)) a.kiln >half.kiln
        curl -s -o /dev/null --max-time 0.5 -X PUT -H "Authorization: Bearer $PUB" -H "X-Kiln-Signature: $sig" \
            -H "X-Kiln-Digest: sha256:$digest" -H "Content-Length: $size" -H 'Expect:' --data-binary @half.kiln \
            "$URL/v1/models/soak/versions/7.7.$it"
        [ $? = 28 ] || fail "the cut-off upload was answered"
        cut=$((cut + 1))
    fi
done

echo "quit $SEQ" >&3
exec 3>&-
cat <&4 >pull.summary
wait $DPID || fail "soak_pull exited $?: $(grep -v '^note' pull.err | tail -5)"
DPID=
primary_requests
el=$(($(now_ms) - t0))

# The mirror holds exactly what the primary holds, through the HTTP API: every listing, each
# version's JSON, each blob (its sha256 and its bytes), the channel's record and history, each
# trust version. mirror_equal leaves in WHY what differs, or nothing.
mirror_equal() {
    WHY=
    for p in /v1/models /v1/models/soak /v1/models/soak/channels/staging \
        /v1/models/soak/channels/staging/history /v1/trust; do
        curl -s "$URL$p" >eq.p; curl -s "$MURL$p" >eq.m
        cmp -s eq.p eq.m || { WHY="GET $p differs"; return; }
    done
    EQ_V=0 EQ_B=0 EQ_T=0
    for v in $(ls pub); do
        curl -s "$URL/v1/models/soak/versions/$v" >eq.p; curl -s "$MURL/v1/models/soak/versions/$v" >eq.m
        cmp -s eq.p eq.m || { WHY="GET /v1/models/soak/versions/$v differs"; return; }
        EQ_V=$((EQ_V + 1))
    done
    for d in $(curl -s "$URL/v1/models/soak" | grep -o 'sha256:[0-9a-f]\{64\}' | sort -u); do
        h=${d#sha256:}
        curl -s "$URL/v1/blobs/sha256/$h" >eq.p; curl -s "$MURL/v1/blobs/sha256/$h" >eq.m
        [ "$(sha256sum <eq.m | cut -d' ' -f1)" = "$h" ] && cmp -s eq.p eq.m || { WHY="blob $d differs"; return; }
        EQ_B=$((EQ_B + 1))
    done
    n=2
    while [ $n -le $TV ]; do
        curl -s "$URL/v1/trust/$n" >eq.p; curl -s "$MURL/v1/trust/$n" >eq.m
        cmp -s eq.p eq.m && cmp -s eq.p v$n.signed.json || { WHY="trust version $n differs"; return; }
        EQ_T=$((EQ_T + 1)) n=$((n + 1))
    done
    EQ_R=$(curl -s "$MURL/v1/models/soak/channels/staging/history" | grep -o '"text":' | wc -l)
}
# The newest record and trust version first (the last sync's), then everything.
tf=$(now_ms) c0=$catchups cm0=$catchup_max
catch_up
final_ms=$(($(now_ms) - tf)) catchups=$c0 catchup_max=$cm0
mirror_equal
[ -z "$WHY" ] || { sleep $((MIRROR_EVERY + 1)); mirror_equal; }
[ -z "$WHY" ] || fail "the mirror holds the primary's newest record but not all it holds: $WHY"
[ $EQ_V = $publishes ] || fail "the mirror holds $EQ_V versions, $publishes were published"
[ "$EQ_R" = $((promotes + rollbacks)) ] || fail "the mirror holds $EQ_R channel records, $((promotes + rollbacks)) were put"
curl -s "$MURL/metrics" >mmetrics.txt
mrequests=$(awk '/^kiln_registry_requests_total/ { s += $NF } END { print s + 0 }' mmetrics.txt)

stop mirror $YPID; YPID=
stop mserve $MPID; MPID=
stop serve-$lives $PID; PID=
$KILN registry fsck --root reg --trust trust.json >fsck.out 2>&1 || fail "fsck: $(cat fsck.out)"
[ -z "$(ls -A reg/tmp 2>/dev/null)" ] || fail "reg/tmp holds $(ls reg/tmp)"
$KILN registry fsck --root mirror --trust trust.json >mfsck.out 2>&1 || fail "fsck of the mirror: $(cat mfsck.out)"
[ -z "$(ls -A mirror/tmp 2>/dev/null)" ] || fail "mirror/tmp holds $(ls mirror/tmp)"
expected=$((tokens + publishes + crash_pubs + promotes + rollbacks + revoked + trust_puts))
rows=$(sqlite3 reg/registry.db 'SELECT count(*) FROM audit')
[ "$rows" = $expected ] || fail "the audit log holds $rows rows, expected $expected"
for a in "token.create $tokens" "publish $((publishes + crash_pubs))" "promote $promotes" "rollback $rollbacks" \
    "token.revoke $revoked" "trust.put $trust_puts"; do
    n=$(sqlite3 reg/registry.db "SELECT count(*) FROM audit WHERE action = '${a% *}'")
    [ "$n" = "${a#* }" ] || fail "the audit log holds $n '${a% *}' rows, expected ${a#* }"
done
old_rows=$(sqlite3 reg/registry.db "SELECT count(*) FROM audit WHERE token = 'ci-old' AND action = 'publish'")
[ "$old_rows" = $old_publishes ] || fail "the audit log holds $old_rows publishes by 'ci-old', $old_publishes were made before its revocation"
# Each item the mirror copied, once: versions, records, trust versions.
mexpected=$((publishes + crash_pubs + promotes + rollbacks + trust_puts))
mrows=$(sqlite3 mirror/registry.db "SELECT count(*) FROM audit WHERE action = 'mirror.sync'")
mall=$(sqlite3 mirror/registry.db "SELECT count(*) FROM audit")
[ "$mrows" = $mexpected ] && [ "$mall" = $mrows ] ||
    fail "the mirror's audit log holds $mall rows, $mrows of them mirror.sync, expected $mexpected ($((publishes + crash_pubs)) versions, $((promotes + rollbacks)) records, $trust_puts trust versions)"
$KILN registry token list --root reg >tokens.out || fail "token list"
grep -q "^ci-old .* revoked .*: soak: revoked mid-run\$" tokens.out || fail "token list: $(cat tokens.out)"
[ "$(grep -c ' active$' tokens.out)" = 3 ] || fail "token list: $(cat tokens.out)"
syncs=$(grep -c '^mirror of .*: copied' mirror.out)
sync_failed=$(grep -c '^kiln: error: ' mirror.err)

cli_sorted=$(printf '%s\n' $cli_lat | sort -n)
q() { printf '%s\n' "$cli_sorted" | awk -v q=$1 '{ a[NR] = $1 } END { i = int(q * (NR - 1)) + 1; print a[i] }'; }
lag_sorted=$(printf '%s\n' $lags | sort -n)
lq() { printf '%s\n' "$lag_sorted" | awk -v q=$1 '{ a[NR] = $1 } END { i = int(q * (NR - 1)) + 1; print a[i] }'; }
echo "== summary"
echo "  registry_seconds        $((el / 1000)) ($samples iterations: $it versions published, then $history_reads steady ones)"
echo "  requests                $requests answered by the primary ($(awk -v r=$requests -v e=$el 'BEGIN { printf "%.0f", r / (e / 1000) }')/s, counted at each stop), $mrequests by the mirror: $publishes versions published ($republished twice), $promotes promotions, $rollbacks rollbacks, $bad bad requests answered as expected, $cut uploads cut off"
sed -n 's/^  //p' pull.summary | sed 's/^/  /'
echo "  cli_pull_latency        p50 $(q 0.5) ms  p99 $(q 0.99) ms  max $(q 1) ms ($cli_pulls kiln pull processes over both registries, predictions checked with kiln infer)"
echo "  outages                 $outages primary stops in mid-round, $((outages - kills - freezes)) by SIGTERM (each exit 0), $kills by SIGKILL during an upload and $freezes by SIGSTOP (then SIGCONT), and $moutages mirror server stops; $((down_ms / 1000)).$(((down_ms % 1000) / 100)) s down in all ($((mdown_ms / 1000)).$(((mdown_ms % 1000) / 100)) s of it the mirror's): $down_pulls kiln_pulls in $down_rounds rounds and $down_cli kiln pull processes served by the other registry, each passing over the stopped one (a frozen one after its 5 s deadline); $((lives - 1)) restarts of the primary and $((mlives - 1)) of the mirror's server on their addresses"
echo "  service restarts        $restarts (a new kiln_watch on the same directory and state), $offline_restarts of them with no registry up, each serving the record its state accepted last, its model's predictions the published ones"
echo "  crashes                 $kills uploads of 'crash' cut by SIGKILL: $crash_acked answered 2xx first (each kept), $crash_kept kept in all, $crash_lost not stored at all; fsck clean after each restart; each published again ('already stored' exactly when kept)"
echo "  mirror                  $syncs syncs copied something, $sync_failed gave up (a sync retries through a short outage), 0 problems; lag p50 $(lq 0.5) s max $(lq 1) s (bound $LAG_MAX s, plus a freeze's length at its end; $(printf '%s\n' $lags | wc -l) samples); the newest record on the mirror within $catchup_max ms at the $catchups catch-ups before outages and rotations"
echo "  mirror_final            the newest record copied $final_ms ms after the traffic stopped, then equal to the primary: $EQ_V versions (JSON byte for byte), $EQ_B blobs (sha256 and bytes), $EQ_R channel records (history and current record byte for byte), $EQ_T trust versions; audit $mrows mirror.sync rows (each item once); fsck clean; tmp empty"
echo "  trust                   $rotations rotations (version 1 -> $TV, each signed by root-a and root-b): removed promote keys$keys_removed; each one's record failed kiln channel verify, was refused by the primary (422) and by every client, then was re-promoted with the new key"
echo "  revocation              token 'ci-old' ($old_publishes publishes) revoked at t=${revoked_at}s; its next use and $((revoked_uses - 1)) more answered 401 'was revoked', counted by the primary's auth_refused{revoked}; the 3 other tokens active and used to the end"
echo "  rss_kb                  $GROW_SUMMARY"
echo "  rss_kb                  $(rss_summary)$([ $CHECK_RSS = 1 ] || echo '; not judged')"
echo "  rss_kb                  first idle sample: primary $SFIRST, mirror server $MFIRST, mirror sync $YFIRST, client $DFIRST"
echo "  idle_fds                primary $FD0 (all $lives lives), mirror server $MFD0 (all $mlives lives), mirror sync $YFD0, client $DFD0 at every one of $samples idle samples"
echo "  audit                   $rows rows, as expected ($tokens tokens, $((publishes + crash_pubs)) publishes ($crash_pubs of 'crash'), $promotes promotions, $rollbacks rollbacks, $revoked revocation, $trust_puts trust versions); fsck clean on both stores; reg/tmp empty"
echo "  result                  PASS"
