#!/bin/sh
# The registry soak (tests/soak/soak.sh runs it; docs/soak.md): a `kiln registry serve` on a
# loopback port under SECONDS of publish, promote, rollback and pull traffic plus bad
# requests, its resident memory and fds (and those of a long-lived client) sampled whenever
# the traffic pauses; at the end fsck must be clean and the audit log must hold exactly the
# rows the traffic should have written.
#
#   registry.sh WORKDIR SECONDS SEED     ($KILN: kiln; $SOAK_BIN: soak_pull's directory)
#
# Two phases. grow (the first 60%), each iteration: pack and sign the next version
# soak@1.0.I (eight trained models in turn), publish it (every fifth twice: the second answer
# is 'already stored'), promote it on staging (every third is then rolled back). steady (the
# rest): no new version or channel record; each iteration publishes an existing version again
# (200, nothing written) and reads the channel's whole history, the largest answer the server
# gives. Both: bad requests with curl (a bad token, a bad name, an unknown blob, a bad Range,
# a replayed channel record, a digest that does not match its body, and every fourth
# iteration an upload cut off halfway), one `kiln pull` whose predictions (`kiln infer`) must
# equal the published model's, then a round of soak_pull: THREADS threads pull ROUND times
# each with kiln_pull (checking predictions) while its kiln_watch follows the channel.
#
# After each iteration the traffic has stopped: the server's fds (the fewest of ten readings
# 20 ms apart) must equal the first such sample's, as must the client's. Resident memory is
# judged against the maximum over each phase's warm-up (its first fifth):
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
CHECK_RSS=1
[ -n "${SOAK_SAN:-}" ] && CHECK_RSS=0
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 2
PID= DPID=
cleanup() {
    [ -n "$DPID" ] && kill $DPID 2>/dev/null
    [ -n "$PID" ] && kill $PID 2>/dev/null
    return 0
}
trap cleanup EXIT
fail() { echo "FAIL: $*"; [ -s pull.err ] && sed 's/^/  soak_pull: /' pull.err | tail -20; exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }
X=$SEED
rnd() { X=$(((X * 1103515245 + 12345) % 2147483648)); R=$(((X / 65536) % $1)); }
PAGE_KB=$(($(getconf PAGESIZE) / 1024))

# Keys, policy, tokens; eight models from a tiny training run (steps 1..8), and what each
# predicts on x.st.
for k in rel prom; do $KILN keygen --out $k --no-password >/dev/null || fail "keygen"; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1}}, "accept_unvalidated": true}
JSON
$KILN data synth --seed 3 --rows 2000 --features 6 --outputs 2 --out d.st >/dev/null 2>&1 || fail "synth"
$KILN data synth --seed 4 --rows 200 --features 6 --outputs 2 --out x.st >/dev/null 2>&1 || fail "synth"
$KILN train --data d.st --run-dir run --set steps=8 --set ckpt_every=1 --set keep=0 --set d_model=16 \
    --set d_ff=32 --set seq_len=16 --set attn_window=8 >/dev/null 2>train.log || { cat train.log; fail "train"; }
mkdir -p pub
for k in 1 2 3 4 5 6 7 8; do
    $KILN export run --step $k --out m$k --name soak >/dev/null || fail "export step $k"
    $KILN infer --model m$k --input x.st --out ref$k.st >/dev/null || fail "infer m$k"
done
PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
ADMIN=$($KILN registry token create --root reg --name ops --scope admin)
tokens=3

$KILN registry serve --root reg --listen 127.0.0.1:0 --trust trust.json >serve.out 2>serve.err &
PID=$!
i=0
while ! grep -q 'http://' serve.out 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 200 ] || fail "server did not start: $(cat serve.err)"; sleep 0.05
done
URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' serve.out)

# idle_sample: the server's fds (fewest of ten readings) and resident kB into SFD and SRSS.
idle_sample() {
    SFD=1000000
    for j in 1 2 3 4 5 6 7 8 9 10; do
        n=$(ls /proc/$PID/fd | wc -l)
        [ "$n" -lt "$SFD" ] && SFD=$n
        sleep 0.02
    done
    SRSS=$(($(cut -d' ' -f2 /proc/$PID/statm) * PAGE_KB))
}
# expect_status CODE CURL_ARGS...: curl's answer code must be CODE.
bad=0
expect_status() {
    want=$1; shift
    got=$(curl -s -o bad.out -w '%{http_code}' "$@")
    [ "$got" = "$want" ] || fail "curl $*: HTTP $got, expected $want: $(cat bad.out)"
    bad=$((bad + 1))
}

