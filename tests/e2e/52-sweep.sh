#!/bin/sh
# kiln sweep on a single-node Slurm cluster started for the test (tests/slurm/cluster.sh,
# stopped however the script ends) and on the local pool: a 4-point sweep, one job preempted
# mid-run with SIGTERM, requeued, resumed, and its last checkpoint the same bytes as an
# uninterrupted run's; a second submission submits nothing, also two started at once; of two
# specs started into one empty root one is refused; 2 ranks through srun give one process's
# bytes; bad specs, roots and schedulers are refused with nothing written.
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)

C="$T/cluster"
slurm=yes
if [ "$(id -u)" != 0 ]; then
    slurm=; echo "52-sweep: not root: the Slurm cluster cannot start (its daemons run as root); local only"
else
    for b in munged slurmctld slurmd sbatch; do
        command -v $b >/dev/null || fail "$b not found (the Makefile installs slurm-wlm and munge)"
    done
fi
pool=
# The local pool (its jobs get its SIGTERM) and the cluster stop however the script ends.
trap '[ -z "$pool" ] || { kill "$pool"; wait "$pool"; } 2>/dev/null
      [ -z "$slurm" ] || "$here/../slurm/cluster.sh" stop "$C" >/dev/null 2>&1; rm -rf "$T"' EXIT
trap 'exit 1' INT TERM

$KILN data synth --seed 1 --rows 2000 --features 6 --outputs 2 --out "$T/d.st" >/dev/null 2>&1 || fail "synth"
# 600 steps of a tiny model: a few seconds each, long enough to be preempted mid-run.
cat >"$T/spec.json" <<EOF
{"data": "d.st",
 "config": {"steps": 600, "d_model": 16, "d_ff": 32, "seq_len": 16, "attn_window": 8,
            "ckpt_every": 100, "eval_every": 100, "keep": 0},
 "grid": {"lr": [0.001, 0.003]},
 "seeds": [1, 2],
 "slurm": {"time": "10:00", "cpus": 1, "signal_seconds": 30}}
EOF
P="lr-0.003,seed-1" # the point preempted
last=ckpt/step-00000600.safetensors

