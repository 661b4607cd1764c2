#!/bin/sh
# An OCI registry behind the bearer-token flow, as Harbor, GHCR and ECR-style registries run
# it: Debian's docker-registry with token auth, and a small token server (oci_token.py, RS256
# tokens by openssl) that grants to kilnci:PASSWORD only, each token good for about 5 s.
# Without credentials kiln says how to log in; with the file `skopeo login` writes, publish,
# promote and pull work; tokens are cached per scope (a pull asks the token server for few of
# its requests) and fetched again once they expire (a mirror syncing past a token's life);
# oci:// over HTTPS with a private CA; no credential is ever printed.
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/oci.sh"
HERE=$(cd "$(dirname "$0")" && pwd)
cd "$T"
for k in rel prom; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"production":{"threshold":1}}, "accept_unvalidated": true}
JSON
signed_archive one 1.0.0 a1.kiln "$T/rel.key"
signed_archive two 1.1.0 a2.kiln "$T/rel.key"

openssl req -x509 -newkey rsa:2048 -nodes -keyout tkey.pem -out tcert.pem -days 2 \
    -subj /CN=kiln-test-token >/dev/null 2>&1 || fail "openssl req"
python3 "$HERE/oci_token.py" tport tcert.pem tkey.pem kiln-issuer kiln-registry kilnci 'tok3n-pw' grants.log -55 \
    2>token.err &
OCI_PIDS="$OCI_PIDS $!"
i=0
until [ -s tport ]; do i=$((i + 1)); [ $i -lt 100 ] || fail "token server: $(cat token.err)"; sleep 0.05; done
TP=$(cat tport)
oci_registry t "$(printf '  token:\n    realm: http://127.0.0.1:%s/token\n    service: kiln-registry\n    issuer: kiln-issuer\n    rootcertbundle: %s/tcert.pem' "$TP" "$T")"
U=oci+http://$OCI_ADDR/desk

expect_fail 2 $KILN trust put trust.json --registry "$U"
grep -q "token service of registry '$U' refused" err || fail "no credentials: $(cat err)"
skopeo login --tls-verify=false --authfile "$T/auth.json" -u kilnci -p 'tok3n-pw' "$OCI_ADDR" >/dev/null 2>sk.err ||
    fail "skopeo login: $(cat sk.err)"
export REGISTRY_AUTH_FILE="$T/auth.json"
: >grants.log
{
    $KILN trust put trust.json --registry "$U" &&
        $KILN publish a1.kiln --registry "$U" &&
        $KILN promote demo 1.0.0 --channel production --key prom.key --registry "$U"
} >run.out 2>&1 || fail "with a token: $(cat run.out)"
: >grants.log
$KILN pull demo@production --registry "$U" --trust trust.json --state st --out svc >pull.out 2>&1 ||
    fail "pull with a token: $(cat pull.out)"
[ "$(cat svc/model.safetensors)" = "weights one" ] || fail "pulled the wrong bytes"
# One pull's requests (trust versions, tags, manifests, blobs) over two repositories: a
# token per scope, cached, not one per request.
n=$(wc -l <grants.log)
[ "$n" -ge 1 ] && [ "$n" -le 3 ] || fail "$n token requests for one pull: $(cat grants.log)"
grep -q 'repository:desk/demo:pull' grants.log || fail "no pull scope asked: $(cat grants.log)"
grep -q 'push' grants.log && fail "a pull asked to push: $(cat grants.log)"
# Tokens live about 5 s: one process that keeps going past that (a mirror syncing every second)
# gets a 401 for its cached token and fetches another, and goes on copying.
$KILN registry mirror --root kstore --from "$U" --trust trust.json --interval 1s >mir.out 2>mir.err &
mpid=$!
OCI_PIDS="$OCI_PIDS $mpid"
i=0
until grep -q 'copied demo/production seq 1' mir.out; do
    i=$((i + 1)); [ $i -lt 200 ] || { kill $mpid; fail "the mirror did not copy: $(cat mir.out mir.err)"; }; sleep 0.05
done
sleep 6
$KILN publish a2.kiln --registry "$U" >/dev/null 2>&1 || fail "publish 1.1.0"
$KILN promote demo 1.1.0 --channel production --key prom.key --registry "$U" >/dev/null 2>&1 || fail "promote 1.1.0"
i=0
until grep -q 'copied demo/production seq 2' mir.out; do
    i=$((i + 1)); [ $i -lt 200 ] || { kill $mpid; fail "the mirror stopped copying once its tokens expired: $(cat mir.out mir.err)"; }
    sleep 0.05
done
kill -TERM $mpid; wait $mpid 2>/dev/null || true
grep -q 'error' mir.err && fail "the mirror failed on the way: $(cat mir.err)"
# oci:// is HTTPS: a registry with a certificate from a private CA, trusted through
# $KILN_REGISTRY_CA (as kiln's own server is); without it the certificate is refused.
unset REGISTRY_AUTH_FILE
printf 'subjectAltName=IP:127.0.0.1\n' >tls.ext
{
    openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout ca.key -out ca.pem \
        -days 2 -subj '/CN=kiln test CA' &&
        openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout srv.key -out srv.csr \
            -subj '/CN=127.0.0.1' &&
        openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key -CAcreateserial -out srv.pem -days 2 \
            -extfile tls.ext
} >tls.log 2>&1 || fail "openssl: $(cat tls.log)"
oci_registry s
S_PORT=${OCI_ADDR#127.0.0.1:}
oci_stop s
printf '  tls:\n    certificate: %s/srv.pem\n    key: %s/srv.key\n' "$T" "$T" >tls.yml
sed -i "/^  addr: /r tls.yml" "$T/s/config.yml"
docker-registry serve "$T/s/config.yml" >"$T/s/log" 2>&1 &
OCI_PIDS="$OCI_PIDS $!"
i=0
until curl -s -o /dev/null --cacert ca.pem "https://127.0.0.1:$S_PORT/v2/"; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the TLS registry did not start: $(cat "$T/s/log")"; sleep 0.05
done
US=oci://127.0.0.1:$S_PORT/secure
expect_fail 2 $KILN trust put trust.json --registry "$US"
grep -qi "certificate" err || fail "an unknown CA was not refused: $(cat err)"
{
    KILN_REGISTRY_CA=ca.pem $KILN trust put trust.json --registry "$US" &&
        KILN_REGISTRY_CA=ca.pem $KILN publish a1.kiln --registry "$US" &&
        KILN_REGISTRY_CA=ca.pem $KILN promote demo 1.0.0 --channel production --key prom.key --registry "$US" &&
        KILN_REGISTRY_CA=ca.pem $KILN pull demo@production --registry "$US" --trust trust.json --state tls-st --out tls-svc
} >tls.out 2>&1 || fail "over HTTPS: $(cat tls.out)"
[ "$(cat tls-svc/model.safetensors)" = "weights one" ] || fail "pulled over HTTPS: the wrong bytes"
grep -rq 'tok3n-pw\|a2lsbmNpOnRvazNuLXB3' run.out pull.out mir.out mir.err err && fail "a credential was printed"
echo "74-oci-token: passed"