publishes=0 promotes=0 rollbacks=0 republished=0 cut=0 cli_pulls=0
# publish_next I: pack, sign, publish soak@1.0.I, promote it; returns the model index in K.
publish_next() {
    K=$((($1 - 1) % 8 + 1)) v=1.0.$1
    rm -f a.kiln a.kiln.minisig
    $KILN pack m$K --name soak --version $v --out a.kiln >/dev/null || fail "pack $v"
    $KILN sign a.kiln --key rel.key --allow-unvalidated >/dev/null || fail "sign $v"
    $KILN publish a.kiln --registry "$URL" --token "$PUB" >pub.out || fail "publish $v"
    grep -q '^published: ' pub.out || fail "publish $v: $(cat pub.out)"
    publishes=$((publishes + 1))
    ln -s ../m$K pub/$v
    $KILN promote soak $v --channel staging --key prom.key --registry "$URL" --token "$PROM" >/dev/null ||
        fail "promote $v"
    promotes=$((promotes + 1))
}

publish_next 1
mkfifo cmd ans
"$SOAK_BIN/soak_pull" "$URL" "$W/trust.json" "$W" $THREADS <cmd >ans 2>pull.err &
DPID=$!
exec 3>cmd 4<ans

t0=$(now_ms)
deadline=$((t0 + SECS * 1000)) steady_at=$((t0 + SECS * 600)) next_print=0
it=1 samples=0 phase=grow phase_t0=$t0 history_reads=0
FD0= DFD0= SFIRST= DFIRST=
# Per phase: warm-up end, warm-up maxima, maxima after, slack.
warm_until=$((t0 + SECS * 120)) SWARM=0 DWARM=0 SMAX=0 DMAX=0 slack=$GROW_SLACK_KB
GROW_SUMMARY=
cli_lat=
echo "registry soak: $SECS s, seed $SEED; $URL, $THREADS pulling threads x $ROUND pulls per round; grow for $((SECS * 6 / 10)) s (RSS slack $GROW_SLACK_KB kB), then steady (RSS slack $SLACK_KB kB), each after a warm-up of a fifth$([ $CHECK_RSS = 1 ] || echo '; RSS not judged under sanitizers')"
while :; do
    # One pull with the CLI, its predictions against the published model's.
    ts=$(now_ms)
    $KILN pull soak@staging --registry "$URL" --trust trust.json --state st-cli --out cli-out >cli.out 2>&1 ||
        fail "kiln pull: $(cat cli.out)"
    cli_lat="$cli_lat $(($(now_ms) - ts))"
    cli_pulls=$((cli_pulls + 1))
    v=$(sed -n 's/^pulled soak@\([^ ]*\) .*/\1/p' cli.out)
    k=$(((${v#1.0.} - 1) % 8 + 1))
    $KILN infer --model cli-out --input x.st --out cli-pred.st >/dev/null || fail "infer on the pulled $v"
    cmp -s cli-pred.st ref$k.st || fail "kiln pull of $v: predictions differ from the published model's"

    # The pullers' round, then the idle samples.
    echo "round $ROUND" >&3
    read -r ok dpulls dfail drss dfd dswaps <&4 || fail "soak_pull stopped"
    [ "$ok" = ok ] && [ "$dfail" = 0 ] || fail "soak_pull: $ok $dpulls $dfail"
    idle_sample
    now=$(now_ms)
    samples=$((samples + 1))
    [ -n "$FD0" ] || { FD0=$SFD DFD0=$dfd SFIRST=$SRSS DFIRST=$drss; }
    warm=0
    # A phase's warm-up is its first fifth, and at least its first sample.
    { [ $now -lt $warm_until ] || [ $SWARM = 0 ]; } && warm=1
    if [ $warm = 1 ]; then
        [ $SRSS -gt $SWARM ] && SWARM=$SRSS
        [ $drss -gt $DWARM ] && DWARM=$drss
    else
        [ $SRSS -gt $SMAX ] && SMAX=$SRSS
        [ $drss -gt $DMAX ] && DMAX=$drss
    fi
    verdict=ok
    [ $SFD = $FD0 ] || verdict="FAIL server fds $SFD, $FD0 at the first idle sample"
    [ $dfd = $DFD0 ] || verdict="FAIL client fds $dfd, $DFD0 at the first idle sample"
    if [ $warm = 0 ] && [ $CHECK_RSS = 1 ]; then
        [ $SRSS -le $((SWARM + slack)) ] || verdict="FAIL server resident $SRSS kB > $SWARM + $slack ($phase)"
        [ $drss -le $((DWARM + slack)) ] || verdict="FAIL client resident $drss kB > $DWARM + $slack ($phase)"
    fi
    if [ $now -ge $next_print ] || [ "$verdict" != ok ] || [ $now -ge $deadline ]; then
        echo "registry t=$(((now - t0) / 1000))s $phase v=1.0.$it pulls=$dpulls swaps=$dswaps server rss=${SRSS}kB ($((SRSS - SWARM))) fds=$SFD client rss=${drss}kB ($((drss - DWARM))) fds=$dfd$([ $warm = 1 ] && echo ' warm-up') $verdict"
        next_print=$((now + 5000))
    fi
    [ "$verdict" = ok ] || fail "${verdict#FAIL }"
    [ $now -lt $deadline ] || break
    if [ $phase = grow ] && [ $now -ge $steady_at ]; then
        GROW_SUMMARY="grow: server warm-up max $SWARM, max after $SMAX (growth $((SMAX - SWARM)), slack $slack); client $DWARM, $DMAX (growth $((DMAX - DWARM)))"
        phase=steady phase_t0=$now warm_until=$((now + (deadline - now) / 5)) SWARM=0 DWARM=0 SMAX=0 DMAX=0 slack=$SLACK_KB
    fi

    if [ $phase = grow ]; then
        # The next version, and what a release manager does.
        it=$((it + 1))
        publish_next $it
        if [ $((it % 5)) = 0 ]; then
            $KILN publish a.kiln --registry "$URL" --token "$PUB" | grep -q '^already stored' || fail "republish of 1.0.$it"
            republished=$((republished + 1))
        fi
        if [ $((it % 3)) = 0 ]; then
            $KILN rollback soak --channel staging --key prom.key --registry "$URL" --token "$PROM" >/dev/null ||
                fail "rollback after 1.0.$it"
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

echo quit >&3
exec 3>&-
cat <&4 >pull.summary
wait $DPID || fail "soak_pull exited $?: $(tail -5 pull.err)"
DPID=
curl -s "$URL/metrics" >metrics.txt
requests=$(awk '/^kiln_registry_requests_total/ { s += $NF } END { print s }' metrics.txt)
el=$(($(now_ms) - t0))
kill -TERM $PID
wait $PID || fail "server exit status after SIGTERM: $(tail -3 serve.err)"
PID=
grep -q 'stopped' serve.err || fail "no clean stop: $(tail -3 serve.err)"
$KILN registry fsck --root reg --trust trust.json >fsck.out 2>&1 || fail "fsck: $(cat fsck.out)"
[ -z "$(ls -A reg/tmp 2>/dev/null)" ] || fail "reg/tmp holds $(ls reg/tmp)"
expected=$((tokens + publishes + promotes + rollbacks))
rows=$(sqlite3 reg/registry.db 'SELECT count(*) FROM audit')
[ "$rows" = $expected ] || fail "the audit log holds $rows rows, expected $expected"
for a in "token.create $tokens" "publish $publishes" "promote $promotes" "rollback $rollbacks"; do
    n=$(sqlite3 reg/registry.db "SELECT count(*) FROM audit WHERE action = '${a% *}'")
    [ "$n" = "${a#* }" ] || fail "the audit log holds $n '${a% *}' rows, expected ${a#* }"
done
cli_sorted=$(printf '%s\n' $cli_lat | sort -n)
q() { printf '%s\n' "$cli_sorted" | awk -v q=$1 '{ a[NR] = $1 } END { i = int(q * (NR - 1)) + 1; print a[i] }'; }
echo "== summary"
echo "  registry_seconds        $((el / 1000)) ($samples iterations: $it versions published, then $history_reads steady ones)"
echo "  requests                $requests answered ($(awk -v r=$requests -v e=$el 'BEGIN { printf "%.0f", r / (e / 1000) }')/s): $publishes versions published ($republished twice), $promotes promotions, $rollbacks rollbacks, $bad bad requests answered as expected, $cut uploads cut off"
sed -n 's/^  //p' pull.summary | sed 's/^/  /'
echo "  cli_pull_latency        p50 $(q 0.5) ms  p99 $(q 0.99) ms  max $(q 1) ms ($cli_pulls kiln pull processes, predictions checked with kiln infer)"
echo "  rss_kb                  $GROW_SUMMARY"
echo "  rss_kb                  steady: server warm-up max $SWARM, max after $SMAX (growth $((SMAX - SWARM)), slack $slack); client $DWARM, $DMAX (growth $((DMAX - DWARM)))$([ $CHECK_RSS = 1 ] || echo '; not judged')"
echo "  rss_kb                  first idle sample: server $SFIRST, client $DFIRST"
echo "  idle_fds                server $FD0, client $DFD0 at every one of $samples idle samples"
echo "  audit                   $rows rows, as expected ($tokens tokens, $publishes publishes, $promotes promotions, $rollbacks rollbacks); fsck clean; reg/tmp empty"
echo "  result                  PASS"
