#!/bin/sh
# kiln on an OCI registry (docs/registry.md "On an OCI registry"): Debian's docker-registry
# (CNCF distribution) on loopback, no kiln server but where one is mirrored. The registry's
# first trust version; publish (checked before writing: signatures under the registry's
# policy, immutable versions); a two-key quorum for production (one key refused before
# anything is written; co-signed and put); pull, promote, rollback, history, kiln models
# --trust, a signed trust version walked to, trust update, renew, audit refused; two
# promoters racing for one seq, prepared and at the same moment (one wins, the other is
# told), and a registry that rewrites an accepted record (a fork, refused); a lying registry
# (swapped blobs, a rolled-back and a withheld channel, a huge declared size, a trickle, a
# redirect to another host), chunked uploads, a refused PATCH, an interrupted upload, and
# injected records (under threshold, expired); skopeo copy --all --preserve-digests and
# skopeo sync to a second registry and an oci: layout, a fresh host pulling from each copy;
# kiln registry mirror both ways; garbage-collect --delete-untagged, then a pull; basic auth
# from the file skopeo login writes.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$T"
for k in root rel p1 p2 stranger; do $KILN keygen --out $k --no-password >/dev/null; done
pk() { sed -n 2p "$1.pub"; }
cat >trust.json <<JSON
{"format":"kiln-trust/1","version":1,"keys":[
 {"name":"root","pubkey":"$(pk root)","roles":["root"]},
 {"name":"rel","pubkey":"$(pk rel)","roles":["release"]},
 {"name":"p1","pubkey":"$(pk p1)","roles":["promote"]},
 {"name":"p2","pubkey":"$(pk p2)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1},"production":{"threshold":2}}, "accept_unvalidated": true}
JSON
archive() { signed_archive "$1" "$2" "$3" "$T/${4:-rel}.key"; }
archive one 1.0.0 a1.kiln
archive two 1.1.0 a2.kiln
archive other 1.0.0 a3.kiln
archive evil 6.6.6 a4.kiln stranger

oci_registry a
A=$OCI_ADDR
U=oci+http://$A/team/kiln
S="--trust trust.json --state st"

# Nothing is written before the registry holds a policy to check it against.
expect_fail 1 $KILN publish a1.kiln --registry "$U"
grep -q "holds no trust policy" err || fail "publish without a policy: $(cat err)"
$KILN trust put trust.json --registry "$U" >out || fail "trust put v1: $(cat out)"
manifest "$A" team/kiln/kiln.trust 1 | grep -q '"artifactType":"application/vnd.kiln.trust.v1+json"' ||
    fail "trust version 1 is not in team/kiln/kiln.trust:1"
expect_fail 2 $KILN trust put trust.json --registry "$U"
grep -q "holds trust version 1 already\|plain policy" err || fail "trust v1 twice: $(cat err)"

# publish: an OCI image manifest tagged 1.0.0, config = manifest.json, layers archive,
# signature, card; the same bytes again are already stored, other bytes refused.
$KILN publish a1.kiln --registry "$U" >out || fail "publish: $(cat out)"
d1=$(sha256sum a1.kiln | cut -d' ' -f1)
grep -q "published: sha256:$d1" out || fail "publish said: $(cat out)"
manifest "$A" team/kiln/demo 1.0.0 >m1.json || fail "no manifest team/kiln/demo:1.0.0"
grep -q '"artifactType":"application/vnd.kiln.model.v1","config":{"digest":"sha256:[0-9a-f]*","mediaType":"application/vnd.kiln.manifest.v1+json"' m1.json ||
    fail "version manifest: $(cat m1.json)"
grep -q "\"digest\":\"sha256:$d1\",\"mediaType\":\"application/vnd.kiln.archive.v1.tar+zstd\"" m1.json ||
    fail "layer 0 is not the archive: $(cat m1.json)"
$KILN publish a1.kiln --registry "$U" | grep -q "already stored: sha256:$d1" || fail "second publish"
expect_fail 2 $KILN publish a3.kiln --registry "$U"
grep -q "immutable" err || fail "other bytes as 1.0.0: $(cat err)"
manifest "$A" team/kiln/demo 1.0.0 | cmp -s - m1.json || fail "a refused publish changed 1.0.0"
expect_fail 1 $KILN publish a4.kiln --registry "$U"
curl -sf -o /dev/null -H 'Accept: application/vnd.oci.image.manifest.v1+json' "http://$A/v2/team/kiln/demo/manifests/6.6.6" &&
    fail "a stranger's archive reached the registry"
$KILN publish a2.kiln --registry "$U" >/dev/null || fail "publish 1.1.0"

# Production needs two promote keys: one is refused before anything is written.
expect_fail 1 $KILN promote demo 1.0.0 --channel production --key p1.key --registry "$U"
grep -q "needs 2 distinct promote keys, the record is signed by 1" err || fail "one key for production: $(cat err)"
curl -s "http://$A/v2/team/kiln/demo/tags/list" | grep -q '_ch.production' && fail "a refused record was written"
$KILN promote demo 1.0.0 --channel production --key p1.key --registry "$U" --out prod1.json >/dev/null ||
    fail "promote --out"
$KILN channel sign --add prod1.json --key p2.key >/dev/null || fail "co-sign"
$KILN channel put prod1.json --registry "$U" >/dev/null || fail "channel put: $(cat err)"
manifest "$A" team/kiln/demo _ch.production.1 | grep -q '"artifactType":"application/vnd.kiln.channel-record.v1+json"' ||
    fail "no record artifact at _ch.production.1"
$KILN pull demo@production --registry "$U" $S --out svc >out || fail "pull: $(cat out)"
grep -q "pulled demo@1.0.0 (channel production, seq 1) sha256:$d1" out || fail "pulled: $(cat out)"
[ "$(cat svc/model.safetensors)" = "weights one" ] || fail "pulled the wrong bytes"

# staging: promote, pull, promote, pull, rollback, pull.
$KILN promote demo 1.0.0 --channel staging --key p1.key --registry "$U" >/dev/null || fail "staging 1.0.0"
$KILN promote demo 1.1.0 --channel staging --key p1.key --registry "$U" >/dev/null || fail "staging 1.1.0"
$KILN pull demo@staging --registry "$U" $S --out stg >/dev/null || fail "pull staging"
[ "$(cat stg/model.safetensors)" = "weights two" ] || fail "staging is not 1.1.0"
$KILN rollback demo --channel staging --key p1.key --registry "$U" $S >out || fail "rollback: $(cat out)"
grep -q "1.0.0 .* seq 3, reason 'rollback'" out || fail "rollback said: $(cat out)"
$KILN pull demo@staging --registry "$U" $S --out stg >out || fail "pull after rollback"
grep -q "seq 3" out && [ "$(cat stg/model.safetensors)" = "weights one" ] || fail "pull after rollback: $(cat out)"
$KILN channel history demo --channel staging --registry "$U" >hist || fail "history"
[ "$(grep -c '^[123] ' hist)" = 3 ] || fail "history: $(cat hist)"
$KILN models --registry "$U" --trust trust.json --state st >models.txt || fail "models: $(cat models.txt)"
grep -q "^demo  2 versions" models.txt || fail "models: $(cat models.txt)"

# A signed trust version: checked as the successor of the registry's policy, walked to.
sed 's/"version":1/"version":2/; s/"staging":{"threshold":1}/"staging":{"threshold":1},"canary":{"threshold":1}/' trust.json >v2.json
$KILN trust sign v2.json --key root.key --out v2.signed.json >/dev/null || fail "trust sign"
expect_fail 2 $KILN trust put v2.json --registry "$U"
$KILN trust put v2.signed.json --registry "$U" >/dev/null || fail "trust put v2"
$KILN pull demo@staging --registry "$U" $S --out stg >/dev/null || fail "pull under v2"
[ -e st/trust/2.json ] || fail "the pull did not walk to trust version 2"
$KILN promote demo 1.1.0 --channel canary --key p1.key --registry "$U" >/dev/null ||
    fail "a channel of trust v2 refused"
$KILN trust update --registry "$U" --trust trust.json --state tu >out || fail "trust update: $(cat out)"
[ -e tu/trust/2.json ] || fail "trust update did not walk to version 2: $(cat out)"
$KILN renew demo --channel canary --key p1.key --registry "$U" --trust trust.json --state st >out ||
    fail "renew: $(cat out)"
grep -q "seq 2" out || fail "renew said: $(cat out)"
$KILN pull demo@canary --registry "$U" $S --out can >out || fail "pull a renewed channel: $(cat out)"
grep -q "channel canary, seq 2" out || fail "renewed pull: $(cat out)"
expect_fail 2 $KILN registry audit --registry "$U"
grep -q "an OCI registry keeps no audit log" err || fail "audit on OCI: $(cat err)"

# Two promoters racing for one seq: each signs staging's next record (seq 4) before either
# puts it; the first is written, the second is told, and nothing of it is written.
$KILN promote demo 1.1.0 --channel staging --key p1.key --registry "$U" --out ra.json >/dev/null || fail "ra"
$KILN promote demo 1.0.0 --channel staging --key p2.key --registry "$U" --out rb.json >/dev/null || fail "rb"
$KILN channel put ra.json --registry "$U" >/dev/null || fail "the first promoter"
expect_fail 2 $KILN channel put rb.json --registry "$U"
grep -q "seq 4, but the next must be 5" err || fail "the second promoter was not told: $(cat err)"
$KILN pull demo@staging --registry "$U" $S --out stg >/dev/null || fail "pull seq 4"
# Two promoters at the same moment, three times over (on canary): whatever the interleaving,
# each either wins or is told, and there is one record per winner, each verifying.
ncan() { curl -s "http://$A/v2/team/kiln/demo/tags/list" | grep -o '"_ch\.canary\.[0-9]*"' | wc -l; }
for r in 1 2 3; do
    before=$(ncan)
    $KILN promote demo 1.0.0 --channel canary --key p1.key --registry "$U" >ra.out 2>ra.err &
    pa=$!
    $KILN promote demo 1.1.0 --channel canary --key p2.key --registry "$U" >rb.out 2>rb.err &
    pb=$!
    set +e; wait $pa; ea=$?; wait $pb; eb=$?; set -e
    [ $ea -eq 0 ] || [ $eb -eq 0 ] || fail "neither racing promoter won: $(cat ra.err rb.err)"
    for e in "$ea:ra.err" "$eb:rb.err"; do
        [ "${e%%:*}" -eq 0 ] || grep -q "lost race\|written meanwhile by another promoter\|but the next must be" "${e#*:}" ||
            fail "a racing promoter lost without being told: $(cat "${e#*:}")"
    done
    w=$(( (ea == 0) + (eb == 0) ))
    [ $(($(ncan) - before)) -eq "$w" ] || fail "race $r: $w promoters said they won, $(($(ncan) - before)) records came"
    $KILN pull demo@canary --registry "$U" --trust trust.json --state race-st --out race >/dev/null 2>err ||
        fail "race $r: the channel does not verify: $(cat err)"
done

# The registry rewrites _ch.staging.4 with the loser's record (anyone with push rights can):
# a client that accepted seq 4 refuses the other record of seq 4 as a fork.
rb_d=sha256:$(sha256sum rb.json | cut -d' ' -f1)
rb_n=$(wc -c <rb.json)
loc=$(curl -si -X POST "http://$A/v2/team/kiln/demo/blobs/uploads/" | tr -d '\r' | sed -n 's/^Location: //Ip')
curl -sf -X PUT -H 'Content-Type: application/octet-stream' --data-binary @rb.json "$loc&digest=$rb_d" >/dev/null ||
    fail "upload the loser's record"
manifest "$A" team/kiln/demo _ch.staging.4 >ra.man
python3 -c 'import json,sys; m=json.load(open(sys.argv[1])); m["layers"][0]["digest"]=sys.argv[2]; m["layers"][0]["size"]=int(sys.argv[3]); sys.stdout.write(json.dumps(m))' \
    ra.man "$rb_d" "$rb_n" >rb.man
curl -sf -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' --data-binary @rb.man \
    "http://$A/v2/team/kiln/demo/manifests/_ch.staging.4" >/dev/null || fail "rewrite _ch.staging.4"
expect_fail 1 $KILN pull demo@staging --registry "$U" $S --out stg
grep -q "a fork" err || fail "a rewritten record was not refused as a fork: $(cat err)"
[ "$(cat stg/model.safetensors)" = "weights two" ] || fail "a refused pull changed the installed model"
curl -sf -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' --data-binary @ra.man \
    "http://$A/v2/team/kiln/demo/manifests/_ch.staging.4" >/dev/null || fail "restore _ch.staging.4"


# Copies made by the registries' own tools: skopeo copy --all --preserve-digests of each tag
# to a second registry, skopeo sync of the whole repositories to a third path there; a fresh
# host pulls from each with every check passing (nothing was trusted to the copier).
oci_registry b
B=$OCI_ADDR
SK="--src-tls-verify=false --dest-tls-verify=false"
for tag in $(curl -s "http://$A/v2/team/kiln/demo/tags/list" | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["tags"]))'); do
    skopeo copy --all --preserve-digests $SK "docker://$A/team/kiln/demo:$tag" "docker://$B/eu/kiln/demo:$tag" >/dev/null 2>sk.err ||
        fail "skopeo copy demo:$tag: $(cat sk.err)"
done
skopeo copy --all --preserve-digests $SK "docker://$A/team/kiln/kiln.trust:1" "docker://$B/eu/kiln/kiln.trust:1" >/dev/null 2>sk.err &&
    skopeo copy --all --preserve-digests $SK "docker://$A/team/kiln/kiln.trust:2" "docker://$B/eu/kiln/kiln.trust:2" >/dev/null 2>>sk.err ||
    fail "skopeo copy kiln.trust: $(cat sk.err)"
manifest "$B" eu/kiln/demo 1.0.0 | cmp -s - m1.json || fail "the copy's manifest digest differs"
$KILN pull demo@production --registry "oci+http://$B/eu/kiln" --trust trust.json --state fresh1 --out h1 >out ||
    fail "pull from the skopeo copy: $(cat out)"
grep -q "pulled demo@1.0.0 (channel production, seq 1) sha256:$d1" out || fail "copy pulled: $(cat out)"
for repo in demo kiln.trust; do
    skopeo sync --all --preserve-digests --src docker --dest docker $SK "$A/team/kiln/$repo" "$B/us/kiln" >/dev/null 2>sk.err ||
        fail "skopeo sync $repo: $(cat sk.err)"
done
$KILN pull demo@staging --registry "oci+http://$B/us/kiln" --trust trust.json --state fresh2 --out h2 >out ||
    fail "pull from the skopeo sync: $(cat out)"
grep -q "pulled demo@1.1.0 (channel staging, seq 4)" out || fail "sync pulled: $(cat out)"

# A round trip through an oci: layout directory (an air gap), back into registry a (a
# layout's reference cannot begin with "_": each tag goes in as k+TAG).
for repo in demo kiln.trust; do
    for tag in $(curl -s "http://$A/v2/team/kiln/$repo/tags/list" | python3 -c 'import json,sys; print(" ".join(json.load(sys.stdin)["tags"]))'); do
        skopeo copy --all --preserve-digests --src-tls-verify=false "docker://$A/team/kiln/$repo:$tag" "oci:layout-$repo:k$tag" >/dev/null 2>sk.err &&
            skopeo copy --all --preserve-digests --dest-tls-verify=false "oci:layout-$repo:k$tag" "docker://$A/airgap/$repo:$tag" >/dev/null 2>>sk.err ||
            fail "oci: layout round trip of $repo:$tag: $(cat sk.err)"
    done
done
$KILN pull demo@production --registry "oci+http://$A/airgap" --trust trust.json --state fresh3 --out h3 >/dev/null ||
    fail "pull after an oci: layout round trip: $(cat err 2>/dev/null)"
cmp -s h3/model.safetensors svc/model.safetensors || fail "the air-gapped copy differs"

# A lying registry (oci_liar.py, a proxy in front of registry a that lies as MODE says) and
# records injected by anyone with push rights: each refused by the client, nothing installed.
python3 "$HERE/oci_liar.py" lport "$A" mode seen 2>liar.err &
OCI_PIDS="$OCI_PIDS $!"
i=0
until [ -s lport ]; do i=$((i + 1)); [ $i -lt 100 ] || fail "liar: $(cat liar.err)"; sleep 0.05; done
L=oci+http://127.0.0.1:$(cat lport)/team/kiln
d2=$(sha256sum a2.kiln | cut -d' ' -f1)
lie() { printf '%s\n' "$*" >mode; }
lie swap "sha256:$d1" "sha256:$d2"
expect_fail 1 $KILN pull demo@production --registry "$L" --trust trust.json --state lie1 --out x1
grep -q "hashes to sha256:$d2, not sha256:$d1; refusing" err && [ ! -e x1 ] || fail "swapped blob: $(cat err)"
lie hide '_ch\.staging\.4'
expect_fail 1 $KILN pull demo@staging --registry "$L" $S --out x2
grep -q "has seq 3, lower than 4 accepted before (a replayed or rolled-back record)" err || fail "rolled back: $(cat err)"
lie hide '_ch\.staging\..*'
expect_fail 1 $KILN pull demo@staging --registry "$L" $S --out x3
grep -q "was accepted at seq 4 before, but the registry no longer has it" err || fail "withheld: $(cat err)"
lie huge 1.0.0
set +e; $KILN pull demo@production --registry "$L" --trust trust.json --state lie4 --out x4 >out 2>err; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "declares demo@1.0.0 at 1099511627776 bytes.*not downloaded" err && [ ! -e x4 ] ||
    fail "huge declared size: $(cat err)"
expect_fail 1 $KILN pull demo@production --registry "$L" --trust trust.json --state lie4 --out x4 --max-size 2T
grep -q "more than an archive of its signed manifest can be .*not downloaded" err || fail "over the signed bound: $(cat err)"
lie trickle "sha256:$d1"
t0=$(date +%s)
set +e; $KILN pull demo@production --registry "$L" --trust trust.json --state lie5 --out x5 --timeout 1s >out 2>err; rc=$?; set -e
[ $rc -ne 0 ] && grep -q "too slow" err && [ ! -e x5 ] || fail "trickle: $(cat err)"
[ $(($(date +%s) - t0)) -lt 30 ] || fail "a trickle held the pull $(($(date +%s) - t0)) s"
lie redirect "sha256:$d1"
$KILN pull demo@production --registry "$L" --trust trust.json --state lie6 --out x6 --token registry-bearer-secret >out 2>err ||
    fail "redirected download: $(cat err)"
grep -q . seen && ! grep -v '^range ' seen | grep -qv '^none$' ||
    fail "the registry's credentials went to the other host: $(cat seen)"
# The other host drops the download half way, then says the signed URL expired: the pull
# resumes there with Range, goes back to the registry for a new URL and resumes from it.
rm -f seen
lie redirect-cut "sha256:$d1"
$KILN pull demo@production --registry "$L" --trust trust.json --state lie8 --out x8 --token registry-bearer-secret >out 2>err ||
    fail "a redirected download cut and expired: $(cat err)"
[ "$(grep -c '^range bytes=[1-9][0-9]*-$' seen)" -eq 2 ] || fail "not resumed twice with Range: $(cat seen)"
! grep -v '^range ' seen | grep -qv '^none$' || fail "credentials to the other host: $(cat seen)"
cmp -s x8/model.safetensors svc/model.safetensors || fail "the resumed download differs"
# A record's write that lands but is answered 500 (docker-registry answers so when two writers
# link one tag at once): the promoter reads the tag back and knows it is in force.
n=$(ncan)
lie put500 "_ch\\.canary\\.$((n + 1))"
$KILN promote demo 1.0.0 --channel canary --key p1.key --registry "$L" >out 2>err ||
    fail "a record that landed, answered 500: $(cat err)"
lie
$KILN pull demo@canary --registry "$U" --trust trust.json --state put500 --out x9 >out 2>err &&
    grep -q "(channel canary, seq $((n + 1)))" out || fail "the record answered 500: $(cat out err)"
# Uploads: in 100-byte chunks (KILN_OCI_CHUNK) through the proxy, then a registry that refuses
# PATCH (one monolithic PUT instead), then one whose first PUT fails (started again from zero).
lie
rm -f seen
archive three 2.0.0 a5.kiln
archive four 2.1.0 a6.kiln
archive five 2.2.0 a7.kiln
KILN_OCI_CHUNK=100 $KILN publish a5.kiln --registry "$L" >out 2>err || fail "chunked publish: $(cat err)"
[ "$(grep -c '^PATCH [0-9]*-[0-9]*$' seen)" -ge 4 ] || fail "no chunked PATCHes: $(cat seen)"
lie nopatch
rm -f seen
KILN_OCI_CHUNK=100 $KILN publish a6.kiln --registry "$L" >out 2>err || fail "publish without PATCH: $(cat err)"
grep -q "PATCH refused" seen && grep -q '^PUT -$' seen || fail "no monolithic PUT after a refused PATCH: $(cat seen)"
lie failput
rm -f seen seen.failed
$KILN publish a7.kiln --registry "$L" >out 2>err || fail "publish after a failed PUT: $(cat err)"
grep -q "PUT failed" seen || fail "the PUT did not fail: $(cat seen)"
lie
for v in 2.0.0 2.1.0 2.2.0; do
    $KILN pull demo@$v --registry "$U" --trust trust.json --state lie7 --out "x-$v" >/dev/null || fail "pull $v after its upload"
done
[ "$(cat x-2.0.0/model.safetensors)" = "weights three" ] && [ "$(cat x-2.2.0/model.safetensors)" = "weights five" ] ||
    fail "an upload's bytes differ"
# Injected records: under the channel's threshold, and expired, each at production's next seq.
inject() { # inject RECORD.json TAG: the record as an artifact at TAG of team/kiln/demo
    rd=sha256:$(sha256sum "$1" | cut -d' ' -f1)
    loc=$(curl -si -X POST "http://$A/v2/team/kiln/demo/blobs/uploads/" | tr -d '\r' | sed -n 's/^Location: //Ip')
    curl -sf -X PUT -H 'Content-Type: application/octet-stream' --data-binary @"$1" "$loc&digest=$rd" >/dev/null
    manifest "$A" team/kiln/demo _ch.production.1 |
        python3 -c 'import json,sys; m=json.load(sys.stdin); m["layers"][0]["digest"]=sys.argv[1]; m["layers"][0]["size"]=int(sys.argv[2]); sys.stdout.write(json.dumps(m))' \
            "$rd" "$(wc -c <"$1")" >inj.man
    curl -sf -X PUT -H 'Content-Type: application/vnd.oci.image.manifest.v1+json' --data-binary @inj.man \
        "http://$A/v2/team/kiln/demo/manifests/$2" >/dev/null || fail "inject $2"
}
uninject() { curl -sf -X DELETE "http://$A/v2/team/kiln/demo/manifests/sha256:$(sha256sum inj.man | cut -d' ' -f1)" >/dev/null; }
$KILN promote demo 1.1.0 --channel production --key p1.key --registry "$U" --out under.json >/dev/null || fail "under.json"
inject under.json _ch.production.2
expect_fail 1 $KILN pull demo@production --registry "$U" $S --out svc
grep -q "needs 2 distinct promote keys" err || fail "under threshold: $(cat err)"
uninject
$KILN promote demo 1.1.0 --channel production --key p1.key --registry "$U" --expires 1s --out old.json >/dev/null || fail "old.json"
$KILN channel sign --add old.json --key p2.key >/dev/null
sleep 2
inject old.json _ch.production.2
expect_fail 1 $KILN pull demo@production --registry "$U" $S --out svc
grep -q "expired" err || fail "expired: $(cat err)"
uninject
[ "$(cat svc/model.safetensors)" = "weights one" ] || fail "a refused record changed the installed model"
$KILN pull demo@production --registry "$U" $S --out svc >/dev/null || fail "pull once the lies stopped"

# kiln registry mirror both ways: the OCI registry as the primary of a kiln store (served by
# kiln registry serve), then that kiln server as the primary of an OCI registry (--root
# oci://...): each copy verified on the way, a fresh host pulling from the last one.
$KILN registry mirror --root kstore --from "$U" --trust trust.json --once >mir1.out 2>&1 || fail "mirror OCI -> kiln: $(cat mir1.out)"
grep -q "copied demo@1.0.0 sha256:$d1" mir1.out || fail "mirror OCI -> kiln: $(cat mir1.out)"
$KILN registry serve --root kstore --listen 127.0.0.1:0 >kserve.out 2>kserve.err &
OCI_PIDS="$OCI_PIDS $!"
serve_url kserve.out kserve.err
$KILN registry mirror --root "oci+http://$B/from-kiln" --from "$URL" --trust trust.json --once >mir2.out 2>&1 ||
    fail "mirror kiln -> OCI: $(cat mir2.out)"
grep -q "copied demo/production seq 1" mir2.out || fail "mirror kiln -> OCI: $(cat mir2.out)"
$KILN pull demo@staging --registry "oci+http://$B/from-kiln" --trust trust.json --state fresh6 --out h6 >out ||
    fail "pull from the OCI mirror of the kiln mirror: $(cat out)"
grep -q "pulled demo@1.1.0 (channel staging, seq 4)" out || fail "mirrored pull: $(cat out)"
$KILN registry mirror --root "oci+http://$B/from-kiln" --from "$URL" --trust trust.json --once >mir3.out 2>&1 ||
    fail "second mirror sync: $(cat mir3.out)"
grep -q "copied 0 trust versions, 0 versions .*, 0 channel records; 0 problems" mir3.out || fail "a second sync copied again: $(cat mir3.out)"

# The registry's garbage collection (untagged manifests deleted): everything kiln wrote is
# tagged, so a pull still works after it.
A_PORT=${A#127.0.0.1:}
oci_stop a
docker-registry garbage-collect --delete-untagged "$T/a/config.yml" >gc.out 2>&1 || fail "garbage-collect: $(tail -3 gc.out)"
oci_start a "$A_PORT"
$KILN pull demo@production --registry "$U" --trust trust.json --state fresh4 --out h4 >/dev/null ||
    fail "pull after garbage-collect --delete-untagged"
$KILN pull demo@staging --registry "$U" $S --out stg >/dev/null || fail "pull staging after gc"

# Basic auth (htpasswd): without credentials the error says how to log in; with the file
# skopeo login writes ($REGISTRY_AUTH_FILE) everything works; the password is never shown.
htpasswd -Bbn kilnci 's3cret-pw' >htpasswd 2>/dev/null || fail "htpasswd"
oci_registry c "$(printf '  htpasswd:\n    realm: kiln-test\n    path: %s/htpasswd' "$T")"
C=$OCI_ADDR
UC=oci+http://$C/secure
expect_fail 2 $KILN trust put trust.json --registry "$UC"
grep -q "asks for credentials and no auth file names '$C' (skopeo login $C" err || fail "no credentials: $(cat err)"
skopeo login --tls-verify=false --authfile "$T/auth.json" -u kilnci -p 's3cret-pw' "$C" >/dev/null 2>sk.err ||
    fail "skopeo login: $(cat sk.err)"
export REGISTRY_AUTH_FILE="$T/auth.json"
{
    $KILN trust put trust.json --registry "$UC" &&
        $KILN publish a1.kiln --registry "$UC" &&
        $KILN promote demo 1.0.0 --channel staging --key p1.key --registry "$UC" &&
        $KILN pull demo@staging --registry "$UC" --trust trust.json --state fresh5 --out h5
} >auth.out 2>&1 || fail "with basic auth: $(cat auth.out)"
grep -q 's3cret-pw\|a2lsbmNp' auth.out && fail "a credential was printed"
unset REGISTRY_AUTH_FILE
echo "72-oci: passed"
