#!/bin/sh
# kiln registry serve's two timeouts (docs/registry.md, "Timeouts and kept-alive connections"):
# a connection that never finishes a request head is closed after --header-timeout; one that
# sent a request stays open, kept alive, until --idle-timeout of silence; bad values are usage
# errors with nothing started.
. "$(dirname "$0")/lib.sh"
expect_fail 2 $KILN registry serve --root "$T/reg0" --listen 127.0.0.1:0 --header-timeout 0
expect_fail 2 $KILN registry serve --root "$T/reg0" --listen 127.0.0.1:0 --idle-timeout 86401
[ ! -e "$T/reg0" ] || fail "a refused serve made its store"
serve_registry "$T/reg" --header-timeout 1 --idle-timeout 3
port=${URL##*:}
/usr/bin/python3 - "$port" <<'PY' || fail "timeouts"
import socket, sys, time
port = int(sys.argv[1])
def closed_after(s, limit):
    s.settimeout(limit)
    t = time.time()
    try:
        d = s.recv(1)
    except socket.timeout:
        return None
    except ConnectionError:
        d = b""
    return time.time() - t if d == b"" else None
silent = socket.create_connection(("127.0.0.1", port))
kept = socket.create_connection(("127.0.0.1", port))
kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
head = b""
while b"ok\n" not in head:
    head += kept.recv(4096)
assert b"Connection: close" not in head, head
t = closed_after(silent, 10)
assert t is not None and t < 5, "silent connection not closed within 5 s (header timeout 1 s): %r" % t
kept.sendall(b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")  # still open after 1 s idle
head = b""
while b"ok\n" not in head:
    head += kept.recv(4096)
t = closed_after(kept, 15)
assert t is not None and t > 2, "kept-alive connection closed after %r s, before its 3 s" % t
print("silent closed, kept-alive outlived the header timeout and closed after %.1f s idle" % t)
PY
echo "59-registry-timeouts: ok"
