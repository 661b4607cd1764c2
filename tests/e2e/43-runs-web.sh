#!/bin/sh
# kiln runs serve in headless Chromium: a sweep of three generated runs (gen-run.sh: a spike,
# a non-finite step, a resume and a device change each, checkpoints, 2 layers of 4 experts)
# served read-only; the sweep page lists them with the overlay form, a run's page draws every
# chart with the three kinds of marks and the best checkpoint named, the overlay draws three
# series on one chart, a spike's explain page says why; no console message or CSP violation
# on any page; a step logged while served shows on reload; refusals. Screenshots go to
# build/screens/ (docs/runs-web-run.png is one of them).
. "$(dirname "$0")/lib.sh"
. "$(dirname "$0")/browser.sh"
GEN="$(dirname "$0")/gen-run.sh"

mkdir -p "$T/sweep"
for lr in 0.001 0.003 0.01; do sh "$GEN" "$T/sweep/lr$lr" 2000 $lr || fail "gen-run"; done
mkdir "$T/sweep/notes"   # not a run: skipped

$KILN runs serve "$T/sweep" >"$T/serve.out" 2>"$T/serve.err" &
PID=$!
trap 'kill $PID 2>/dev/null || true; rm -rf "$T"' EXIT
serve_url "$T/serve.out" "$T/serve.err"
grep -q "^kiln runs: serving '$T/sweep' on http://127.0.0.1:[0-9]*/$" "$T/serve.out" ||
    fail "the URL line: $(cat "$T/serve.out")"

# 1. The sweep: a row per run, a checkbox each in a GET form to /overlay, links to each run.
browse "$URL/" runs-sweep 700
d="$T/runs-sweep.dom"
[ "$(count '<tr class="run">' "$d")" = 3 ] || fail "sweep: not 3 rows"
[ "$(count 'type="checkbox" name="run"' "$d")" = 3 ] || fail "sweep: not 3 checkboxes"
grep -q '<form method="get" action="/overlay">' "$d" || fail "sweep: no overlay form"
grep -q '<a href="/run?r=lr0.001">lr0.001</a>' "$d" || fail "sweep: no link to a run"
grep -q '<th>lr</th>' "$d" && ! grep -q '<th>seed</th>' "$d" || fail "sweep: varied keys"
grep -q 'finished' "$d" || fail "sweep: state"

# 2. A run: every chart, the marks of a spike, a non-finite step, a resume; the best named.
browse "$URL/run?r=lr0.001" runs-web-run 2600
d="$T/runs-web-run.dom"
for id in loss loss_terms val_loss val_r2 lr grad_norm router_entropy load_imbalance dead_experts overflow \
          attn_entropy act_rms expert_load-0 expert_load-1 tensor_update_ratio tensor_grad_norm; do
    grep -q "id=\"chart-$id\"" "$d" || fail "run page: no chart $id"
done
[ "$(count '<svg class="chart"' "$d")" = 16 ] || fail "run page: not 16 charts"
for k in spike nonfinite resume device best ckpt best-val; do
    [ "$(count "<g class=\"mark $k\">" "$d")" -ge 16 ] || fail "run page: mark $k not on every chart"
done
# The loss alone on its chart, its terms on the next; the best validation named beside the
# best checkpoint (issue 30).
sed -n '/id="chart-loss"/,/<\/figure>/p' "$d" >"$T/run-loss"
[ "$(count '<g class="series"' "$T/run-loss")" = 1 ] || fail "run page: the loss chart is not the loss alone"
grep -q '<title>best validation: val_loss [0-9.e-]* at step [0-9]*' "$d" && grep -q '>best val</text>' "$d" ||
    fail "best validation not named"
grep -q '<title>spike at step 800: step 800: loss 40' "$d" || fail "run page: the spike's hover text"
grep -q '<title>best checkpoint: step 2000' "$d" && grep -q '>best ckpt</text>' "$d" || fail "best not named"
grep -q '<a href="/explain?r=lr0.001&amp;step=800"><g class="mark spike">' "$d" ||
    fail "run page: the spike's mark does not link its explanation"
