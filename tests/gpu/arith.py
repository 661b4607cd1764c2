#!/usr/bin/python3
"""arith.py - the training step's arithmetic at gpu-check's throughput benchmark shapes.

For each op of one forward + backward (train/model_cuda.c, as built today, and the optimizer
step of train/trainer_cuda.c): FLOPs and bytes moved to and from HBM, and its lower bound on an
H200: max(FLOPs / peak, bytes / 4.8 TB/s). The peak is the one the op can use: 989 TFLOP/s
for bf16 tensor-core GEMMs, 67 TFLOP/s for f32 on CUDA cores (the attention kernels, f32
GEMMs: the context sets default math, no TF32). The sum of the bounds is the step's floor
and the best MFU the step could reach as built; the "design" column is the same sum with
activations in bf16 (half the elementwise bytes) and attention on tensor cores.

Bytes count what each kernel reads and writes in HBM at least once (re-reads that the
kernel's tiling keeps in L1/L2 are not counted), including the conversions to bf16 before
each GEMM, the bias fill, beta=1 reads of C, and the zeroing of every gradient buffer.
It is a floor, not a prediction: a kernel at 60-80% of the bound is doing well.

    /usr/bin/python3 tests/gpu/arith.py            # every config
    /usr/bin/python3 tests/gpu/arith.py moe-bf16   # one
"""
import sys

HBM = 4.8e12  # bytes/s, H200
BF16 = 989e12  # dense bf16 tensor cores, FLOP/s
F32 = 67e12  # f32 on CUDA cores
GIB = 1024**3


class Cfg:
    def __init__(self, name, D, L, H, Fh, E, K, S, W, B, prec, F=16, O=4):
        self.__dict__.update(locals())
        del self.__dict__["self"]


# gpu-check's run_bench(): F=16 features, O=4 outputs.
CONFIGS = [
    Cfg("moe-bf16", 1024, 8, 16, 2048, 8, 2, 512, 128, 64, "bf16"),
    Cfg("moe-f32", 1024, 8, 16, 2048, 8, 2, 512, 128, 64, "f32"),
    Cfg("dense-bf16", 1024, 8, 16, 4096, 0, 0, 512, 128, 64, "bf16"),
    Cfg("dense2048-bf16", 2048, 16, 16, 8192, 0, 0, 512, 128, 32, "bf16"),
    Cfg("moe32-bf16", 1536, 12, 12, 3072, 32, 2, 512, 128, 32, "bf16"),
]


def mean_window(S, W):
    return sum(min(i + 1, W) for i in range(S)) / S


