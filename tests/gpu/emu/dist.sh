#!/bin/sh
# dist.sh - data parallelism of the CUDA trainer on the emulator (called by emu.sh with its
# build directory): kiln train --device cuda in one process (the gradients of the micro-batches
# folded on the device), on 2 ranks under mpirun (NCCL, here tests/gpu/emu/nccl.cc over MPI;
# small buckets so that the model has several, each queued from the backward pass) and on 1
# rank through NCCL: every checkpoint and every logged value the same. Then a resume on
# another rank count, ranks sharing a GPU, and an NCCL that fails to start.
set -eu
E=$1
KILN=$(pwd)/$E/kiln
T=$(mktemp -d)
trap 'rm -rf "$T"' EXIT
fail() {
    echo "FAIL dist: $*" >&2
    exit 1
}
MPIRUN="mpirun --allow-run-as-root --oversubscribe"
# Under EMU_SAN=1, LeakSanitizer reports what Open MPI itself keeps until exit (its plugins'
# strdup'd names): the ranks run without leak detection (still with every other ASan check);
# the one-process runs, which never start MPI, keep it.
[ -z "${EMU_SAN:-}" ] || MPIRUN="$MPIRUN -x ASAN_OPTIONS=detect_leaks=0"
$KILN data synth --seed 3 --rows 400 --features 4 --outputs 2 --out "$T/d.st" 2>/dev/null || fail synth
S="--device cuda --set d_model=8 --set d_ff=8 --set n_heads=2 --set n_layers=2 --set seq_len=8
   --set attn_window=4 --set batch_size=2 --set accum_steps=4 --set steps=4 --set warmup_steps=1
   --set ckpt_every=2 --set eval_every=2 --set keep=0 --set val_fraction=0.1"
# Two emulated GPUs, one per rank (EMU_DEVICES), and buckets of 512 bytes.
export KILN_TEST_BUCKET_BYTES=512 EMU_DEVICES=2
$KILN train --data "$T/d.st" --run-dir "$T/one" $S 2>"$T/one.log" || { cat "$T/one.log" >&2; fail "one process"; }
$MPIRUN -np 2 -x KILN_TEST_BUCKET_BYTES -x EMU_DEVICES $KILN train --data "$T/d.st" --run-dir "$T/two" $S \
    >"$T/two.out" 2>"$T/two.log" || { cat "$T/two.log" >&2; fail "2 ranks"; }
$MPIRUN -np 1 -x KILN_TEST_BUCKET_BYTES -x EMU_DEVICES $KILN train --data "$T/d.st" --run-dir "$T/nccl1" $S \
    >/dev/null 2>"$T/nccl1.log" || { cat "$T/nccl1.log" >&2; fail "1 rank through NCCL"; }
[ "$(grep -c finished "$T/two.out")" = 1 ] || fail "not exactly one rank reported the end"
dump() {
    sqlite3 "$1/metrics.db" "
      SELECT step, printf('%!.17g %!.17g %!.17g %!.17g %!.17g %!.17g %d %!.17g', loss, mse,
             load_balance, z, lr, grad_norm, applied, max_abs_output),
             printf('%!.17g %!.17g', val_loss, val_r2) FROM steps ORDER BY step;
      SELECT step, name, printf('%!.17g %!.17g', grad_norm, update_ratio) FROM tensors
        ORDER BY step, name;"
}
dump "$T/one" >"$T/one.m"
[ "$(grep -c '' "$T/one.m")" -gt 4 ] || fail "metrics dump too short"
for r in two nccl1; do
    for f in "$T"/one/ckpt/step-*.safetensors; do
        cmp -s "$f" "$T/$r/ckpt/$(basename "$f")" || fail "$r: $(basename "$f") differs from one process"
    done
    dump "$T/$r" >"$T/$r.m"
    cmp -s "$T/one.m" "$T/$r.m" || { diff "$T/one.m" "$T/$r.m" | head >&2; fail "$r: metrics differ"; }
done
[ "$(ls "$T"/one/ckpt/step-*.safetensors | wc -l)" = 2 ] || fail "expected 2 checkpoints"
ev() { sqlite3 "$1/metrics.db" "SELECT message FROM events WHERE kind = '$2'"; }
[ "$(ev "$T/two" start)" = "run started on 2 ranks of cuda" ] || fail "start event: $(ev "$T/two" start)"
ev "$T/two" devices | grep -q '^2 ranks over NCCL: GPU 0, GPU 1$' || fail "devices event: $(ev "$T/two" devices)"
ev "$T/two" buckets | grep -Eq '^[0-9]+ gradient buckets of at most 512 bytes; [1-9][0-9]* queued during the backward pass, 0 after it$' ||
    fail "buckets event: $(ev "$T/two" buckets)"
echo "dist: 1 process, 2 ranks and 1 rank through NCCL: the same checkpoints and metrics"

# 2 ranks resumed in one process, and one process resumed on 2 ranks.
last=ckpt/step-00000004.safetensors
cp -r "$T/two" "$T/two-one" && rm "$T/two-one/$last"
$KILN train --resume "$T/two-one" 2>"$T/r1.log" || { cat "$T/r1.log" >&2; fail "2 ranks resumed on 1"; }
cmp -s "$T/one/$last" "$T/two-one/$last" || fail "2 ranks then 1 process: checkpoint differs"
cp -r "$T/one" "$T/one-two" && rm "$T/one-two/$last"
$MPIRUN -np 2 -x KILN_TEST_BUCKET_BYTES -x EMU_DEVICES $KILN train --resume "$T/one-two" >/dev/null 2>"$T/r2.log" ||
    { cat "$T/r2.log" >&2; fail "1 process resumed on 2 ranks"; }
cmp -s "$T/one/$last" "$T/one-two/$last" || fail "1 process then 2 ranks: checkpoint differs"
ev "$T/one-two" resume | grep -q 'on 2 ranks of cuda' || fail "resume event: $(ev "$T/one-two" resume)"
echo "dist: resumed on the other rank count: the same checkpoint"

# One GPU for 2 local ranks: allowed (local rank modulo the count), and said.
$MPIRUN -np 2 -x KILN_TEST_BUCKET_BYTES -x EMU_DEVICES=1 $KILN train --data "$T/d.st" \
    --run-dir "$T/shared" $S --set steps=2 >/dev/null 2>"$T/shared.log" || { cat "$T/shared.log" >&2; fail "shared GPU"; }
ev "$T/shared" devices | grep -q 'GPU 0, GPU 0; GPUs are shared: .* on 1 rank$' || fail "shared: $(ev "$T/shared" devices)"
grep -q 'GPUs are shared' "$T/shared.log" || fail "shared GPU: no warning"

# NCCL that does not start on rank 1: every rank stops, exit 2, the message names NCCL,
# nothing is written.
set +e
$MPIRUN -np 2 -x EMU_NCCL_FAIL_INIT=1 $KILN train --data "$T/d.st" --run-dir "$T/bad" $S \
    >/dev/null 2>"$T/bad.log"
rc=$?
set -e
[ $rc = 2 ] || { cat "$T/bad.log" >&2; fail "NCCL init failure exited $rc, expected 2"; }
grep -q '^kiln: error: cannot train on device "cuda" on 2 ranks: rank 1: NCCL init rank: ' "$T/bad.log" ||
    { cat "$T/bad.log" >&2; fail "NCCL init failure: unclear message"; }
[ ! -e "$T/bad" ] || fail "NCCL init failure: a run directory was written"
echo "dist: shared GPU reported; NCCL init failure: exit 2, nothing written"