grep -q 'class="mark nonfinite-point"><title>loss: step 1200: not a number' "$d" ||
    fail "run page: the non-finite loss is not a mark"
grep -q '>log</text>' "$d" || fail "run page: no log axis"
grep -q 'data-name="update_ratio@' "$d" || fail "run page: no top movers"
grep -q '<th>lr</th><td><code>0.001</code>' "$d" || fail "run page: no config"
grep -q 'class="event spike"' "$d" || fail "run page: no events table"

# 3. The overlay: three runs, three series on each chart, a legend.
browse "$URL/overlay?run=lr0.001&run=lr0.003&run=lr0.01" runs-overlay 1400
d="$T/runs-overlay.dom"
sed -n '/id="chart-loss"/,/<\/figure>/p' "$d" >"$T/ov-loss"
[ "$(count '<g class="series"' "$T/ov-loss")" = 3 ] || fail "overlay: not 3 series on the loss chart"
[ "$(count '<g class="item">' "$T/ov-loss")" = 3 ] || fail "overlay: no legend of 3"
# each smoothed, the raw curve faint beneath (issue 30); smooth=0 draws them raw
[ "$(count '<polyline class="series smoothed"' "$T/ov-loss")" = 3 ] &&
    [ "$(count '<polyline class="series raw"' "$T/ov-loss")" = 3 ] || fail "overlay: not smoothed"
curl -sf "$URL/overlay?run=lr0.001&run=lr0.003&smooth=0" | grep -q 'series smoothed' && fail "overlay: smooth=0 smoothed"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/overlay?run=lr0.001&smooth=1")" = 400 ] || fail "overlay: smooth=1 taken"
# values on hover: 48 columns, each titled with its steps and every run's value there
[ "$(count '<rect class="hover"' "$T/ov-loss")" = 48 ] || fail "overlay: no hover columns"
grep -q '<title>steps 1 to [0-9]*' "$T/ov-loss" && grep -q 'lr0.01: [0-9.e+-]* at step [0-9]*' "$T/ov-loss" ||
    fail "overlay: the hover titles"
# log=1 puts the validation loss (linear by itself: it spans less than two decades) on a log axis
ov_val() { curl -sf "$URL/overlay?run=lr0.001&run=lr0.003$1" | sed -n '/id="chart-val_loss"/,/<\/figure>/p'; }
ov_val "&log=1" | grep -q '>log</text>' && ! ov_val "" | grep -q '>log</text>' || fail "overlay: log=1"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/overlay?run=lr0.001&log=2")" = 400 ] || fail "overlay: log=2 taken"
for lr in 0.001 0.003 0.01; do grep -q "data-name=\"lr$lr\"" "$T/ov-loss" || fail "overlay: lr$lr"; done
# What differs between them, a row each (issue 30).
grep -q '<h2>What differs</h2>' "$d" && grep -q '<table class="sweep differs">' "$d" || fail "overlay: no table of what differs"
for lr in 0.001 0.003 0.01; do
    grep -q "<tr class=\"run\"><td><a href=\"/run?r=lr$lr\">lr$lr</a></td><td><code>$lr</code></td></tr>" "$d" ||
        fail "overlay: lr$lr's row of what differs"
done

# 4. A spike explained.
browse "$URL/explain?r=lr0.001&step=800" runs-explain 900
grep -q 'step 800: why' "$T/runs-explain.dom" && grep -q '<th>loss</th><td><code>40 (median' "$T/runs-explain.dom" ||
    fail "explain page"

