#!/bin/sh
# bench_mhd_modes.sh: issue 29 item 9, does another threading mode of libmicrohttpd see a
# slow-loris client's close that epoll misses? For each mode of bench/mhd_modes.c: 64 and 300
# slow-loris connections from 127.0.0.2 (a head begun, a header line every 0.3 s for 2 s),
# 64 silent ones and 64 half-closed ones, then closed by the client: the server's sockets in
# CLOSE-WAIT counted 0.2 to 13 s after (ss); then keep-alive requests a second (ab -k -c 16
# -n 20000, twice), and the threads and RSS with 60 half-open connections. Needs cc, the
# libmicrohttpd headers, python3, ss and ab (apache2-utils).
set -eu
here=$(cd "$(dirname "$0")" && pwd)
T=$(mktemp -d) && trap 'kill $P 2>/dev/null || true; rm -rf "$T"' EXIT
P=
cc -O2 -o "$T/mhd_modes" "$here/mhd_modes.c" -lmicrohttpd -pthread
cat >"$T/loris.py" <<'PY'
import socket, subprocess, sys, time
port, n, how = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
def close_wait():
    out = subprocess.run(["ss", "-Htan", "state", "close-wait", "( sport = :%d )" % port],
                         capture_output=True, text=True).stdout
    return len([l for l in out.splitlines() if l.strip()])
cs = []
for i in range(n):
    s = socket.socket(); s.bind(("127.0.0.2", 0)); s.connect(("127.0.0.1", port)); cs.append(s)
for k in range(8):
    for s in cs:
        try:
            if how != "silent": s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n" if k == 0 else b"X-a: b\r\n")
        except OSError: pass
    time.sleep(0.3)
t0 = time.time()
for s in cs:
    s.shutdown(socket.SHUT_WR) if how == "half" else s.close()
seen = []
for at in (0.2, 1, 4, 8, 9.5, 11, 13):
    while time.time() - t0 < at: time.sleep(0.02)
    seen.append("%gs:%d" % (at, close_wait()))
print("  %d %s: CLOSE-WAIT %s" % (n, how, " ".join(seen)))
PY
for m in epoll poll select tpc; do
    "$T/mhd_modes" $m >"$T/port" 2>/dev/null & P=$!
    sleep 0.3; port=$(cat "$T/port")
    echo "$m:"
    for a in "64 close" "300 close" "64 silent" "64 half"; do python3 "$T/loris.py" "$port" $a; done
    r1=$(ab -q -k -c 16 -n 20000 "http://127.0.0.1:$port/" 2>/dev/null | awk '/Requests per second/ {print $4}')
    r2=$(ab -q -k -c 16 -n 20000 "http://127.0.0.1:$port/" 2>/dev/null | awk '/Requests per second/ {print $4}')
    echo "  keep-alive requests/s: $r1 $r2"
    python3 - "$port" "$P" <<'PY'
import socket, sys, time
port, pid = int(sys.argv[1]), sys.argv[2]
cs = [socket.create_connection(("127.0.0.1", port)) for i in range(60)]
for s in cs: s.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n")
time.sleep(0.5)
st = dict(l.split(":", 1) for l in open("/proc/%s/status" % pid) if ":" in l)
print("  with 60 half-open: %s threads, VmRSS %s" % (st["Threads"].strip(), st["VmRSS"].strip()))
PY
    kill $P; wait $P 2>/dev/null || true; P=
done
