#!/bin/sh
# kiln data synth | inspect | import, as a user drives them.
. "$(dirname "$0")/lib.sh"

# synth: deterministic, reports the oracle R^2, refuses too few features
$KILN data synth --seed 1 --rows 2000 --features 6 --outputs 2 --out "$T/a.st" 2>"$T/synth.err" || fail "synth"
grep -q 'fwd_ret_1' "$T/synth.err" || fail "synth printed no R^2 table"
grep -q 'oracle' "$T/synth.err" || fail "synth printed no oracle R^2"
$KILN data synth --seed 1 --rows 2000 --features 6 --outputs 2 --out "$T/b.st" 2>/dev/null || fail "synth again"
cmp -s "$T/a.st" "$T/b.st" || fail "same seed gave different bytes"
$KILN data synth --seed 2 --rows 2000 --features 6 --outputs 2 --out "$T/c.st" 2>/dev/null || fail "synth seed 2"
cmp -s "$T/a.st" "$T/c.st" && fail "different seeds gave the same bytes"
expect_fail 2 $KILN data synth --seed 1 --rows 2000 --features 3 --outputs 1 --out "$T/d.st"
grep -q 'features' "$T/err" || fail "small F: message does not say features"
[ ! -e "$T/d.st" ] || fail "refused synth wrote a file"

# inspect: table and JSON agree on the digest
$KILN data inspect "$T/a.st" >"$T/table" || fail "inspect"
sum=$(sha256sum "$T/a.st" | cut -d' ' -f1)
grep -q "sha256 *$sum" "$T/table" || fail "inspect sha256 differs from sha256sum"
grep -q '^rows *2000$' "$T/table" || fail "inspect rows"
grep -q 'feature *flow' "$T/table" || fail "inspect column names"
grep -q 'target *fwd_ret_2' "$T/table" || fail "inspect target names"
$KILN data inspect --json "$T/a.st" >"$T/j" || fail "inspect --json"
grep -q "\"sha256\": \"$sum\"" "$T/j" || fail "inspect --json sha256"
grep -q '"rows": 2000' "$T/j" || fail "inspect --json rows"
expect_fail 2 $KILN data inspect "$T/missing.st"
grep -q 'missing.st' "$T/err" || fail "inspect of a missing file does not name it"

# import: a good CSV, then one with a bad line that must not replace the good output
printf 'time,open,flow,ret_fwd\n1,100.5,0.25,0.01\n2,101,-0.5,-0.02\n3,100.75,0.1,0.005\n' >"$T/good.csv"
$KILN data import --csv "$T/good.csv" --features open,flow --targets ret_fwd --out "$T/imp.st" 2>/dev/null ||
    fail "import"
$KILN data inspect "$T/imp.st" >"$T/table" || fail "inspect imported"
grep -q '^rows *3$' "$T/table" || fail "imported rows"
grep -q 'feature *open' "$T/table" || fail "imported names"
cp "$T/imp.st" "$T/imp.orig"
printf 'time,open,flow,ret_fwd\n1,100.5,0.25,0.01\n2,101,-0.5\n3,100.75,0.1,0.005\n' >"$T/bad.csv"
expect_fail 2 $KILN data import --csv "$T/bad.csv" --features open,flow --targets ret_fwd --out "$T/imp.st"
grep -q 'bad.csv' "$T/err" || fail "import error does not name the file"
grep -q 'line 3' "$T/err" || fail "import error does not name the line"
cmp -s "$T/imp.st" "$T/imp.orig" || fail "failed import changed the existing output"
printf 'a,b\n1,x\n' >"$T/nan.csv"
expect_fail 2 $KILN data import --csv "$T/nan.csv" --features a --targets b --out "$T/n.st"
grep -q "line 2, column 'b'" "$T/err" || fail "non-number: no line and column"
expect_fail 2 $KILN data import --csv "$T/good.csv" --features open,nope --targets ret_fwd --out "$T/n.st"
grep -q "no column 'nope'" "$T/err" || fail "missing column not named"
[ ! -e "$T/n.st" ] || fail "failed import wrote a file"

# export's header is RFC 4180 and never a spreadsheet formula; what it writes imports back
# (issue 29): a quote and a line break in names, a name that begins with '='.
printf '"say ""hi""","two\nlines",=cmd,y\n1,2,3,4\n3.40282347e+38,-3.40282347e+38,0,1\n' >"$T/names.csv"
nl='
'
$KILN data import --csv "$T/names.csv" --features "say \"hi\",two${nl}lines,=cmd" --targets y \
    --out "$T/names.st" 2>/dev/null || fail "import of quoted names"
