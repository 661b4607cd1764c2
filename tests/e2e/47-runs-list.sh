#!/bin/sh
# kiln runs list: a sweep of four tiny runs (lr x n_experts) side by side shows exactly the
# varied keys as columns, in the order of their best validation loss; --sort, --where and
# --json (checked against metrics.db); a run listed while `kiln train` writes it is running,
# the same run killed with SIGKILL is interrupted, a corrupt run.json is an error row and
# exit 1 while the other runs still show.
. "$(dirname "$0")/lib.sh"

$KILN data synth --seed 1 --rows 1500 --features 6 --outputs 1 --out "$T/d.st" 2>/dev/null || fail "synth"
S="--set steps=20 --set eval_every=10 --set d_model=16 --set d_ff=32 --set seq_len=16 --set attn_window=16"
for lr in 0.003 0.01; do
    for e in 2 4; do
        $KILN train --data "$T/d.st" --run-dir "$T/sweep/lr$lr-e$e" $S --set lr=$lr --set n_experts=$e \
            >/dev/null 2>"$T/train.log" || { cat "$T/train.log" >&2; fail "train lr $lr n_experts $e"; }
    done
done
mkdir "$T/sweep/notes" # not a run: skipped without a word

# The table: the shared keys above, a column per varied key and only those.
$KILN runs list "$T/sweep" --width 100 >"$T/list" 2>"$T/err" || { cat "$T/err" >&2; fail "runs list"; }
[ ! -s "$T/err" ] || fail "runs list wrote to stderr: $(cat "$T/err")"
cat "$T/list" >&2
head -1 "$T/list" | grep -q '^same in all 4 runs: steps=20 d_model=16 ' || fail "no line of shared keys"
cols=$(sed -n 2p "$T/list" | tr -s ' ' '\n' | grep -vxE 'name|state|step|loss|val_loss|val_r2|tok/s|updated|nonfin|spikes' | tr '\n' ' ')
[ "$cols" = "lr n_experts " ] || fail "config columns '$cols', expected the varied 'lr n_experts'"
[ "$(wc -l <"$T/list")" -eq 6 ] || fail "expected the shared line, a header and 4 rows"
# (awk counts bytes: the 3 of a '…' count as 1 column)
fits() { sed 's/…/./g' | awk -v w="$1" 'length > w { exit 1 }'; }
fits 100 <"$T/list" || fail "a line is wider than --width 100"
$KILN runs list "$T/sweep" --width 80 | fits 80 || fail "a line is wider than --width 80"
# Every row finished, its lr and n_experts cells those its name was trained with.
tail -n 4 "$T/list" | awk '$2 != "finished" { exit 1 }
    { split($1, a, "-e"); if ("lr" $(NF-1) != a[1] || $NF != a[2]) exit 1 }' ||
    fail "rows do not show their state and varied keys"
# Default order: best validation loss ascending, as metrics.db has it.
for d in "$T"/sweep/lr*; do
    echo "$(sqlite3 "$d/metrics.db" 'SELECT min(val_loss) FROM steps') ${d##*/}"
done | sort -g | awk '{ printf "%s ", $2 }' >"$T/want"
[ "$(tail -n 4 "$T/list" | awk '{ printf "%s ", $1 }')" = "$(cat "$T/want")" ] ||
    fail "order is not by best val_loss: $(cat "$T/want")"

# --sort on a config key, descending (ties by name); --where on two keys, and one key twice.
[ "$($KILN runs list "$T/sweep" --sort -lr | tail -n 4 | awk '{ printf "%s ", $1 }')" = \
    "lr0.01-e2 lr0.01-e4 lr0.003-e2 lr0.003-e4 " ] || fail "--sort -lr"
$KILN runs list "$T/sweep" --where n_experts=4 --where lr=1e-2 >"$T/w" || fail "--where"
[ "$(awk '/^lr/ { print $1 }' "$T/w")" = lr0.01-e4 ] || fail "--where n_experts=4 lr=1e-2: $(cat "$T/w")"
[ "$($KILN runs list "$T/sweep" --where lr=0.003 --where lr=0.01 --where n_experts=2 --sort name |
    awk '/^lr/ { printf "%s ", $1 }')" = "lr0.003-e2 lr0.01-e2 " ] || fail "--where one key twice"
