"""tsmoe_ref.py - kiln-tsmoe/1 in float64 numpy, straight from docs/model.md, and the test
vectors it writes (tests/vectors/tsmoe-{dense,moe}.*.safetensors; `make vectors`).

It shares no code with kiln: no C, no kiln package. The forward, the loss and its terms are
written out as docs/model.md states them, one token and one head at a time where that reads
closest to the page; gradients are float64 central differences of the loss (the vectors'
contract, docs/model.md "Vectors"), so they check the C backward passes without sharing an
idea with them.

    /usr/bin/python3 tests/ref/tsmoe_ref.py OUT_DIR        write the vectors
    /usr/bin/python3 tests/ref/tsmoe_ref.py --check DIR    recompute DIR's outputs, losses and
                                                           gradients from its models and inputs
"""

import json
import math
import os
import struct
import sys

import numpy as np

# ---- safetensors (F32 only: the vectors hold float32 numbers) ----


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8 : 8 + n])
    meta = header.pop("__metadata__", {})
    body = data[8 + n :]
    tensors = {}
    for name, t in header.items():
        if t["dtype"] != "F32":
            raise ValueError(f"{path}: {name}: dtype {t['dtype']}, only F32 is read here")
        a, b = t["data_offsets"]
        tensors[name] = np.frombuffer(body[a:b], dtype="<f4").reshape(t["shape"]).copy()
    return tensors, meta


def write_safetensors(path, tensors, meta):
    """Names sorted, data packed in that order, the header padded with spaces to 8 bytes."""
    header, blobs, at = {}, [], 0
    for name in sorted(tensors):
        a = np.ascontiguousarray(tensors[name], dtype="<f4")
        header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [at, at + a.nbytes]}
        blobs.append(a.tobytes())
        at += a.nbytes
    header = {"__metadata__": meta, **header}
    text = json.dumps(header, separators=(",", ":"), sort_keys=False).encode()
    text += b" " * (-len(text) % 8)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))
    os.replace(tmp, path)


# ---- the model (docs/model.md "Forward") ----


def rmsnorm(u, g, eps):
    return u / np.sqrt(np.mean(u * u, axis=-1, keepdims=True) + eps) * g


def gelu(u):
    return 0.5 * u * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u**3)))


def linear(u, w, b=None):
    y = u @ w.T
    return y if b is None else y + b


def softmax(z):
    z = z - np.max(z)
    e = np.exp(z)
    return e / np.sum(e)


def logsumexp(z):
    m = np.max(z)
    return m + math.log(np.sum(np.exp(z - m)))


def forward(cfg, p, x):
    """Outputs y[B,S,O] and, per mixture layer, (router logits [N,E], probabilities [N,E],
    chosen experts [N,K]) for the loss."""
    D, L, H, W = cfg["d_model"], cfg["n_layers"], cfg["n_heads"], cfg["attn_window"]
    E, K, eps = cfg["n_experts"], cfg["top_k"], cfg["norm_eps"]
    B, S, _ = x.shape
    Dh = D // H
    h = linear((x - p["norm.in_mean"]) / p["norm.in_std"], p["embed.weight"], p["embed.bias"])
    routing = []
    for l in range(L):
        pre = f"blocks.{l}."
        u = rmsnorm(h, p[pre + "attn_norm.weight"], eps)
        qkv = linear(u, p[pre + "attn.qkv.weight"], p[pre + "attn.qkv.bias"])
        q, k, v = qkv[..., :D], qkv[..., D : 2 * D], qkv[..., 2 * D :]
        o = np.zeros((B, S, D))
        i, j = np.arange(S)[:, None], np.arange(S)[None, :]
        band = (j <= i) & (j > i - W)  # i-W < j <= i
        for hd in range(H):
            m = 2.0 ** (-8.0 * (hd + 1) / H)
            cols = slice(hd * Dh, (hd + 1) * Dh)
            score = q[..., cols] @ np.swapaxes(k[..., cols], 1, 2) / math.sqrt(Dh) - m * (i - j)
            score = np.where(band, score, -np.inf)
            a = np.exp(score - score.max(axis=-1, keepdims=True))
            a /= a.sum(axis=-1, keepdims=True)
            o[..., cols] = a @ v[..., cols]
        h = h + linear(o, p[pre + "attn.out.weight"], p[pre + "attn.out.bias"])
        u = rmsnorm(h, p[pre + "ffn_norm.weight"], eps)
        if E == 0:
            f = gelu(linear(u, p[pre + "ffn.fc.weight"], p[pre + "ffn.fc.bias"]))
            h = h + linear(f, p[pre + "ffn.proj.weight"], p[pre + "ffn.proj.bias"])
            continue
        rw = p[pre + "moe.router.weight"]
        fw, fb = p[pre + "moe.fc.weight"], p[pre + "moe.fc.bias"]
        pw, pb = p[pre + "moe.proj.weight"], p[pre + "moe.proj.bias"]
        logits, probs, chosen = [], [], []
        h = h.copy()
        for b in range(B):
            for t in range(S):
                r = rw @ u[b, t]
                pt = softmax(r)
                # the K largest probabilities; equal ones: the lower expert index first
                order = sorted(range(E), key=lambda e: (-pt[e], e))[:K]
                gsum = sum(pt[e] for e in order)
                for e in order:
                    out = pw[e] @ gelu(fw[e] @ u[b, t] + fb[e]) + pb[e]
                    h[b, t] += pt[e] / gsum * out
                logits.append(r)
                probs.append(pt)
                chosen.append(order)
        routing.append((np.array(logits), np.array(probs), chosen))
    y = linear(rmsnorm(h, p["final_norm.weight"], eps), p["head.weight"], p["head.bias"])
    return y, routing


