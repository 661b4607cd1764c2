#!/bin/sh
# kiln registry audit as a platform engineer reads it: every entry oldest first, filtered by
# model, action and time, as JSON Lines (each entry once, the ids rising, as many as the
# database holds, across pages of 1000), refused without an admin token; and --follow as a log
# shipper runs it: new entries as they come, a registry restarted under it said once and read
# on from the last id, nothing missed or printed twice, exit 0 at SIGTERM.
. "$(dirname "$0")/lib.sh"
R=$T/reg
$KILN keygen --out "$T/k" --no-password >/dev/null
printf '{"format":"kiln-trust/1","keys":[{"name":"k","pubkey":"%s","roles":["release","promote"]}],"channels":{"production":{"threshold":1}},"accept_unvalidated":true}\n' \
    "$(sed -n 2p "$T/k.pub")" >"$T/trust.json"
for v in 1.0.0 1.1.0; do signed_archive "$v" "$v" "$T/a-$v.kiln" "$T/k.key"; done
ADM=$($KILN registry token create --root "$R" --name ops --scope admin)
PROM=$($KILN registry token create --root "$R" --name rm --scope promote)
serve_registry "$R" --trust "$T/trust.json"
for v in 1.0.0 1.1.0; do $KILN publish "$T/a-$v.kiln" --registry "$URL" --token "$ADM" >/dev/null; done
P="--key $T/k.key --registry $URL --token $PROM"
$KILN promote demo 1.0.0 --channel production $P >/dev/null
$KILN promote demo 1.1.0 --channel production $P --reason "weekly retrain" >/dev/null
$KILN rollback demo --channel production $P >/dev/null
A="--registry $URL --token $ADM"

# Everything, oldest first: 2 tokens, 2 publishes, 2 promotions, a rollback.
$KILN registry audit $A >"$T/all" 2>"$T/all.err" || fail "audit: $(cat "$T/all.err")"
[ "$(sed -n 1p "$T/all" | tr -s ' ')" = " id time action token what" ] || fail "header: $(sed -n 1p "$T/all")"
[ "$(sed 1d "$T/all" | wc -l)" = 7 ] || fail "7 entries: $(cat "$T/all")"
grep -q "^ *3  [0-9T:Z-]\{20\}  publish  *ops  *demo@1.0.0 sha256:$(sha256sum "$T/a-1.0.0.kiln" | cut -c1-12)$" "$T/all" ||
    fail "publish row: $(cat "$T/all")"
grep -q "^ *6  .*  promote  *rm  *demo/production -> 1.1.0 sha256:[0-9a-f]\{12\} (weekly retrain)$" "$T/all" ||
    fail "the record's reason: $(cat "$T/all")"
grep -q "^ *7  .*  rollback  *rm  *demo/production -> 1.0.0 sha256:[0-9a-f]\{12\}$" "$T/all" || fail "rollback row: $(cat "$T/all")"
grep -q '^7 entries$' "$T/all.err" || fail "count: $(cat "$T/all.err")"
# Filters.
$KILN registry audit $A --action promote,rollback --model demo >"$T/f" 2>"$T/f.err"
[ "$(sed 1d "$T/f" | awk '{print $1 $3}' | tr '\n' ' ')" = "5promote 6promote 7rollback " ] || fail "filtered: $(cat "$T/f")"
$KILN registry audit $A --since 1h --after 5 >"$T/f" 2>"$T/f.err"
[ "$(sed 1d "$T/f" | awk '{print $1}' | tr '\n' ' ')" = "6 7 " ] || fail "--after 5: $(cat "$T/f")"
$KILN registry audit $A --since 2999-01-01T00:00:00Z >"$T/f" 2>"$T/f.err"
[ ! -s "$T/f" ] && grep -q '^0 entries$' "$T/f.err" || fail "--since the future: $(cat "$T/f" "$T/f.err")"
# Refused: no token, a promote token; bad options.
expect_fail 2 $KILN registry audit --registry "$URL"
grep -q "HTTP 401" "$T/err" || fail "no token: $(cat "$T/err")"
expect_fail 2 $KILN registry audit --registry "$URL" --token "$PROM"
grep -q "lacks the 'admin' scope" "$T/err" || fail "promote token: $(cat "$T/err")"
[ ! -s "$T/out" ] || fail "a refused read printed a table: $(cat "$T/out")"
expect_fail 2 $KILN registry audit $A --since yesterday
expect_fail 2 $KILN registry audit $A --interval 1s
expect_fail 2 $KILN registry audit $A --model 'Bad/Name'