# 5. Steps logged while served show on reload, read incrementally: the long-lived server's
# charts are a fresh server's, byte for byte, after new steps and after a resume (which
# truncates the steps after its checkpoint and logs them again).
charts() { curl -sf "$1/run?r=lr0.003" | sed -n '/<h2>Training/,/<h2>Events/p' | sed 's/ read at .*//'; }
charts "$URL" >/dev/null || fail "run page"
sqlite3 "$T/sweep/lr0.003/metrics.db" "INSERT INTO steps(step, time, loss, grad_norm) VALUES (2001, 1.8e9, 0.5, 9.5)"
curl -sf "$URL/" | grep -q '2001 / 2000' || fail "a new step does not show on reload"
charts "$URL" >"$T/live1"
grep -q 'step 2001 of 2000' "$T/live1" || curl -sf "$URL/run?r=lr0.003" | grep -q 'step 2001 of 2000' || fail "run page: step 2001"
sqlite3 "$T/sweep/lr0.003/metrics.db" "DELETE FROM steps WHERE step > 1500;
  INSERT INTO events(step, time, kind, message) VALUES (1500, 1.9e9, 'resume', 'resumed from step 1500');
  INSERT INTO steps(step, time, loss, grad_norm) VALUES (1501, 1.9e9, 7.5, 0.25)"
charts "$URL" >"$T/live2"
$KILN runs serve "$T/sweep" >"$T/serve2.out" 2>"$T/serve2.err" &
PID2=$!
serve_url "$T/serve2.out" "$T/serve2.err"
charts "$URL" >"$T/fresh2"
kill $PID2; wait $PID2 2>/dev/null || true
serve_url "$T/serve.out" "$T/serve.err"
[ -s "$T/live2" ] && cmp -s "$T/live2" "$T/fresh2" || { diff "$T/live2" "$T/fresh2" | cut -c1-160 | head -5 >&2; fail "after a resume the cached charts are not a fresh read's"; }
cmp -s "$T/live1" "$T/live2" && fail "the resume did not change the charts"

# 6. Refusals: no path out of the directory, a missing run, a write.
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/run?r=..%2Fsweep")" = 404 ] || fail "../ not refused"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/run?r=nope")" = 404 ] || fail "missing run"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/overlay")" = 400 ] || fail "empty overlay"
[ "$(curl -s -o /dev/null -w '%{http_code}' -X POST "$URL/")" = 405 ] || fail "POST not refused"
[ "$(curl -s -o /dev/null -w '%{http_code}' "$URL/explain?r=lr0.001&step=x")" = 400 ] || fail "bad step"
curl -sI "$URL/" | grep -qi "^content-security-policy: default-src 'none'; style-src 'sha256-" ||
    fail "no content security policy"
kill $PID; wait $PID 2>/dev/null || true

# 7. One run served by itself; bad arguments.
$KILN runs serve "$T/sweep/lr0.01" --listen 127.0.0.1:0 >"$T/serve.out" 2>"$T/serve.err" &
PID=$!
serve_url "$T/serve.out" "$T/serve.err"
# (its page at once, not a list of one run to click through: issue 30)
curl -sf "$URL/" | grep -q 'id="chart-loss"' || fail "one run: / is not its page"
curl -sf "$URL/run?r=." | grep -q 'id="chart-loss"' || fail "one run: its page"
kill $PID; wait $PID 2>/dev/null || true
# A chart whose every value is 0 is folded into a line saying so (issue 30): a short real run
# has no overflow and no dead expert.
$KILN data synth --seed 1 --rows 800 --features 4 --outputs 1 --out "$T/tiny.st" >/dev/null 2>&1 || fail "synth"
$KILN train --data "$T/tiny.st" --run-dir "$T/tiny" --set steps=4 --set d_model=8 --set d_ff=8 --set seq_len=8 \
    --set attn_window=8 --set n_heads=2 >/dev/null 2>&1 || fail "train a tiny run"
$KILN runs serve "$T/tiny" --listen 127.0.0.1:0 >"$T/serve.out" 2>"$T/serve.err" &
PID=$!
serve_url "$T/serve.out" "$T/serve.err"
curl -sf "$URL/" >"$T/tiny.html" || fail "the tiny run's page"
grep -q '<p class="folded" id="folded-overflow">overflow (tokens past capacity): 0 at every step logged (chart folded)</p>' "$T/tiny.html" &&
    ! grep -q 'id="chart-overflow"' "$T/tiny.html" || fail "an all-zero chart not folded"
