#!/bin/sh
# kiln train / runs: a short run, SIGKILL at an arbitrary moment and resume gives the
# same checkpoint bytes as a run that never stopped; refusals leave run dirs alone.
. "$(dirname "$0")/lib.sh"

$KILN data synth --seed 1 --rows 3000 --features 8 --outputs 2 --out "$T/d.st" 2>/dev/null || fail "synth"
S="--set steps=100 --set ckpt_every=10 --set eval_every=50 --set keep=0"
last=ckpt/step-00000100.safetensors

# The data section of a safetensors file: everything after 8 + header length bytes.
data_of() {
    n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    tail -c +$((n + 9)) "$1"
}

# An uninterrupted run, and what runs show says about it.
$KILN train --data "$T/d.st" --run-dir "$T/a" $S 2>"$T/a.log" || { cat "$T/a.log" >&2; fail "train"; }
[ -f "$T/a/run.json" ] && [ -f "$T/a/metrics.db" ] && [ -f "$T/a/$last" ] || fail "run dir incomplete"
grep -q 'val_r2' "$T/a.log" || fail "no validation in the log"
$KILN runs show "$T/a" >"$T/show" || fail "runs show"
grep -q 'step 100 of 100 (100%), finished' "$T/show" || fail "runs show progress"
grep -q "sha256 $(sha256sum "$T/d.st" | cut -d' ' -f1)" "$T/show" || fail "runs show data digest"
grep -q 'validation  step 100: loss' "$T/show" || fail "runs show validation"
# The per-layer router table at the last step: one row per layer, one load per expert
# (the defaults: 2 layers, 4 experts), the loads of a layer summing to 1 (to the rounding of
# four 3-decimal figures).
grep -q '^layers      at step 100$' "$T/show" || fail "runs show: no layer table"
rows=$(awk '/^  layer  attn_H/ {on=1; next} on && /^  [0-9]/ {print} on && !/^  [0-9]/ {on=0}' "$T/show")
[ "$(printf '%s\n' "$rows" | wc -l)" -eq 2 ] || fail "runs show: expected 2 layer rows"
printf '%s\n' "$rows" | awk 'NF != 11 { exit 1 } { s = $8 + $9 + $10 + $11; if (s < 0.9975 || s > 1.0025) exit 1 }' ||
    fail "runs show: expert loads are not 4 shares summing to 1"
grep -q '"lr": 0.003' "$T/show" || fail "runs show config"
[ "$(sqlite3 "$T/a/metrics.db" 'SELECT count(*) FROM steps')" = 100 ] || fail "a row per step"
[ "$(sqlite3 "$T/a/metrics.db" 'SELECT count(*) FROM layers WHERE step = 50')" = 2 ] || fail "per-layer rows"

# The same run killed with SIGKILL after its first checkpoint plus a random moment.
$KILN train --data "$T/d.st" --run-dir "$T/b" $S 2>/dev/null &
pid=$!
i=0
while [ ! -e "$T/b/ckpt/step-00000010.safetensors" ]; do
    sleep 0.01; i=$((i + 1)); [ $i -lt 3000 ] || fail "no first checkpoint"
done
sleep "0.$(od -An -tu2 -N2 /dev/urandom | tr -d ' ' | cut -c1-2)"
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
echo "killed after $(ls "$T/b/ckpt" | wc -l) checkpoints" >&2
$KILN train --resume "$T/b" 2>"$T/b.log" || { cat "$T/b.log" >&2; fail "resume"; }
data_of "$T/a/$last" >"$T/a.bin"
data_of "$T/b/$last" >"$T/b.bin"
[ -s "$T/a.bin" ] && cmp -s "$T/a.bin" "$T/b.bin" || fail "resumed run's tensors differ from the uninterrupted run's"
cmp -s "$T/a/$last" "$T/b/$last" || fail "resumed checkpoint's metadata differs"
[ "$(sqlite3 "$T/b/metrics.db" 'SELECT count(*) FROM steps')" = 100 ] || fail "resume duplicated or lost rows"
$KILN runs diff "$T/a" "$T/b" >"$T/diff" || { cat "$T/diff" >&2; fail "runs diff exit"; }
grep -q '^identical$' "$T/diff" || fail "runs diff does not say identical"

# runs plot: the resumed run drawn over the uninterrupted one (identical curves: every mean
# cell '#'), its resume marked; the CSV has a row per step and the same losses as metrics.db.
$KILN runs plot "$T/a" "$T/b" --metric loss --width 40 --height 8 >"$T/plot" || fail "runs plot"
grep -q '^  \* .*/a: 100 points' "$T/plot" && grep -q '^  o .*/b: 100 points' "$T/plot" || fail "runs plot legend"
grep -q '^      marks .*R' "$T/plot" || fail "runs plot: the resume is not marked"
plotted=$(sed -n '2,9p' "$T/plot" | cut -c14- | tr -cd '*o#' | wc -c)
overlap=$(sed -n '2,9p' "$T/plot" | cut -c14- | tr -cd '#' | wc -c)
[ "$plotted" -eq 40 ] && [ "$overlap" -eq 40 ] || fail "runs plot: identical runs should overlap in all 40 columns ($overlap of $plotted)"
$KILN runs plot "$T/a" --metric loss --metric router_entropy@1 --csv >"$T/plot.csv" || fail "runs plot --csv"
[ "$(grep -c '^[0-9]' "$T/plot.csv")" -eq 200 ] || fail "runs plot --csv: expected 100 rows per metric"
[ "$(sed -n 2p "$T/plot.csv" | cut -d, -f2)" = "$(sqlite3 "$T/a/metrics.db" "SELECT printf('%.9g', loss) FROM steps WHERE step = 1")" ] ||
    fail "runs plot --csv: step 1's loss is not metrics.db's"
