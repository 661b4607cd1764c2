#!/bin/sh
# The trainer soak (tests/soak/soak.sh runs it; docs/soak.md): the same small run, over and
# over, SIGKILLed at seeded random moments and resumed until it finishes; each finished run
# must end in a last checkpoint byte for byte the uninterrupted run's (cmp), the same files in
# its run directory (no temporaries, no journal, the same checkpoints kept), a row per step in
# metrics.db, and `kiln runs diff` saying identical.
#
#   trainer.sh WORKDIR SECONDS SEED      ($KILN: the kiln binary)
#
# Kill moments: while a run has no run.json yet, uniform within half the time an
# uninterrupted start takes to write it, either side of that moment (the run directory is
# being created); after that a quarter uniform over twice that time (a resume verifying
# checkpoints, sweeping temporaries, truncating metrics), the rest uniform over a third of an
# uninterrupted run. A run directory left by a kill must be usable as a user would use it:
# `kiln train --resume` where run.json exists, the original `kiln train` command where not.
set -u
: "${KILN:?set KILN to the kiln binary}"
W=$1 SECS=$2 SEED=$3
rm -rf "$W" && mkdir -p "$W" && cd "$W" || exit 2
fail() { echo "FAIL: $*"; exit 1; }
now_ms() { echo $(($(date +%s%N) / 1000000)); }

STEPS=${SOAK_TRAIN_STEPS:-300}
CFG="--set steps=$STEPS --set ckpt_every=5 --set keep=3 --set eval_every=50"
LAST=ckpt/step-$(printf %08d $STEPS).safetensors
$KILN data synth --seed 1 --rows 3000 --features 8 --outputs 2 --out d.st >/dev/null 2>&1 || fail "synth"

# The uninterrupted run, timed, and when its run.json appeared.
t0=$(now_ms)
$KILN train --data d.st --run-dir ref $CFG >ref.log 2>&1 &
pid=$!
while [ ! -e ref/run.json ] && kill -0 $pid 2>/dev/null; do sleep 0.005; done
t_json=$(($(now_ms) - t0))
wait $pid || { cat ref.log; fail "the uninterrupted run failed"; }
t_run=$(($(now_ms) - t0))
[ -f "ref/$LAST" ] || fail "the uninterrupted run wrote no $LAST"
(cd ref && find . | sort) >ref.files
echo "trainer soak: $SECS s, seed $SEED; run of $STEPS steps (ckpt_every 5, keep 3) takes $t_run ms uninterrupted, run.json after $t_json ms"

# Seeded draws (an LCG in shell arithmetic): rnd N gives 0..N-1 in $R.
X=$SEED
rnd() { X=$(((X * 1103515245 + 12345) % 2147483648)); R=$(((X / 65536) % $1)); }
win=$((2 * t_json)) third=$((t_run / 3))
[ $win -gt 0 ] || win=1
[ $third -gt 0 ] || third=1

deadline=$(($(now_ms) + SECS * 1000))
runs=0 kills=0 early=0 startup=0 nojson=0 torn=0 cycles_max=0 t_total=0
while [ "$(now_ms)" -lt $deadline ] || [ $runs -eq 0 ]; do
    runs=$((runs + 1))
    d=run$runs
    rs=$(now_ms) c=0 done=0
    while [ $done -eq 0 ]; do
        c=$((c + 1))
        [ $c -le 2000 ] || fail "$d: not finished after 2000 cycles"
        if [ -e $d/run.json ]; then
            $KILN train --resume $d >>$d.log 2>&1 &
            pid=$!
            rnd 4
            if [ $R -eq 0 ]; then
                rnd $win; early=$((early + 1))
            else
                rnd $third
            fi
        else
            $KILN train --data d.st --run-dir $d $CFG >>$d.log 2>&1 &
            pid=$!
            rnd $t_json; R=$((R + t_json / 2)); startup=$((startup + 1))
        fi
        sleep "$(printf '%d.%03d' $((R / 1000)) $((R % 1000)))"
        kill -9 $pid 2>/dev/null
        { wait $pid; } 2>/dev/null
        rc=$?
        if [ $rc -eq 0 ]; then
            done=1
        elif [ $rc -eq 137 ]; then
            kills=$((kills + 1))
            if [ -d $d ] && [ ! -e $d/run.json ]; then
                nojson=$((nojson + 1))
                [ -d $d/ckpt ] && torn=$((torn + 1))
            fi
        else
            echo "--- $d.log (last lines)"; tail -5 $d.log
            echo "--- $d: $(ls -A $d 2>/dev/null | tr '\n' ' ')"
            fail "$d: cycle $c exited $rc (not killed, not finished): the run directory a kill left is not usable"
        fi
    done
    el=$(($(now_ms) - rs))
    t_total=$((t_total + el))
    [ $c -gt $cycles_max ] && cycles_max=$c
    cmp -s "ref/$LAST" "$d/$LAST" || fail "$d: $LAST differs from the uninterrupted run's (cmp)"
    (cd $d && find . | sort) >$d.files
    cmp -s ref.files $d.files || { diff ref.files $d.files; fail "$d: its files differ from the uninterrupted run's (above)"; }
    if command -v sqlite3 >/dev/null; then
        n=$(sqlite3 $d/metrics.db 'SELECT count(*) FROM steps')
        [ "$n" = $STEPS ] || fail "$d: metrics.db holds $n step rows, not $STEPS"
    fi
    $KILN runs diff ref $d >$d.diff 2>&1 && grep -q '^identical$' $d.diff || { cat $d.diff; fail "$d: runs diff"; }
    echo "trainer run $runs: $((c - 1)) kills, finished on cycle $c in $el ms; $LAST identical (cmp), same files, $STEPS metric rows, runs diff identical"
    rm -rf $d $d.log $d.files $d.diff
done
echo "== summary"
echo "  trainer_runs            $runs runs of $STEPS steps, each killed and resumed until it finished, all identical to the uninterrupted run"
echo "  trainer_kills           $kills SIGKILLs, at most $((cycles_max - 1)) in one run: $startup while run.json was due (within $((t_json / 2))-$((t_json * 3 / 2)) ms; $nojson left no run.json, $torn of them a ckpt/ directory), $early during a resume's set-up (within $win ms), the rest within $third ms"
echo "  trainer_time            $t_total ms for the $runs runs ($(( t_total / runs )) ms each; uninterrupted: $t_run ms)"
echo "  result                  PASS"
