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

echo
echo "demo finished in $W"
