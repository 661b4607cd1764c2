#!/usr/bin/env python3
"""A small token server for tests/e2e/74-oci-token.sh: the bearer-token flow of docker's
registry auth (distribution's "token" auth). GET /token?service=S&scope=SCOPE with HTTP basic
credentials USER:PASSWORD answers {"token": JWT, "access_token": JWT, "expires_in": N}, the JWT
RS256-signed (by `openssl dgst`, no Python crypto library) with the certificate in its x5c
header, granting every action asked of every scope, its "exp" TTL seconds from now
(distribution allows 60 s of clock skew past it: a TTL of -55 makes a token the registry takes
for about 5 s). Anything else is 401. Each grant is appended to LOG ("scope"), so the test can
count how often a client asked.

usage: oci_token.py PORTFILE CERT KEY ISSUER SERVICE USER PASSWORD LOG TTL
"""
import base64, json, os, subprocess, sys, time, urllib.parse
from http.server import BaseHTTPRequestHandler, HTTPServer

portfile, cert, key, issuer, service, user, password, log, ttl = sys.argv[1:10]
ttl = int(ttl)
der = subprocess.run(["openssl", "x509", "-in", cert, "-outform", "DER"], check=True,
                     capture_output=True).stdout


def b64(b):
    return base64.urlsafe_b64encode(b).rstrip(b"=").decode()


def jwt(scopes):
    now = int(time.time())
    access = []
    for sc in scopes:
        parts = sc.split(":")
        if len(parts) < 3:
            continue
        access.append({"type": parts[0], "name": ":".join(parts[1:-1]),
                       "actions": parts[-1].split(",")})
    head = {"alg": "RS256", "typ": "JWT", "x5c": [base64.b64encode(der).decode()]}
    claims = {"iss": issuer, "sub": user, "aud": service, "exp": now + ttl, "nbf": now - 10,
              "iat": now, "jti": os.urandom(8).hex(), "access": access}
    signing = b64(json.dumps(head).encode()) + "." + b64(json.dumps(claims).encode())
    sig = subprocess.run(["openssl", "dgst", "-sha256", "-sign", key], input=signing.encode(),
                         check=True, capture_output=True).stdout
    return signing + "." + b64(sig)


class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def do_GET(self):
        u = urllib.parse.urlparse(self.path)
        q = urllib.parse.parse_qs(u.query)
        want = "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        if u.path != "/token" or self.headers.get("Authorization") != want or \
                q.get("service", [""])[0] != service:
            self.send_response(401)
            self.end_headers()
            return
        scopes = [s for v in q.get("scope", []) for s in v.split(" ")]
        with open(log, "a") as f:
            f.write(" ".join(scopes) + "\n")
        t = jwt(scopes)
        body = json.dumps({"token": t, "access_token": t, "expires_in": max(ttl, 60)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


srv = HTTPServer(("127.0.0.1", 0), H)
with open(portfile + ".tmp", "w") as f:
    f.write(str(srv.server_address[1]))
os.rename(portfile + ".tmp", portfile)
srv.serve_forever()