def loss_terms(cfg, p, x, targets):
    """(loss, mse, load_balance, z) as docs/model.md "Loss" defines them, with the file's
    coefficients in cfg."""
    y, routing = forward(cfg, p, x)
    mse = float(np.mean((y - targets) ** 2))
    E, K = cfg["n_experts"], cfg["top_k"]
    lb = z = 0.0
    for logits, probs, chosen in routing:
        N = len(chosen)
        f = np.zeros(E)
        for ch in chosen:
            for e in ch:
                f[e] += 1.0
        f /= N * K
        P = probs.mean(axis=0)
        lb += E * float(np.sum(f * P))
        z += float(np.mean([logsumexp(r) ** 2 for r in logits]))
    loss = mse + cfg["aux_loss_coef"] * lb + cfg["z_loss_coef"] * z
    return loss, mse, lb, z, y


TRAINED_SKIP = ("norm.in_mean", "norm.in_std")  # fixed standardisation, not trained


def gradients(cfg, p, x, targets, h=1e-6):
    """grad.<name> for every trained parameter, by float64 central differences."""
    grads = {}
    for name in sorted(p):
        if name in TRAINED_SKIP:
            continue
        g = np.zeros_like(p[name])
        flat, gflat = p[name].reshape(-1), g.reshape(-1)
        for i in range(flat.size):
            keep = flat[i]
            flat[i] = keep + h
            up = loss_terms(cfg, p, x, targets)[0]
            flat[i] = keep - h
            down = loss_terms(cfg, p, x, targets)[0]
            flat[i] = keep
            gflat[i] = (up - down) / (2 * h)
        grads["grad." + name] = g
    return grads


# ---- the vectors ----

# Two small models, one dense and one mixture, shaped so that every rule shows: the window is
# shorter than the sequence in the mixture (the band of the attention mask), the head count
# gives two ALiBi slopes, and K < E makes the gates renormalise.
CASES = {
    "dense": dict(n_features=4, n_outputs=1, d_model=8, n_layers=2, n_heads=2, d_ff=16,
                  n_experts=0, top_k=0, seq_len=5, attn_window=5, batch=2, seed=1001),
    "moe": dict(n_features=3, n_outputs=2, d_model=8, n_layers=2, n_heads=2, d_ff=12,
                n_experts=3, top_k=2, seq_len=6, attn_window=4, batch=2, seed=1002),
}
AUX, ZC = 0.01, 0.001


def make_case(c):
    """Float32 parameters, inputs and targets from numpy's own generator and the case's seed:
    weights of the scale training reaches (not the 0.02 of initialisation, which would make
    every term near zero), non-trivial gains, norm statistics and biases."""
    rng = np.random.default_rng(c["seed"])
    F, O, D, L, Fh, E = (c[k] for k in ("n_features", "n_outputs", "d_model", "n_layers",
                                          "d_ff", "n_experts"))
    B, S = c["batch"], c["seq_len"]

    def w(*shape, scale=None):
        s = scale if scale is not None else 1.0 / math.sqrt(shape[-1])
        return rng.normal(0.0, s, size=shape).astype(np.float32)

    def gain(n):
        return (1.0 + 0.2 * rng.standard_normal(n)).astype(np.float32)

    p = {
        "norm.in_mean": w(F, scale=0.5),
        "norm.in_std": (0.5 + rng.random(F)).astype(np.float32),
        "embed.weight": w(D, F),
        "embed.bias": w(D, scale=0.1),
        "final_norm.weight": gain(D),
        "head.weight": w(O, D),
        "head.bias": w(O, scale=0.1),
    }
    for l in range(L):
        pre = f"blocks.{l}."
        p[pre + "attn_norm.weight"] = gain(D)
        p[pre + "attn.qkv.weight"] = w(3 * D, D)
        p[pre + "attn.qkv.bias"] = w(3 * D, scale=0.1)
        p[pre + "attn.out.weight"] = w(D, D)
        p[pre + "attn.out.bias"] = w(D, scale=0.1)
        p[pre + "ffn_norm.weight"] = gain(D)
        if E == 0:
            p[pre + "ffn.fc.weight"] = w(Fh, D)
            p[pre + "ffn.fc.bias"] = w(Fh, scale=0.1)
            p[pre + "ffn.proj.weight"] = w(D, Fh)
            p[pre + "ffn.proj.bias"] = w(D, scale=0.1)
        else:
            p[pre + "moe.router.weight"] = w(E, D, scale=0.5)
            p[pre + "moe.fc.weight"] = w(E, Fh, D)
            p[pre + "moe.fc.bias"] = w(E, Fh, scale=0.1)
            p[pre + "moe.proj.weight"] = w(E, D, Fh)
            p[pre + "moe.proj.bias"] = w(E, D, scale=0.1)
    x = rng.normal(0.0, 1.0, size=(B, S, F)).astype(np.float32)
    targets = rng.normal(0.0, 1.0, size=(B, S, O)).astype(np.float32)
    return p, x, targets


