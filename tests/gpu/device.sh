#!/bin/sh
# device.sh - one lease's worth of GPU checks on a bare machine (no build dependencies, no
# network), from the repository root, with .gpu-bundle/ carried (tests/gpu/bundle.sh):
# tests/gpu/run.sh on the carried gpu-check, then the command line on the GPU: train on
# cuda (f32 and bf16) and on cpu, resume a cuda run on cpu, export, golden, validate (its
# CPU-vs-CUDA parity runs), and infer on the GPU against the CPU. Copies the logs to $OUT.
set -u
B=$(pwd)/.gpu-bundle
O=${OUT:-/tmp/kiln-gpu-out}
mkdir -p "$O" /tmp/kiln-lib
tar -C /tmp/kiln-lib -xzf "$B/lib.tgz" || exit 2
# cuBLAS and NCCL are opened on first use, from LD_LIBRARY_PATH: CUDA's folder, and for NCCL
# the copy python3's packages carry (nvidia/nccl/lib on the lent machines) else any other.
# Without one, gpu-check skips its NCCL rows and says why.
found=$(find -H /usr/local/cuda/lib64 /usr/lib /opt /usr/local/lib -name 'libnccl.so.2' 2>/dev/null)
nccl=$(printf '%s\n' "$found" | grep -m 1 'nvidia/nccl/lib' || printf '%s\n' "$found" | head -n 1)
BIN=$B/bin
[ -n "$nccl" ] || echo "no libnccl.so.2 on this machine: the NCCL rows will be skipped" | tee "$O/nccl.txt"
export LD_LIBRARY_PATH=/tmp/kiln-lib/lib:/usr/local/cuda/lib64${nccl:+:$(dirname "$nccl")}${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv | tee "$O/gpu.txt"
date -u | tee -a "$O/gpu.txt"
missing=$(ldd "$BIN"/* | grep 'not found' | sort -u)
[ -z "$missing" ] || { echo "missing libraries: $missing"; exit 2; }

W=/tmp/kiln-gpu-build
rm -rf "$W" && mkdir -p "$W" && cp "$BIN/gpu-check" "$W/"
KILN_VECTORS=$B/vectors KILN_GPU_PREBUILT=1 BUILD=$W timeout 330 sh tests/gpu/run.sh
rc_check=$?
cp "$W/gpu/run.log" "$W/gpu/results.txt" "$O/" 2>/dev/null

K=$BIN/kiln
T=/tmp/kiln-cli
rm -rf "$T" && mkdir -p "$T"
cli() {
    echo "\$ kiln $*"
    t0=$(date +%s.%N)
    "$K" "$@"
    r=$?
    echo "  (exit $r, $(awk "BEGIN{printf \"%.1f\", $(date +%s.%N) - $t0}") s)"
}
{
    cli data synth --seed 1 --rows 20000 --features 8 --outputs 2 --out $T/m.st
    cli train --data $T/m.st --run-dir $T/cpu
    cli train --data $T/m.st --run-dir $T/cuda --device cuda
    cli train --data $T/m.st --run-dir $T/bf16 --device cuda --set precision=bf16
    cli train --data $T/m.st --run-dir $T/half --device cuda --set steps=300
    cli train --resume $T/half --device cpu --set steps=600
    cli runs diff $T/cpu $T/cuda
    cli runs diff $T/cuda $T/half
    cli runs show --events 5 $T/bf16
    cli export $T/cuda --out $T/model
    cli golden make --model $T/model --data $T/m.st --windows 16
    cli validate --model $T/model --data $T/m.st --make-bf16
    cli infer --model $T/model --input $T/m.st --out $T/y-cpu.st
    cli infer --model $T/model --input $T/m.st --out $T/y-cuda.st --device cuda
    cli infer --model $T/model --input $T/m.st --out $T/y-cuda-s.st --device cuda --stream
} >"$O/cli.log" 2>&1
cp $T/model/validation.json "$O/" 2>/dev/null
# The GPU's outputs against the CPU's, with the image's python3 (numpy, safetensors).
python3 - "$T" >>"$O/cli.log" 2>&1 <<'PY' || echo "python3 comparison failed" >>"$O/cli.log"
import sys
from safetensors.numpy import load_file
t = sys.argv[1]
c = load_file(t + "/y-cpu.st")["outputs"]
for f in ("y-cuda.st", "y-cuda-s.st"):
    g = load_file(t + "/" + f)["outputs"]
    err = abs(g - c).max() / abs(c).max()
    print(f"infer {f} vs cpu: {g.shape} max |gpu - cpu| / max |cpu| = {err:.3g}")
PY
grep -v '^kiln: step' "$O/cli.log" | tail -n 90
exit $rc_check
