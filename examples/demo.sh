#!/bin/sh
# make demo: the whole kiln pipeline in a fresh temporary directory, end to end —
# synthetic data, train, SIGKILL, resume, inspect the run; keys, a trust policy and a
# registry on loopback; release v1 (export, golden, validate, pack, sign, publish), promote
# it to production with two signatures, pull it and run the example service on it; release
# v2 validated against v1, promote (and sign the rollback in advance), roll back to v1 in one
# command, pull again; revoke a stolen promote key
# with a signed trust version and re-sign production; a summary at the end, with
# the address of the registry's web page and what it shows.
# make demo-oci (KILN_DEMO_REGISTRY=oci): the same walk with an OCI registry in place of kiln's
# own server — Debian's docker-registry (CNCF distribution) on loopback, filesystem storage in
# the demo's directory, no tokens; the registry is untrusted storage and every check stays in
# the client (README, "On your OCI registry"). Its summary lists the tags by skopeo, and the
# models are then copied to a second registry ("another region") with skopeo sync and a fresh
# host pulls from there.
# Each step prints what it runs; any failure stops the demo with a non-zero status.
set -eu
KILN=${KILN:-build/kiln}
BUILD=$(cd "$(dirname "$KILN")" && pwd)
KILN=$BUILD/kiln
SERVICE=$BUILD/stream_service
W=${KILN_DEMO_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-demo-XXXXXX")}
mkdir -p "$W"
cd "$W"
export KILN_DEMO=1
# The client's anti-rollback state lives here, not in ~/.local/state.
STATE=$W/client-state
MODEL=market-alpha
REGISTRY=${KILN_DEMO_REGISTRY:-kiln}
case $REGISTRY in kiln | oci) ;; *)
    echo "demo: KILN_DEMO_REGISTRY is '$REGISTRY': kiln (kiln registry serve) or oci (docker-registry)" >&2
    exit 2 ;;
esac
step=0
REGPIDS=
URL=http://registry.invalid PUB=kiln_publish PROM=kiln_promote ADMIN=kiln_admin
# The tokens each write shows on kiln's server; an OCI registry on loopback takes none.
T_PUB= T_PROM= T_PROMOTE= T_ADMIN=
say() { step=$((step + 1)); printf '\n\033[1m== %d. %s\033[0m\n' "$step" "$*"; }
# Shorter paths and the URL as $URL in what is shown.
tidy() { sed "s|$BUILD/||g; s|$W/||g; s|$URL|\$URL|g; s|$PUB|\$PUB|g; s|$PROM|\$PROM|g; s|$ADMIN|\$ADMIN|g"; }
# run CMD...: show the command, run it, show its output (stdout and stderr); its status is
# the command's, so a failure stops the demo.
run() {
    printf '$ %s\n' "$*" | tidy
    if "$@" >"$W/.run.out" 2>&1; then tidy <"$W/.run.out"; else
        rc=$?; tidy <"$W/.run.out"; return $rc
    fi
}
# runq CMD...: the same, showing only the command.
runq() { printf '$ %s\n' "$*" | tidy; "$@" >"$W/.run.out" 2>&1 || { rc=$?; tidy <"$W/.run.out"; return $rc; }; }
# Stop the registries (by PID), whatever happens.
stop_registries() {
    for p in $REGPIDS; do kill -TERM "$p" 2>/dev/null && wait "$p" 2>/dev/null || true; done
    REGPIDS=
}
# Say where the demo stopped if it did not finish.
finish() {
    rc=$?
    stop_registries
    if [ "$rc" -ne 0 ]; then
        printf '\n\033[1mdemo FAILED at step %d (exit %d); files in %s\033[0m\n' "$step" "$rc" "$W" >&2
    fi
    exit "$rc"
}
trap finish EXIT
trap 'exit 130' INT TERM

say "synthesise a market: 20000 rows, 8 features, 2 forward-return targets"
run "$KILN" data synth --seed 1 --rows 20000 --features 8 --outputs 2 --out market.safetensors
run "$KILN" data inspect market.safetensors