expect_fail 2 $KILN runs plot "$T/a" --metric act_rms@9
grep -q "no layer '9'" "$T/err" || fail "runs plot: a layer the run does not have is not named"

# Another seed: runs diff names the config key and the first differing step, exits 1.
$KILN train --data "$T/d.st" --run-dir "$T/c" --set steps=5 --set seed=2 2>/dev/null || fail "train seed 2"
set +e; $KILN runs diff "$T/a" "$T/c" >"$T/diff2"; rc=$?; set -e
[ $rc -eq 1 ] || fail "runs diff of different runs exited $rc"
grep -q 'seed' "$T/diff2" && grep -q 'losses first differ at step 1:' "$T/diff2" || fail "runs diff output"

# A bad config key: exit 2, the key named, the run dirs untouched.
before=$(ls -lR --time-style=full-iso "$T/a" | sha256sum)
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/a" --set bogus_key=1
grep -q "'bogus_key'" "$T/err" || fail "bad --set key not named"
printf '{"d_model": 32, "learning_rate": 0.1}\n' >"$T/bad.json"
expect_fail 2 $KILN train --config "$T/bad.json" --data "$T/d.st" --run-dir "$T/new"
grep -q "'learning_rate'" "$T/err" && grep -q 'bad.json' "$T/err" || fail "bad config key not named with its file"
[ ! -e "$T/new" ] || fail "refused config created a run dir"
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/a" --set steps=5
grep -q 'resume' "$T/err" || fail "second start into a run dir not refused"
expect_fail 2 $KILN train --resume "$T/a" --set lr=0.1
grep -q "'lr'" "$T/err" || fail "incompatible resume not named"
[ "$(ls -lR --time-style=full-iso "$T/a" | sha256sum)" = "$before" ] || fail "refusals changed the run dir"

# Shapes that do not fit: heads that do not divide d_model, a window longer than the
# sequence, features that disagree with the dataset; each named, no run dir made.
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/shape" --set n_heads=3
grep -q 'n_heads' "$T/err" || fail "n_heads not named"
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/shape" --set attn_window=64
grep -q 'attn_window' "$T/err" || fail "attn_window not named"
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/shape" --set n_features=3
grep -q 'n_features' "$T/err" || fail "n_features not named"
[ ! -e "$T/shape" ] || fail "a config that does not fit created a run dir"

# A truncated dataset file is refused with its name.
head -c 100 "$T/d.st" >"$T/trunc.st"
expect_fail 2 $KILN train --data "$T/trunc.st" --run-dir "$T/trunc"
grep -q 'trunc.st' "$T/err" || fail "truncated dataset not named"
[ ! -e "$T/trunc" ] || fail "a truncated dataset created a run dir"

# A dataset with NaN is refused before a run dir appears (4 rows, 1 feature, 1 target).
h='{"features":{"dtype":"F32","shape":[4,1],"data_offsets":[0,16]},"targets":{"dtype":"F32","shape":[4,1],"data_offsets":[16,32]}}'
pad=$(( (8 - ${#h} % 8) % 8 )); while [ $pad -gt 0 ]; do h="$h "; pad=$((pad - 1)); done
len=${#h}
{ printf "$(printf '\\%03o' $((len % 256)) $((len / 256)))\000\000\000\000\000\000"; printf '%s' "$h"
  printf '\000\000\200\077\000\000\300\177\000\000\200\077\000\000\200\077'
  printf '\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000\000'; } >"$T/nan.st"
expect_fail 2 $KILN train --data "$T/nan.st" --run-dir "$T/nan" --set seq_len=1 --set attn_window=1
grep -q 'NaN' "$T/err" || { cat "$T/err" >&2; fail "NaN dataset: message does not say NaN"; }
[ ! -e "$T/nan" ] || fail "NaN dataset created a run dir"

# --print-config prints the defaults, which parse back as a config file.
$KILN train --print-config >"$T/defaults.json" || fail "print-config"
$KILN train --print-config --config "$T/defaults.json" >"$T/again.json" || fail "print-config of the defaults"
cmp -s "$T/defaults.json" "$T/again.json" || fail "defaults do not parse back to themselves"
$KILN train --print-config --set optimizer=sgd --set lr=0.001 | grep -q '"optimizer": "sgd"' || fail "--set"
