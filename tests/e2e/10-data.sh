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
