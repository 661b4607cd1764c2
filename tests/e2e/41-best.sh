#!/bin/sh
# The best checkpoint: with keep=N the trainer keeps the newest N checkpoints and the one
# whose step logged the lowest validation loss (a run that got worse keeps its best), across a
# resume; kiln export --best freezes that one; refusals for a run without validation losses
# and for --best with --step.
. "$(dirname "$0")/lib.sh"

$KILN data synth --seed 3 --rows 2000 --features 6 --outputs 2 --out "$T/d.st" >/dev/null 2>&1 || fail "synth"
S="--set ckpt_every=4 --set eval_every=4 --set keep=2 --set d_model=16 --set d_ff=32 --set seq_len=16 --set attn_window=8"
$KILN train --data "$T/d.st" --run-dir "$T/r" --set steps=40 $S >/dev/null 2>"$T/train.log" || { cat "$T/train.log" >&2; fail "train"; }
ckpts() { ls "$1/ckpt" | sed -n 's/^step-0*\([0-9]*\)\.safetensors$/\1/p' | sort -n | tr '\n' ' '; }
# What the rule keeps: the newest two, and the best of every checkpoint step as metrics.db has it.
best=$(sqlite3 "$T/r/metrics.db" "SELECT step FROM steps WHERE val_loss IS NOT NULL AND step % 4 = 0 ORDER BY val_loss, step DESC LIMIT 1")
want=$(printf '%s\n' 36 40 "$best" | sort -nu | tr '\n' ' ')
[ "$(ckpts "$T/r")" = "$want" ] || fail "kept $(ckpts "$T/r"), expected $want (best $best)"

# A run that gets worse: step 36's validation loss made the lowest (as if the rest were
# worse), then the run goes on to step 60: 36 stays beside the newest two.
sqlite3 "$T/r/metrics.db" "UPDATE steps SET val_loss = 1e-9 WHERE step = 36"
$KILN train --resume "$T/r" --set steps=60 >/dev/null 2>"$T/resume.log" || { cat "$T/resume.log" >&2; fail "resume"; }
[ "$(ckpts "$T/r")" = "36 56 60 " ] || fail "after the resume: $(ckpts "$T/r")"
$KILN runs show "$T/r" >"$T/show" || fail "runs show"
grep -q '^checkpoints 36 56 60 (best validation loss: 36, which kiln export --best takes)$' "$T/show" ||
    fail "runs show: $(grep checkpoints "$T/show")"
$KILN export "$T/r" --best --out "$T/m" >"$T/ex" || fail "export --best"
grep -q "step-00000036.safetensors' (step 36, f32)" "$T/ex" || fail "export --best: $(cat "$T/ex")"
grep -q '"step": 36' "$T/m/card.json" || fail "the card's lineage step"
expect_fail 2 $KILN export "$T/r" --best --step 60 --out "$T/m2"

# A loss that is not finite is never the best (issue 33: export ranked a -inf loss first with
# SQL of its own while runs show skipped it; one function decides for both now): step 56's
# validation loss made -inf, and export --best still takes 36, as runs show says.
sqlite3 "$T/r/metrics.db" "UPDATE steps SET val_loss = -1e999 WHERE step = 56"
[ "$(sqlite3 "$T/r/metrics.db" "SELECT val_loss < -1e308 FROM steps WHERE step = 56")" = 1 ] || fail "could not store -inf"
$KILN runs show "$T/r" | grep -q '(best validation loss: 36, which kiln export --best takes)$' || fail "runs show after -inf"
$KILN export "$T/r" --best --out "$T/m-inf" >"$T/ex" || fail "export --best with a -inf loss"
grep -q "(step 36, f32)" "$T/ex" || fail "export --best took a non-finite loss: $(cat "$T/ex")"

# A NaN validation loss at the lowest checkpoint step, the best until now (inf - inf: SQLite
# keeps a NaN as NULL, as the trainer's NaN is logged): with 56's -inf, 60 is the best, and
# runs show, export --best and the card's lineage agree (one rule, runs/: kiln_run_best_ckpt;
# the lineage's validation is the newest finite one at or before the step frozen).
sqlite3 "$T/r/metrics.db" "UPDATE steps SET val_loss = 1e999 - 1e999 WHERE step = 36"
[ "$(sqlite3 "$T/r/metrics.db" "SELECT val_loss IS NULL FROM steps WHERE step = 36")" = 1 ] || fail "a NaN is not kept as NULL"
$KILN runs show "$T/r" >"$T/show" || fail "runs show after NaN"
grep -q '^checkpoints 36 56 60 (best validation loss: 60, which kiln export --best takes)$' "$T/show" ||
    fail "runs show after NaN: $(grep checkpoints "$T/show")"
$KILN export "$T/r" --best --out "$T/m-nan" >"$T/ex" || fail "export --best with a NaN loss"
grep -q "(step 60, f32)" "$T/ex" || fail "export --best disagrees with runs show: $(cat "$T/ex")"
grep -q '"val_step": 60' "$T/m-nan/card.json" || fail "the card's lineage: $(grep val_ "$T/m-nan/card.json")"
# Frozen at 56 (-inf): the card's validation is 52's, the newest finite one, not the -inf.
$KILN export "$T/r" --step 56 --out "$T/m-56" >/dev/null || fail "export --step 56"
grep -q '"val_step": 52' "$T/m-56/card.json" || fail "the card at 56: $(grep val_ "$T/m-56/card.json")"
grep -q '"val_loss": [0-9]' "$T/m-56/card.json" || fail "the card at 56 has no finite val_loss"

# No validation loss at any checkpoint (eval_every 0): refused, nothing written.
$KILN train --data "$T/d.st" --run-dir "$T/nv" --set steps=8 $S --set eval_every=0 --set val_fraction=0 >/dev/null 2>"$T/nv.log" ||
    { cat "$T/nv.log" >&2; fail "train without validation"; }
expect_fail 2 $KILN export "$T/nv" --best --out "$T/m3"
grep -q "none of the [0-9]* checkpoints' steps logged a finite validation loss" "$T/err" || fail "no validation: $(cat "$T/err")"
[ ! -e "$T/m3" ] || fail "a refused export wrote a model"