grep -q 'id="chart-loss"' "$T/tiny.html" || fail "the tiny run's loss chart"
kill $PID; wait $PID 2>/dev/null || true
expect_fail 2 $KILN runs serve "$T/none"
grep -q "$T/none" "$T/err" || fail "a missing directory not named"
printf 'x' >"$T/afile"
expect_fail 2 $KILN runs serve "$T/afile"
grep -q "$T/afile" "$T/err" || fail "a file as DIR not named"
expect_fail 2 $KILN runs serve --listen bogus "$T/sweep"
grep -q "'bogus'" "$T/err" || fail "a bad --listen not named"

# 8. A long run read through the summary its trainer writes (step_sums; gen-run.sh sums the
# steps table up with the trainer's code, bench_metrics_log) draws what the same file read row
# by row draws, as a run logged before the summary existed is read; also after steps are added.
SUMTOOL="$(dirname "$KILN")/bench_metrics_log"
[ -x "$SUMTOOL" ] || fail "no $SUMTOOL (make $SUMTOOL)"
mkdir -p "$T/long"
GEN_SUMMARIZE="$SUMTOOL" sh "$GEN" "$T/long/run" 40000 0.001 || fail "gen-run, summed up"
[ "$(sqlite3 "$T/long/run/metrics.db" "SELECT upto FROM step_sums_done WHERE level = 1")" = 40000 ] ||
    fail "the summary is not there"
[ "$(sqlite3 "$T/long/run/metrics.db" "SELECT upto FROM layer_sums_done WHERE level = 1")" = 40000 ] ||
    fail "the layers' summary is not there"
[ "$(sqlite3 "$T/long/run/metrics.db" "SELECT upto FROM tensor_sums_done WHERE level = 1")" = 40000 ] ||
    fail "the tensors' summary is not there"
long_page() { # the long run's page from a server just started, without its footer's time
    $KILN runs serve "$T/long" >"$T/long.out" 2>"$T/long.err" &
    PID=$!
    serve_url "$T/long.out" "$T/long.err"
    curl -sf "$URL/run?r=run" | sed 's/ read at .*//' >"$1" || fail "the long run's page"
    kill $PID; wait $PID 2>/dev/null || true
}
long_page "$T/long.sums"
grep -q 'id="chart-loss"' "$T/long.sums" && grep -q 'class="mark spike"' "$T/long.sums" ||
    fail "the long run's page: no loss chart or spike mark"
# (its layers and tensors read whole too, as a _sums_done with nothing done has them read)
sqlite3 "$T/long/run/metrics.db" "ALTER TABLE step_sums_done RENAME TO kept;
  CREATE TABLE kept_l AS SELECT * FROM layer_sums_done; UPDATE layer_sums_done SET upto = 0;
  CREATE TABLE kept_t AS SELECT * FROM tensor_sums_done; UPDATE tensor_sums_done SET upto = 0"
long_page "$T/long.rows"
cmp -s "$T/long.sums" "$T/long.rows" || { diff "$T/long.sums" "$T/long.rows" | cut -c1-160 | head -5 >&2; fail "the summary's page is not the rows' page"; }
sqlite3 "$T/long/run/metrics.db" "ALTER TABLE kept RENAME TO step_sums_done; DELETE FROM
  layer_sums_done; INSERT INTO layer_sums_done SELECT * FROM kept_l; DROP TABLE kept_l;
  DELETE FROM tensor_sums_done; INSERT INTO tensor_sums_done SELECT * FROM kept_t; DROP TABLE kept_t;
  INSERT INTO steps(step, time, loss, grad_norm) VALUES (40001, 1.8e9, 90, 9.5), (40050, 1.8e9, 0.5, 0.5)"
"$SUMTOOL" summarize "$T/long/run/metrics.db" || fail "summarize"
long_page "$T/long.sums2"
sqlite3 "$T/long/run/metrics.db" "DROP TABLE step_sums_done; UPDATE layer_sums_done SET upto = 0;
  UPDATE tensor_sums_done SET upto = 0"
long_page "$T/long.rows2"
cmp -s "$T/long.sums2" "$T/long.rows2" || fail "after new steps the summary's page is not the rows' page"
cmp -s "$T/long.sums" "$T/long.sums2" && fail "the new steps do not show"
echo "ok"
