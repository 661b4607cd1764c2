#!/bin/sh
# The registry over HTTPS: kiln registry serve --tls-cert/--tls-key with a certificate from a
# private CA (made here with openssl), every client trusting that CA through $KILN_REGISTRY_CA
# (publish, promote, pull, channel history, a mirror's sync), a client that does not trust it
# refused before any request, a certificate for another name refused, plain HTTP to the HTTPS
# port refused, and serve refusing a missing, garbled or mismatched certificate or key before
# it makes anything. docs/registry.md, "HTTPS".
. "$(dirname "$0")/lib.sh"
command -v openssl >/dev/null || fail "openssl not found (the Makefile installs it)"
mkcert() { # NAME SAN: a P-256 key and a certificate for SAN signed by the CA, 10 years
    openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/$1.key" \
        -out "$T/$1.csr" -subj "/CN=kiln test server" 2>/dev/null || fail "openssl req $1"
    printf 'subjectAltName=%s\n' "$2" >"$T/$1.ext"
    openssl x509 -req -in "$T/$1.csr" -CA "$T/ca.pem" -CAkey "$T/ca.key" -CAcreateserial \
        -out "$T/$1.pem" -days 3650 -extfile "$T/$1.ext" 2>/dev/null || fail "openssl x509 $1"
}
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$T/ca.key" \
    -out "$T/ca.pem" -days 3650 -subj "/CN=kiln test CA" 2>/dev/null || fail "openssl CA"
mkcert srv IP:127.0.0.1
mkcert other DNS:registry.example.com

rel_prom_trust
mkdir -p "$T/m"
printf 'weights 1' >"$T/m/model.safetensors"
printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}' >"$T/m/card.json"
$KILN pack "$T/m" --name demo --version 1.0.0 --out "$T/a.kiln" >/dev/null
$KILN sign "$T/a.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null

# serve refuses a bad pair before it makes the store.
expect_fail 2 $KILN registry serve --root "$T/never" --listen 127.0.0.1:0 --tls-cert "$T/srv.pem"
grep -q "HTTPS needs both a certificate and its private key" "$T/err" || fail "cert alone: $(cat "$T/err")"
printf 'not a certificate\n' >"$T/junk.pem"
expect_fail 2 $KILN registry serve --root "$T/never" --listen 127.0.0.1:0 --tls-cert "$T/junk.pem" --tls-key "$T/srv.key"
grep -q "'$T/junk.pem': not a PEM certificate" "$T/err" || fail "junk cert: $(cat "$T/err")"
expect_fail 2 $KILN registry serve --root "$T/never" --listen 127.0.0.1:0 --tls-cert "$T/srv.pem" --tls-key "$T/junk.pem"
grep -q "'$T/junk.pem': not a PEM private key" "$T/err" || fail "junk key: $(cat "$T/err")"
expect_fail 1 $KILN registry serve --root "$T/never" --listen 127.0.0.1:0 --tls-cert "$T/srv.pem" --tls-key "$T/other.key"
grep -q "'$T/other.key' is not the private key of the certificate '$T/srv.pem'" "$T/err" || fail "mismatch: $(cat "$T/err")"
[ ! -e "$T/never" ] || fail "a refused certificate left a store behind"

PUB=$($KILN registry token create --root "$T/reg" --name ci --scope publish)
PROM=$($KILN registry token create --root "$T/reg" --name rm --scope promote)
serve_registry "$T/reg" --trust "$T/trust.json" --tls-cert "$T/srv.pem" --tls-key "$T/srv.key"
case $URL in https://127.0.0.1:*) ;; *) fail "serve did not say https: $(cat "$T/serve.out")" ;; esac

# A client that does not trust the CA: refused at the handshake, nothing sent.
expect_fail 2 $KILN publish "$T/a.kiln" --registry "$URL" --token "$PUB"
grep -q "SSL certificate problem" "$T/err" || fail "untrusted CA: $(cat "$T/err")"
# Plain HTTP to the HTTPS port: no answer a client takes.
expect_fail 2 $KILN channel history demo --channel production --registry "http://${URL#https://}"

export KILN_REGISTRY_CA="$T/ca.pem"
$KILN publish "$T/a.kiln" --registry "$URL" --token "$PUB" | grep -q '^published: sha256:' || fail "publish over https"
$KILN promote demo 1.0.0 --channel production --key "$T/prom.key" --registry "$URL" --token "$PROM" >/dev/null ||
    fail "promote over https"
$KILN pull demo@production --registry "$URL" --trust "$T/trust.json" --state "$T/st" --out "$T/svc" >"$T/pull.out" ||
    fail "pull over https: $(cat "$T/pull.out")"
grep -q '^pulled demo@1.0.0 (channel production, seq 1)' "$T/pull.out" || fail "pulled: $(cat "$T/pull.out")"
[ "$(cat "$T/svc/model.safetensors")" = "weights 1" ] || fail "the pulled model differs"
$KILN channel history demo --channel production --registry "$URL" | grep -q ' promote$' || fail "history over https"
$KILN registry mirror --root "$T/mirror" --from "$URL" --trust "$T/trust.json" --once >"$T/sync.out" ||
    fail "mirror over https: $(cat "$T/sync.out")"
grep -q '^copied demo/production seq 1 -> 1.0.0$' "$T/sync.out" || fail "mirror: $(cat "$T/sync.out")"

# The web page over HTTPS tells browsers to keep to it (HSTS); plain HTTP pages do not.
curl -s -D "$T/page.h" -o /dev/null --cacert "$T/ca.pem" "$URL/" || fail "the page over https"
grep -qi '^Strict-Transport-Security: max-age=31536000' "$T/page.h" || fail "no HSTS: $(cat "$T/page.h")"

# The right CA but a certificate for another name: refused.
kill $PID; wait $PID 2>/dev/null || true
serve_registry "$T/reg" --trust "$T/trust.json" --tls-cert "$T/other.pem" --tls-key "$T/other.key"
expect_fail 2 $KILN channel history demo --channel production --registry "$URL"
grep -q "SSL: no alternative certificate subject name matches target host name '127.0.0.1'\|certificate subject name" "$T/err" ||
    fail "wrong name: $(cat "$T/err")"
