#!/bin/sh
# The registry's web page as a platform engineer opens it: a registry populated with kiln
# publish, promote and rollback (one reason hostile HTML), then the pages fetched with curl:
# the models, a model's versions (signers, lineage) and channels, a channel's history, the
# audit log for admins only; the security headers; refusals as HTML pages; metrics; the trust
# policy's page before and after a rotation that revokes a promote key.
. "$(dirname "$0")/lib.sh"
command -v curl >/dev/null || fail "curl is missing (the Makefile installs it)"
R=$T/reg
for k in rel p1 p2 r1; do $KILN keygen --out "$T/$k" --no-password >/dev/null; done
pk() { sed -n 2p "$T/$1.pub"; }
cat >"$T/trust.json" <<JSON
{"format":"kiln-trust/1","version":1,"keys":[
 {"name":"r1","pubkey":"$(pk r1)","roles":["root"]},
 {"name":"rel","pubkey":"$(pk rel)","roles":["release"]},
 {"name":"p2","pubkey":"$(pk p2)","roles":["promote"]},
 {"name":"p1","pubkey":"$(pk p1)","roles":["promote"]}],
 "channels":{"staging":{"threshold":1}},"accept_unvalidated":true}
JSON
# archive CONTENT VERSION: a small unvalidated model with a card, packed and signed.
archive() {
    mkdir -p "$T/m-$2"
    printf 'weights %s' "$1" >"$T/m-$2/model.safetensors"
    printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"run-'"$1"'","step":40,"dataset_sha256":"abcdef0123456789","code_version":"0.1.0","metrics":{"val_loss":0.8125}}}' >"$T/m-$2/card.json"
    $KILN pack "$T/m-$2" --name demo --version "$2" --out "$T/$2.kiln" >/dev/null
    $KILN sign "$T/$2.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null
}
archive one 1.0.0
archive two 1.1.0
PUB=$($KILN registry token create --root "$R" --name ci --scope publish)
PROM=$($KILN registry token create --root "$R" --name release-manager --scope promote)
ADM=$($KILN registry token create --root "$R" --name ops --scope admin)
serve_registry "$R" --trust "$T/trust.json"
$KILN publish "$T/1.0.0.kiln" --registry "$URL" --token "$PUB" >/dev/null
$KILN publish "$T/1.1.0.kiln" --registry "$URL" --token "$PUB" >/dev/null
P="--channel staging --key $T/p1.key --registry $URL --token $PROM"
$KILN promote demo 1.0.0 $P >/dev/null
HOSTILE='<script>alert(1)</script>&"'"'"
$KILN promote demo 1.1.0 $P --reason "$HOSTILE" >/dev/null
$KILN rollback demo $P >/dev/null

# get PATH [TOKEN]: the page into $T/page, its headers into $T/hdr, its status printed.
get() {
    set -- "$1" ${2:+-H "Authorization: Bearer $2"}
    p=$1; shift
    curl -sS -o "$T/page" -D "$T/hdr" -w '%{http_code}' "$@" "$URL$p"
}
has() { grep -qF -- "$1" "$T/page" || fail "$2: '$1' is not on the page: $(cat "$T/page")"; }
hdr() { tr -d '\r' <"$T/hdr" | grep -qi "^$1\$" || fail "header '$1' missing: $(cat "$T/hdr")"; }

[ "$(get /)" = 200 ] || fail "/ answered $(cat "$T/page")"
hdr 'content-type: text/html; charset=utf-8'
hdr "content-security-policy: default-src 'none'; style-src 'sha256-[A-Za-z0-9+/=]*'; .*"
hdr 'x-content-type-options: nosniff'
hdr 'referrer-policy: no-referrer'
! grep -qi '^strict-transport-security' "$T/hdr" || fail "HSTS over plain HTTP: $(cat "$T/hdr")"
has '<a href="/ui/models/demo">demo</a>' "models"
has '<td class="n">2</td>' "version count"
has '<a href="/ui/models/demo/channels/staging">staging</a> → 1.0.0 <small>seq 3</small>' "channel at a glance"

