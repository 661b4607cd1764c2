#!/usr/bin/env python3
"""A lying OCI registry for tests/e2e/72-oci.sh: a proxy in front of a real docker-registry
that lies as the test asks, through the file MODE (read on every request, so the test switches
without a restart; empty: tell the truth). Lies:

  swap DIGEST OTHER        GET of blob DIGEST answers blob OTHER's bytes
  hide REGEX               tags/list leaves out the tags that match REGEX
  huge TAG                 manifest TAG answers with its archive layer declaring 1 TiB
  trickle DIGEST           GET of blob DIGEST sends a byte every half second
  nopatch                  every PATCH (a chunk of an upload) answers 405
  failput                  the first PUT that ends a blob upload answers 500 (an upload
                           interrupted: the client starts it again from zero), then the truth
  redirect DIGEST          GET of blob DIGEST answers 307 to the second port ("object
                           storage" on another host), which serves the blob and writes each
                           request's Authorization header (or "none") to SEEN
  redirect-cut DIGEST      the same, but the other host sends half the blob and drops the
                           connection, then answers the resumed request (Range) 403 as an
                           expired signed URL would, then serves the rest to the next (after
                           the registry redirected again); each request's Range goes to SEEN

usage: oci_liar.py PORTFILE UPSTREAM MODE SEEN
"""
import http.client, json, re, sys, threading, time, os
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

portfile, upstream, modefile, seen = sys.argv[1:5]


def mode():
    try:
        return open(modefile).read().split()
    except OSError:
        return []


def fetch(method, path, headers, body=None):
    c = http.client.HTTPConnection(upstream, timeout=30)
    # The client's Host goes on: the registry's Location headers then name the proxy.
    h = {k: v for k, v in headers.items() if k.lower() != "content-length"}
    c.request(method, path, body=body, headers=h)
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, r.getheaders(), data


class Proxy(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def send(self, status, headers, data, skip=()):
        self.send_response(status)
        for k, v in headers:
            if k.lower() in ("content-length", "transfer-encoding", "connection") or k.lower() in skip:
                continue
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def handle_any(self):
        n = int(self.headers.get("Content-Length") or 0)
        body = self.rfile.read(n) if n else None
        m = mode()
        p = self.path
        if m and m[0] == "swap" and self.command == "GET" and p.endswith("/blobs/" + m[1]):
            st, hd, data = fetch("GET", p.replace(m[1], m[2]), dict(self.headers))
            return self.send(st, hd, data, skip=("docker-content-digest",))
        if m and m[0] == "trickle" and self.command == "GET" and p.endswith("/blobs/" + m[1]):
            st, hd, data = fetch("GET", p, dict(self.headers))
            self.send_response(200)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            try:
                for b in data:
                    self.wfile.write(bytes([b]))
                    self.wfile.flush()
                    time.sleep(0.5)
            except OSError:
                pass
            return
        if m and m[0] in ("redirect", "redirect-cut") and self.command == "GET" and \
                p.endswith("/blobs/" + m[1]):
            self.send_response(307)
            self.send_header("Location", "http://localhost:%d%s" % (store.server_address[1], p))
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if m and m[0] == "nopatch" and self.command == "PATCH":
            with open(seen, "a") as f:
                f.write("PATCH refused\n")
            return self.send(405, [], b'{"errors":[{"code":"UNSUPPORTED"}]}')
        if m and m[0] == "failput" and self.command == "PUT" and "/blobs/uploads/" in p \
                and not os.path.exists(seen + ".failed"):
            open(seen + ".failed", "w").close()
            with open(seen, "a") as f:
                f.write("PUT failed\n")
            return self.send(500, [], b'{"errors":[{"code":"UNKNOWN"}]}')
        if m and m[0] == "put500" and self.command == "PUT" and \
                re.search("/manifests/" + m[1] + "$", p):
            fetch("PUT", p, dict(self.headers), body)  # written, then answered as failed
            return self.send(500, [], b'{"errors":[{"code":"UNKNOWN"}]}')
        if self.command in ("PATCH", "PUT") and "/blobs/uploads/" in p:
            with open(seen, "a") as f:
                f.write(self.command + " " + (self.headers.get("Content-Range") or "-") + "\n")
        st, hd, data = fetch(self.command, p, dict(self.headers), body)
        if m and m[0] == "hide" and "/tags/list" in p and st == 200:
            j = json.loads(data)
            j["tags"] = [t for t in j["tags"] if not re.fullmatch(m[1], t)]
            data = json.dumps(j).encode()
        if m and m[0] == "huge" and p.endswith("/manifests/" + m[1]) and st == 200:
            j = json.loads(data)
            for l in j["layers"]:
                if l["mediaType"] == "application/vnd.kiln.archive.v1.tar+zstd":
                    l["size"] = 1 << 40
            data = json.dumps(j).encode()
        self.send(st, hd, data)

    do_GET = do_HEAD = do_PUT = do_POST = do_PATCH = do_DELETE = handle_any


class Store(BaseHTTPRequestHandler):
    """The other host a redirect sends the download to."""
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        rng = self.headers.get("Range")
        with open(seen, "a") as f:
            f.write((self.headers.get("Authorization") or "none") + "\n")
            f.write("range " + (rng or "-") + "\n")
        h = {"Host": upstream}
        if rng:
            h["Range"] = rng
        st, hd, data = fetch("GET", self.path, h)
        if mode()[:1] == ["redirect-cut"]:
            n = len(open(seen).read().split("range ")) - 1  # this request's number
            if n == 1:  # half, then the connection drops
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data[: len(data) // 2])
                self.wfile.flush()
                self.close_connection = True
                return
            if n == 2:  # the signed URL expired
                return Proxy.send(self, 403, [], b"<Error><Code>AccessDenied</Code></Error>")
        Proxy.send(self, st, hd, data)


store = ThreadingHTTPServer(("127.0.0.1", 0), Store)
threading.Thread(target=store.serve_forever, daemon=True).start()
srv = ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(portfile + ".tmp", portfile)
srv.serve_forever()