say "train the tiny default config, killed with SIGKILL part way"
"$KILN" train --print-config >config.json
head -5 config.json; echo "  ..."
printf '$ %s &\n' "kiln train --data market.safetensors --run-dir run1"
"$KILN" train --data market.safetensors --run-dir run1 2>train1.log &
pid=$!
while [ ! -e run1/ckpt/step-00000200.safetensors ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
sleep 0.3
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
[ -e run1/ckpt/step-00000200.safetensors ] || { echo "no checkpoint before the kill" >&2; exit 1; }
echo "killed; checkpoints on disk: $(ls run1/ckpt | tr '\n' ' ')"

say "resume: continues from the newest checkpoint that verifies"
run "$KILN" train --resume run1 >resume.log 2>&1
tail -3 resume.log

say "the run: config, progress, metrics, events"
printf '$ kiln runs show run1 --events 5\n'
"$KILN" runs show run1 --events 5 >show.txt
sed '/^config/,/^}/c\config      { ... the full training config (JSON), trimmed here ... }' show.txt | head -30 | tidy

say "a second run without the interruption is bitwise the same"
"$KILN" train --data market.safetensors --run-dir run1b 2>/dev/null
run "$KILN" runs diff run1 run1b

say "keys and a trust policy: two root keys (sign the policy's next versions), one release key, two promote keys; production needs both"
for k in root-a root-b release alice bob; do run "$KILN" keygen --out "$k" --no-password >/dev/null; done
run "$KILN" trust init --out trust.json --root-key root-a.pub --root-key root-b.pub --release-key release.pub \
    --promote-key alice.pub --promote-key bob.pub --channel staging:1 --channel production:2
run cat trust.json

if [ "$REGISTRY" = kiln ]; then
say "a registry on loopback: a fresh root, tokens, kiln registry serve on a free port"
printf '$ kiln registry token create --root registry --name ci --scope publish\n'
PUB=$("$KILN" registry token create --root registry --name ci --scope publish)
printf '$ kiln registry token create --root registry --name release-manager --scope promote\n'
PROM=$("$KILN" registry token create --root registry --name release-manager --scope promote)
ADMIN=$("$KILN" registry token create --root registry --name ops --scope admin)
T_PUB="--token $PUB" T_PROM="--token $PROM" T_PROMOTE="--promote-token $PROM" T_ADMIN="--token $ADMIN"
echo "publish token ${PUB%"${PUB#kiln_????????}"}…, promote token ${PROM%"${PROM#kiln_????????}"}… (shown once, stored hashed)"
printf '$ kiln registry serve --root registry --listen 127.0.0.1:0 --trust trust.json &\n'
"$KILN" registry serve --root registry --listen 127.0.0.1:0 --trust trust.json >serve.out 2>serve.err &
REGPIDS=$!
i=0
while ! grep -q 'http://' serve.out 2>/dev/null; do
    i=$((i + 1))
    if [ $i -ge 200 ] || ! kill -0 "$REGPIDS" 2>/dev/null; then
        cat serve.err >&2; echo "the registry did not start" >&2; exit 1
    fi
    sleep 0.05
done
URL=$(sed -n 's/.* on \(http:\/\/127\.0\.0\.1:[0-9]*\).*/\1/p' serve.out)
tidy <serve.out
else
say "an OCI registry on loopback: Debian's docker-registry (CNCF distribution), filesystem storage here"
free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
# oci_registry NAME: docker-registry with its store and config in $W/NAME; sets ADDR.
oci_registry() {
    port=$(free_port)
    mkdir -p "$W/$1"
    printf 'version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: %s\nhttp:\n  addr: 127.0.0.1:%s\nlog:\n  level: error\n' \
        "$W/$1/data" "$port" >"$W/$1/config.yml"
    docker-registry serve "$W/$1/config.yml" >"$W/$1/log" 2>&1 &
    REGPIDS="$REGPIDS $!"
    ADDR=127.0.0.1:$port
    i=0
    until curl -s -o /dev/null "http://$ADDR/v2/"; do
        i=$((i + 1)); [ $i -lt 200 ] || { cat "$W/$1/log" >&2; echo "docker-registry did not start" >&2; exit 1; }
        sleep 0.05
    done
}
printf '$ docker-registry serve registry/config.yml &\n'
oci_registry registry
URL=oci+http://$ADDR/desk/kiln
echo "listening on $ADDR; kiln's URL for it: \$URL = oci+http://$ADDR/desk/kiln (oci:// is HTTPS)"
echo "the registry's policy goes in first: what kiln checks before it writes anything there"
run "$KILN" trust put trust.json --registry "$URL"
fi
R="--name $MODEL --registry $URL --key release.key --trust trust.json $T_PUB --state $STATE"

say "release v1: export, golden data, validate (no baseline yet), pack, sign, publish, promote to staging"
run "$KILN" release run1 --version 1.0.0 $R --promote staging --promote-key alice.key \
    $T_PROMOTE --out-dir release-v1
cp "$W/.run.out" release-v1.txt
printf '$ kiln inspect release-v1/%s-1.0.0.kiln\n' "$MODEL"
"$KILN" inspect release-v1/$MODEL-1.0.0.kiln >inspect.txt
sed '/^$/q' inspect.txt

say "promote v1 to production: one signature is refused, alice and bob co-sign"
printf '$ kiln promote %s 1.0.0 --channel production --key alice.key ...\n' "$MODEL"
if "$KILN" promote $MODEL 1.0.0 --channel production --key alice.key --registry "$URL" $T_PROM 2>refused.txt; then
    echo "production took a record with one signature" >&2; exit 1
fi
tidy <refused.txt
run "$KILN" promote $MODEL 1.0.0 --channel production --key alice.key --registry "$URL" --out prod-v1.json
run "$KILN" channel sign --add prod-v1.json --key bob.key
run "$KILN" channel put prod-v1.json --registry "$URL" $T_PROM

say "pull production and run the example service on the pulled model"
run "$KILN" pull $MODEL@production --registry "$URL" --trust trust.json --state "$STATE" --out service-model
"$KILN" data export market.safetensors --from 16000 --rows 500 --features-only >ticks-all.csv
tail -n +2 ticks-all.csv >ticks.csv
printf '$ stream_service service-model < ticks.csv > predictions-v1.csv\n'
"$SERVICE" service-model <ticks.csv >predictions-v1.csv
echo "$(wc -l <predictions-v1.csv) predictions; the last three:"
tail -3 predictions-v1.csv

say "a second, longer run (900 steps, lower peak lr); release v2, validated against v1 pulled from production"
printf '$ kiln train --data market.safetensors --run-dir run2 --set steps=900 --set lr=0.001\n'
"$KILN" train --data market.safetensors --run-dir run2 --set steps=900 --set lr=0.001 >train2.log 2>&1
tail -1 train2.log
run "$KILN" release run2 --version 2.0.0 $R --promote staging --promote-key alice.key \
    $T_PROMOTE --out-dir release-v2
cp "$W/.run.out" release-v2.txt

say "promote v2 to production (co-signed), pull, serve"
runq "$KILN" promote $MODEL 2.0.0 --channel production --key alice.key --registry "$URL" --out prod-v2.json
runq "$KILN" channel sign --add prod-v2.json --key bob.key
run "$KILN" channel put prod-v2.json --registry "$URL" $T_PROM
echo "while both promote keys are at hand, the way back is signed too (seq 3 -> 1.0.0) and kept off the registry:"
runq "$KILN" rollback $MODEL --channel production --trust trust.json --state "$STATE" --key alice.key --registry "$URL" --out rollback.json
runq "$KILN" channel sign --add rollback.json --key bob.key
run "$KILN" pull $MODEL@production --registry "$URL" --trust trust.json --state "$STATE" --out service-model
"$SERVICE" service-model <ticks.csv >predictions-v2.csv 2>/dev/null
echo "the last three predictions of v2:"
tail -3 predictions-v2.csv

say "the gate: an early checkpoint (run1, step 200) released as v3 fails validation against v2"
printf '$ kiln release run1 --step 200 --version 3.0.0 ... --out-dir release-v3\n'
if "$KILN" release run1 --step 200 --version 3.0.0 $R --out-dir release-v3 >release-v3.txt 2>&1; then
    echo "a worse model passed validation" >&2; exit 1
fi
tidy <release-v3.txt
[ ! -e release-v3/$MODEL-3.0.0.kiln ] || { echo "the failed release was packed" >&2; exit 1; }

if [ "$REGISTRY" = kiln ]; then how="with a promote token alone"; else how="with no key at hand"; fi
say "roll production back to v1 in one step: the prepared record (seq 3), put $how"
run "$KILN" channel put rollback.json --registry "$URL" $T_PROM
run "$KILN" pull $MODEL@production --registry "$URL" --trust trust.json --state "$STATE" --out service-model
"$SERVICE" service-model <ticks.csv >predictions-rollback.csv 2>/dev/null
if cmp -s predictions-v1.csv predictions-rollback.csv; then
    echo "after the rollback the service predicts exactly what v1 did (all 500 ticks, byte for byte)"
else
    echo "the rolled-back model predicts differently from v1" >&2; exit 1
fi

say "alice's key is stolen: trust version 2 drops it (carol takes her place), signed by both root keys"
run "$KILN" keygen --out carol --no-password >/dev/null
/usr/bin/python3 - "$(tail -1 carol.pub)" <<'PY'
import json, sys
p = json.load(open("trust.json"))
p["version"] = 2
for k in p["keys"]:
    if k["name"] == "alice":
        k["name"], k["pubkey"] = "carol", sys.argv[1]
json.dump(p, open("trust-v2.json", "w"), indent=2, sort_keys=True)
PY
run "$KILN" trust sign trust-v2.json --key root-a.key --out trust-v2.signed.json
run "$KILN" trust sign --add trust-v2.signed.json --key root-b.key
run "$KILN" trust verify trust-v2.signed.json --trust trust.json
run "$KILN" trust put trust-v2.signed.json --registry "$URL" $T_ADMIN
echo "the service's next pull walks to version 2 first: the record alice co-signed no longer counts"
if run "$KILN" pull $MODEL@production --registry "$URL" --trust trust.json --state "$STATE" --out service-model; then
    echo "a record signed by a revoked key was accepted" >&2; exit 1
fi
echo "bob and carol sign a new record for the same version, and the service pulls again;"
echo "staging, whose current record alice signed alone, gets one from bob"
run "$KILN" promote $MODEL 1.0.0 --channel production --key bob.key --registry "$URL" --reason "re-signed: alice revoked" --out resign.json
run "$KILN" channel sign --add resign.json --key carol.key
run "$KILN" channel put resign.json --registry "$URL" $T_PROM
run "$KILN" promote $MODEL 2.0.0 --channel staging --key bob.key --registry "$URL" $T_PROM --reason "re-signed: alice revoked"
run "$KILN" pull $MODEL@production --registry "$URL" --trust trust.json --state "$STATE" --out service-model
echo "the trading host checks what it runs, without asking the registry:"
run "$KILN" installed $MODEL@production --dir service-model --trust trust.json --state "$STATE"
# The example service following production itself (kiln_watch), its predictions into $1.
watching_service() {
    "$SERVICE" --watch $MODEL@production --registry "$URL" --trust trust.json --state watch-state \
        --dir watch-model --metrics service.prom <ticks.csv >"$1"
}
# What a node_exporter would scrape from the service's --metrics file.
service_metrics() {
    grep -E '^kiln_watch_(info|record_expiry|poll_failures_in_row|serving_offline)' service.prom
}
echo "a service that follows production itself (kiln_watch): pulled, verified, loaded, serving"
printf '$ stream_service --watch %s@production --registry %s --trust trust.json --state watch-state --dir watch-model < ticks.csv > predictions-watch.csv\n' "$MODEL" "$URL"
watching_service predictions-watch.csv
cmp -s predictions-watch.csv predictions-rollback.csv || { echo "the watching service predicted otherwise" >&2; exit 1; }
echo "its metrics for node_exporter's textfile collector (--metrics service.prom, rewritten after every poll):"
service_metrics

say "summary"
d1=$(sha256sum release-v1/$MODEL-1.0.0.kiln | cut -d' ' -f1)
d2=$(sha256sum release-v2/$MODEL-2.0.0.kiln | cut -d' ' -f1)
loss() { sed -n 's/.*held-out loss \([0-9.e-]*\).*/\1/p' "$1.txt"; }
printf '%-8s %-18s %-9s %-14s %s\n' version digest bytes "held-out loss" run
printf '%-8s %-18s %-9s %-14s %s\n' 1.0.0 "sha256:${d1%"${d1#??????????}"}…" \
    "$(wc -c <release-v1/$MODEL-1.0.0.kiln)" "$(loss release-v1)" "run1 (600 steps, killed and resumed)"
printf '%-8s %-18s %-9s %-14s %s\n' 2.0.0 "sha256:${d2%"${d2#??????????}"}…" \
    "$(wc -c <release-v2/$MODEL-2.0.0.kiln)" "$(loss release-v2)" "run2 (900 steps, lr 0.001), validated against 1.0.0"
printf '%-8s %-18s %-9s %-14s %s\n' 3.0.0 "(not published)" - "$(sed -n 's/.*held-out loss \([0-9.e-]*\) is worse.*/\1/p' release-v3.txt)" \
    "run1 step 200: refused at validate against 2.0.0"
echo
echo "what the registry holds, each channel's signed record verified here (a cron job adds --expiring 7d):"
run "$KILN" models $MODEL --registry "$URL" --trust trust.json --state "$STATE"
echo
echo "channel production, as the registry reports it:"
run "$KILN" channel history $MODEL --channel production --registry "$URL"
echo
echo "channel staging:"
"$KILN" channel history $MODEL --channel staging --registry "$URL"
echo
if [ "$REGISTRY" = kiln ]; then
echo "who did what and when, from the registry's audit log (an admin token; --follow tails it):"
run "$KILN" registry audit --registry "$URL" $T_ADMIN --action publish,promote,rollback,trust.put
else
echo "what the registry holds, by its own tools (tags: a version, _ch.CHANNEL.SEQ records, CHANNEL hints):"
printf '$ skopeo list-tags docker://%s/desk/kiln/%s\n' "$ADDR" "$MODEL"
skopeo list-tags --tls-verify=false "docker://$ADDR/desk/kiln/$MODEL" | tr -d ' \n' | sed 's/.*"Tags":\[//; s/\].*//; s/,/ /g'; echo
fi
echo
echo "what the pulled model predicted on the last three ticks (fwd_ret_1, fwd_ret_2):"
printf '%-6s %-28s %-28s %s\n' tick "v1 (production seq 1)" "v2 (production seq 2)" "after rollback (seq 3)"
n=$(wc -l <ticks.csv)
for k in 3 2 1; do
    t=$((n - k + 1))
    printf '%-6s %-28s %-28s %s\n' "$t" "$(sed -n "${t}p" predictions-v1.csv)" \
        "$(sed -n "${t}p" predictions-v2.csv)" "$(sed -n "${t}p" predictions-rollback.csv)"
done
if [ "$REGISTRY" = kiln ]; then
run "$KILN" registry fsck --root registry --trust trust.json

# The registry's web page, as a browser gets it: its front page says what is there.
if command -v curl >/dev/null && curl -fsS "$URL/" >web-home.html 2>/dev/null; then
    versions=$(sed -n 's|.*<td class="n">\([0-9]*\)</td>.*|\1|p' web-home.html | head -1)
    glance=$(grep -o 'class="ch"><a [^>]*>[^<]*</a> → [^ ]* <small>seq [0-9]*' web-home.html |
        sed 's|.*>\([^<]*\)</a> → \([^ ]*\) <small>seq \([0-9]*\)|\1 → \2 (seq \3)|' |
        paste -sd ';' - | sed 's/;/, /g')
    echo
    echo "web page: $URL/ (served until the registry goes down below; kiln registry serve --root $W/registry"
    echo "  --listen 127.0.0.1:8080 --trust $W/trust.json serves it again)"
    echo "  $MODEL: $versions versions with signers and lineage; $glance; history per channel; /ui/audit for admins"
    trust=$(grep -o 'Trust policy version [0-9]* in force: [^.]*' web-home.html)
    echo "  $trust; /ui/trust: every key, and each version with its signers and changes"
fi
else
say "another region: skopeo sync copies the models and trust versions to a second registry; a fresh host pulls there"
PRIMARY=$ADDR
oci_registry region2
for repo in $MODEL kiln.trust; do
    runq skopeo sync --all --preserve-digests --src docker --dest docker --src-tls-verify=false \
        --dest-tls-verify=false "$PRIMARY/desk/kiln/$repo" "$ADDR/desk"
done
REGION2=oci+http://$ADDR/desk
run "$KILN" pull $MODEL@production --registry "$REGION2" --trust trust.json --state fresh-host --out region2-model
cmp -s region2-model/model.safetensors service-model/model.safetensors ||
    { echo "the second region's copy differs" >&2; exit 1; }
echo "the same bytes, every check passed again on the fresh host: skopeo was trusted with nothing"
fi

say "the registry goes down; the trading service restarts on the model it kept"
stop_registries
echo "(a lone registry is retried for about 4 s before the service gives up on it)"
printf '$ stream_service --watch %s@production --registry %s ... < ticks.csv > predictions-offline.csv\n' "$MODEL" "$URL"
watching_service predictions-offline.csv
cmp -s predictions-offline.csv predictions-watch.csv || { echo "the restarted service predicted otherwise" >&2; exit 1; }
echo "the same predictions, tick for tick, as before the outage; its metrics say it serves offline:"
service_metrics

echo
echo "demo finished in $W"