[ "$(get /ui/models/demo)" = 200 ] || fail "model page: $(cat "$T/page")"
has '>1.1.0</a>' "version 1.1.0"
has '>1.0.0</a> <span class="tag ok">staging</span>' "the version staging points at"
has "run <code>run-two</code> · step 40" "lineage"
has 'val_loss 0.8125' "metrics"
id=$(sed -n 's/^untrusted comment: minisign public key \([0-9A-F]\{16\}\)$/\1/p' "$T/rel.pub")
[ -n "$id" ] || fail "no key id in rel.pub: $(cat "$T/rel.pub")"
has "rel <small><code>$id</code>" "release signer and key id"
has 'allow-unvalidated' "unvalidated signature"
has '<td class="n">3</td>' "the current seq"
has 'release-manager' "who put the record"
[ "$(grep -c 'class="tag warn">absent<' "$T/page")" = 2 ] || fail "validation verdicts: $(cat "$T/page")"

[ "$(get /ui/models/demo/channels/staging)" = 200 ] || fail "channel page: $(cat "$T/page")"
[ "$(grep -c '^<tr><td class="n">' "$T/page")" = 3 ] || fail "three history rows: $(cat "$T/page")"
has '<span class="tag warn">rollback</span> from 1.1.0' "the rollback"
has '<span class="tag">promote</span> from 1.0.0' "the promotion"
has '&lt;script&gt;alert(1)&lt;/script&gt;&amp;&quot;&#39;' "the escaped reason"
grep -qF '<script>' "$T/page" && fail "a reason reached the page unescaped"

[ "$(get /ui/audit)" = 401 ] || fail "audit without a token"
hdr 'content-type: text/html; charset=utf-8'
has 'needs a token' "401 page"
[ "$(get /ui/audit "$PROM")" = 403 ] || fail "audit with a promote token"
[ "$(get /ui/audit "$ADM")" = 200 ] || fail "audit with an admin token: $(cat "$T/page")"
has '<td>rollback</td>' "audit rows"
[ "$(get /ui/models/nope)" = 404 ] || fail "unknown model"
has "model &#39;nope&#39; not found" "404 page"
[ "$(get /ui/models/..%2Fetc)" = 400 ] || fail "a bad name"
curl -sS "$URL/metrics" | grep -q 'route="/ui/models/{model}",method="GET",status="200"} 1' || fail "metrics"

# The trust policy: version 1 (the --trust file) in force, then p2's key is revoked by a version
# 2 that r1 signs, and the page shows who signed it and that p2 went.
keyid() { sed -n 's/^untrusted comment: minisign public key \([0-9A-F]\{16\}\)$/\1/p' "$T/$1.pub"; }
[ "$(get /)" = 200 ] || fail "/ before the rotation"
has 'Trust policy version 1 in force: 1 root, 1 release, 2 promote keys.' "the policy's line"
[ "$(get /ui/trust)" = 200 ] || fail "trust page: $(cat "$T/page")"
has '<h2>In force: version 1</h2>' "version 1 in force"
has "<tr><td>p2</td><td><code>$(keyid p2)</code></td>" "p2 in force"
has '0 stored versions' "nothing stored yet"
sed -e 's/"version":1/"version":2/' -e '/"name":"p2"/d' "$T/trust.json" >"$T/v2.json"
$KILN trust sign "$T/v2.json" --key "$T/r1.key" --out "$T/v2.signed.json" >/dev/null
$KILN trust put "$T/v2.signed.json" --registry "$URL" --token "$ADM" >/dev/null
[ "$(get /)" = 200 ] || fail "/ after the rotation"
has 'Trust policy version 2 in force: 1 root, 1 release, 1 promote key.' "the policy's line after"
[ "$(get /ui/trust)" = 200 ] || fail "trust page after the rotation: $(cat "$T/page")"
has '<h2>In force: version 2</h2>' "version 2 in force"
grep -q '<tr><td>p2</td>' "$T/page" && fail "p2 still in force: $(cat "$T/page")"
v2=$(grep '^<tr><td class="n">2 <span class="tag ok">in force</span>' "$T/page") || fail "no row for version 2: $(cat "$T/page")"
for want in '<td>ops</td>' "r1 <small><code>$(keyid r1)</code></small> <span class=\"tag\">v1</span> <span class=\"tag\">v2</span>" \
    "<span class=\"tag bad\">removed</span> key &#39;p2&#39; ($(keyid p2)) removed (promote)" '<span class="tag ok">verified</span>'; do
    case $v2 in *"$want"*) ;; *) fail "version 2's row lacks '$want': $v2" ;; esac
done
kill -TERM $PID
wait $PID