$KILN data export "$T/names.st" >"$T/names.out" || fail "export of quoted names"
printf '"say ""hi""","two\nlines",'"'"'=cmd,y\n' >"$T/names.want"
head -3 "$T/names.out" | head -c "$(wc -c <"$T/names.want")" | cmp -s - "$T/names.want" ||
    fail "export header: $(head -2 "$T/names.out")"
grep -q '^3.40282347e+38,-3.40282347e+38,0,1$' "$T/names.out" || fail "export of FLT_MAX: $(tail -1 "$T/names.out")"
$KILN data import --csv "$T/names.out" --features "say \"hi\",two${nl}lines,'=cmd" --targets y \
    --out "$T/names2.st" 2>/dev/null || fail "what export wrote (FLT_MAX included) does not import"
$KILN data export "$T/names2.st" >"$T/names2.out" || fail "export again"
cmp -s "$T/names.out" "$T/names2.out" || fail "export, import, export changed the file"

# import refuses: a group name not UTF-8, a --time or --group column twice, epoch seconds
# outside the years 0000-9999; each naming the line, none writing the output
printf 'g,a,y\nSPX,1,2\nCAC\351,3,4\n' >"$T/latin1.csv"
expect_fail 2 $KILN data import --csv "$T/latin1.csv" --features a --targets y --group g --out "$T/u.st"
grep -q "line 3, column 'g': the group name is not valid UTF-8" "$T/err" || fail "latin-1 group: $(cat "$T/err")"
printf 't,a,t,y\n1,1,2,2\n' >"$T/twot.csv"
expect_fail 2 $KILN data import --csv "$T/twot.csv" --features a --targets y --time t --out "$T/u.st"
grep -q "column 't' appears twice" "$T/err" || fail "two time columns: $(cat "$T/err")"
printf 'g,a,g,y\nA,1,B,2\n' >"$T/twog.csv"
expect_fail 2 $KILN data import --csv "$T/twog.csv" --features a --targets y --group g --out "$T/u.st"
grep -q "column 'g' appears twice" "$T/err" || fail "two group columns: $(cat "$T/err")"
printf 't,a,y\n-9223372036854775808,1,2\n9223372036854775807,3,4\n' >"$T/ext.csv"
expect_fail 2 $KILN data import --csv "$T/ext.csv" --features a --targets y --time t --out "$T/u.st"
grep -q "line 2, column 't'.*years 0000 to 9999" "$T/err" || fail "int64 epoch: $(cat "$T/err")"
[ ! -e "$T/u.st" ] || fail "a refused import wrote its output"
printf 't,a,y\n0000-01-01,1,2\n9999-12-31T23:59:59Z,3,4\n' >"$T/span.csv"
$KILN data import --csv "$T/span.csv" --features a --targets y --time t --out "$T/span.st" 2>/dev/null ||
    fail "the years 0000 and 9999"
$KILN data inspect "$T/span.st" >"$T/table" || fail "inspect of the span"
grep -q '0000-01-01' "$T/table" && grep -q '9999-12-31T23:59:59Z' "$T/table" || fail "span: $(cat "$T/table")"
grep -q -- '-[0-9]*[dhms]\b' "$T/table" && fail "a negative step: $(cat "$T/table")"

# A FIFO or a device as the CSV or the dataset: refused at once, naming it (no hang)
mkfifo "$T/in.fifo"
expect_fail 2 timeout 10 $KILN data import --csv "$T/in.fifo" --features a --targets y --out "$T/u.st"
grep -q "in.fifo': not a regular file (a FIFO)" "$T/err" || fail "FIFO csv: $(cat "$T/err")"
expect_fail 2 timeout 10 $KILN data inspect /dev/zero
grep -q "'/dev/zero': not a regular file (a character device)" "$T/err" || fail "/dev/zero: $(cat "$T/err")"

