#!/bin/sh
# `make install` as a trading service's build uses it: into a temporary DESTDIR, then the
# example service built from outside the tree with `pkg-config --cflags --libs kiln` only,
# run on a model pulled from a registry, against the installed libkiln.so.0 (its soname);
# `pip install ./python` into a venv finds that library through kiln.pc; `make uninstall`
# removes every file it installed and nothing else.
. "$(dirname "$0")/lib.sh"
REPO=$(cd "$(dirname "$0")/../.." && pwd)
BUILD=$(cd "$(dirname "$KILN")" && pwd)
[ -f "$BUILD/libkiln.so" ] || fail "$BUILD/libkiln.so is not built"
D="$T/root"
make -s -C "$REPO" install BUILD="$BUILD" DESTDIR="$D" PREFIX=/usr/local >"$T/install.log" 2>&1 ||
    { cat "$T/install.log" >&2; fail "make install"; }
L="$D/usr/local/lib"
for f in bin/kiln include/kiln.h lib/libkiln.so.0.1 lib/libkiln.a lib/pkgconfig/kiln.pc; do
    [ -f "$D/usr/local/$f" ] || fail "not installed: $f"
done
[ "$(readlink "$L/libkiln.so.0")" = libkiln.so.0.1 ] || fail "libkiln.so.0 -> $(readlink "$L/libkiln.so.0")"
[ "$(readlink "$L/libkiln.so")" = libkiln.so.0 ] || fail "libkiln.so -> $(readlink "$L/libkiln.so")"
readelf -d "$L/libkiln.so.0.1" | grep -q 'SONAME.*\[libkiln\.so\.0\]' || fail "no soname libkiln.so.0"
cmp -s "$D/usr/local/include/kiln.h" "$REPO/include/kiln.h" || fail "the installed header differs"

# The service, built in a directory of its own with nothing of the tree but its source.
export PKG_CONFIG_PATH="$L/pkgconfig" PKG_CONFIG_SYSROOT_DIR="$D"
[ "$(pkg-config --modversion kiln)" = "$(sed -n 's/^#define KILN_VERSION "\(.*\)"/\1/p' "$REPO/include/kiln.h")" ] ||
    fail "pkg-config --modversion kiln: $(pkg-config --modversion kiln 2>&1)"
mkdir "$T/svc" && cp "$REPO/examples/stream_service.c" "$T/svc/"
(cd "$T/svc" && cc -O2 -o stream_service stream_service.c $(pkg-config --cflags --libs kiln)) 2>"$T/cc.log" ||
    { cat "$T/cc.log" >&2; fail "the service does not build with pkg-config's flags"; }
LD_LIBRARY_PATH="$L" ldd "$T/svc/stream_service" | grep -q "libkiln.so.0 => $L/libkiln.so.0" ||
    fail "the service does not load the installed library: $(LD_LIBRARY_PATH="$L" ldd "$T/svc/stream_service" | grep kiln)"

# A model pulled from a registry, as a service gets one.
cd "$T"
for k in rel prom; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"production":{"threshold":1}}}
JSON
tiny_run 5
PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
serve_registry reg --trust trust.json
$KILN release run --step 40 --version 1.0.0 --name market --registry "$URL" --key rel.key --trust trust.json \
    --token "$PUB" --state st --windows 8 --promote production --promote-key prom.key --promote-token "$PROM" \
    --out-dir r1 >rel.out 2>&1 || fail "release: $(cat rel.out)"
$KILN pull market@production --registry "$URL" --trust trust.json --state st --out prod >/dev/null || fail "pull"
$KILN infer --model prod --input d.st --out want.st --stream >/dev/null || fail "infer"
/usr/bin/python3 - d.st want.st >ticks.csv 2>want.csv <<'PY' || fail "ticks"
import json, struct, sys
import numpy as np
def rd(p, name):
    b = open(p, "rb").read(); n = struct.unpack("<Q", b[:8])[0]; h = json.loads(b[8:8 + n])
    t = h[name]; s, e = t["data_offsets"]
    return np.frombuffer(b[8 + n + s:8 + n + e], dtype=np.float32).reshape(t["shape"])
x, y = rd(sys.argv[1], "features")[:200], rd(sys.argv[2], "outputs")[:200]
for r in x: print(",".join("%.9g" % v for v in r))
for r in y: print(",".join("%.9g" % v for v in r), file=sys.stderr)
PY
LD_LIBRARY_PATH="$L" "$T/svc/stream_service" prod <ticks.csv >got.csv 2>svc.err || fail "the service: $(cat svc.err)"
/usr/bin/python3 -c '
import sys, numpy as np
a = np.loadtxt(sys.argv[1], delimiter=",", ndmin=2); b = np.loadtxt(sys.argv[2], delimiter=",", ndmin=2)
sys.exit(0 if a.shape == b.shape and np.allclose(a, b, rtol=1e-5, atol=1e-6) else 1)' got.csv want.csv ||
    fail "the installed library's predictions differ from kiln infer --stream"

# Python, installed into a venv outside the tree, finds the installed library by kiln.pc.
mkdir py && cp -r "$REPO/python" py/src && rm -rf py/src/build py/src/*.egg-info
/usr/bin/python3 -m venv --without-pip --system-site-packages py/venv
/usr/bin/python3 -m pip --python py/venv/bin/python install --no-build-isolation --no-index py/src >py.log 2>&1 ||
    { cat py.log >&2; fail "pip install"; }
(unset KILN_LIB PYTHONPATH; cd py && venv/bin/python -c '
import kiln, sys
p = kiln.library_path()
assert p.startswith(sys.argv[1]), p
with kiln.Model(sys.argv[2]) as m:
    print(p, m.n_features)' "$L" "$T/prod") >py.out 2>&1 || fail "python with the installed library: $(cat py.out)"

make -s -C "$REPO" uninstall BUILD="$BUILD" DESTDIR="$D" PREFIX=/usr/local >/dev/null 2>&1 || fail "make uninstall"
left=$(find "$D" -type f -o -type l)
[ -z "$left" ] || fail "make uninstall left: $left"
echo "08-install: ok"
