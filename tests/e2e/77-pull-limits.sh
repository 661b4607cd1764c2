#!/bin/sh
# What a hostile registry can make `kiln pull` download, and for how long (docs/registry.md,
# "Limits"): a registry declaring 2^50 bytes is refused before the download starts and leaves
# nothing in the state directory; one that sends the truth a byte a second is passed over for
# the next registry within --timeout (--min-rate); alone, --deadline ends the pull, and so does
# SIGINT, each removing the partial download; --max-size refuses a larger archive; bad values
# are usage errors. The hostile registries are a proxy of the real one (python3, stdlib only).
. "$(dirname "$0")/lib.sh"
rel_prom_trust
mkdir -p "$T/m"
head -c 65536 /dev/urandom >"$T/m/model.safetensors" # incompressible: the archive is as big
printf '%s' '{"name":"demo","created":"2026-03-04T05:06:07Z","lineage":{"run_id":"r-1","step":40,"dataset_sha256":"abcd","code_version":"0.1.0","metrics":{}}}' >"$T/m/card.json"
$KILN pack "$T/m" --name demo --version 1.0.0 --out "$T/a.kiln" >/dev/null
$KILN sign "$T/a.kiln" --key "$T/rel.key" --allow-unvalidated >/dev/null
PUB=$($KILN registry token create --root "$T/store" --name ci --scope publish)
PROM=$($KILN registry token create --root "$T/store" --name rm --scope promote)
serve_registry "$T/store" --trust "$T/trust.json"
GOOD=$URL
$KILN publish "$T/a.kiln" --registry "$GOOD" --token "$PUB" >/dev/null
$KILN promote demo 1.0.0 --channel production --key "$T/prom.key" --registry "$GOOD" --token "$PROM" >/dev/null

# proxy MODE: a proxy of GOOD on a free port (EVIL its URL): "huge" declares 2^50 bytes for
# the archive (in every JSON answer) and streams zeros; "trickle" sends the archive a byte a
# second. Each connection gives up after 30 s, so a client that never does fails the timing.
cat >"$T/proxy.py" <<'PY'
import http.server, json, socketserver, sys, time, urllib.request
mode, good = sys.argv[1], sys.argv[2]
HUGE = 1 << 50
class H(http.server.BaseHTTPRequestHandler):
    def log_message(self, *a): pass
    def do_GET(self):
        try:
            r = urllib.request.urlopen(good + self.path, timeout=10)
            status, body = r.status, r.read()
        except urllib.error.HTTPError as e:
            status, body = e.code, e.read()
        blob = self.path.startswith("/v1/blobs/")
        if mode == "huge" and not blob and status == 200:
            j = json.loads(body)
            def lie(o):
                if isinstance(o, dict):
                    for k, v in o.items():
                        if k == "size" and isinstance(v, int): o[k] = HUGE
                        else: lie(v)
                elif isinstance(o, list):
                    for v in o: lie(v)
            lie(j)
            body = json.dumps(j).encode()
        n = HUGE if mode == "huge" and blob else len(body)
        self.send_response(status)
        self.send_header("Content-Length", str(n))
        self.end_headers()
        until = time.time() + 30
        try:
            if blob and mode == "huge":
                while time.time() < until: self.wfile.write(b"\0" * 65536)
            elif blob and mode == "trickle":
                for i in range(len(body)):
                    if time.time() > until: break
                    self.wfile.write(body[i:i + 1]); self.wfile.flush(); time.sleep(1)
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
PROXY_PID=
trap 'kill $PID $PROXY_PID 2>/dev/null || true; rm -rf "$T"' EXIT
proxy() {
    [ -z "$PROXY_PID" ] || { kill "$PROXY_PID"; wait "$PROXY_PID" 2>/dev/null || true; }
    : >"$T/proxy.out"
    /usr/bin/python3 "$T/proxy.py" "$1" "$GOOD" >"$T/proxy.out" 2>"$T/proxy.err" &
    PROXY_PID=$!
    _w=0
    while ! grep -q http "$T/proxy.out"; do
        _w=$((_w + 1)); [ $_w -lt 100 ] || fail "proxy did not start: $(cat "$T/proxy.err")"; sleep 0.05
    done
    EVIL=$(cat "$T/proxy.out")
}
# no_downloads STATE: nothing in STATE/downloads.
no_downloads() {
    [ -z "$(ls -A "$1/downloads" 2>/dev/null)" ] || fail "left in $1/downloads: $(ls -la "$1/downloads")"
}

# 2^50 bytes declared: refused before a byte is downloaded (exit 2: a limit), nothing left.
proxy huge
s0=$(date +%s)
expect_fail 2 $KILN pull demo@production --registry "$EVIL" --trust "$T/trust.json" --out "$T/svc" --state "$T/st1"
grep -q "declares demo@1.0.0 at 1125899906842624 bytes, more than this client accepts (17179869184 bytes: max_size, --max-size); not downloaded" \
    "$T/err" || fail "2^50 bytes: $(cat "$T/err")"
