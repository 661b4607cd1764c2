#!/bin/sh
# kiln infer: a dataset made from the vectors' first input sequence, run batch and
# stream, must give the vectors' outputs; bad models and inputs fail cleanly.
. "$(dirname "$0")/lib.sh"
V=${KILN_VECTORS:-$(cd "$(dirname "$0")/.." && pwd)/vectors}
[ -f "$V/tsmoe-moe.io.safetensors" ] || fail "no vectors in $V (set KILN_VECTORS)"

# Safetensors by hand, with od and dd: the header's length, a tensor's byte range.
hlen() { od -An -tu8 -N8 "$1" | tr -d ' '; }
header() { dd if="$1" bs=1 skip=8 count="$(hlen "$1")" 2>/dev/null | tr -d ' '; echo; }
range() { # FILE TENSOR -> "begin end", absolute
    header "$1" | sed -n "s/.*\"$2\":{[^}]*\"data_offsets\":\[\([0-9]*\),\([0-9]*\)\].*/\1 \2/p" |
        { read -r a b; echo $((a + 8 + $(hlen "$1"))) $((b + 8 + $(hlen "$1"))); }
}
floats() { # FILE BEGIN COUNT -> one float per line
    od -An -v -tf4 -j "$2" -N $(($3 * 4)) "$1" | tr -s ' ' '\n' | sed '/^$/d'
}
u64le() { n=$1; i=0; while [ $i -lt 8 ]; do printf "\\$(printf %03o $((n % 256)))"; n=$((n / 256)); i=$((i + 1)); done; }
# dataset OUT SRC BEGIN ROWS COLS: `features` [ROWS,COLS] copied from SRC's bytes at BEGIN.
dataset() {
    h="{\"features\":{\"dtype\":\"F32\",\"shape\":[$4,$5],\"data_offsets\":[0,$(($4 * $5 * 4))]}}"
    while [ $((${#h} % 8)) -ne 0 ]; do h="$h "; done
    { u64le ${#h}; printf '%s' "$h"; dd if="$2" bs=1 skip="$3" count=$(($4 * $5 * 4)) 2>/dev/null; } >"$1"
}
# close A B: two float lists agree within 1e-5 of max(|b|, rms(b)), and have the same length.
close() {
    paste "$1" "$2" | awk '{ a[NR] = $1; b[NR] = $2; if ($1 == "" || $2 == "") bad = 1; s += $2 * $2 }
        END { if (bad || NR == 0) exit 1; r = sqrt(s / NR); w = 0
              for (i = 1; i <= NR; i++) { d = a[i] - b[i]; if (d < 0) d = -d; m = b[i] < 0 ? -b[i] : b[i]
                  if (m < r) m = r; if (d / m > w) w = d / m }
              printf "max relative error %g over %d values\n", w, NR; exit !(w < 1e-5) }'
}

for v in moe dense; do
    io=$V/tsmoe-$v.io.safetensors
    mkdir -p "$T/$v"
    cp "$V/tsmoe-$v.model.safetensors" "$T/$v/model.safetensors"
    shape=$(header "$io" | sed -n 's/.*"inputs":{[^}]*"shape":\[\([0-9]*\),\([0-9]*\),\([0-9]*\)\].*/\2 \3/p')
    S=${shape% *} F=${shape#* }
    O=$(header "$io" | sed -n 's/.*"outputs":{[^}]*"shape":\[[0-9]*,[0-9]*,\([0-9]*\)\].*/\1/p')
    set -- $(range "$io" inputs)
    dataset "$T/$v.data" "$io" "$1" "$S" "$F"
    set -- $(range "$io" outputs)
    floats "$io" "$1" $((S * O)) >"$T/$v.want"

    $KILN infer --model "$T/$v" --input "$T/$v.data" --out "$T/$v.batch" >"$T/out" || fail "infer $v"
    grep -q "$S rows (batch, cpu)" "$T/out" || fail "infer $v summary: $(cat "$T/out")"
    $KILN infer --model "$T/$v/model.safetensors" --input "$T/$v.data" --out "$T/$v.stream" --stream >/dev/null ||
        fail "infer --stream $v"
    for mode in batch stream; do
        set -- $(range "$T/$v.$mode" outputs)
        [ $(($2 - $1)) -eq $((S * O * 4)) ] || fail "$v $mode: outputs hold $(($2 - $1)) bytes"
        floats "$T/$v.$mode" "$1" $((S * O)) >"$T/$v.$mode.got"
        close "$T/$v.$mode.got" "$T/$v.want" || fail "$v $mode outputs differ from the vectors"
    done
    close "$T/$v.stream.got" "$T/$v.batch.got" || fail "$v: stream and batch differ"

    # --device: a name that is no device is refused; cuda without a GPU (or without CUDA in
    # the build) fails before anything is written, and an existing output stays as it was.
    cp "$T/$v.batch" "$T/$v.keep"
    expect_fail 2 $KILN infer --model "$T/$v" --input "$T/$v.data" --out "$T/$v.batch" --device gpu
    grep -q 'device must be cpu, cuda or cuda:N, not "gpu"' "$T/err" || fail "bad --device not named"
    set +e
    $KILN infer --model "$T/$v" --input "$T/$v.data" --out "$T/$v.batch" --device cuda:7 >"$T/out" 2>"$T/err"
    rc=$?
    set -e
    if [ $rc -eq 0 ]; then
        echo "a GPU 7 is present: --device cuda:7 ran" >&2
    else
        grep -Eq 'kiln: error: .*(CUDA|cuda|GPU)' "$T/err" || fail "--device cuda:7: unclear error: $(cat "$T/err")"
        cmp -s "$T/$v.keep" "$T/$v.batch" || fail "a failed --device cuda:7 changed the output file"
    fi

    # The example service, beside the kiln binary: CSV ticks in, CSV predictions out.
    svc=$(dirname "$KILN")/stream_service
    [ -x "$svc" ] || fail "no $svc (make builds it)"
    set -- $(range "$io" inputs)
    floats "$io" "$1" $((S * F)) | awk -v F="$F" '{ printf "%s%s", $1, NR % F ? "," : "\n" }' >"$T/$v.csv"
    "$svc" "$T/$v" <"$T/$v.csv" >"$T/$v.pred" 2>"$T/$v.lat" || fail "stream_service $v: $(cat "$T/$v.lat")"
    grep -q "ticks $S  push latency (us): p50 .* p99 .* max " "$T/$v.lat" || fail "latency line: $(cat "$T/$v.lat")"
    tr ',' '\n' <"$T/$v.pred" >"$T/$v.pred.got"
    close "$T/$v.pred.got" "$T/$v.want" || fail "stream_service $v predictions differ from the vectors"
    # Two instruments in one push_many a line: each gets what it gets alone, to the digit.
    tac "$T/$v.csv" >"$T/$v.rev.csv"
    "$svc" "$T/$v" <"$T/$v.rev.csv" >"$T/$v.rev.pred" 2>/dev/null || fail "stream_service $v (reversed)"
    paste -d, "$T/$v.csv" "$T/$v.rev.csv" >"$T/$v.two.csv"
    "$svc" "$T/$v" 2 <"$T/$v.two.csv" >"$T/$v.two.pred" 2>"$T/$v.lat" || fail "stream_service $v 2: $(cat "$T/$v.lat")"
    paste -d, "$T/$v.pred" "$T/$v.rev.pred" | cmp -s - "$T/$v.two.pred" ||
        fail "stream_service $v with 2 instruments differs from one at a time"
done

# Failures: exit 2, a message naming what is wrong, the output file untouched.
echo keep >"$T/keep"
expect_fail 2 $KILN infer --input "$T/moe.data" --out "$T/keep"
expect_fail 2 $KILN infer --model "$T/nowhere" --input "$T/moe.data" --out "$T/keep"
grep -q "nowhere/model.safetensors\|nowhere" "$T/err" || fail "missing model not named: $(cat "$T/err")"
expect_fail 2 $KILN infer --model "$T/dense" --input "$T/moe.data" --out "$T/keep"
grep -q "'features' must be \[N,4\] (the model's n_features), not 2-D with 3 columns" "$T/err" || fail "wrong width not explained: $(cat "$T/err")"
expect_fail 2 $KILN infer --model "$T/moe" --input "$V/tsmoe-moe.io.safetensors" --out "$T/keep"
grep -q "tensor 'features' is missing" "$T/err" || fail "missing features not named: $(cat "$T/err")"
printf 'not a model' >"$T/bad.safetensors"
expect_fail 2 $KILN infer --model "$T/bad.safetensors" --input "$T/moe.data" --out "$T/keep"
grep -q "bad.safetensors" "$T/err" || fail "bad model file not named: $(cat "$T/err")"
[ "$(cat "$T/keep")" = keep ] || fail "a failed infer changed the output file"
# --out replaces an earlier outputs file only: never the dataset read, nor another file.
cp "$T/moe.data" "$T/moe.data.bak"
expect_fail 2 $KILN infer --model "$T/moe" --input "$T/moe.data" --out "$T/moe.data"
grep -q "moe.data' exists and is not an outputs file" "$T/err" || fail "infer --out over its input: $(cat "$T/err")"
cmp -s "$T/moe.data" "$T/moe.data.bak" || fail "infer --out overwrote its input"
expect_fail 2 $KILN infer --model "$T/moe" --input "$T/moe.data" --out "$T/keep"
[ "$(cat "$T/keep")" = keep ] || fail "infer --out overwrote another file"
$KILN infer --model "$T/moe" --input "$T/moe.data" --out "$T/moe.batch" >/dev/null || fail "infer over its own earlier output"
$KILN infer --help | grep -q -- '--stream' || fail "help"
