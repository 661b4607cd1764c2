#!/bin/sh
# kiln sweep against a fake Slurm as slow as a loaded controller (tests/slurm/fake/: squeue,
# sbatch and scancel answer after 1-3 s, first on PATH; nothing runs): two submissions of one
# spec submit each point once; two specs started into one empty root, one is refused; a point
# whose name would pass 255 bytes gets a short stable one; a root sbatch cannot take is
# refused with nothing made; a value keeps every digit in the point's config and --extend
# accepts it; a dataset replaced under its path is refused. The same races on a real cluster:
# 52-sweep.sh.
. "$(dirname "$0")/lib.sh"
here=$(cd "$(dirname "$0")" && pwd)
PATH="$here/../slurm/fake:$PATH"
FAKE_SLURM_DIR="$T/fake"
SLURM_CONF="$T/fake.conf" # kiln wants a slurm.conf before it asks the controller
export PATH FAKE_SLURM_DIR SLURM_CONF
: >"$SLURM_CONF"
[ "$(command -v squeue)" = "$here/../slurm/fake/squeue" ] || fail "the fake squeue is not first on PATH"

$KILN data synth --seed 1 --rows 400 --features 6 --outputs 2 --out "$T/d.st" >/dev/null 2>&1 || fail "synth"
printf '%s\n' '{"data": "d.st", "config": {"steps": 20}, "grid": {"lr": [0.001, 0.003]}}' >"$T/a.json"
printf '%s\n' '{"data": "d.st", "config": {"steps": 30}, "grid": {"lr": [0.001, 0.003]}}' >"$T/b.json"
# sbatched ROOT: how many times sbatch was given a batch script of ROOT.
sbatched() { grep -c " $1/jobs/" "$FAKE_SLURM_DIR/submitted" || true; }
# two SPEC_A SPEC_B ROOT: kiln sweep of SPEC_A, and of SPEC_B 0.3 s later, on ROOT at once;
# their output in $T/1.out and $T/2.out, their exit codes in rc1 and rc2.
two() {
    $KILN sweep "$T/$1" --root "$3" >"$T/1.out" 2>&1 &
    p1=$!
    sleep 0.3
    $KILN sweep "$T/$2" --root "$3" >"$T/2.out" 2>&1 &
    p2=$!
    set +e; wait $p1; rc1=$?; wait $p2; rc2=$?; set -e
}

# ---- two submitters of one spec: each point submitted once ----
two a.json a.json "$T/one"
[ $rc1 = 0 ] && [ $rc2 = 0 ] || { cat "$T/1.out" "$T/2.out" >&2; fail "two submitters of one spec: exit $rc1 and $rc2"; }
[ "$(sbatched "$T/one")" = 2 ] || { cat "$T/1.out" "$T/2.out" "$FAKE_SLURM_DIR/submitted" >&2; fail "two submitters of one spec: $(sbatched "$T/one") jobs for 2 points"; }
grep -q '^submitted 2 points to Slurm; 0 finished, 0 queued or running before$' "$T/1.out" &&
    grep -q "^waiting for another kiln sweep (pid $p1) submitting to '$T/one'$" "$T/2.out" &&
    grep -q '^nothing to submit: 0 of 2 points finished, 2 queued or running$' "$T/2.out" ||
    { cat "$T/1.out" "$T/2.out" >&2; fail "two submitters of one spec: the second did not see the first's jobs"; }
[ "$(grep -c '"job":' "$T/one/jobs.json")" = 2 ] || fail "two submitters: jobs.json does not hold 2 jobs"

# ---- two specs into one empty root: the first takes it, the second is refused ----
mkdir "$T/two"
two a.json b.json "$T/two"
[ $rc1 = 0 ] && [ $rc2 = 2 ] || { cat "$T/1.out" "$T/2.out" >&2; fail "two specs into one root: exit $rc1 and $rc2"; }
grep -q "holds the runs of another spec" "$T/2.out" || { cat "$T/2.out" >&2; fail "two specs into one root: no clear error"; }
[ "$(sbatched "$T/two")" = 2 ] || fail "two specs into one root: $(sbatched "$T/two") jobs for 2 points"
grep -q '"steps": 20' "$T/two/sweep.json" && ! grep -q '"steps": 30' "$T/two/sweep.json" ||
    fail "two specs into one root: sweep.json is not the first spec's"

# ---- a local pool holds the root while it runs: a submission is refused at once ----
printf '%s\n' '{"data": "d.st", "config": {"steps": 100000, "eval_every": 0, "ckpt_every": 0}}' >"$T/pool.json"
$KILN sweep "$T/pool.json" --root "$T/pool" --scheduler local >"$T/pool.out" 2>&1 &
pool=$!
trap 'kill $pool 2>/dev/null || true; wait $pool 2>/dev/null || true; rm -rf "$T"' EXIT
i=0
until grep -q "^$pool local$" "$T/pool/.sweep.lock" 2>/dev/null; do
    i=$((i + 1)); [ $i -lt 100 ] || fail "the local pool did not take the root's lock"; sleep 0.1
done
start=$(date +%s)
expect_fail 2 $KILN sweep "$T/pool.json" --root "$T/pool"
grep -q "'$T/pool': another kiln sweep (pid $pool) is running its local pool" "$T/err" || { cat "$T/err" >&2; fail "a root held by a local pool: no clear error"; }
[ $(($(date +%s) - start)) -lt 10 ] || fail "a root held by a local pool: the submission waited"
kill $pool; wait $pool 2>/dev/null || true

# The rest needs no slow controller.
FAKE_SLURM_DELAY="0 0.1"
export FAKE_SLURM_DELAY