def model_config(c):
    keys = ("attn_window", "d_ff", "d_model", "n_experts", "n_features", "n_heads", "n_layers",
            "n_outputs", "seq_len", "top_k")
    cfg = {k: c[k] for k in keys}
    cfg.update(format="kiln-tsmoe/1", norm_eps=1e-05)
    return dict(sorted(cfg.items()))


def f64(p):
    return {k: v.astype(np.float64) for k, v in p.items()}


def compute(cfg, p32, x32, t32):
    """Everything an .io file holds, in float64 from the float32 numbers."""
    p, x, t = f64(p32), x32.astype(np.float64), t32.astype(np.float64)
    loss, mse, lb, z, y = loss_terms(cfg, p, x, t)
    return y, gradients(cfg, p, x, t), dict(loss=loss, mse=mse, load_balance=lb, z=z)


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    for name, c in CASES.items():
        p32, x32, t32 = make_case(c)
        mcfg = model_config(c)
        cfg = dict(mcfg, aux_loss_coef=AUX, z_loss_coef=ZC)
        y, grads, terms = compute(cfg, p32, x32, t32)
        write_safetensors(os.path.join(out_dir, f"tsmoe-{name}.model.safetensors"), p32,
                          {"kiln.config": json.dumps(mcfg, sort_keys=True)})
        io = {"inputs": x32, "targets": t32, "outputs": y.astype(np.float32)}
        io.update({k: v.astype(np.float32) for k, v in grads.items()})
        meta = {k: repr(v) for k, v in terms.items()}
        meta.update(aux_loss_coef=repr(AUX), z_loss_coef=repr(ZC))
        write_safetensors(os.path.join(out_dir, f"tsmoe-{name}.io.safetensors"), io, meta)
        print(f"tsmoe-{name}: loss {terms['loss']:.6f} (mse {terms['mse']:.6f}, "
              f"load_balance {terms['load_balance']:.6f}, z {terms['z']:.6f})")


def rel(a, b):
    """Largest difference relative to b's largest magnitude."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    scale = max(float(np.max(np.abs(b))), 1e-30)
    return float(np.max(np.abs(a - b))) / scale


def check(vec_dir):
    """Recompute every .io file of vec_dir from its .model file and inputs; exit 1 where this
    page's reference and the file disagree beyond float32 storage (outputs and losses 1e-5,
    gradients 1e-3 of the tensor's largest magnitude)."""
    bad = 0
    for name in CASES:
        p32, meta_m = read_safetensors(os.path.join(vec_dir, f"tsmoe-{name}.model.safetensors"))
        io, meta = read_safetensors(os.path.join(vec_dir, f"tsmoe-{name}.io.safetensors"))
        cfg = json.loads(meta_m["kiln.config"])
        cfg.update(aux_loss_coef=float(meta["aux_loss_coef"]),
                   z_loss_coef=float(meta["z_loss_coef"]))
        y, grads, terms = compute(cfg, p32, io["inputs"], io["targets"])
        rows = [("outputs", rel(y, io["outputs"]), 1e-5)]
        for k in ("loss", "mse", "load_balance", "z"):
            want = float(meta[k])
            rows.append((k, abs(terms[k] - want) / max(abs(want), 1e-30) if want else
                         abs(terms[k]), 1e-5))
        worst = max(((g, rel(grads[g], io[g])) for g in grads), key=lambda r: r[1])
        missing = sorted(set(k for k in io if k.startswith("grad.")) ^ set(grads))
        rows.append((f"gradients (worst {worst[0]})", worst[1], 1e-3))
        for what, err, tol in rows:
            ok = err <= tol
            bad += not ok
            print(f"{'ok  ' if ok else 'FAIL'} tsmoe-{name} {what}: {err:.2e} (limit {tol:g})")
        if missing:
            bad += 1
            print(f"FAIL tsmoe-{name}: gradients named differently: {missing}")
    return bad


def main(argv):
    if len(argv) == 3 and argv[1] == "--check":
        return 1 if check(argv[2]) else 0
    if len(argv) == 2 and not argv[1].startswith("-"):
        write(argv[1])
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
