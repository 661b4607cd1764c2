#!/bin/sh
# kiln export / golden make / validate as a user runs them: train, freeze, make a golden set,
# validate (and pack the verdict); each way a model can go wrong fails with exit 1 and a
# reason naming the check; exports are reproducible and a corrupt checkpoint is refused.
. "$(dirname "$0")/lib.sh"

tiny_run 2

# byte_xor FILE OFFSET MASK: flip bits of one byte in place.
byte_xor() {
    b=$(od -An -tu1 -j "$2" -N1 "$1" | tr -d ' ')
    printf "$(printf '\\%03o' $((b ^ $3)))" | dd of="$1" bs=1 seek="$2" conv=notrunc 2>/dev/null
}
# tensor_at FILE NAME: the file offset of a tensor's first byte.
tensor_at() {
    n=$(od -An -tu8 -N8 "$1" | tr -d ' ')
    off=$(dd if="$1" bs=1 skip=8 count="$n" 2>/dev/null |
          sed -n "s/.*\"$2\":{[^}]*\"data_offsets\":\[\([0-9]*\),.*/\1/p")
    [ -n "$off" ] || fail "no tensor $2 in $1"
    echo $((8 + n + off))
}

# Export: twice the same bytes; the default is the newest checkpoint.
$KILN export "$T/run" --out "$T/m" >"$T/out" || fail "export"
grep -q "step 40, f32" "$T/out" || fail "export output: $(cat "$T/out")"
$KILN export "$T/run" --out "$T/m2" --step 40 >/dev/null || fail "export again"
cmp -s "$T/m/model.safetensors" "$T/m2/model.safetensors" || fail "model bytes differ between exports"
cmp -s "$T/m/card.json" "$T/m2/card.json" || fail "card bytes differ between exports"
grep -q '"run_id": "[0-9a-f]\{32\}"' "$T/m/card.json" || fail "card has no run id"
grep -q '"created": "20[0-9-]*T[0-9:]*Z"' "$T/m/card.json" || fail "card has no creation time"
expect_fail 2 $KILN export "$T/run" --out "$T/m"
grep -q "not empty" "$T/err" || fail "overwrite: $(cat "$T/err")"
expect_fail 2 $KILN export "$T/run" --out "$T/x" --dtype f16

# A corrupt checkpoint is refused; nothing is written.
cp "$T/run/ckpt/step-00000036.safetensors" "$T/keep.st"
size=$(wc -c <"$T/run/ckpt/step-00000036.safetensors")
byte_xor "$T/run/ckpt/step-00000036.safetensors" $((size - 2)) 4
expect_fail 1 $KILN export "$T/run" --out "$T/bad" --step 36
grep -q "step-00000036.safetensors': tensor data digest mismatch" "$T/err" || fail "corrupt: $(cat "$T/err")"
[ ! -e "$T/bad" ] || fail "a refused export left its directory"
ls -a "$T" | grep -q '\.export-' && fail "a refused export left a temporary directory"
cp "$T/keep.st" "$T/run/ckpt/step-00000036.safetensors"

# Golden set and a passing validation; pack reads the verdict.
$KILN golden make --model "$T/m" --data "$T/d.st" --windows 8 >/dev/null || fail "golden make"
[ -f "$T/m/golden/golden.safetensors" ] && [ -f "$T/m/golden/golden.json" ] || fail "golden files"
$KILN validate --model "$T/m" --data "$T/d.st" --make-bf16 >"$T/v.out" 2>"$T/v.err" ||
    { cat "$T/v.out" "$T/v.err" >&2; fail "validate of a fresh model"; }
for c in golden parity_trainer_runtime parity_batch_stream parity_f32_bf16; do
    grep -q "^$c  *passed" "$T/v.out" || fail "$c did not pass: $(cat "$T/v.out")"
done
grep -q '^parity_cpu_cuda  *not run: ' "$T/v.out" || grep -q '^parity_cpu_cuda  *passed' "$T/v.out" ||
    fail "cuda line: $(cat "$T/v.out")"
grep -q '"passed": true' "$T/m/validation.json" || fail "report not passed"
$KILN pack "$T/m" --name demo --version 1.0.0 --out "$T/m.kiln" | grep -q "validation passed" || fail "pack verdict"

# Unknown thresholds are refused.
expect_fail 2 $KILN validate --model "$T/m" --data "$T/d.st" --set parity.rtool=1
grep -q "unknown threshold 'parity.rtool'" "$T/err" || fail "unknown key: $(cat "$T/err")"

# A perturbed weight (a mantissa bit of blocks.0.moe.fc.weight[40]) fails the golden check.
cp -r "$T/m" "$T/p"
byte_xor "$T/p/model.safetensors" $(($(tensor_at "$T/p/model.safetensors" blocks.0.moe.fc.weight) + 162)) 8
expect_fail 1 $KILN validate --model "$T/p" --data "$T/d.st" --report "$T/p.json"
grep -q "kiln: failed: golden (f32 model vs its stored outputs): .* outside tolerance" "$T/err" ||
    fail "perturbed: $(cat "$T/err")"
grep -q '"passed": false' "$T/p.json" || fail "perturbed report passed"

# An altered stored golden output fails it too.
cp -r "$T/m" "$T/g"
byte_xor "$T/g/golden/golden.safetensors" $(($(tensor_at "$T/g/golden/golden.safetensors" outputs) + 2)) 16
expect_fail 1 $KILN validate --model "$T/g" --data "$T/d.st"
grep -q "kiln: failed: golden .* window 0 step 0 output 0" "$T/err" || fail "altered golden: $(cat "$T/err")"

# A baseline better than the candidate (the candidate is step 4 of 40).
$KILN export "$T/run" --step 4 --out "$T/early" >/dev/null || fail "export step 4"
$KILN golden make --model "$T/early" --data "$T/d.st" --windows 4 >/dev/null || fail "golden early"
expect_fail 1 $KILN validate --model "$T/early" --data "$T/d.st" --baseline "$T/m"
grep -q "kiln: failed: baseline_loss: held-out loss .* worse than the baseline" "$T/err" ||
    fail "baseline: $(cat "$T/err")"
$KILN validate --model "$T/m" --data "$T/d.st" --baseline "$T/early" >/dev/null 2>&1 ||
    fail "the better model against the early one"

# A bf16 export off by more than its tolerance (another checkpoint's weights).
$KILN export "$T/run" --step 8 --dtype bf16 --out "$T/b16" >/dev/null || fail "bf16 export"
expect_fail 1 $KILN validate --model "$T/m" --data "$T/d.st" --bf16 "$T/b16"
grep -q "kiln: failed: parity_f32_bf16 " "$T/err" || fail "bf16: $(cat "$T/err")"
$KILN export "$T/run" --dtype bf16 --out "$T/b16ok" >/dev/null || fail "bf16 export"
$KILN validate --model "$T/m" --data "$T/d.st" --bf16 "$T/b16ok" --report "$T/b.json" >/dev/null 2>&1 ||
    fail "the honest bf16 export"
exit 0
