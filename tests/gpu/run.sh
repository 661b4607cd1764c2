#!/bin/sh
# run.sh - the GPU checks, for a machine with an NVIDIA GPU (about two minutes on an H200;
# every section has a time limit so the whole run stays under eight minutes).
#
#   tests/gpu/run.sh            (from the repository root)
#
# Sections: build (make gpu-check), ops + network + throughput (build/gpu-check), then the
# CUDA trainer and runtime checks (tests/gpu/trainer.sh, tests/gpu/runtime.sh) when they
# exist; a section that does not exist yet is reported as "not built". Everything printed
# also goes to build/gpu/run.log; build/gpu/results.txt holds every figure of gpu-check.
# Exit: 0 all ran sections passed, 1 a check failed, 77 no GPU (nothing checked), 2 setup.
set -u
cd "$(dirname "$0")/../.." || exit 2
BUILD=${BUILD:-build}
OUT=$BUILD/gpu
mkdir -p "$OUT" || exit 2
LOG=$OUT/run.log
: >"$LOG"
say() { printf '%s\n' "$*" | tee -a "$LOG"; }

summary=""
worst=0
note() { summary="$summary$(printf '%-10s %-12s %s' "$1" "$2" "$3")
"; }
fail() { worst=1; }

JOBS=$(nproc 2>/dev/null || echo 2)
say "== build (make -j$JOBS gpu-check)"
if timeout 300 make -j"$JOBS" BUILD="$BUILD" gpu-check >>"$LOG" 2>&1; then
    note build ok "$BUILD/gpu-check"
elif [ -x "$BUILD/gpu-check" ]; then
    # A machine without the build dependencies (and no network for apt) can still run a
    # gpu-check built elsewhere and carried in $BUILD.
    say "build failed here; running the $BUILD/gpu-check that is already there"
    note build prebuilt "make failed; used the existing $BUILD/gpu-check"
else
    say "build failed; the last lines of $LOG:"
    tail -n 30 "$LOG"
    note build FAILED "see $LOG"
    printf '\n%s' "$summary"
    exit 2
fi

say "== ops, network, throughput ($BUILD/gpu-check)"
rm -f "$OUT/check.rc"
{ timeout 420 "$BUILD/gpu-check" --out "$OUT/results.txt"; echo $? >"$OUT/check.rc"; } 2>&1 |
    tee -a "$LOG"
rc=$(cat "$OUT/check.rc" 2>/dev/null || echo 2)
line=$(grep '^gpu-check: [0-9]* passed' "$LOG" | tail -n 1 | cut -d' ' -f2-)
case $rc in
0) note check ok "$line" ;;
77)
    note check skipped "no GPU visible (exit 77): nothing was checked"
    printf '\n%s' "$summary"
    exit 77
    ;;
1) note check FAILED "$line" && fail ;;
124) note check FAILED "timed out after 420 s; see $LOG" && fail ;;
*) note check FAILED "exit $rc (crash or setup error); see $LOG" && fail ;;
esac

for section in trainer runtime; do
    script=tests/gpu/$section.sh
    if [ ! -f "$script" ]; then
        note "$section" "not built" "no $script yet"
        continue
    fi
    say "== $section ($script)"
    if timeout 240 sh "$script" 2>&1 | tee -a "$LOG" | tail -n 1 | grep -q '^ok'; then
        note "$section" ok "$script"
    else
        note "$section" FAILED "$script did not end with 'ok'; see $LOG"
        fail
    fi
done

say ""
say "== summary"
printf '%s' "$summary" | tee -a "$LOG"
exit $worst
