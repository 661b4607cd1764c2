#!/bin/sh
# A run whose steps cannot fit the process's memory limits is refused before anything is
# written, naming the need and the limit (issue 16, defect 6): OpenBLAS, which kiln used
# before its own GEMM, retried a failed mmap of its per-thread work buffer forever, so under
# `ulimit -v` just above kiln's own buffers a run used to hang in its first step with run.json
# written. A limit comfortably above the need trains. (threads=1: no worker threads, so the
# figures do not depend on the machine's cores; `timeout`: a hang fails the script instead of
# stalling it.)
. "$(dirname "$0")/lib.sh"
command -v prlimit >/dev/null || fail "prlimit (util-linux) is missing"
$KILN data synth --seed 1 --rows 4000 --features 8 --outputs 2 --out "$T/d.st" >/dev/null 2>&1 || fail "synth"
RUN="train --data $T/d.st --set batch_size=2000 --set steps=2 --set threads=1"

# The figures the check works from, as the trainer logs them (KILN_LOG=debug).
KILN_LOG=debug timeout -s KILL 120 $KILN $RUN --run-dir "$T/r0" >/dev/null 2>"$T/r0.log" || { cat "$T/r0.log" >&2; fail "unlimited run"; }
line=$(grep 'train: memory:' "$T/r0.log") || fail "no memory line in the debug log"
as=$(echo "$line" | sed -n 's/.*memory: \([0-9]*\) MiB of address space.*/\1/p')
data=$(echo "$line" | sed -n 's/.* and \([0-9]*\) MiB of data.*/\1/p')
more=$(echo "$line" | sed -n 's/.* needs \([0-9]*\) MiB more.*/\1/p')
[ -n "$as" ] && [ -n "$data" ] && [ -n "$more" ] || fail "cannot read '$line'"
MIB=1048576

# Room for kiln's buffers but not for the spare: refused at once, no run directory.
for lim in "as $as" "data $data"; do
    set -- $lim
    set +e
    timeout -s KILL 60 prlimit --$1=$((($2 + 40) * MIB)) $KILN $RUN --run-dir "$T/r-$1" >"$T/out" 2>"$T/err"
    rc=$?
    set -e
    [ $rc -ne 137 ] || fail "--$1 $(($2 + 40)) MiB: the run hung (killed after 60 s; SIGTERM does not stop it)"
    [ $rc -eq 2 ] || { cat "$T/err" >&2; fail "--$1 $(($2 + 40)) MiB: exit $rc, expected 2"; }
    grep -q "^kiln: error: not enough memory for this run: it needs about [0-9]* MiB of .*this process's limit (RLIMIT_$(echo $1 | tr a-z A-Z)" "$T/err" ||
        fail "--$1: $(cat "$T/err")"
    [ "$(wc -l <"$T/err")" -eq 1 ] || fail "--$1: more than the error line: $(cat "$T/err")"
    [ ! -e "$T/r-$1" ] || fail "--$1: a run directory was left: $(ls -A "$T/r-$1")"
done

# Validation runs the network too (each model it checks, the first one first): a model checked under a limit just above what it has mapped is
# refused the same way, with no report written.
$KILN export "$T/r0" --out "$T/m" >/dev/null 2>&1 || fail "export"
$KILN golden make --model "$T/m" --data "$T/d.st" --windows 8 >/dev/null 2>&1 || fail "golden make"
KILN_LOG=debug $KILN validate --model "$T/m" --data "$T/d.st" --report "$T/v0.json" >/dev/null 2>"$T/v0.log" ||
    { cat "$T/v0.log" >&2; fail "unlimited validate"; }
vas=$(sed -n 's/.*train: memory: \([0-9]*\) MiB of address space.*/\1/p' "$T/v0.log" | head -n 1)
[ -n "$vas" ] || fail "no memory line in validate's debug log"
set +e
timeout -s KILL 60 prlimit --as=$((($vas + 40) * MIB)) $KILN validate --model "$T/m" --data "$T/d.st" >"$T/out" 2>"$T/err"
rc=$?
set -e
[ $rc -ne 137 ] || fail "validate under --as $(($vas + 40)) MiB hung (killed after 60 s)"
[ $rc -eq 2 ] || { cat "$T/err" >&2; fail "validate under --as: exit $rc, expected 2"; }
grep -q "^kiln: error: not enough memory for checking '$T/m/model.safetensors': it needs about" "$T/err" ||
    fail "validate: $(cat "$T/err")"
[ ! -e "$T/m/validation.json" ] || fail "validate wrote a report"

# Comfortably above the need: trains.
timeout -s KILL 120 prlimit --as=$((($as + $more + 256) * MIB)) $KILN $RUN --run-dir "$T/r-ok" >"$T/out" 2>"$T/err" ||
    { cat "$T/err" >&2; fail "a limit 256 MiB above the need did not train"; }
grep -q "run '$T/r-ok' finished: 2 steps" "$T/out" "$T/err" || fail "not finished: $(cat "$T/err")"
echo "46-train-memory: ok"
