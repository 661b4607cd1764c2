#!/bin/sh
# kiln runs show --follow: a run followed while it trains prints its steps (every --every,
# each validation, the last) and events as metrics.db has them, then how it ended: exit 0
# when it finished, 1 when it was interrupted (SIGINT, then resumed and followed to the end)
# or diverged (non-finite steps printed as skipped). A run not training is said so at once.
# kiln runs plot --follow draws again while a run trains.
. "$(dirname "$0")/lib.sh"

$KILN data synth --seed 2 --rows 1500 --features 6 --outputs 1 --out "$T/d.st" >/dev/null 2>&1 || fail "synth"
S="--set d_model=16 --set d_ff=32 --set seq_len=16 --set attn_window=16 --set eval_every=40"

# stop_when DIR QUERY: once metrics.db of DIR answers QUERY with 1 or more, stop (SIGSTOP)
# the trainer $pid, so that a follower surely starts while the run is training.
stop_when() {
    _i=0
    until [ "$(sqlite3 "$1/metrics.db" "$2" 2>/dev/null)" -ge 1 ] 2>/dev/null; do
        kill -0 $pid 2>/dev/null || { cat "$T/train.err" >&2; fail "the trainer exited"; }
        sleep 0.02; _i=$((_i + 1)); [ $_i -lt 500 ] || { kill -9 $pid; fail "the trainer logged nothing"; }
    done
    kill -STOP $pid
}
# start_stopped DIR ARGS...: a trainer of a new run in the background (pid), stopped once it
# has logged a step.
start_stopped() {
    _d=$1; shift
    $KILN train --data "$T/d.st" --run-dir "$_d" $S "$@" >/dev/null 2>"$T/train.err" &
    pid=$!
    stop_when "$_d" 'SELECT count(*) FROM steps'
}
# steps FILE: the step numbers of the step lines a follower printed, one per line.
steps() { sed -n 's|^  step \([0-9]*\)/.*|\1|p' "$1"; }

# 1. Followed to the end: exit 0, the steps as logged.
start_stopped "$T/a" --set steps=200
$KILN runs show --follow --every 25 --interval 100ms "$T/a" >"$T/f" 2>"$T/ferr" &
fpid=$!
sleep 0.3
kill -CONT $pid
wait $fpid || { cat "$T/f" "$T/ferr" >&2; fail "following a run that finished did not exit 0"; }
wait $pid || fail "the trainer failed"
cat "$T/f" >&2
[ ! -s "$T/ferr" ] || fail "the follower wrote to stderr: $(cat "$T/ferr")"
grep -q "^following   $T/a until it stops" "$T/f" || fail "no following line"
[ "$(tail -n 1 "$T/f")" = "stopped     step 200 of 200, finished" ] || fail "last line: $(tail -n 1 "$T/f")"
steps "$T/f" >"$T/got"
sort -n -c -u "$T/got" || fail "steps printed out of order or twice: $(tr '\n' ' ' <"$T/got")"
# After the first printed step: exactly the multiples of 25 (the validations at 40, 80, ...
# too) up to 200, whatever the first was.
first=$(head -n 1 "$T/got")
awk -v f="$first" 'NR > 1 && ($1 % 25 != 0 && $1 % 40 != 0) { exit 1 }' "$T/got" ||
    fail "a step printed that is neither a 25th nor a validation"
for s in 50 75 80 100 120 125 150 160 175 200; do
    [ "$s" -le "$first" ] || grep -qx "$s" "$T/got" || fail "step $s not printed: $(tr '\n' ' ' <"$T/got")"
done
# Each line's numbers are metrics.db's.
for s in 100 120 200; do
    want=$(sqlite3 "$T/a/metrics.db" "SELECT printf('loss %.6g', loss) FROM steps WHERE step = $s")
    grep -q "^  step $s/200 $want mse " "$T/f" || fail "step $s: not '$want': $(grep "^  step $s/" "$T/f")"
done
for s in 120 200; do
    want=$(sqlite3 "$T/a/metrics.db" "SELECT printf('val_loss %.6g', val_loss) FROM steps WHERE step = $s")
    grep -q "^  step $s/200 .* $want val_r2 " "$T/f" || fail "step $s: not '$want'"
done

# 2. Interrupted (SIGINT: the trainer checkpoints and stops): exit 1, said so; then resumed
# and followed again to the end, the resume event first.
start_stopped "$T/b" --set steps=100000 --set ckpt_every=1000000
$KILN runs show --follow --interval 100ms "$T/b" >"$T/f" 2>&1 &
fpid=$!
sleep 0.3
kill -CONT $pid
sleep 0.5
kill -INT $pid
wait $pid 2>/dev/null || true
set +e; wait $fpid; rc=$?; set -e
cat "$T/f" >&2
[ $rc -eq 1 ] || fail "following an interrupted run exited $rc, not 1"
last=$(sqlite3 "$T/b/metrics.db" 'SELECT max(step) FROM steps')
[ "$(tail -n 1 "$T/f")" = "stopped     step $last of 100000, interrupted (kiln train --resume $T/b continues it)" ] ||
    fail "last line: $(tail -n 1 "$T/f")"