# ---- a point setting 15 keys: its name would pass 255 bytes; a short stable one instead ----
cat >"$T/long.json" <<'JSON'
{"data": "d.st", "points": [{"steps": 20, "batch_size": 4, "lr": 0.00123456789012, "min_lr": 0.000123456789012,
  "warmup_steps": 3, "weight_decay": 0.0123456789012, "beta1": 0.912345678901, "beta2": 0.991234567890,
  "adam_eps": 1.23456789012e-08, "grad_clip": 1.23456789012, "seed": 123456789, "val_fraction": 0.123456789012,
  "eval_every": 10, "ckpt_every": 10, "aux_loss_coef": 0.0123456789012}]}
JSON
$KILN sweep "$T/long.json" --root "$T/long" >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "a point of 15 keys"; }
name=$(sed -n 's/^submitted \(.*\) as Slurm job [0-9]*$/\1/p' "$T/out")
[ ${#name} -le 120 ] && [ ${#name} -gt 20 ] || fail "a point of 15 keys: name of ${#name} bytes: '$name'"
case $name in adam_eps-1.23456789012e-08,aux_loss_coef-0.0123456789012,*~[0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f][0-9a-f]) ;;
*) fail "a point of 15 keys: name '$name' is not the cut name and a digest" ;; esac
[ -f "$T/long/jobs/$name.json" ] && [ -f "$T/long/jobs/$name.sh" ] || fail "a point of 15 keys: no jobs/$name.json or .sh"
$KILN sweep "$T/long.json" --root "$T/long" >"$T/out" 2>&1 || fail "a point of 15 keys, again"
grep -qx 'nothing to submit: 0 of 1 points finished, 1 queued or running' "$T/out" || { cat "$T/out" >&2; fail "a point of 15 keys: its name is not stable"; }

# ---- a root sbatch cannot take (a space): refused before anything is made ----
expect_fail 2 $KILN sweep "$T/a.json" --root "$T/a b"
grep -q "a Slurm sweep's root path must have no white space" "$T/err" || { cat "$T/err" >&2; fail "a root with a space: no clear error"; }
[ ! -e "$T/a b" ] || fail "a root with a space: the root was made"

# ---- every digit of a value: in the point's config, and --extend accepts the spec again ----
printf '%s\n' '{"data": "d.st", "config": {"steps": 2}, "points": [{"lr": 0.0010000000000000002}]}' >"$T/x.json"
printf '%s\n' '{"data": "d.st", "config": {"steps": 2}, "points": [{"lr": 0.0010000000000000002}, {"lr": 0.002}]}' >"$T/x2.json"
$KILN sweep "$T/x.json" --root "$T/x" >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "a 17-digit value"; }
P=lr-0.0010000000000000002
grep -q '"lr": 0.0010000000000000002,' "$T/x/jobs/$P.json" || { cat "$T/x/jobs/$P.json" >&2; fail "jobs/$P.json lost digits of lr"; }
$KILN train --config "$T/x/jobs/$P.json" --data "$T/d.st" --run-dir "$T/xrun" >/dev/null 2>&1 || fail "train from jobs/$P.json"
grep -q '"lr": 0.0010000000000000002,' "$T/xrun/run.json" || fail "the run of jobs/$P.json did not train with every digit of lr"
$KILN sweep "$T/x2.json" --root "$T/x" --extend >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "--extend of a 17-digit value"; }
grep -q '^submitted lr-0.002 as Slurm job' "$T/out" && [ "$(grep -c '^submitted' "$T/out")" = 2 ] ||
    { cat "$T/out" >&2; fail "--extend did not submit the new point alone"; }

# ---- the dataset replaced under its path: refused, whatever the spec ----
printf '%s\n' '{"data": "d.st", "config": {"steps": 2}, "points": [{"lr": 0.001}, {"lr": 0.002}]}' >"$T/y.json"
printf '%s\n' '{"data": "d.st", "config": {"steps": 2}, "points": [{"lr": 0.001}, {"lr": 0.002}, {"lr": 0.004}]}' >"$T/y2.json"
$KILN sweep "$T/y.json" --root "$T/y" >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "sweep y"; }
mv "$T/d.st" "$T/d.keep"
$KILN data synth --seed 2 --rows 400 --features 6 --outputs 2 --out "$T/d.st" >/dev/null 2>&1 || fail "synth 2"
for args in "$T/y2.json --extend" "$T/y.json"; do
    expect_fail 2 $KILN sweep $args --root "$T/y"
    grep -q "the sweep in '$T/y' trained on other bytes of its dataset '$T/d.st'" "$T/err" || { cat "$T/err" >&2; fail "a replaced dataset ($args): no clear error"; }
done
[ "$(sbatched "$T/y")" = 2 ] || fail "a replaced dataset: a job was submitted"
# A job of the sweep started now (queued before the file changed) refuses it too.
expect_fail 2 $KILN sweep job --root "$T/y" --point lr-0.002
grep -q "trained on other bytes of its dataset" "$T/err" || { cat "$T/err" >&2; fail "a job on a replaced dataset: no clear error"; }
[ ! -e "$T/y/lr-0.002" ] || fail "a job on a replaced dataset: the run was started"
mv "$T/d.keep" "$T/d.st"
$KILN sweep "$T/y2.json" --root "$T/y" --extend >"$T/out" 2>&1 || { cat "$T/out" >&2; fail "--extend, the dataset restored"; }
grep -q '^submitted lr-0.004 as Slurm job' "$T/out" || { cat "$T/out" >&2; fail "--extend, the dataset restored: lr-0.004 not submitted"; }
grep -q '"data_sha256": "' "$T/y/sweep.json" || fail "sweep.json records no data_sha256"
echo "53-sweep-fake: ok"