def issued_keys(S, W):
    """Keys per query the tiled attention multiplies (64-query tiles, 64-key chunks)."""
    tot = 0
    for q0 in range(0, S, 64):
        q1 = min(q0 + 64, S)
        k0 = max(0, q0 - W + 1)
        span = q1 - k0
        tot += (q1 - q0) * 64 * ((span + 63) // 64)
    return tot / S


def params(c):
    D, Fh, E, L = c.D, c.Fh, c.E, c.L
    ffn = E * (2 * D * Fh + Fh + D) + D * E if E else 2 * D * Fh + Fh + D
    layer = 2 * D + 3 * D * D + 3 * D + D * D + D + ffn
    return c.F * D + D + L * layer + D + D * c.O + c.O + 2 * c.F


def flops_per_token(c):
    D, Fh, E, K, L = c.D, c.Fh, c.E, c.K, c.L
    ffn = K * 2 * D * Fh + E * D if E else 2 * D * Fh
    act = c.F * D + L * (4 * D * D + ffn) + D * c.O
    return 6 * act + 12 * L * D * mean_window(c.S, c.W), act


def act_bytes(c):
    """Device bytes of train/layout.c's activations at max_batch = B (f32 everywhere)."""
    N, D, E, K, Fh = c.B * c.S, c.D, c.E, c.K, c.Fh
    R = N * K if E else N
    A = c.B * c.H * c.S * c.W
    per = 6 * N * D + 2 * N + 3 * N * D + A + 2 * R * Fh
    if E:
        per += 2 * N * K * D + 2 * N * E + N + N * K + 3 * N * K
    tail = N * c.F + 3 * N * D + N + N * c.O + 4 * N * D + 3 * N * D + A + 2 * R * Fh + N * c.O
    tail += N * D
    if E:
        tail += 2 * N * K * D + N * K + N * E
    return 4 * (c.L * per + tail)


class Step:
    def __init__(self, c):
        self.c = c
        self.rows = {}

    def add(self, op, flops, byts, peak, calls=1, dbytes=None):
        r = self.rows.setdefault(op, [0, 0.0, 0.0, peak, 0.0])
        r[0] += calls
        r[1] += flops
        r[2] += byts
        r[4] += byts if dbytes is None else dbytes

    def ew(self, op, byts, flops=0.0, calls=1):
        """Elementwise or reduction work: the design halves its activation bytes (bf16)."""
        self.add(op, flops, byts, F32, calls, byts / 2)

    def opt(self, op, byts, flops=0.0, calls=1):
        """Work on the f32 parameter, gradient and moment blocks: f32 in the design too."""
        self.add(op, flops, byts, F32, calls, byts)


def linear(s, tag, N, IC, OC, bias=True, bf16=True, dinp=True, calls=1, nw=1):
    """kernels/cuda/linear.cu: forward and backward of out[N,OC] = inp[N,IC] W^T + b, in
    calls launches over N rows in all and nw weight matrices."""
    fl = 2.0 * N * IC * OC
    W = IC * OC * nw  # weight elements read
    if bf16:
        fwd = 6 * N * IC + 2 * N * IC + 2 * W + 4 * N * OC
        if bias:
            fwd += 4 * N * OC + 4 * N * OC  # fill_rows, then beta=1 reads C
        bwd = 6 * N * IC + 6 * N * OC  # inputs and dout to bf16
        bwd += 2 * N * IC + 2 * N * OC + 8 * W  # dW += x^T dy
        if dinp:
            bwd += 4 * N * IC + 2 * W + 2 * N * OC + 8 * N * IC  # zero, dinp += dy W
        if bias:
            bwd += 4 * N * OC  # column sums
        # design: bf16 activations in and out, bias in the epilogue, no conversions
        dfwd = 2 * N * IC + 2 * W + 2 * N * OC
        dbwd = 2 * N * IC + 2 * N * OC + 8 * W + (2 * W + 2 * N * OC + 2 * N * IC) * dinp
        s.add(f"gemm {tag} fwd", fl, fwd, BF16, calls, dbytes=dfwd)
        s.add(f"gemm {tag} bwd", 2 * fl if dinp else fl, bwd, BF16, calls, dbytes=dbwd)
    else:
        fwd = 4 * N * IC + 4 * W + 4 * N * OC + (8 * N * OC if bias else 0)
        bwd = 4 * N * IC + 4 * N * OC + 8 * W
        if dinp:
            bwd += 4 * N * IC + 4 * W + 4 * N * OC + 8 * N * IC
        if bias:
            bwd += 4 * N * OC
        s.add(f"gemm {tag} fwd", fl, fwd, F32, calls)
        s.add(f"gemm {tag} bwd", 2 * fl if dinp else fl, bwd, F32, calls)


def step(c):
    s = Step(c)
    N, D, H, Fh, E, K, L = c.B * c.S, c.D, c.H, c.Fh, c.E, c.K, c.L
    A = c.B * H * c.S * c.W
    bf = c.prec == "bf16"
    P = params(c)
    wk = issued_keys(c.S, c.W)
    M = N * K  # gathered rows (no drops at the benchmark's capacity)
    if bf:
        s.opt("params to bf16", 6 * P)
    s.opt("zero grads", 4 * P)
    s.ew("standardize", 8 * N * c.F)
    linear(s, "embed", N, c.F, D, bf16=bf, dinp=False)
    # RMSNorm forward: the first layer's (and, with experts, each layer's attention norm and
    # the final one) alone; the others fused with the residual add before them
    # (kiln_cuda_residual_rmsnorm_forward: reads a and b, writes the sum and the normed rows)
    alone = 1 + (L if E else 0)
    fused = L + (0 if E else L)
    s.ew("rmsnorm fwd", alone * (8 * N * D + 4 * N), alone * 8 * N * D, calls=alone)
    s.ew("residual add + rmsnorm fwd (fused)", fused * (16 * N * D + 4 * N), fused * 9 * N * D,
         calls=fused)
    for _ in range(L):
        linear(s, "qkv", N, D, 3 * D, bf16=bf)
        att_fl = 4.0 * N * D * wk
        s.add("attention fwd", att_fl, 12 * N * D + 4 * A + 4 * N * D, F32, dbytes=(12 * N * D + 4 * N * D) / 2)
        s.add("attention bwd", 2 * att_fl,
              12 * N * D + 4 * A + 4 * N * D + 8 * A + 12 * N * D * 2 + 4 * A, F32,
              dbytes=(12 * N * D + 4 * N * D + 12 * N * D) / 2)
        linear(s, "attn out", N, D, D, bf16=bf)
        s.ew("stats (entropy, rms)", 4 * A + 4 * N * D + (4 * N * E if E else 0), calls=3 if E else 2)
        s.ew("rmsnorm bwd", 2 * (4 * N * D + 16 * N * D + 8 * N * D), 2 * 8 * N * D, calls=2)
        s.ew("zero act grads", 4 * N * D * 6 + (4 * M * D * 2 + 4 * M * Fh * 2 if E else 4 * N * Fh * 2))
        if not E:
            linear(s, "fc", N, D, Fh, bf16=bf)
            s.ew("gelu fwd", 8 * N * Fh, 20 * N * Fh)
            s.ew("gelu bwd", 16 * N * Fh, 30 * N * Fh)
            linear(s, "proj", N, Fh, D, bf16=bf)
        else:
            linear(s, "router (f32)", N, D, E, bias=False, bf16=False)
            s.ew("router fwd (softmax, top-k, gates)", 4 * N * E * 2 + 4 * N + 8 * N * K, 10 * N * E)
            s.ew("router loss fwd + bwd", 4 * N * E * 3 + 8 * N * K, 10 * N * E, calls=2)
            s.ew("dispatch", 4 * N * K + 8 * N * K + 4 * N * K, calls=3)
            s.ew("gather fwd + bwd", 8 * M * D + 4 * M * D + 8 * N * D, calls=2)
            s.ew("combine fwd + bwd", 4 * N * D + 4 * M * D + 4 * N * D + 4 * N * D + 8 * M * D,
                 4 * M * D, calls=2)
            # one grouped GEMM per direction (kiln_cuda_linear_grouped_*) over M rows in all
            # and the weights of all E experts
            linear(s, "experts fc", M, D, Fh, bf16=bf, nw=E)
            linear(s, "experts proj", M, Fh, D, bf16=bf, nw=E)
            s.ew("gelu fwd", 8 * M * Fh, 20 * M * Fh)
            s.ew("gelu bwd", 16 * M * Fh, 30 * M * Fh)
    s.ew("rmsnorm bwd", 28 * N * D, 16 * N * D)
    linear(s, "head", N, D, c.O, bf16=bf)
    s.ew("loss (mse fwd + bwd)", 4 * N * c.O * 4, 4 * N * c.O, calls=2)
    nt = 2 + L * (13 if not E else 16) + 3  # trained tensors (gpu-check's table has them)
    s.opt("optimizer: grad norm (sumsq)", 4 * P, 2 * P, calls=nt)
    s.opt("optimizer: AdamW (one launch)", 28 * P, 15 * P)
    return s


def us(x):
    return x * 1e6


def table(c, out):
    s = step(c)
    fpt, active = flops_per_token(c)
    N = c.B * c.S
    model_flops = fpt * N
    P = params(c)
    out(f"## {c.name}: D={c.D} L={c.L} H={c.H} Fh={c.Fh} E={c.E} K={c.K} S={c.S} W={c.W} "
        f"B={c.B} ({N} tokens/step), {P / 1e6:.1f} M params, {active / 1e6:.1f} M active/token")
    mem_net = P * (4 + 4 + (2 if c.prec == "bf16" else 0))
    mem_adam = 8 * P
    acts = act_bytes(c)
    out(f"memory: params+grads{'+bf16 copy' if c.prec == 'bf16' else ''} {mem_net / GIB:.1f} GiB, "
        f"AdamW moments {mem_adam / GIB:.1f} GiB, activations {acts / GIB:.1f} GiB, "
        f"total {(mem_net + mem_adam + acts) / GIB:.1f} GiB of 139 (plus the ops' scratch)")
    out(f"model FLOPs/step {model_flops / 1e12:.2f} TFLOP (6 x active weights + 12 L D w), "
        f"mean window {mean_window(c.S, c.W):.1f}, attention issues {issued_keys(c.S, c.W):.1f} keys/query")
    out("")
    out(f"{'op':36} {'calls':>6} {'GFLOP':>9} {'GB':>8} {'us@peak':>9} {'us@HBM':>9} "
        f"{'bound us':>9} {'share':>6} {'design us':>9}")
    tot = dtot = 0.0
    rows = []
    for op, (calls, fl, by, peak, dby) in s.rows.items():
        tf, tb = fl / peak, by / HBM
        b = max(tf, tb)
        # design: every matrix product on tensor cores, activations in bf16
        d = max(fl / BF16, dby / HBM)
        rows.append((op, calls, fl, by, tf, tb, b, d))
        tot += b
        dtot += d
    for op, calls, fl, by, tf, tb, b, d in rows:
        out(f"{op:36} {calls:6d} {fl / 1e9:9.1f} {by / 1e9:8.2f} {us(tf):9.0f} {us(tb):9.0f} "
            f"{us(b):9.0f} {100 * b / tot:5.1f}% {us(d):9.0f}")
    gemm = sum(b for op, _, _, _, _, _, b, _ in rows if op.startswith("gemm"))
    fb = sum(b for op, _, _, _, _, _, b, _ in rows if not op.startswith("optimizer"))
    dfb = sum(d for op, _, _, _, _, _, _, d in rows if not op.startswith("optimizer"))
    out(f"{'floor of the step (sum)':36} {'':6} {sum(r[2] for r in rows) / 1e9:9.1f} "
        f"{sum(r[3] for r in rows) / 1e9:8.2f} {'':9} {'':9} {us(tot):9.0f} {'':6} {us(dtot):9.0f}")
    out(f"{'  of which forward + backward':36} {'':6} {'':9} {'':8} {'':9} {'':9} {us(fb):9.0f} "
        f"{'':6} {us(dfb):9.0f}")
    out(f"GEMMs' share of the floor: {100 * gemm / tot:.0f}%")
    out(f"best-case MFU as built, forward + backward (what gpu-check's bench times): "
        f"{100 * model_flops / fb / BF16:.1f}% ({N / fb:,.0f} tokens/s); with the optimizer "
        f"step: {100 * model_flops / tot / BF16:.1f}%")
    out(f"design (bf16 activations, attention on tensor cores), forward + backward: "
        f"{100 * model_flops / dfb / BF16:.1f}% ({N / dfb:,.0f} tokens/s); with the optimizer "
        f"step: {100 * model_flops / dtot / BF16:.1f}%")
    out("")


def main():
    want = sys.argv[1:]
    out = print
    out(f"H200: {HBM / 1e12:.1f} TB/s HBM, {BF16 / 1e12:.0f} TFLOP/s dense bf16, "
        f"{F32 / 1e12:.0f} TFLOP/s f32 (CUDA cores)")
    out("")
    for c in CONFIGS:
        if not want or c.name in want:
            table(c, out)


if __name__ == "__main__":
    main()