# ---- inspect's gaps (issue 30): a gap is a step clearly longer than the usual one --------
# Every step of a regular series was listed as a gap. Series of each kind, each as a CSV with
# a time column: none, then the same with rows taken out, which must be listed and no more.
/usr/bin/python3 - "$T" <<'EOF' || fail "writing the gap series"
import random, sys
from datetime import datetime, timedelta, timezone
out = sys.argv[1]
t0 = datetime(2020, 1, 1, tzinfo=timezone.utc)
def write(name, times, drop=()):
    with open(f"{out}/{name}.csv", "w") as f:
        f.write("time,a,y\n")
        for i, t in enumerate(times):
            if t not in drop:
                f.write(f"{t.strftime('%Y-%m-%dT%H:%M:%SZ')},{i % 7},{i % 5}\n")
days = [t0 + timedelta(days=i) for i in range(400)]
write("daily", days)
write("daily-hole", days, {days[69]})                      # 2020-03-10 missing
bdays = [d for d in days if d.weekday() < 5]
write("bdaily", bdays)
write("bdaily-hole", bdays, set(bdays[100:105]))           # a week missing
write("bdaily-midweek", bdays, {bdays[55]})                # 2020-03-18, a Wednesday
hours = [t0 + timedelta(hours=i) for i in range(2000)]
write("hourly", hours)
write("hourly-hole", hours, {hours[500]})
r, t, irr = random.Random(1), t0, []
for i in range(2000):
    irr.append(t)
    t += timedelta(seconds=r.randint(60, 600))
write("irregular", irr)
write("irregular-hole", irr[:1000] + [x + timedelta(hours=2) for x in irr[1000:]])
EOF
for s in daily bdaily hourly irregular; do
    for v in $s $s-hole; do
        $KILN data import --csv "$T/$v.csv" --features a --targets y --time time --out "$T/$v.st" 2>/dev/null ||
            fail "import $v"
        $KILN data inspect "$T/$v.st" >"$T/$v.ins" || fail "inspect $v"
    done
    grep -q '^gaps      none (\(a gap is a step over 5/4 of the usual \|business-daily\)' "$T/$s.ins" ||
        fail "$s: steps listed as gaps: $(cat "$T/$s.ins")"
    [ "$(grep -c ' to .*(.*row [0-9]*)$' "$T/$s-hole.ins")" = 1 ] || fail "$s-hole: not one gap: $(cat "$T/$s-hole.ins")"
    grep -q '^          1 in all (' "$T/$s-hole.ins" || fail "$s-hole: count: $(cat "$T/$s-hole.ins")"
done
grep -q 'median step 1d$' "$T/daily.ins" || fail "daily median: $(cat "$T/daily.ins")"
grep -q '^gaps      2020-03-09 to 2020-03-11 (2d, row 69)$' "$T/daily-hole.ins" || fail "daily hole: $(cat "$T/daily-hole.ins")"
grep -q '^gaps      none (business-daily, no row on a weekend: a gap is a step that skips a weekday)$' "$T/bdaily.ins" ||
    fail "bdaily: $(cat "$T/bdaily.ins")"
# a midweek holiday (2d) is shorter than every weekend: only counting weekdays sees it
$KILN data import --csv "$T/bdaily-midweek.csv" --features a --targets y --time time --out "$T/bdm.st" 2>/dev/null ||
    fail "import bdaily-midweek"
$KILN data inspect "$T/bdm.st" >"$T/bdm.ins" || fail "inspect bdaily-midweek"
grep -q '^gaps      2020-03-17 to 2020-03-19 (2d, row 55)$' "$T/bdm.ins" && grep -q '^          1 in all (business-daily' "$T/bdm.ins" ||
    fail "bdaily midweek: $(cat "$T/bdm.ins")"
grep -q '^gaps      2020-05-19 to 2020-05-27 (8d, row 100)$' "$T/bdaily-hole.ins" || fail "bdaily hole: $(cat "$T/bdaily-hole.ins")"
grep -q '^gaps      2020-01-21T19:00:00Z to 2020-01-21T21:00:00Z (2h, row 500)$' "$T/hourly-hole.ins" ||
    fail "hourly hole: $(cat "$T/hourly-hole.ins")"
grep -q '^gaps      .* row 1000)$' "$T/irregular-hole.ins" || fail "irregular hole: $(cat "$T/irregular-hole.ins")"
$KILN data inspect --json "$T/bdaily.st" >"$T/bd.json" || fail "inspect --json"
grep -q '"gaps_total": 0' "$T/bd.json" && grep -q '"usual_step_seconds": 259200' "$T/bd.json" &&
    grep -q '"gap_rule": "weekdays"' "$T/bd.json" || fail "json: $(cat "$T/bd.json")"