[ $(($(date +%s) - s0)) -lt 20 ] || fail "the 2^50-byte registry held the pull"
no_downloads "$T/st1"
[ ! -e "$T/svc" ] || fail "something at --out"
# With the honest registry second: the model from it.
$KILN pull demo@production --registry "$EVIL" --registry "$GOOD" --trust "$T/trust.json" --out "$T/svc" \
    --state "$T/st2" >"$T/pull.out" 2>"$T/pull.err" || fail "failover past the liar: $(cat "$T/pull.err")"
grep -q "^pulled demo@1.0.0 (channel production, seq 1) .* from $GOOD\( (record from $EVIL)\)\{0,1\}\$" "$T/pull.out" || fail "$(cat "$T/pull.out")"
grep -q "more than this client accepts.*; trying $GOOD\$" "$T/pull.err" || fail "$(cat "$T/pull.err")"
no_downloads "$T/st2"

# A byte a second never stalls: --min-rate (default 16K/s over each --timeout) passes it over.
proxy trickle
s0=$(date +%s)
$KILN pull demo@production --registry "$EVIL" --registry "$GOOD" --trust "$T/trust.json" --out "$T/svc3" \
    --state "$T/st3" --timeout 3s >"$T/pull.out" 2>"$T/pull.err" || fail "failover past the trickle: $(cat "$T/pull.err")"
el=$(($(date +%s) - s0))
grep -q "^pulled demo@1.0.0 (channel production, seq 1) .* from $GOOD\( (record from $EVIL)\)\{0,1\}\$" "$T/pull.out" || fail "$(cat "$T/pull.out")"
grep -q "too slow: [0-9]* bytes in 3000 ms, under the minimum of 16384 bytes a second.*; trying $GOOD\$" \
    "$T/pull.err" || fail "trickle: $(cat "$T/pull.err")"
[ $el -lt 20 ] || fail "the trickling registry held the pull for $el s"
no_downloads "$T/st3"
# Alone, with a rate it keeps (--min-rate 1): --deadline ends the pull; the partial goes.
expect_fail 2 $KILN pull demo@production --registry "$EVIL" --trust "$T/trust.json" --out "$T/svc4" \
    --state "$T/st4" --min-rate 1 --deadline 2s
grep -q "the deadline of 2000 ms for the whole operation passed (deadline_ms, --deadline)" "$T/err" ||
    fail "deadline: $(cat "$T/err")"
no_downloads "$T/st4"
# SIGINT: the transfer cut, the partial removed, exit 2.
$KILN pull demo@production --registry "$EVIL" --trust "$T/trust.json" --out "$T/svc5" --state "$T/st5" \
    --min-rate 1 >"$T/out" 2>"$T/err" &
K=$!
_w=0
until [ -n "$(ls "$T/st5/downloads" 2>/dev/null | grep partial)" ]; do
    _w=$((_w + 1)); [ $_w -lt 200 ] || { kill $K; fail "no download began: $(cat "$T/err")"; }; sleep 0.05
done
kill -INT $K
set +e; wait $K; rc=$?; set -e
[ $rc -eq 2 ] || fail "SIGINT: exit $rc: $(cat "$T/err")"
grep -q "^kiln: error: pull stopped by SIGINT; nothing installed, its download removed\$" "$T/err" ||
    fail "SIGINT: $(cat "$T/err")"
no_downloads "$T/st5"

# --max-size: the honest archive over it is refused; bad values are usage errors.
expect_fail 2 $KILN pull demo@production --registry "$GOOD" --trust "$T/trust.json" --out "$T/svc6" \
    --state "$T/st6" --max-size 1K
grep -q "more than this client accepts (1024 bytes: max_size, --max-size)" "$T/err" || fail "--max-size 1K: $(cat "$T/err")"
$KILN pull demo@production --registry "$GOOD" --trust "$T/trust.json" --out "$T/svc6" --state "$T/st6" \
    --max-size 1M --min-rate 64K/s --deadline 1m >/dev/null || fail "--max-size 1M"
for bad in "--max-size 12X" "--max-size 0" "--max-size -1" "--min-rate 0" "--min-rate 5G" "--deadline 5" "--deadline 8d"; do
    # shellcheck disable=SC2086
    expect_fail 2 $KILN pull demo@production --registry "$GOOD" --trust "$T/trust.json" --out "$T/svc7" $bad
    grep -q "^kiln: error: ${bad%% *} '${bad#* }' is not a" "$T/err" || fail "$bad: $(cat "$T/err")"
done
# The same limits on a mirror's sync.
expect_fail 1 $KILN registry mirror --root "$T/mirror" --from "$GOOD" --trust "$T/trust.json" --once --max-size 1K
grep -q "^problem: registry .* declares demo@1.0.0 (sha256:.*) at [0-9]* bytes, more than this client accepts (1024 bytes" "$T/out" ||
    fail "mirror --max-size: $(cat "$T/out" "$T/err")"
