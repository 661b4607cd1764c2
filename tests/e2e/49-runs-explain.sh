#!/bin/sh
# kiln runs explain on real runs: a run with a non-finite step (KILN_TEST_POISON_STEPS makes
# the first trained tensor's gradient NaN) is explained at that step without being asked,
# the tensor named, the backward pass placed; its figures agree with metrics.db (the value,
# and the median of the steps before computed here by SQLite); --json parses; a calm run has
# nothing to explain; refusals exit 2 naming the run. runs show points at it when a run had
# trouble, and so does kiln train when the run ends.
. "$(dirname "$0")/lib.sh"

$KILN data synth --seed 2 --rows 1500 --features 6 --outputs 1 --out "$T/d.st" >/dev/null 2>&1 || fail "synth"
S="--set d_model=16 --set d_ff=32 --set seq_len=16 --set attn_window=16 --set steps=60"
KILN_TEST_POISON_STEPS=40,45 $KILN train --data "$T/d.st" --run-dir "$T/p" $S >/dev/null 2>"$T/train.err" ||
    { cat "$T/train.err" >&2; fail "train"; }

grep -q "^kiln: 0 spikes, 2 non-finite steps: kiln runs explain $T/p shows what led to the first$" "$T/train.err" ||
    { cat "$T/train.err" >&2; fail "kiln train does not point at explain"; }

# 1. The non-finite step, found and placed.
$KILN runs explain "$T/p" >"$T/x" 2>"$T/xerr" || { cat "$T/x" "$T/xerr" >&2; fail "explain"; }
grep -q "^step      40 of 60, the run's first spike or non-finite step (2 in all" "$T/x" ||
    { cat "$T/x" >&2; fail "not step 40"; }
grep -q '^          nonfinite: step 40: ' "$T/x" || fail "no event line"
grep -q '^update    skipped$' "$T/x" || fail "the update not said skipped"
grep -q '^  embed.weight  *-  ' "$T/x" || { cat "$T/x" >&2; fail "the non-finite tensor is not listed first"; }
grep -q "1 of 27 tensors' gradients were not: the backward pass broke in the embedding" "$T/x" ||
    { cat "$T/x" >&2; fail "the backward pass not placed"; }

# runs show points at it; a calm run's show does not (below).
$KILN runs show "$T/p" >"$T/show" || fail "runs show"
grep -q "^trouble     0 spikes, 2 non-finite steps: kiln runs explain $T/p shows what led to the first$" "$T/show" ||
    { cat "$T/show" >&2; fail "runs show does not point at explain"; }

# --all: a line for each.
$KILN runs explain --all "$T/p" >"$T/x" || fail "--all"
[ "$(sed -n 1p "$T/x")" = "2 spike and non-finite steps (kiln runs explain --step N $T/p for one in full)" ] &&
    grep -q '^step 40       nonfinite  the loss was finite .* the backward pass broke in the embedding' "$T/x" &&
    grep -q '^step 45       nonfinite  ' "$T/x" && [ "$(wc -l <"$T/x")" = 3 ] ||
    { cat "$T/x" >&2; fail "--all"; }
expect_fail 2 $KILN runs explain --all --json "$T/p"

# 2. Its figures are metrics.db's: the loss at step 40, and the median gradient norm of the
# 39 steps before it (the 20th smallest).
$KILN runs explain --json "$T/p" >"$T/x.json" || fail "--json"
j() { sqlite3 :memory: "SELECT json_extract(readfile('$T/x.json'), '$1')"; }
db() { sqlite3 "$T/p/metrics.db" "$1"; }
[ "$(j '$.format')" = kiln-runs-explain/1 ] || fail "format"
[ "$(j '$.step')" = 40 ] && [ "$(j '$.baseline_steps')" = 39 ] || fail "step or baseline"
[ "$(j '$.step_metrics.loss.value')" = "$(db 'SELECT loss FROM steps WHERE step = 40')" ] ||
    fail "the loss is not metrics.db's"
want=$(db 'SELECT grad_norm FROM steps WHERE step < 40 ORDER BY grad_norm LIMIT 1 OFFSET 19')
[ "$(j '$.step_metrics.grad_norm.median')" = "$want" ] ||
    fail "median gradient norm $(j '$.step_metrics.grad_norm.median'), SQLite says $want"
[ "$(j '$.step_metrics.grad_norm.value')" = "" ] || fail "a non-finite norm is not null"
[ "$(j '$.nonfinite_tensors')" = 1 ] && [ "$(j '$.tensors[0].name')" = embed.weight ] ||
    fail "the non-finite tensor"
[ "$(j '$.layers[1].layer')" = 1 ] || fail "no layers"
[ "$(j '$.trouble')" = "[40,45]" ] || fail "trouble: $(j '$.trouble')"
[ "$(j '$.findings[0].kind')" = backward ] || fail "the first finding's kind: $(j '$.findings[0].kind')"

# 3. Another step, asked; a shorter baseline.
$KILN runs explain --step 50 --window 8 --tensors 3 "$T/p" >"$T/x" || fail "--step 50"
grep -q '^step      50 of 60$' "$T/x" && grep -q 'median of 8 before' "$T/x" ||
    { cat "$T/x" >&2; fail "--step 50 --window 8"; }
[ "$(grep -c '^  [a-z_]*\.[a-z_.0-9]*weight\|^  [a-z_]*\.[a-z_.0-9]*bias' "$T/x")" = 3 ] ||
    { cat "$T/x" >&2; fail "--tensors 3"; }

# 4. A calm run: nothing to explain, exit 0.
$KILN train --data "$T/d.st" --run-dir "$T/c" $S >/dev/null 2>"$T/train.err" || fail "train calm"
! grep -q 'runs explain' "$T/train.err" || fail "a calm run's training points at explain"
$KILN runs explain "$T/c" >"$T/x" || fail "calm run"
grep -q "no spike and no non-finite step in 60 logged steps: nothing to explain" "$T/x" ||
    { cat "$T/x" >&2; fail "calm run said"; }
$KILN runs show "$T/c" >"$T/show" || fail "runs show calm"
! grep -q '^trouble' "$T/show" || fail "a calm run's show speaks of trouble"

# 5. Refusals.
expect_fail 2 $KILN runs explain --step 61 "$T/p"
grep -q "'$T/p': step 61 was not logged (the run logged steps 1 to 60)" "$T/err" || fail "step 61"
expect_fail 2 $KILN runs explain "$T"
grep -q "'$T': not a run directory" "$T/err" || fail "not a run"
expect_fail 2 $KILN runs explain --window 0 "$T/p"
expect_fail 2 $KILN runs explain --step -1 "$T/p"
echo "ok 49-runs-explain"
