#!/bin/sh
# kiln train --device cuda: where the build has no CUDA or the machine no GPU, it is refused
# at the start with a clear message and exit 2, before anything is written (and a resume on
# cuda leaves the run as it was); on a GPU the run trains and says where.
. "$(dirname "$0")/lib.sh"

$KILN data synth --seed 1 --rows 2000 --features 4 --outputs 1 --out "$T/d.st" 2>/dev/null || fail "synth"
S="--set steps=4 --set ckpt_every=2 --set keep=0 --set eval_every=0 --set d_model=8 --set n_layers=1 --set d_ff=8 --set n_heads=2 --set seq_len=8 --set attn_window=4 --set batch_size=2"

set +e
$KILN train --data "$T/d.st" --run-dir "$T/g" --device cuda $S >"$T/out" 2>"$T/err"
rc=$?
set -e
if [ $rc -eq 0 ]; then
    echo "a GPU is present: the run trained on it" >&2
    sqlite3 "$T/g/metrics.db" "SELECT message FROM events WHERE kind = 'start'" | grep -q 'run started on cuda' ||
        fail "the start event does not say cuda"
    exit 0
fi
[ $rc -eq 2 ] || { cat "$T/err" >&2; fail "--device cuda exited $rc, expected 2"; }
grep -q 'kiln: error: cannot train on device "cuda": ' "$T/err" || { cat "$T/err" >&2; fail "unclear message"; }
grep -Eq 'no usable CUDA device|has no CUDA' "$T/err" || { cat "$T/err" >&2; fail "the reason is missing"; }
[ ! -e "$T/g" ] || fail "a run directory was written"

# The config key does the same; a typo is a config error.
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/g" --set device=cuda $S
[ ! -e "$T/g" ] || fail "a run directory was written (--set device=cuda)"
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/g" --device gpu $S
grep -q "config key 'device' must be \"cpu\" or \"cuda\"" "$T/err" || fail "bad device not named"
expect_fail 2 $KILN train --data "$T/d.st" --run-dir "$T/g" --set precision=bf16 $S
grep -q "'precision' is \"bf16\", which only device \"cuda\" has" "$T/err" || fail "bf16 on cpu not refused"

# A cpu run resumed on cuda is refused and left as it was.
$KILN train --data "$T/d.st" --run-dir "$T/c" $S 2>/dev/null || fail "cpu run"
cp "$T/c/ckpt/step-00000004.safetensors" "$T/c4"
events=$(sqlite3 "$T/c/metrics.db" 'SELECT count(*) FROM events')
expect_fail 2 $KILN train --resume "$T/c" --device cuda --set steps=6
grep -q 'cannot train on device "cuda"' "$T/err" || fail "resume: unclear message"
cmp -s "$T/c4" "$T/c/ckpt/step-00000004.safetensors" || fail "the checkpoint changed"
[ ! -e "$T/c/ckpt/step-00000006.safetensors" ] || fail "a step was trained"
[ "$(sqlite3 "$T/c/metrics.db" 'SELECT count(*) FROM events')" = "$events" ] || fail "events were added"
grep -q '"device": "cpu"' "$T/c/run.json" || fail "run.json changed"
echo ok
