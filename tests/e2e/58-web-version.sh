#!/bin/sh
# The registry's version page in headless Chromium: kiln release carries the run's curves as
# run_summary.json (listed in the manifest, so signed; the same run gives the same bytes),
# and /ui/models/NAME/versions/VERSION draws them with kiln runs serve's charts, shows the
# validation report check by check and links the baseline it was measured against (v2
# against v1); an archive without the file says "no run summary". No console message or CSP
# violation. Screenshot: build/screens/registry-version.png (docs/registry-version.png).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/browser.sh"
cd "$T"
for k in root rel prom; do $KILN keygen --out $k --no-password >/dev/null; done
cat >trust.json <<JSON
{"format":"kiln-trust/1","keys":[
 {"name":"root","pubkey":"$(tail -1 root.pub)","roles":["root"]},
 {"name":"rel","pubkey":"$(tail -1 rel.pub)","roles":["release"]},
 {"name":"prom","pubkey":"$(tail -1 prom.pub)","roles":["promote"]}],
 "channels":{"production":{"threshold":1}},"accept_unvalidated":true}
JSON
tiny_run 3

# The summary: written by export, the same bytes twice, listed in the manifest.
$KILN export run --step 40 --out ex1 >/dev/null && $KILN export run --step 40 --out ex2 >/dev/null || fail "export"
cmp ex1/run_summary.json ex2/run_summary.json || fail "the same run gave two summaries"
[ "$(sqlite3 :memory: "SELECT json_extract(readfile('ex1/run_summary.json'), '\$.format')")" = kiln-run-summary/1 ] ||
    fail "summary format"
[ "$(sqlite3 :memory: "SELECT json_extract(readfile('ex1/run_summary.json'), '\$.step')")" = 40 ] || fail "summary step"
n=$(sqlite3 :memory: "SELECT max(json_array_length(value, '\$.step')) FROM json_each(json_extract(readfile('ex1/run_summary.json'), '\$.series'))")
[ "$n" -ge 40 ] && [ "$n" -le 1000 ] || fail "summary points per series: $n"

PUB=$($KILN registry token create --root reg --name ci --scope publish)
PROM=$($KILN registry token create --root reg --name rm --scope promote)
serve_registry reg --trust trust.json
R="--name market --registry $URL --key rel.key --trust trust.json --token $PUB --state st --windows 8"
P="--promote production --promote-key prom.key --promote-token $PROM"
$KILN release run --step 20 --version 1.0.0 $R $P --out-dir r1 >out1 || fail "release v1: $(cat out1)"
$KILN release run --step 40 --version 2.0.0 $R $P --out-dir r2 >out2 || fail "release v2: $(cat out2)"
$KILN pull market@production --registry "$URL" --trust trust.json --state st --out prod >/dev/null || fail "pull"
[ -f prod/run_summary.json ] || fail "no run_summary.json in the release"
grep -q 'run_summary.json' prod/manifest.json || fail "the manifest does not list run_summary.json"

# A version published from a model directory without the file (packed by hand).
signed_archive x 0.1.0 "$T/old.kiln" rel.key
$KILN publish "$T/old.kiln" --registry "$URL" --token "$PUB" >/dev/null || fail "publish old"

# 1. v2's page: the charts from its summary, the validation checks, the baseline linked.
browse "$URL/ui/models/market/versions/2.0.0" registry-version 2000
d="$T/registry-version.dom"
for id in loss val_loss val_r2 lr grad_norm router_entropy; do
    grep -q "id=\"chart-$id\"" "$d" || fail "version page: no chart $id"
done
grep -q '<g class="mark exported"><title>exported checkpoint: step 40' "$d" && grep -q '>exported</text>' "$d" ||
    fail "the exported step not marked"
[ "$(count '<tr class="check">' "$d")" -ge 5 ] || { grep -A3 Validation "$d" >&2; fail "version page: the checks"; }
grep -q '<code>baseline_loss</code></td><td><span class="tag ok">passed' "$d" || fail "baseline_loss not passed"
grep -q '<a class="baseline" href="/ui/models/market/versions/1.0.0">market 1.0.0</a>' "$d" ||
    fail "the baseline not linked"
grep -q 'Version 2.0.0 of' "$d" || fail "heading"

# A page seen again is drawn from memory, not the archive: with v2's blob moved away, the
# charts are still there.
h=$(sha256sum r2/market-2.0.0.kiln | cut -d' ' -f1)
b="reg/blobs/sha256/$(echo "$h" | cut -c1-2)/$h"
[ -f "$b" ] || fail "v2's blob not at $b"
mv "$b" "$T/blob.aside"
curl -sf "$URL/ui/models/market/versions/2.0.0" | grep -q 'id="chart-loss"' || { mv "$T/blob.aside" "$b"; fail "the summary was read again"; }
mv "$T/blob.aside" "$b"

# 2. v1: no baseline; its page links nowhere but says so.
browse "$URL/ui/models/market/versions/1.0.0" registry-version-v1 1200
grep -q 'none: validated without --baseline' "$T/registry-version-v1.dom" || fail "v1 baseline"
grep -q 'id="chart-loss"' "$T/registry-version-v1.dom" || fail "v1 charts"

# 3. Without a summary: said so; unvalidated said so.
browse "$URL/ui/models/demo/versions/0.1.0" registry-version-none 800
grep -q 'no run summary' "$T/registry-version-none.dom" || fail "no 'no run summary'"
grep -q 'no validation report' "$T/registry-version-none.dom" || fail "no 'no validation report'"
! grep -q '<svg class="chart"' "$T/registry-version-none.dom" || fail "charts without a summary"

# 4. The model page links each version's page; a missing version is a 404.
curl -sf "$URL/ui/models/market" | grep -q 'href="/ui/models/market/versions/2.0.0">validation and training curves' ||
    fail "the model page does not link the version page"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/ui/models/market/versions/9.9.9")" = 404 ] || fail "missing version"
echo ok
