#!/bin/sh
# make demo: the whole kiln pipeline on an embedded default, in a fresh temporary
# directory — synthetic data, train, interrupt, resume, inspect the run, run the
# example service. Each step prints what it runs; a failure stops the demo.
set -eu
KILN=${KILN:-build/kiln}
BUILD=$(cd "$(dirname "$KILN")" && pwd)
KILN=$BUILD/kiln
W=${KILN_DEMO_DIR:-$(mktemp -d "${TMPDIR:-/tmp}/kiln-demo-XXXXXX")}
mkdir -p "$W"
cd "$W"
step=0
say() { step=$((step + 1)); printf '\n\033[1m== %d. %s\033[0m\n' "$step" "$*"; }
run() { printf '$ %s\n' "$*"; "$@"; }
export KILN_DEMO=1

say "synthesise a market: 20000 rows, 8 features, 2 forward-return targets"
run "$KILN" data synth --seed 1 --rows 20000 --features 8 --outputs 2 --out market.safetensors
run "$KILN" data inspect market.safetensors

say "train the tiny default config, killed with SIGKILL part way"
"$KILN" train --print-config | head -5; echo "  ..."
printf '$ %s &\n' "kiln train --data market.safetensors --run-dir run1"
"$KILN" train --data market.safetensors --run-dir run1 2>train1.log &
pid=$!
while [ ! -e run1/ckpt/step-00000200.safetensors ] && kill -0 $pid 2>/dev/null; do sleep 0.05; done
sleep 0.3
kill -9 $pid 2>/dev/null || true
wait $pid 2>/dev/null || true
echo "killed; checkpoints on disk: $(ls run1/ckpt | tr '\n' ' ')"

say "resume: continues from the newest checkpoint that verifies"
run "$KILN" train --resume run1 2>&1 | tail -3

say "the run: config, progress, metrics, events"
run "$KILN" runs show run1 --events 5 | grep -v '^  "' | head -30

say "a second run without the interruption is bitwise the same"
"$KILN" train --data market.safetensors --run-dir run1b 2>/dev/null
run "$KILN" runs diff run1 run1b

say "freeze the run into a model directory (weights, card with lineage)"
run "$KILN" export run1 --out v1 --name market-alpha
run cat v1/card.json

say "golden data: the model's outputs on 64 held-out windows, to hold every later build to"
run "$KILN" golden make --model v1 --data market.safetensors --windows 64

say "validate v1: golden regression, trainer vs runtime, batch vs stream, f32 vs bf16"
run "$KILN" validate --model v1 --data market.safetensors --make-bf16

say "a second, longer run, validated against v1 as the production baseline"
"$KILN" train --data market.safetensors --run-dir run2 --set steps=900 --set lr=0.002 2>&1 | tail -1
run "$KILN" export run2 --out v2 --name market-alpha
"$KILN" golden make --model v2 --data market.safetensors --windows 64 >/dev/null
run "$KILN" validate --model v2 --data market.safetensors --baseline v1

say "the example service: 500 ticks of features in, one prediction per tick out"
"$KILN" data export market.safetensors --from 16000 --rows 500 --features-only | tail -n +2 > ticks.csv
printf '$ stream_service v1 < ticks.csv > predictions.csv\n'
"$BUILD/stream_service" v1 < ticks.csv > predictions.csv
echo "$(wc -l < predictions.csv) predictions; the last three:"
tail -3 predictions.csv

echo
echo "demo finished in $W"