# step DIR: the newest step the run logged (0 before its metrics.db has one).
step() { sqlite3 "$1/metrics.db" "SELECT coalesce(max(step), 0) FROM steps" 2>/dev/null || echo 0; }
# wait_step DIR: until the run logged step 10 (60 s at most); it must not have finished.
wait_step() {
    _i=0
    while [ "$(step "$1")" -lt 10 ]; do
        _i=$((_i + 1)); [ $_i -lt 600 ] || fail "'$1' logged no steps in 60 s"; sleep 0.1
    done
    [ "$(step "$1")" -lt 600 ] || fail "'$1' finished before it could be preempted"
}
# all_finished ROOT [slurm]: until kiln sweep status says every point finished (180 s at most).
all_finished() {
    _i=0
    while :; do
        # Every job left the queue (on Slurm; asked first, since a job ends a moment after its
        # run's last step) and every run finished.
        _q=; [ -z "${2:-}" ] || _q=$(squeue -h)
        $KILN sweep status "$1" >"$T/status" 2>"$T/status.err" || { cat "$T/status.err" >&2; fail "sweep status"; }
        [ -z "$_q" ] && grep -q '^4 points: 4 finished$' "$T/status" && return 0
        ! grep -q ' failed ' "$T/status" || { cat "$T/status" "$1"/jobs/*.log >&2; fail "a point failed"; }
        _i=$((_i + 1)); [ $_i -lt 900 ] || { cat "$T/status" >&2; fail "the sweep did not finish in 180 s"; }
        sleep 0.2
    done
}
# check_preempted ROOT: the preempted point's events, its last checkpoint against the
# uninterrupted run's, and the other points' too.
check_preempted() {
    ev=$(sqlite3 "$1/$P/metrics.db" "SELECT kind FROM events ORDER BY id" | tr '\n' ' ')
    case $ev in
    "start interrupted preempted requeued resume "*) ;; # (and the run's own, such as spikes)
    *) fail "$1: events of the preempted point: $ev" ;;
    esac
    cmp -s "$T/ref/$last" "$1/$P/$last" || fail "$1: the preempted point's last checkpoint differs from an uninterrupted run's"
    for p in lr-0.001,seed-1 lr-0.001,seed-2 lr-0.003,seed-2; do
        [ -f "$1/$p/$last" ] || fail "$1: $p has no last checkpoint"
    done
    $KILN runs list "$1" >"$T/list" || fail "runs list"
    [ "$(grep -c ' finished ' "$T/list")" = 4 ] || { cat "$T/list" >&2; fail "$1: runs list does not show 4 finished runs"; }
}

# The uninterrupted run of the point preempted, trained directly from its config.
cat >"$T/ref.json" <<EOF
{"steps": 600, "d_model": 16, "d_ff": 32, "seq_len": 16, "attn_window": 8, "ckpt_every": 100,
 "eval_every": 100, "keep": 0, "lr": 0.003, "seed": 1}
EOF
$KILN train --config "$T/ref.json" --data "$T/d.st" --run-dir "$T/ref" >/dev/null 2>"$T/ref.log" ||
    { cat "$T/ref.log" >&2; fail "reference run"; }

# ---- bad input: an error, exit 2, nothing written ----
cd "$T"
bad() { # bad SPEC_TEXT ROOT MESSAGE
    printf '%s\n' "$1" >"$T/bad.json"
    expect_fail 2 $KILN sweep "$T/bad.json" --root "$2" --scheduler local
    grep -q "$3" "$T/err" || { cat "$T/err" >&2; fail "bad spec: expected '$3'"; }
    [ ! -e "$2" ] || fail "bad spec: '$2' was made"
}
bad '{"data": "d.st", "config": {"lrr": 1}}' "$T/b" "'$T/bad.json' config: unknown config key 'lrr'"
bad '{"data": "d.st", "grid": {"d_model": [16, 17]}}' "$T/b" "point 'd_model-17'"
bad '{"data": "d.st", "points": [{"lr": 0.001}, {"lr": 1e-3}]}' "$T/b" "points 1 and 2 would both be named 'lr-0.001'"
bad '{"data": "d.st", "points": [{"ranks": 2}]}' "$T/b" "not a multiple of the 2 ranks"
bad '{"data": "nope.st"}' "$T/b" "dataset 'nope.st'"
bad '{"data": "d.st", "slurm": {"partiton": "x"}}' "$T/b" "unknown slurm key 'partiton'"
mkdir "$T/junk" && : >"$T/junk/x"
expect_fail 2 $KILN sweep "$T/spec.json" --root "$T/junk" --scheduler local
grep -q "holds no sweep" "$T/err" || fail "a root of other files: no clear error"
# No slurm.conf, and a controller that does not answer: nothing written.
expect_fail 2 env SLURM_CONF="$T/none.conf" $KILN sweep "$T/spec.json" --root "$T/b"
grep -q "no Slurm cluster configured here: '$T/none.conf' does not exist" "$T/err" || { cat "$T/err" >&2; fail "no slurm.conf: no clear error"; }
[ ! -e "$T/b" ] || fail "no slurm.conf: the root was made"
cd - >/dev/null

# A point on 2 ranks and one on 1 (srun tasks on Slurm, mpirun on the local pool).
cat >"$T/mpi.json" <<EOF
{"data": "d.st", "config": {"steps": 20, "d_model": 16, "d_ff": 32, "seq_len": 16, "attn_window": 8,
 "ckpt_every": 10, "eval_every": 10, "keep": 0, "batch_size": 8, "accum_steps": 2},
 "points": [{"ranks": 1}, {"ranks": 2}]}
EOF
# same_ranks ROOT: the 2-rank point trained on 2 ranks, with the 1-rank point's bytes.
same_ranks() {
    [ "$(sqlite3 "$1/ranks-2/metrics.db" "SELECT message FROM events WHERE kind = 'start'")" = "run started on 2 ranks" ] ||
        fail "$1: the ranks-2 point did not train on 2 ranks"
    for s in 10 20; do
        cmp -s "$1/ranks-1/ckpt/step-000000$s.safetensors" "$1/ranks-2/ckpt/step-000000$s.safetensors" ||
            fail "$1: 2 ranks: checkpoint $s differs from one process's"
    done
}

# ---- Slurm ----
if [ -n "$slurm" ]; then
    "$here/../slurm/cluster.sh" start "$C" >/dev/null || fail "the Slurm cluster did not start"
    export SLURM_CONF="$C/slurm.conf"
    sbatch --wait -o /dev/null --wrap hostname >/dev/null || fail "sbatch --wrap hostname"

    S="$T/slurm"
    $KILN sweep "$T/spec.json" --root "$S" --max-parallel 2 >"$T/sub" 2>"$T/sub.err" || { cat "$T/sub.err" >&2; fail "sweep on slurm"; }
    [ "$(grep -c '^submitted .* as Slurm job [0-9]*$' "$T/sub")" = 4 ] || { cat "$T/sub" >&2; fail "not 4 jobs submitted"; }
    grep -q '#SBATCH --requeue' "$S/jobs/$P.sh" && grep -q '#SBATCH --signal=TERM@30' "$S/jobs/$P.sh" &&
        grep -q '#SBATCH --time=10:00' "$S/jobs/$P.sh" || fail "batch script lacks --requeue, --signal or --time"
    job=$(sed -n "s/^submitted $P as Slurm job //p" "$T/sub")
    [ -n "$job" ] || fail "no job id for $P"
    grep -q "\"job\": \"$job\"" "$S/jobs.json" || fail "jobs.json does not record job $job"
    # The same spec while the jobs are queued or running: nothing more.
    $KILN sweep "$T/spec.json" --root "$S" --max-parallel 2 >"$T/again" 2>&1 || { cat "$T/again" >&2; fail "sweep again"; }
    grep -q '^nothing to submit: ' "$T/again" || { cat "$T/again" >&2; fail "second submission submitted"; }

    wait_step "$S/$P"
    scancel --signal=TERM "$job" || fail "scancel --signal=TERM $job"
    all_finished "$S" slurm
    scontrol show job "$job" | grep -q 'Restarts=1' || { scontrol show job "$job" >&2; fail "job $job was not requeued once"; }
    grep -q "^$P  *finished  *$job  *COMPLETED  *600/600  *1 " "$T/status" || { cat "$T/status" >&2; fail "status of $P"; }
    check_preempted "$S"
    $KILN sweep "$T/spec.json" --root "$S" --max-parallel 2 >"$T/again" 2>&1 || { cat "$T/again" >&2; fail "sweep after the end"; }
    grep -qx 'nothing to submit: 4 of 4 points finished, 0 queued or running' "$T/again" || { cat "$T/again" >&2; fail "a finished sweep submitted again"; }
    $KILN sweep status --json "$S" | grep -q '"preemptions": 1' || fail "status --json: no preemption"

    # --extend: a spec that only adds a point submits that point alone; one that changes a
    # point is refused, as is another spec without it.
    sed 's/"seeds": \[1, 2\]/"points": [{"lr": 0.01, "steps": 20}], "seeds": [1, 2]/' "$T/spec.json" >"$T/spec2.json"
    expect_fail 2 $KILN sweep "$T/spec2.json" --root "$S"
    grep -q "holds the runs of another spec" "$T/err" || fail "another spec: no clear error"
    $KILN sweep "$T/spec2.json" --root "$S" --extend >"$T/ext" 2>&1 || { cat "$T/ext" >&2; fail "--extend"; }
    [ "$(grep -c '^submitted .* as Slurm job' "$T/ext")" = 2 ] && grep -q '^submitted lr-0.01,seed-1,steps-20 ' "$T/ext" ||
        { cat "$T/ext" >&2; fail "--extend did not submit the 2 new points alone"; }
    sed 's/0.003/0.004/' "$T/spec2.json" >"$T/spec3.json"
    expect_fail 2 $KILN sweep "$T/spec3.json" --root "$S" --extend
    grep -q "is not in the new spec" "$T/err" || { cat "$T/err" >&2; fail "--extend that drops a point: no clear error"; }

    # 2 ranks through srun (Open MPI's PMIx): one process's bytes.
    $KILN sweep "$T/mpi.json" --root "$T/mpi" >/dev/null 2>&1 || fail "mpi sweep"
    i=0
    until $KILN sweep status "$T/mpi" 2>/dev/null | grep -q '^2 points: 2 finished$'; do
        i=$((i + 1)); [ $i -lt 600 ] || { cat "$T"/mpi/jobs/*.log >&2; fail "the 2-rank sweep did not finish"; }
        sleep 0.2
    done
    same_ranks "$T/mpi"

    # Two submitters at once (cron and a person): each point submitted once, the second
    # waiting for the first's lock and then seeing its jobs; two specs into one empty root:
    # one takes it, the other is refused. (tests/e2e/53-sweep-fake.sh: with a slow squeue.)
    # jobs_of ROOT: the jobs Slurm holds under the name of ROOT's sweep (kiln-DIGEST12).
    jobs_of() { squeue -h --states=all -n "kiln-$(sed -n 's/^  "digest": "\(.\{12\}\).*/\1/p' "$1/sweep.json")" -o %i | wc -l; }
    race() { # race SPEC_A SPEC_B ROOT: both at once; rc1, rc2, $T/r1.out, $T/r2.out
        $KILN sweep "$T/$1" --root "$3" >"$T/r1.out" 2>&1 &
        r1=$!
        $KILN sweep "$T/$2" --root "$3" >"$T/r2.out" 2>&1 &
        r2=$!
        set +e; wait $r1; rc1=$?; wait $r2; rc2=$?; set -e
    }
    printf '%s\n' '{"data": "d.st", "config": {"steps": 20, "d_model": 16, "d_ff": 32, "seq_len": 16, "attn_window": 8}, "grid": {"lr": [0.001, 0.003]}}' >"$T/race.json"
    # (The second race's specs are others: Slurm's job name is the spec's digest.)
    sed 's/"steps": 20/"steps": 30/' "$T/race.json" >"$T/race2.json"
    sed 's/"steps": 20/"steps": 40/' "$T/race.json" >"$T/race3.json"
    race race.json race.json "$T/race"
    [ $rc1 = 0 ] && [ $rc2 = 0 ] || { cat "$T/r1.out" "$T/r2.out" >&2; fail "two submitters of one spec: exit $rc1 and $rc2"; }
    [ "$(jobs_of "$T/race")" = 2 ] || { cat "$T/r1.out" "$T/r2.out" >&2; fail "two submitters of one spec: $(jobs_of "$T/race") jobs for 2 points"; }
    cat "$T/r1.out" "$T/r2.out" | grep -q '^nothing to submit: 0 of 2 points finished, 2 queued or running$' ||
        { cat "$T/r1.out" "$T/r2.out" >&2; fail "two submitters of one spec: neither saw the other's jobs"; }
    mkdir "$T/race2"
    race race2.json race3.json "$T/race2"
    [ $((rc1 + rc2)) = 2 ] && [ $((rc1 * rc2)) = 0 ] || { cat "$T/r1.out" "$T/r2.out" >&2; fail "two specs into one root: exit $rc1 and $rc2"; }
    cat "$T/r1.out" "$T/r2.out" | grep -q "holds the runs of another spec" || { cat "$T/r1.out" "$T/r2.out" >&2; fail "two specs into one root: no clear error"; }
    won=race2.json; [ $rc1 = 0 ] || won=race3.json
    grep -qE "\"steps\": $(sed 's/.*"steps": \([0-9]*\).*/\1/' "$T/$won"),?$" "$T/race2/sweep.json" || fail "two specs into one root: sweep.json is not the accepted spec's"
    [ "$(jobs_of "$T/race2")" = 2 ] || fail "two specs into one root: $(jobs_of "$T/race2") jobs of the accepted spec for 2 points"
    [ "$(grep -c '"job":' "$T/race2/jobs.json")" = 2 ] || fail "two specs into one root: jobs.json does not hold 2 jobs"

    # A controller that does not answer (its port closed): a clear error, nothing written.
    sed 's/^SlurmctldPort=.*/SlurmctldPort=1/' "$C/slurm.conf" >"$T/down.conf"
    expect_fail 2 env SLURM_CONF="$T/down.conf" $KILN sweep "$T/spec.json" --root "$T/down"
    grep -q "the Slurm controller is not reachable" "$T/err" || { cat "$T/err" >&2; fail "unreachable controller: no clear error"; }
    [ ! -e "$T/down" ] || fail "unreachable controller: the root was made"
fi

# ---- the local pool ----
L="$T/local"
$KILN sweep "$T/spec.json" --root "$L" --scheduler local --max-parallel 2 >"$T/pool" 2>"$T/pool.err" &
pool=$!
wait_step "$L/$P"
pid=$(sed -n "s/^started $P as local-//p" "$T/pool")
[ -n "$pid" ] || { cat "$T/pool" >&2; fail "no local job for $P"; }
kill -TERM "-$pid" # its process group: the job and its trainer, as a preemption signals them
wait $pool || { pool=; cat "$T/pool" "$T/pool.err" >&2; fail "local sweep"; }
pool=
grep -q "^preempted $P: checkpoint written; requeued$" "$T/pool" && grep -q "^restarted $P as local-" "$T/pool" ||
    { cat "$T/pool" >&2; fail "the local pool did not rerun the preempted point"; }
grep -qx '4 points run: 4 finished, 0 failed; 1 preemption resumed' "$T/pool" || { cat "$T/pool" >&2; fail "local sweep summary"; }
check_preempted "$L"
$KILN sweep "$T/spec.json" --root "$L" --scheduler local >"$T/again" 2>&1 || fail "local sweep again"
grep -qx 'nothing to submit: 4 of 4 points finished, 0 running' "$T/again" || { cat "$T/again" >&2; fail "a finished local sweep ran again"; }
# 2 ranks through mpirun on the local pool.
$KILN sweep "$T/mpi.json" --root "$T/mpil" --scheduler local >"$T/mpil.out" 2>&1 || { cat "$T/mpil.out" "$T"/mpil/jobs/*.log >&2; fail "local 2-rank sweep"; }
same_ranks "$T/mpil"
# A point whose run diverges: the pool exits 1, and the status says why.
printf '%s\n' '{"data": "d.st", "config": {"steps": 20, "d_model": 16, "d_ff": 32, "seq_len": 16, "attn_window": 8, "max_bad_steps": 1}}' >"$T/div.json"
set +e; KILN_TEST_POISON_STEPS=3 $KILN sweep "$T/div.json" --root "$T/div" --scheduler local >"$T/div.out" 2>"$T/div.err"; rc=$?; set -e
[ $rc = 1 ] && grep -q "^kiln: error: 1 point failed" "$T/div.err" || { cat "$T/div.out" "$T/div.err" >&2; fail "a diverged point: exit $rc"; }
$KILN sweep status "$T/div" >"$T/div.st" || fail "status of a failed sweep"
grep -q '^base  *failed  *local-[0-9]*  *-  *3/20 .*step 3: 1 non-finite steps in a row' "$T/div.st" || { cat "$T/div.st" >&2; fail "status of a diverged point"; }
echo "52-sweep: ok${slurm:+ (slurm and local)}"
