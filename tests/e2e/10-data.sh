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
