#!/bin/sh
# make soak: the long-running checks, one part after another, SECONDS in all (runtime 45%,
# registry 35%, trainer 20%). Each part prints a line per sample and a summary; the
# summaries, with the machine, the date and the load, go to OUT/report.txt. Exits 1 if any
# part failed (every part runs regardless), 2 on a usage error. docs/soak.md says what each
# part checks and what it found.
#
#   soak.sh SECONDS OUT     ($KILN: kiln; $SOAK_BIN: the drivers' directory; SOAK_SEED: 1;
#                            SOAK_SAN=1: the binaries carry ASan+UBSan, RSS is not judged)
set -u
: "${KILN:?set KILN to the kiln binary}" "${SOAK_BIN:?set SOAK_BIN to the soak drivers}"
[ $# = 2 ] && [ "$1" -ge 30 ] 2>/dev/null || { echo "usage: soak.sh SECONDS(>=30) OUT" >&2; exit 2; }
SECS=$1 OUT=$2
SEED=${SOAK_SEED:-1}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
export KILN SOAK_BIN SOAK_SAN="${SOAK_SAN:-}"
rss_flag=
if [ -n "$SOAK_SAN" ]; then
    export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1
    rss_flag=--no-rss
    export SOAK_TRAIN_STEPS=${SOAK_TRAIN_STEPS:-100}
fi
load() { cut -d' ' -f1-3 /proc/loadavg; }
report=$OUT/report.txt
{
    echo "# kiln soak: $(date -u +%Y-%m-%dT%H:%M:%SZ), $SECS s, seed $SEED$([ -n "$SOAK_SAN" ] && echo ', ASan+UBSan build')"
    echo "# $($KILN --version 2>/dev/null | head -1); tree $(git -C "$here" rev-parse --short HEAD 2>/dev/null || echo unknown)$(git -C "$here" diff --quiet HEAD -- "$(git -C "$here" rev-parse --show-toplevel)" 2>/dev/null || echo ' with uncommitted changes')"
    echo "# machine: $(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1), $(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $(uname -sr)"
    echo "# load average at the start: $(load)"
} >"$report.tmp"

status=0
# part NAME SECONDS CMD...: run it, its output to OUT/NAME.log and the terminal, its summary
# (the indented lines after "== summary") and its first failures to the report.
part() {
    name=$1 secs=$2; shift 2
    echo "== soak: $name ($secs s, load $(load))"
    l0=$(load)
    t0=$(date +%s)
    { "$@"; echo "exit $?"; } 2>&1 | tee "$OUT/$name.log"
    rc=$(tail -1 "$OUT/$name.log" | sed -n 's/^exit //p')
    {
        echo
        echo "## $name: $([ "$rc" = 0 ] && echo PASS || echo "FAIL (exit $rc)"), $(($(date +%s) - t0)) s, load average $l0 at the start, $(load) at the end"
        sed -n '/^== summary/,$p' "$OUT/$name.log" | grep '^  '
        grep '^FAIL' "$OUT/$name.log" | head -5
    } >>"$report.tmp"
    [ "$rc" = 0 ] || status=1
}

rt=$((SECS * 45 / 100)) rg=$((SECS * 35 / 100))
tr=$((SECS - rt - rg))
rm -rf "$OUT/work" && mkdir -p "$OUT/work/runtime"
part runtime $rt "$SOAK_BIN/soak_runtime" "$OUT/work/runtime" $rt $rss_flag
part registry $rg "$here/registry.sh" "$OUT/work/registry" $rg "$SEED"
part trainer $tr "$here/trainer.sh" "$OUT/work/trainer" $tr "$SEED"
echo "# load average at the end: $(load)" >>"$report.tmp"
echo "# result: $([ $status = 0 ] && echo PASS || echo FAIL)" >>"$report.tmp"
mv "$report.tmp" "$report"
[ $status = 0 ] && rm -rf "$OUT/work"
echo
cat "$report"
exit $status
