"""kiln.torch: the PyTorch twin of kiln-tsmoe/1 against the float64 vectors, kiln's own init,
checkpoints and model directories, and `kiln validate --reference` (parity_reference),
including two PyTorch models that each differ from docs/model.md in one detail and must fail it.

Everything of kiln is reached through the CLI (env KILN, default build/kiln)."""

import json
import math
import os
import subprocess

import numpy as np
import torch

import kiln
import kiln.torch as kt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
VEC = os.environ.get("KILN_VECTORS") or os.path.join(ROOT, "tests", "vectors")
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))
SMALL = {"d_model": 16, "n_layers": 2, "n_heads": 4, "d_ff": 32, "n_experts": 4, "top_k": 2,
         "seq_len": 16, "attn_window": 16}


def sh(*args, ok=(0,)):
    p = subprocess.run([KILN, *args], capture_output=True, text=True)
    if p.returncode not in ok:
        raise AssertionError(f"kiln {' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def check(what, cond):
    if not cond:
        raise AssertionError(what)


def raises(fn, *words):
    try:
        fn()
    except kiln.Error as e:
        for w in words:
            check(f"'{w}' in the message '{e.message}'", w in e.message)
        return e
    raise AssertionError(f"no kiln.Error (wanted one naming {words})")


# ---- the vectors (float64) ----------------------------------------------------------------

def vectors(name):
    m = kt.TSMoE.from_model_dir(os.path.join(VEC, f"{name}.model.safetensors")).double()
    io, meta = kt.read_safetensors(os.path.join(VEC, f"{name}.io.safetensors"))
    m.aux_loss_coef = float(meta["aux_loss_coef"])
    m.z_loss_coef = float(meta["z_loss_coef"])
    x = torch.from_numpy(io["inputs"].astype(np.float64))
    t = torch.from_numpy(io["targets"].astype(np.float64))
    y, loss = m(x, t)
    # The vectors are float64 results stored as float32: outputs agree to float32 rounding.
    want = io["outputs"].astype(np.float64)
    rel = np.abs(y.detach().numpy() - want).max() / np.abs(want).max()
    check(f"{name}: outputs within 1e-6 relative (got {rel:.3g})", rel < 1e-6)
    for k in ("loss", "mse", "load_balance", "z"):
        got, exp = loss[k].item(), float(meta[k])
        check(f"{name}: {k} {got!r} vs {exp!r}", abs(got - exp) <= 1e-12 * max(1.0, abs(exp)))
    loss["loss"].backward()
    names = [n for n, p in m.named_parameters()]
    check(f"{name}: a gradient for every trained parameter",
          sorted("grad." + n for n in names) == sorted(k for k in io if k.startswith("grad.")))
    for n, p in m.named_parameters():
        g = io["grad." + n].astype(np.float64)
        err = np.abs(p.grad.numpy() - g).max() / max(np.abs(g).max(), 1e-300)
        check(f"{name}: grad {n} within 1e-6 of its largest (got {err:.3g})", err < 1e-6)
    check("norm.in_* are buffers, never trained", "norm.in_mean" not in names)


def test_torch_vectors_moe():
    vectors("tsmoe-moe")


def test_torch_vectors_dense():
    vectors("tsmoe-dense")


def test_torch_vectors_fail_when_wrong():
    """The vector check can fail: a model with its gates left unrenormalised misses them."""
    class Unrenormalised(kt.TSMoE):
        def top_k_gates(self, p, k):
            order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
            return order, torch.gather(p, 1, order)

    m = Unrenormalised.from_model_dir(os.path.join(VEC, "tsmoe-moe.model.safetensors")).double()
    io, _ = kt.read_safetensors(os.path.join(VEC, "tsmoe-moe.io.safetensors"))
    y, _ = m(torch.from_numpy(io["inputs"].astype(np.float64)))
    rel = np.abs(y.detach().numpy() - io["outputs"]).max() / np.abs(io["outputs"]).max()
    check(f"unrenormalised gates are far off the vectors (got {rel:.3g})", rel > 1e-3)


# ---- kiln's files ---------------------------------------------------------------------------

def synth(tmp, rows=3000, features=5, outputs=2, seed=3):
    path = os.path.join(tmp, "market.safetensors")
    sh("data", "synth", "--seed", str(seed), "--rows", str(rows), "--features", str(features),
       "--outputs", str(outputs), "--out", path)
    return path


def train(tmp, data, steps, *sets):
    run = os.path.join(tmp, "run")
    args = ["train", "--data", data, "--run-dir", run, "--set", f"steps={steps}"]
    for k, v in SMALL.items():
        args += ["--set", f"{k}={v}"]
    for s in sets:
        args += ["--set", s]
    sh(*args)
    return run


def test_torch_init_is_kilns(tmp):
    """TSMoE(config, seed) holds, bit for bit, the weights `kiln train` starts from (one SGD
    step of lr 1e-30 leaves every random weight as it was: the update is below its ulp)."""
    data = synth(tmp)
    run = train(tmp, data, 1, "optimizer=sgd", "lr=1e-30", "min_lr=0", "warmup_steps=0",
                "weight_decay=0", "grad_clip=0", "seed=7", "ckpt_every=1")
    ck = kt.TSMoE.from_checkpoint(os.path.join(run, "ckpt", "step-00000001.safetensors"),
                                  fold_targets=False)
    cfg = dict(SMALL, n_features=5, n_outputs=2)
    mine = kt.TSMoE(cfg, seed=7)
    a, b = mine.arrays(), ck.arrays()
    random = [n for n in a if n.endswith(".weight") and "norm" not in n]
    check("some random tensors", len(random) >= 10)
    for n in random:
        check(f"{n} bitwise equal to kiln's init", np.array_equal(a[n], b[n]))
    # The input standardisation is the training split's, as the trainer computes it.
    feats, _ = kt.read_safetensors(data)
    tr_end, _, _ = kt.split(feats["features"].shape[0], 0.2, SMALL["seq_len"])
    mine.set_input_norm(feats["features"][:tr_end])
    for n in ("norm.in_mean", "norm.in_std"):
        d = np.abs(mine.arrays()[n] - b[n]).max()
        check(f"{n} as the trainer's (max diff {d:.3g})", d <= 1e-6 * np.abs(b[n]).max())
    # Another seed gives other weights.
    other = kt.TSMoE(cfg, seed=8).arrays()
    check("seed 8 differs", not np.array_equal(other[random[0]], a[random[0]]))


def test_torch_checkpoint_and_model_dir(tmp):
    """A kiln checkpoint and its export load into the same weights; the PyTorch forward agrees
    with `kiln infer` on the exported model; a corrupted checkpoint is refused by name."""
    data = synth(tmp)
    run = train(tmp, data, 30, "ckpt_every=30", "eval_every=30")
    ckpt = os.path.join(run, "ckpt", "step-00000030.safetensors")
    model = os.path.join(tmp, "m")
    sh("export", run, "--out", model)
    a = kt.TSMoE.from_checkpoint(ckpt)
    b = kt.TSMoE.from_model_dir(model)
    check("step from the checkpoint", a.step == 30 and b.step == 30)
    for n, v in a.arrays().items():
        check(f"{n} equal", np.array_equal(v, b.arrays()[n]))
    # kiln infer on the first 64 rows, one sequence, against the PyTorch forward.
    t, _ = kt.read_safetensors(data)
    x = t["features"][:64]
    small = os.path.join(tmp, "rows.safetensors")
    kt.write_safetensors(small, {"features": x, "targets": t["targets"][:64]})
    out = os.path.join(tmp, "pred.safetensors")
    sh("infer", "--model", model, "--input", small, "--out", out)
    got, _ = kt.read_safetensors(out)
    y = got["outputs"]
    mine = b.predict(x)
    rel = np.abs(mine - y.reshape(mine.shape)).max() / np.abs(y).max()
    check(f"PyTorch forward within 1e-5 of kiln infer (got {rel:.3g})", rel < 1e-5)
    # A checkpoint whose data was altered is refused, naming the file.
    bad = os.path.join(tmp, "bad.safetensors")
    blob = bytearray(open(ckpt, "rb").read())
    blob[-3] ^= 0x40
    open(bad, "wb").write(bytes(blob))
    raises(lambda: kt.TSMoE.from_checkpoint(bad), bad, "digest mismatch")
    raises(lambda: kt.TSMoE.from_model_dir(os.path.join(tmp, "nope")), "nope")
    raises(lambda: b(torch.zeros(2, 3)), "expected [B, S, 5]")
    raises(lambda: b.predict(np.array([["a"] * 5] * 4)), "not numbers")
    raises(lambda: b(np.array([[["a"] * 5] * 4])), "not numbers")
    # A sequence longer than the attention's query block (256 rows) gives what the runtime
    # gives: the blocked attention is the same function.
    long_x = t["features"][:700]
    kt.write_safetensors(small, {"features": long_x, "targets": t["targets"][:700]})
    sh("infer", "--model", model, "--input", small, "--out", out)
    y = kt.read_safetensors(out)[0]["outputs"]
    rel = np.abs(b.predict(long_x) - y).max() / np.abs(y).max()
    check(f"700 rows within 1e-5 of kiln infer (got {rel:.3g})", rel < 1e-5)
    raises(lambda: kt.TSMoE(dict(SMALL, n_features=5, n_outputs=2, top_k=9)), "top_k")
    raises(lambda: kt.TSMoE(dict(SMALL, n_features=5, n_outputs=2, colour=1)), "colour")


def trained_torch(tmp, steps=60, cls=kt.TSMoE, seed=1):
    """A small float32 model trained in PyTorch on synthetic data, saved as a model directory
    with a golden set: (model, model_dir, data)."""
    data = synth(tmp)
    t, _ = kt.read_safetensors(data)
    f, y = t["features"], t["targets"]
    cfg = dict(SMALL, n_features=f.shape[1], n_outputs=y.shape[1])
    torch.manual_seed(seed)
    m = cls(cfg, seed=seed)
    tr_end, _, _ = kt.split(f.shape[0], 0.2, cfg["seq_len"])
    m.set_input_norm(f[:tr_end])
    opt = torch.optim.AdamW(m.parameters(), lr=3e-3, weight_decay=0.01)
    rng = np.random.default_rng(seed)
    S = cfg["seq_len"]
    for _ in range(steps):
        starts = rng.integers(0, tr_end - S + 1, size=16)
        xb = torch.from_numpy(np.stack([f[s:s + S] for s in starts]))
        yb = torch.from_numpy(np.stack([y[s:s + S] for s in starts]))
        _, loss = m(xb, yb)
        opt.zero_grad()
        loss["loss"].backward()
        opt.step()
        m.step += 1
    model_dir = os.path.join(tmp, "model")
    m.save_model_dir(model_dir, dataset=data, name="torch-test", code_version="test 1",
                     train_config={"val_fraction": 0.2, "lr": 3e-3, "steps": steps})
    sh("golden", "make", "--model", model_dir, "--data", data, "--windows", "16")
    return m, model_dir, data


def validate(model_dir, data, ref, *extra, ok=(0,)):
    rep = os.path.join(os.path.dirname(ref), "v.json")
    p = sh("validate", "--model", model_dir, "--data", data, "--reference", ref, "--report", rep,
           *extra, ok=ok)
    return p, json.load(open(rep))


def test_torch_model_dir_validates_and_packs(tmp):
    """save_model_dir writes what golden make, validate (with --reference), pack and sign
    take; the card says where the model came from."""
    m, model_dir, data = trained_torch(tmp)
    card = json.load(open(os.path.join(model_dir, "card.json")))
    lin = card["lineage"]
    check("card: torch version", lin["framework"] == "torch " + torch.__version__)
    check("card: code version", lin["code_version"] == "test 1")
    check("card: dataset digest", lin["dataset_sha256"] == kt.sha256_file(data))
    check("card: step", lin["step"] == 60)
    ref = os.path.join(tmp, "ref.safetensors")
    m.reference_outputs(model_dir, ref)
    p, rep = validate(model_dir, data, ref)
    c = rep["checks"]["parity_reference"]
    check("parity_reference passed: " + p.stdout, c["status"] == "passed")
    check("in the report's verdict", rep["passed"] is True)
    check("inputs digest checked", c["figures"]["inputs_digest_checked"] is True)
    print(f"  parity_reference on a float32 model: max relative error "
          f"{c['figures']['max_rel_err']:.3g}, max abs {c['figures']['max_abs_err']:.3g} at "
          f"scale {c['figures']['scale']:.3g}")
    check("validate prints the check", "parity_reference" in p.stdout)
    sh("validate", "--model", model_dir, "--data", data)  # the report pack reads
    sh("pack", model_dir, "--name", "torch-test", "--version", "1.0.0", "--out",
       os.path.join(tmp, "t.kiln"))
    sh("keygen", "--out", os.path.join(tmp, "rel"), "--no-password")
    sh("sign", os.path.join(tmp, "t.kiln"), "--key", os.path.join(tmp, "rel.key"))
    # A REF made on another golden set is refused by the check, naming the reason.
    sh("golden", "make", "--model", model_dir, "--data", data, "--windows", "8", "--force")
    p, rep = validate(model_dir, data, ref, ok=(1, 2))
    check("another golden set: exit 2 (shape) or 1", p.returncode in (1, 2))
    check("names the reference: " + p.stderr, ref in p.stderr)
    # Saving over a non-empty directory is refused, nothing changed.
    before = open(os.path.join(model_dir, "card.json")).read()
    raises(lambda: m.save_model_dir(model_dir), model_dir, "not an empty directory")
    check("card untouched", open(os.path.join(model_dir, "card.json")).read() == before)


def mismatch(tmp, cls, what):
    """A PyTorch model that differs from docs/model.md in one detail: its REF must fail
    parity_reference, and the verdict with it. Returns the check's max relative error."""
    m, model_dir, data = trained_torch(tmp, cls=cls)
    # The saved weights are the variant's; kiln computes docs/model.md on them.
    ref = os.path.join(tmp, "ref.safetensors")
    m.reference_outputs(model_dir, ref)
    p, rep = validate(model_dir, data, ref, ok=(1,))
    c = rep["checks"]["parity_reference"]
    check(f"{what}: parity_reference failed", c["status"] == "failed")
    check(f"{what}: the verdict failed", rep["passed"] is False)
    check(f"{what}: reason on stderr: {p.stderr}", "kiln: failed: parity_reference" in p.stderr)
    check(f"{what}: golden still passes", rep["checks"]["golden"]["status"] == "passed")
    print(f"  {what}: max relative error {c['figures']['max_rel_err']:.3g}, "
          f"{100 * c['figures']['frac_outside']:.3g}% outside")
    return c["figures"]["max_rel_err"]


class Unrenormalised(kt.TSMoE):
    """Top-k gates left as the router's probabilities, not renormalised over the K chosen."""

    def top_k_gates(self, p, k):
        order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
        return order, torch.gather(p, 1, order)


class AlibiOffByOne(kt.TSMoE):
    """ALiBi slopes 2^(-8h/H) with h from 0: every head's slope one head off."""

    def alibi_slopes(self, n_heads):
        return [2.0 ** (-8.0 * h / n_heads) for h in range(n_heads)]


class GeluErf(kt.TSMoE):
    """GELU with erf instead of docs/model.md's tanh form."""

    def gelu(self, u):
        return 0.5 * u * (1.0 + torch.erf(u / math.sqrt(2.0)))


def test_torch_mismatch_unrenormalised_gates(tmp):
    mismatch(tmp, Unrenormalised, "top-k gates unrenormalised")


def test_torch_mismatch_alibi_off_by_one(tmp):
    mismatch(tmp, AlibiOffByOne, "ALiBi slopes off by one head")


def test_torch_gelu_erf_is_below_the_threshold(tmp):
    """What the check cannot see: GELU erf vs tanh moves a lightly trained model's outputs by
    far less than reference.rtol. Measured and printed; held to be below the threshold, so
    that docs/validation.md's statement stays true."""
    m, model_dir, data = trained_torch(tmp, cls=GeluErf)
    ref = os.path.join(tmp, "ref.safetensors")
    m.reference_outputs(model_dir, ref)
    p, rep = validate(model_dir, data, ref, ok=(0, 1))
    f = rep["checks"]["parity_reference"]["figures"]
    # Against the spec model on the same weights, in float64 (no engine noise).
    spec = kt.TSMoE(m.config, seed=None)
    spec.load_arrays(m.arrays())
    g, _ = kt.read_safetensors(os.path.join(model_dir, "golden", "golden.safetensors"))
    x = torch.from_numpy(g["inputs"].astype(np.float64))
    with torch.no_grad():
        a = spec.double()(x)[0].numpy()
        b = GeluErf(m.config, seed=None).double()
        b.load_arrays(m.arrays())
        b = b(x)[0].numpy()
    exact = np.abs(a - b).max() / np.abs(a).max()
    print(f"  GELU erf vs tanh after 60 steps: {exact:.3g} of the output scale in float64; "
          f"parity_reference max relative error {f['max_rel_err']:.3g} "
          f"({rep['checks']['parity_reference']['status']})")
    check("erf vs tanh moves outputs by less than reference.rtol 1e-4", exact < 1e-4)
