#!/bin/sh
# run.sh - the GPU checks, for a machine with an NVIDIA GPU (a few minutes on an H200; the
# build has 180 s and gpu-check 270 s, so the whole run stays under eight minutes).
#
#   tests/gpu/run.sh            (from the repository root; give it a 480 s timeout)
#   KILN_GPU_PREBUILT=1 BUILD=dir tests/gpu/run.sh   (dir/gpu-check built elsewhere: no make)
#
# Sections: build (make gpu-check), then build/gpu-check: every op and the device network
# against the CPU, the trainer on the GPU against the CPU trainer (50 steps' losses, two runs
# and an interrupted run with the same checkpoint bytes), the runtime on the GPU against the
# CPU runtime (batch, chunked, streams) with streaming latency p50/p99, then throughput and
# MFU. Everything printed also goes to build/gpu/run.log; build/gpu/results.txt holds every
# figure of gpu-check. The summary table comes last.
# Exit: 0 all passed, 1 a check failed, 77 no GPU (nothing checked), 2 setup.
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
if [ "${KILN_GPU_PREBUILT:-}" = 1 ] && [ -x "$BUILD/gpu-check" ]; then
    # A GPU machine without the build dependencies and no network (tests/gpu/bundle.sh
    # carries a gpu-check built elsewhere): no make, whose apt-get would only wait there.
    say "== build: skipped (KILN_GPU_PREBUILT=1), using $BUILD/gpu-check"
    note build prebuilt "$BUILD/gpu-check (built elsewhere, KILN_GPU_PREBUILT=1)"
elif say "== build (make -j$JOBS gpu-check)" &&
    timeout 180 make -j"$JOBS" BUILD="$BUILD" gpu-check >>"$LOG" 2>&1; then
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

say "== ops, network, trainer, runtime, throughput ($BUILD/gpu-check)"
rm -f "$OUT/check.rc"
{ timeout 270 "$BUILD/gpu-check" --out "$OUT/results.txt"; echo $? >"$OUT/check.rc"; } 2>&1 |
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
124) note check FAILED "timed out after 270 s; see $LOG" && fail ;;
*) note check FAILED "exit $rc (crash or setup error); see $LOG" && fail ;;
esac

# The latency and throughput figures, for the summary.
grep -E '^info +(runtime .*: stream latency|bench ).* err ' "$OUT/results.txt" 2>/dev/null |
    sed -e 's/^info  *//' -e 's/ *err nan  *tol nan  */  /' | while IFS= read -r l; do printf '           %s\n' "$l"; done >"$OUT/figures"

say ""
say "== summary"
printf '%s' "$summary" | tee -a "$LOG"
cat "$OUT/figures" 2>/dev/null | tee -a "$LOG"
exit $worst
