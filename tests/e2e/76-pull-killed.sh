#!/bin/sh
# A pull killed mid-download (SIGKILL: nothing of kiln runs after it) leaves the model at --out
# and the client's state as they were: a pull hashes, and unpacks into its private directory,
# while the archive lands (docs/registry.md, "Pull: what is checked"), so the kill comes while
# that directory holds part of a model. The only trace allowed is the partial download's rule:
# STATE/downloads/<hex>.partial (a prefix of the archive, resumed by the next pull) and its lock
# file. The next pull resumes it, installs the new version and removes the killed pull's
# private directory. The slow registry is a proxy of the real one that sends half the archive,
# then nothing (python3, stdlib only).
. "$(dirname "$0")/lib.sh"
rel_prom_trust
card='{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}'
for v in 1 2; do
    mkdir -p "$T/m$v"
    head -c $((4 << 20)) /dev/urandom >"$T/m$v/model.safetensors" # incompressible: 4 MiB archives
    printf '%s' "$card" >"$T/m$v/card.json"
    $KILN pack "$T/m$v" --name demo --version "1.0.$v" --out "$T/a$v.kiln" >/dev/null
    $KILN sign "$T/a$v.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null
done
PUB=$($KILN registry token create --root "$T/store" --name ci --scope publish)
PROM=$($KILN registry token create --root "$T/store" --name rm --scope promote)
serve_registry "$T/store" --trust "$T/trust.json"
GOOD=$URL
for v in 1 2; do $KILN publish "$T/a$v.kiln" --registry "$GOOD" --token "$PUB" >/dev/null; done
$KILN promote demo 1.0.1 --channel production --key "$T/prom.key" --registry "$GOOD" --token "$PROM" >/dev/null
mkdir "$T/host"
$KILN pull demo@production --registry "$GOOD" --trust "$T/trust.json" --out "$T/host/svc" --state "$T/st" \
    >/dev/null 2>"$T/err" || fail "first pull: $(cat "$T/err")"
$KILN promote demo 1.0.2 --channel production --key "$T/prom.key" --registry "$GOOD" --token "$PROM" >/dev/null

# The proxy: every answer as GOOD gives it, but a blob's first half only, then silence.
cat >"$T/proxy.py" <<'PY'
import http.server, socketserver, sys, time, urllib.request
good = sys.argv[1]
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        try:
            r = urllib.request.urlopen(good + self.path, timeout=10)
            status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            if self.path.startswith("/v1/blobs/"):
                self.wfile.write(body[:len(body) // 2]); self.wfile.flush(); time.sleep(60)
            else:
                self.wfile.write(body)
        except OSError:
            pass
class S(socketserver.ThreadingMixIn, http.server.HTTPServer):
    daemon_threads = True
s = S(("127.0.0.1", 0), H)
print("http://127.0.0.1:%d" % s.server_address[1], flush=True)
s.serve_forever()
PY
/usr/bin/python3 "$T/proxy.py" "$GOOD" >"$T/proxy.out" 2>"$T/proxy.err" &
PROXY_PID=$!
trap 'kill $PID $PROXY_PID 2>/dev/null || true; rm -rf "$T"' EXIT
_w=0
while ! grep -q http "$T/proxy.out"; do
    _w=$((_w + 1)); [ $_w -lt 100 ] || fail "proxy did not start: $(cat "$T/proxy.err")"; sleep 0.05
done
SLOW=$(cat "$T/proxy.out")

# snapshot DIR...: every file's path and sha256, every directory's path, sorted.
snapshot() { (cd "$T" && find "$@" -path '*/downloads' -prune -o -type d -print -o -type f -exec sha256sum {} + | sort); }
snapshot host st >"$T/before"
ls -A "$T/host" >"$T/host.before"

A2=$(sha256sum "$T/a2.kiln" | cut -d' ' -f1)
HALF=$(($(stat -c %s "$T/a2.kiln") / 2))
$KILN pull demo@production --registry "$SLOW" --trust "$T/trust.json" --out "$T/host/svc" --state "$T/st" \
    --min-rate 1 >"$T/out" 2>"$T/err" &
K=$!
# Until the half has landed and the pull's private directory holds part of the model.
_w=0
until [ "$(stat -c %s "$T/st/downloads/$A2.partial" 2>/dev/null || echo 0)" -ge $HALF ] &&
    [ -n "$(find "$T/host" -path '*/.svc.pull-*' -name model.safetensors -size +0 2>/dev/null)" ]; do
    _w=$((_w + 1)); [ $_w -lt 400 ] || { kill $K; fail "the download did not reach half: $(cat "$T/err")"; }
    sleep 0.05
done
kill -KILL $K
set +e; wait $K; rc=$?; set -e
[ $rc -eq 137 ] || fail "the pull was not killed (exit $rc): $(cat "$T/err")"

# Nothing at --out changed, nothing in the state but the partial download and its lock.
snapshot host st | grep -v '/\.svc\.pull-' >"$T/after"
cmp -s "$T/before" "$T/after" || fail "the killed pull changed the model or the state: $(diff "$T/before" "$T/after")"
[ "$(ls "$T/st/downloads" | sort | tr '\n' ' ')" = "$A2.lock $A2.partial " ] ||
    fail "downloads after the kill: $(ls -la "$T/st/downloads")"
cmp -s -n $HALF "$T/st/downloads/$A2.partial" "$T/a2.kiln" || fail "the partial is not a prefix of the archive"
[ "$(stat -c %s "$T/st/downloads/$A2.partial")" -eq $HALF ] || fail "the partial is not the half sent"
ls -d "$T"/host/.svc.pull-* >/dev/null 2>&1 || fail "no private directory: the kill came before the unpack began"
grep -q "\"version\": *\"1.0.1\"" "$T/st/channels/demo/production.json" || fail "the state moved on: $(cat "$T/st/channels/demo/production.json")"

# The next pull resumes the partial (its Range), installs 1.0.2 and leaves nothing behind.
KILN_LOG=debug $KILN pull demo@production --registry "$GOOD" --trust "$T/trust.json" --out "$T/host/svc" \
    --state "$T/st" >"$T/out" 2>"$T/err" || fail "the pull after the kill: $(cat "$T/err")"
grep -q '^pulled demo@1.0.2 (channel production, seq 2)' "$T/out" || fail "$(cat "$T/out")"
cmp -s "$T/host/svc/model.safetensors" "$T/m2/model.safetensors" || fail "1.0.2 not installed"
grep -q "removed '.*/host/\.svc\.pull-[A-Za-z0-9]*', left by a pull that was killed" "$T/err" ||
    fail "the killed pull's directory was not said to be removed: $(cat "$T/err")"
[ "$(ls -A "$T/host")" = svc ] || fail "left beside --out: $(ls -A "$T/host")"
[ -z "$(ls -A "$T/st/downloads")" ] || fail "left in downloads: $(ls -A "$T/st/downloads")"
echo "76-pull-killed: ok"