# What a registry says is printed as text: a store edited behind the server's back puts
# escape sequences (a terminal title, a bell) into names; the commands print '?' for them.
sqlite3 "$R/registry.db" "UPDATE channel_records SET publisher = 'rm' || char(27) || ']0;pwned' || char(7) WHERE seq = 3;
    UPDATE audit SET token = 'rm' || char(27) || '[2J' || char(155) || 'x' WHERE id = 5;"
$KILN channel history demo --channel production --registry "$URL" >"$T/h" 2>&1 || fail "history: $(cat "$T/h")"
$KILN registry audit $A --after 4 --action promote >"$T/au" 2>&1 || fail "audit: $(cat "$T/au")"
# (exit 1: these few-byte cards are not as kiln writes cards, which provenance flags)
$KILN provenance demo@production --registry "$URL" --trust "$T/trust.json" --state "$T/pst" >"$T/pv" 2>&1 ||
    [ $? = 1 ] || fail "provenance: $(cat "$T/pv")"
for f in h au pv; do
    [ "$(tr -d '\000-\010\013\014\016-\037\177' <"$T/$f" | wc -c)" = "$(wc -c <"$T/$f")" ] ||
        fail "control bytes reached the terminal in $f: $(od -c "$T/$f" | grep -m1 '033')"
done
grep -q 'rm?\]0;pwned?' "$T/h" && grep -q 'rm?\]0;pwned?' "$T/pv" && grep -q 'rm?\[2J?x' "$T/au" ||
    fail "the names as text: $(cat "$T/h" "$T/au" "$T/pv")"

# JSON Lines across pages: 2500 more entries straight into the store (as a busy registry
# would have them); each id once, in order, as many as the database holds.
sqlite3 "$R/registry.db" "WITH RECURSIVE n(i) AS (SELECT 1 UNION ALL SELECT i + 1 FROM n WHERE i < 2500)
    INSERT INTO audit(time, token, action, model) SELECT 1700000000 + i, 'bulk', 'publish', 'bulk' FROM n;"
$KILN registry audit $A --json >"$T/j"
[ "$(wc -l <"$T/j")" = "$(sqlite3 "$R/registry.db" 'SELECT count(*) FROM audit')" ] || fail "json lines: $(wc -l <"$T/j")"
sed 's/.*"id":\([0-9]*\),.*/\1/' "$T/j" >"$T/ids"
seq 1 "$(wc -l <"$T/j")" | cmp -s - "$T/ids" || fail "ids not each once in order"
grep -q '"id":5,.*"token":"rm\\u001B\[2J\\u009Bx"' "$T/j" || fail "json escapes: $(sed -n 5p "$T/j")"
grep -q '^{"action":"rollback","channel":"production","digest":"sha256:[0-9a-f]\{64\}","id":7,"model":"demo","reason":"rollback","time":"[0-9T:Z-]\{20\}","token":"rm","version":"1.0.0"}$' "$T/j" ||
    fail "json rollback entry: $(sed -n 7p "$T/j")"

# --follow: new entries as they come; the registry restarted on its port under the follower.
N=$(wc -l <"$T/j")
$KILN registry audit $A --follow --interval 100ms --after "$N" --json >"$T/fol" 2>"$T/fol.err" &
FOL=$!
$KILN registry token create --root "$R" --name t1 --scope read >/dev/null
w=0; until grep -q '"token":"t1"' "$T/fol"; do w=$((w + 1)); [ $w -lt 100 ] || fail "follow: t1 not seen"; sleep 0.05; done
PORT=${URL##*:}
kill $PID; wait $PID || true
$KILN registry token create --root "$R" --name t2 --scope read >/dev/null
w=0; until grep -q 'polling on' "$T/fol.err"; do w=$((w + 1)); [ $w -lt 100 ] || fail "follow: no warning: $(cat "$T/fol.err")"; sleep 0.05; done
: >"$T/serve.out"
$KILN registry serve --root "$R" --listen 127.0.0.1:"$PORT" --trust "$T/trust.json" >"$T/serve.out" 2>"$T/serve.err" &
PID=$!
serve_url "$T/serve.out" "$T/serve.err"
$KILN registry token create --root "$R" --name t3 --scope read >/dev/null
w=0; until grep -q '"token":"t3"' "$T/fol"; do w=$((w + 1)); [ $w -lt 100 ] || fail "follow: t3 not seen: $(cat "$T/fol.err")"; sleep 0.05; done
kill -TERM $FOL
wait $FOL || fail "follow: exit status at SIGTERM"
[ "$(sed 's/.*"token":"\([^"]*\)".*/\1/' "$T/fol" | tr '\n' ' ')" = "t1 t2 t3 " ] || fail "follow: $(cat "$T/fol")"
[ "$(grep -c 'polling on' "$T/fol.err")" = 1 ] && grep -q "answers again; read on from entry $((N + 2))$" "$T/fol.err" ||
    fail "follow's notes: $(cat "$T/fol.err")"