grep -q "^  step $last .*interrupted" "$T/f" || fail "the interrupt event was not printed"
$KILN train --resume "$T/b" --set steps=$((last + 30)) >/dev/null 2>"$T/train.err" &
pid=$!
stop_when "$T/b" "SELECT count(*) FROM events WHERE kind = 'resume'"
$KILN runs show --follow --interval 50ms "$T/b" >"$T/f" 2>&1 &
fpid=$!
sleep 0.3
kill -CONT $pid
wait $fpid || { cat "$T/f" >&2; fail "following the resumed run did not exit 0"; }
wait $pid || fail "the resumed trainer failed"
cat "$T/f" >&2
[ "$(tail -n 1 "$T/f")" = "stopped     step $((last + 30)) of $((last + 30)), finished" ] ||
    fail "resumed, last line: $(tail -n 1 "$T/f")"
grep -q "^  step $((last + 30))/$((last + 30)) " "$T/f" || fail "the resumed run's last step not printed"

# 3. Diverged: the poisoned steps print as skipped, their events too, each explained; exit 1
# with the reason.
KILN_TEST_POISON_STEPS=150,151,152 start_stopped "$T/c" --set steps=400 --set max_bad_steps=3
$KILN runs show --follow --every 1000 --interval 100ms "$T/c" >"$T/f" 2>&1 &
fpid=$!
sleep 0.3
kill -CONT $pid
wait $pid 2>/dev/null && fail "the poisoned run did not fail"
set +e; wait $fpid; rc=$?; set -e
cat "$T/f" >&2
[ $rc -eq 1 ] || fail "following a diverged run exited $rc, not 1"
for s in 150 151 152; do
    grep -q "^  step $s/400 .* (update skipped)" "$T/f" || fail "step $s not printed as skipped"
    grep -q "^  step $s .*nonfinite" "$T/f" || fail "the nonfinite event of step $s not printed"
    # each explained once its row is in (kiln runs explain's most telling finding)
    grep -A1 "^  step $s/400 " "$T/f" | grep -q "^    why (step $s): the loss was finite .* the backward pass broke in the embedding" ||
        fail "step $s not explained after its row"
done
[ "$(grep -c '^    why ' "$T/f")" = 3 ] || fail "explained other than the 3 non-finite steps"
tail -n 1 "$T/f" | grep -q "^stopped     step 152 of 400, diverged: .*non-finite" || fail "last line: $(tail -n 1 "$T/f")"

# 4. kiln runs plot --follow: drawn again while the run trains, once more after, exit 0.
start_stopped "$T/d" --set steps=150
$KILN runs plot --follow --interval 100ms --width 40 --height 5 "$T/d" >"$T/p" 2>"$T/perr" &
fpid=$!
sleep 0.3
kill -CONT $pid
wait $fpid || { cat "$T/p" "$T/perr" >&2; fail "plot --follow of a run that finished did not exit 0"; }
wait $pid || fail "the trainer failed"
[ "$(grep -c '^-- .* (following: redrawn while a run trains; Ctrl-C stops following)$' "$T/p")" -ge 2 ] ||
    fail "plot --follow drew fewer than two drawings while the run trained: $(grep '^-- ' "$T/p")"
[ "$(grep '^-- ' "$T/p" | tail -n 1 | sed 's/^-- [^ ]* //')" = "(no run is training: the last drawing)" ] ||
    fail "plot --follow: no last drawing"
[ "$(tail -n 1 "$T/p")" = "$T/d: finished at step 150" ] || fail "plot --follow: $(tail -n 1 "$T/p")"
last=$(awk '/^-- /{n=NR} END{print n}' "$T/p")
tail -n +"$last" "$T/p" | grep -q 'loss: 150 points, last' || fail "the last drawing lacks the last step"
expect_fail 2 $KILN runs plot --follow --csv "$T/d"
expect_fail 2 $KILN runs plot --interval 1s "$T/d"
set +e; $KILN runs plot --follow "$T/c" >"$T/p"; rc=$?; set -e
[ $rc -eq 1 ] && [ "$(tail -n 1 "$T/p")" = "$T/c: diverged at step 152" ] || fail "plot --follow of a diverged run: $rc $(tail -n 1 "$T/p")"

# 5. A run not training: said at once, with its state's exit status.
$KILN runs show --follow "$T/a" >"$T/f" || fail "a finished run: not exit 0"
[ "$(tail -n 1 "$T/f")" = "following   nothing: the run is not training (finished)" ] || fail "$(tail -n 1 "$T/f")"
set +e; $KILN runs show --follow "$T/c" >"$T/f"; rc=$?; set -e
[ $rc -eq 1 ] || fail "a diverged run not training: exit $rc, not 1"
expect_fail 2 $KILN runs show --every 5 "$T/a"
expect_fail 2 $KILN runs show --follow --interval 0s "$T/a"
expect_fail 2 $KILN runs show --follow "$T/none"
echo "runs-follow OK"
