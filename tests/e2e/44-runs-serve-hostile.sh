#!/bin/sh
# kiln runs serve over a hostile directory of runs (issue 29): a child that is a symlink to a
# run elsewhere is neither listed nor served, on any page, and a run whose run.json or
# metrics.db is a link out of it is shown as an error, the linked file unread (a FIFO as a
# run's .lock hangs neither the start nor a page); a run with
# 2 MiB event messages and a 1 MiB config value renders a bounded page, each long string cut
# with a marker; 300 half-open connections from 127.0.0.2 do not lock 127.0.0.1 out.
. "$(dirname "$0")/lib.sh"
GEN="$(dirname "$0")/gen-run.sh"
get() { curl -s -o "$T/body" -w '%{http_code}' --max-time 20 "$URL$1"; }

mkdir -p "$T/sweep" "$T/elsewhere"
sh "$GEN" "$T/sweep/a" 200 0.001 || fail "gen-run a"
sh "$GEN" "$T/elsewhere/secret" 200 0.003 || fail "gen-run secret"
sed -i 's/"run_id": "[^"]*"/"run_id": "OUTSIDE-RUN-7c1"/' "$T/elsewhere/secret/run.json"
ln -s "$T/elsewhere/secret" "$T/sweep/evil"
# a run of its own whose files are links out of it
mkdir -p "$T/sweep/half"
ln -s "$T/elsewhere/secret/run.json" "$T/sweep/half/run.json"
ln -s "$T/elsewhere/secret/metrics.db" "$T/sweep/half/metrics.db"
mkdir -p "$T/sweep/dbonly"
cp "$T/sweep/a/run.json" "$T/sweep/dbonly/run.json"
ln -s "$T/elsewhere/secret/metrics.db" "$T/sweep/dbonly/metrics.db"
# a run whose .lock (the trainer's liveness lock) is a FIFO: opened without waiting for a writer
sh "$GEN" "$T/sweep/fifo" 100 0.001 || fail "gen-run fifo"
mkfifo "$T/sweep/fifo/.lock"

: >"$T/serve.out"
$KILN runs serve "$T/sweep" >"$T/serve.out" 2>"$T/serve.err" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
serve_url "$T/serve.out" "$T/serve.err"

# 1. Links out of the directory: not listed, not served. (A FIFO .lock does not hang the page.)
[ "$(get /)" = 200 ] || fail "sweep page (hung on a FIFO .lock?): $(cat "$T/body")"
grep -q 'href="/run?r=a"' "$T/body" || fail "the real run is not listed"
grep -q 'href="/run?r=fifo"' "$T/body" || fail "the run with a FIFO .lock is not listed"
grep -q 'r=evil' "$T/body" && fail "a symlinked child is listed"
grep -q 'OUTSIDE-RUN-7c1\|0\.003' "$T/body" && fail "the linked run's values are on the sweep page"
for page in "/run?r=evil" "/explain?r=evil&step=80" "/overlay?run=evil"; do
    code=$(get "$page")
    [ "$code" = 404 ] || fail "$page answered $code"
    grep -q 'OUTSIDE-RUN-7c1' "$T/body" && fail "$page served the linked run"
done
for r in half dbonly; do
    code=$(get "/run?r=$r")
    grep -q 'OUTSIDE-RUN-7c1' "$T/body" && fail "/run?r=$r read a linked run.json"
    grep -q "is a symlink" "$T/body" || fail "/run?r=$r ($code) does not say what was refused: $(head -c 600 "$T/body")"
done
$KILN runs list "$T/sweep" >"$T/list" 2>&1 || true
grep -q 'evil' "$T/list" && fail "kiln runs list lists a symlinked child: $(cat "$T/list")"
grep -q 'OUTSIDE-RUN-7c1' "$T/list" && fail "kiln runs list read a linked file"