expect_fail 2 $KILN runs list "$T/sweep" --where lrate=1
grep -q "'lrate'" "$T/err" || fail "an unknown --where key is not named"

# --json: every run, the varied keys, each best val_loss equal to metrics.db's.
$KILN runs list "$T/sweep" --json >"$T/l.json" || fail "--json"
q() { sqlite3 :memory: "SELECT $1 FROM json_each(readfile('$T/l.json'), '\$.runs')${2:+ WHERE $2}"; }
[ "$(sqlite3 :memory: "SELECT json_valid(readfile('$T/l.json')), json_extract(readfile('$T/l.json'), '\$.varied')")" = \
    '1|["lr","n_experts"]' ] || fail "--json varied"
[ "$(q 'count(*)' "json_extract(value, '\$.state') = 'finished'")" = 4 ] || fail "--json states"
for d in "$T"/sweep/lr*; do
    n=${d##*/}
    got=$(q "json_extract(value, '\$.val_loss') || ' ' || json_extract(value, '\$.config.lr')" \
        "json_extract(value, '\$.name') = '$n'")
    want=$(sqlite3 "$d/metrics.db" 'SELECT min(val_loss) FROM steps')
    lr=${n#lr} && lr=${lr%-e*}
    echo "$got $want $lr" | awk '{ d = $1 - $3; if (d < 0) d = -d; if (d > 1e-12 * $3 || $2 + 0 != $4 + 0) exit 1 }' ||
        fail "--json $n: val_loss and lr '$got', metrics.db's best $want, lr $lr"
done

# A run being trained: listed while the trainer writes it, then killed.
$KILN train --data "$T/d.st" --run-dir "$T/sweep/live" $S --set steps=1000000 2>/dev/null &
pid=$!
i=0
until [ "$(sqlite3 "$T/sweep/live/metrics.db" 'SELECT count(*) FROM steps' 2>/dev/null)" -ge 3 ] 2>/dev/null; do
    kill -0 $pid 2>/dev/null || fail "the background trainer exited"
    sleep 0.05; i=$((i + 1)); [ $i -lt 400 ] || { kill -9 $pid; fail "the background trainer logged no step"; }
done
$KILN runs list "$T/sweep" --width 120 >"$T/live" || { kill -9 $pid; fail "runs list while training"; }
kill -9 $pid
wait $pid 2>/dev/null || true
cat "$T/live" >&2
grep -q '^live  *running  ' "$T/live" || fail "a run being trained is not shown as running"
sed -n 2p "$T/live" | grep -q ' steps$' || fail "steps now differs and has no column"
$KILN runs list "$T/sweep/live" >"$T/killed" || fail "runs list after the kill"
grep -q 'live  *interrupted  ' "$T/killed" || fail "a killed run is not shown as interrupted: $(cat "$T/killed")"
$KILN runs show "$T/sweep/live" >"$T/show" || fail "runs show after the kill"
grep -q "^progress .*, interrupted (kiln train --resume $T/sweep/live continues it)\$" "$T/show" ||
    fail "runs show does not say the killed run is interrupted: $(grep progress "$T/show")"

# A corrupt run.json: its row says why, the exit status is 1, the others still show.
cp -R "$T/sweep/lr0.003-e2" "$T/sweep/broken"
head -c 200 "$T/sweep/lr0.003-e2/run.json" >"$T/sweep/broken/run.json"
set +e; $KILN runs list "$T/sweep" --width 120 >"$T/bad" 2>"$T/err"; rc=$?; set -e
cat "$T/bad" >&2
[ $rc -eq 1 ] || fail "a broken run exited $rc, not 1"
grep -q "^broken  *error: 'run.json': invalid JSON" "$T/bad" || fail "no error row for the broken run"
[ "$(grep -c '^lr.*finished' "$T/bad")" -eq 4 ] && grep -q '^live .*interrupted' "$T/bad" ||
    fail "the other runs do not all show"
[ "$(grep -c 'kiln: error:' "$T/err")" -eq 1 ] && grep -q "broken/run.json" "$T/err" ||
    fail "stderr does not name the broken run.json: $(cat "$T/err")"
[ "$($KILN runs list "$T/sweep" --json 2>/dev/null | grep -c '"state": "error"')" -eq 1 ] ||
    fail "--json has no error row"