# 2. A run with two 2 MiB event messages (a spike's: marked on every chart) and a 1 MiB config
# value: each is cut to 1 KiB with a marker, the page stays small; and a run whose config
# alone would make a page past 8 MiB (12,000 keys of 1 KiB values) is answered 500 saying so.
sh "$GEN" "$T/sweep/big" 200 0.001 || fail "gen-run big"
sqlite3 "$T/sweep/big/metrics.db" "INSERT INTO events(step, time, kind, message) VALUES
 (90, 1.7e9, 'spike', 'BIGMSG-' || hex(zeroblob(1048576))),
 (95, 1.7e9, 'note', 'BIGMSG-' || hex(zeroblob(1048576)));" || fail "big events"
{ printf '%s' "$(sed 's/"seed": 1}}$/"seed": 1, "note": "/' "$T/sweep/big/run.json")"; head -c 1048576 /dev/zero | tr '\0' y
  printf '"}}\n'; } >"$T/big.json" && mv "$T/big.json" "$T/sweep/big/run.json"
[ "$(wc -c <"$T/sweep/big/run.json")" -gt 1048576 ] || fail "the 1 MiB config value was not written"
code=$(get "/run?r=big")
[ "$code" = 200 ] || fail "/run?r=big answered $code: $(sed -n "s/.*<p>\\(.*\\)<\\/p>.*/\\1/p" "$T/body" | head -c 600)"
size=$(wc -c <"$T/body")
echo "page of a run with two 2 MiB messages and a 1 MiB config value: $size bytes"
[ "$size" -lt 1048576 ] || fail "the page of a run with 2 MiB messages is $size bytes"
grep -q 'BIGMSG-0000' "$T/body" || fail "the long message is not shown at all"
grep -q 'yyyy…' "$T/body" || fail "the long config value is not cut with a marker"
grep -q '0000…' "$T/body" || fail "the long message is not cut with a marker"
mkdir -p "$T/sweep/wide"
sh "$GEN" "$T/sweep/wide" 50 0.001 || fail "gen-run wide"
k1=$(head -c 1000 /dev/zero | tr '\0' k)
awk -v v="$k1" 'BEGIN {printf "{\"format\": \"kiln-run/1\", \"config\": {\"steps\": 50"
    for (i = 0; i < 12000; i++) printf ", \"k%05d\": \"%s\"", i, v; print "}}"}' >"$T/sweep/wide/run.json"
code=$(get "/run?r=wide")
[ "$code" = 500 ] || fail "/run?r=wide (a 12 MB page) answered $code with $(wc -c <"$T/body") bytes"
grep -q 'more than 8 MiB' "$T/body" || fail "the 500 does not say why: $(head -c 600 "$T/body")"
[ "$(get /)" = 200 ] || fail "the sweep page after the big runs: $(head -c 600 "$T/body")"

# 3. 300 half-open connections from 127.0.0.2 (a request head begun, never finished): the
# address holds 64 (the per-address limit both servers have, web/httpd.c), so 127.0.0.1 is
# served every time while they last; and each is closed by the 10 s header timeout.
port=${URL##*:}
/usr/bin/python3 - "$port" <<'PY' || fail "half-open connections locked 127.0.0.1 out"
import socket, sys, time
port = int(sys.argv[1])
held = []
for i in range(300):
    s = socket.socket()
    s.bind(("127.0.0.2", 0))
    try:
        s.connect(("127.0.0.1", port))
        s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
    except OSError:
        pass
    held.append(s)
time.sleep(0.5)
ok = 0
for i in range(12):
    try:
        c = socket.create_connection(("127.0.0.1", port), timeout=5)
        c.sendall(b"GET /run?r=a HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        data = b""
        while True:
            d = c.recv(65536)
            if not d:
                break
            data += d
        ok += data.startswith(b"HTTP/1.1 200")
        c.close()
    except OSError:
        pass
assert ok == 12, "%d of 12 requests from 127.0.0.1 served while 127.0.0.2 held 300 half-open" % ok
# The header timeout (10 s) closes the half-open ones the server took.
t0 = time.time()
open_ = [s for s in held]
while open_ and time.time() - t0 < 15:
    still = []
    for s in open_:
        s.settimeout(0.05)
        try:
            if s.recv(1) == b"":
                continue
        except socket.timeout:
            still.append(s)
            continue
        except OSError:
            continue
    open_ = still
assert not open_, "%d half-open connections still open after %.0f s" % (len(open_), time.time() - t0)
print("12 of 12 served from 127.0.0.1; the half-open connections closed within %.1f s" % (time.time() - t0))
PY
echo ok
