"""research.py: what a researcher's notebook does, as a script. Trains kiln-tsmoe/1 in PyTorch
(float32, kiln.torch.TSMoE) on a kiln dataset, saves a model directory kiln can release, makes
its golden set (kiln golden make) and writes the reference outputs `kiln validate
--reference` holds the C runtime to, and the notebook's own predictions on the held-out rows.

    kiln data synth --seed 1 --rows 20000 --features 8 --outputs 2 --out market.safetensors
    PYTHONPATH=python python3 examples/research.py --data market.safetensors --out nb

writes nb/model/ (model.safetensors, card.json, golden/), nb/reference.safetensors,
nb/heldout.safetensors (the held-out rows, a kiln dataset) and nb/predictions.safetensors
(`outputs` [N,O]: the notebook's predictions on them, one sequence from the first row, as
`kiln infer` computes). `research.py compare PREDICTIONS INFERRED` then checks what `kiln
infer` wrote against the notebook's predictions with the parity rule and thresholds (exit 1
when outside). README.md, "From a notebook", shows the shell lines after it.
"""

import argparse
import math
import os
import shutil
import subprocess
import sys
import time

# One BLAS thread: the small matrices of this model gain nothing from more, and a notebook
# shares its machine.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402
import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "python"))

import kiln  # noqa: E402
import kiln.torch as kt  # noqa: E402

CONFIG = {"d_model": 32, "n_layers": 2, "n_heads": 4, "d_ff": 64, "n_experts": 4, "top_k": 2,
          "seq_len": 32, "attn_window": 32}


def kiln_binary(given):
    if given:
        return given
    if os.environ.get("KILN"):
        return os.environ["KILN"]
    built = os.path.join(os.path.dirname(HERE), "build", "kiln")
    return built if os.path.exists(built) else (shutil.which("kiln") or "kiln")


def code_version(given):
    if given:
        return given
    try:
        return subprocess.run(["git", "-C", HERE, "rev-parse", "HEAD"], capture_output=True,
                              text=True, check=True).stdout.strip() or None
    except (OSError, subprocess.CalledProcessError):
        return None


def lr_at(i, steps, lr, min_lr, warmup):
    """kiln train's schedule: linear warmup, then cosine to min_lr at the last step."""
    if i < warmup:
        return lr * (i + 1) / warmup
    t = (i - warmup) / max(1, steps - 1 - warmup)
    return min_lr + 0.5 * (lr - min_lr) * (1 + math.cos(math.pi * min(1.0, t)))


def train(args):
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    data = kiln.read_dataset(args.data)  # with its time and group columns, if it has them
    f, y = data.features, data.targets
    cfg = dict(CONFIG, n_features=f.shape[1], n_outputs=y.shape[1])
    S = cfg["seq_len"]
    # kiln train's split, by its own code: with instruments (kiln data import --group) each
    # is split at the same moment, and no window holds rows of two of them.
    sp = kt.split(data, args.val_fraction, S)
    model = kt.TSMoE(cfg, seed=args.seed)  # kiln train's initial weights for this seed
    model.set_input_norm(f[sp.train_index()])
    # The head fits standardised targets, as kiln train's: on daily returns (std ~0.01) the
    # MSE would otherwise be ~1e-4 beside a load-balance term of ~0.02, and drive nothing.
    # save_model_dir folds the standardisation back into the head.
    model.set_target_norm(y[sp.train_index()])
    decay = [p for n, p in model.named_parameters()
             if n.endswith(".weight") and p.dim() >= 2]
    other = [p for n, p in model.named_parameters() if not (n.endswith(".weight") and p.dim() >= 2)]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01},
                             {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.99), eps=1e-8)
    rng = np.random.default_rng(args.seed)
    # kiln's validation windows: up to 256 non-overlapping windows spread over the held-out rows
    xv = torch.from_numpy(sp.windows(f, sp.val_starts))
    yv = torch.from_numpy(sp.windows(y, sp.val_starts))
    t0 = time.monotonic()
    for i in range(args.steps):
        for g in opt.param_groups:
            g["lr"] = lr_at(i, args.steps, args.lr, args.lr / 10, 30)
        starts = sp.train_starts[rng.integers(0, len(sp.train_starts), size=args.batch)]
        xb, yb = torch.from_numpy(sp.windows(f, starts)), torch.from_numpy(sp.windows(y, starts))
        _, loss = model(xb, yb)
        opt.zero_grad()
        loss["loss"].backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        model.step += 1
        if (i + 1) % 100 == 0 or i + 1 == args.steps:
            with torch.no_grad():
                pv, lv = model(xv, yv)
                val = lv["mse"].item()  # standardised units, as kiln train's val_loss
                sst = ((yv - yv.mean(dim=(0, 1))) ** 2).sum(dim=(0, 1))
                r2 = (1 - ((pv - yv) ** 2).sum(dim=(0, 1)) / sst).mean().item()
            print(f"step {i + 1}/{args.steps} loss {loss['loss'].item():.6f} "
                  f"mse {loss['mse'].item():.6f} lb {loss['load_balance'].item():.3f} "
                  f"z {loss['z'].item():.3f} val_loss {val:.6f} val_r2 {r2:.4f} "
                  f"({time.monotonic() - t0:.1f} s)", flush=True)
    return model, f, y, sp, {"val_loss": val, "val_r2": r2, "loss": loss["loss"].item()}


def main(argv):
    if len(argv) > 1 and argv[1] == "compare":
        return compare(argv[2:])
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--data", required=True, help="a kiln dataset (kiln data synth/import)")
    ap.add_argument("--out", required=True, help="output directory (new)")
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--val-fraction", type=float, default=0.2)
    ap.add_argument("--windows", type=int, default=64,
                    help="golden windows (kiln release makes 64 by default: keep them equal)")
    ap.add_argument("--name", default="market-torch")
    ap.add_argument("--code-version", default=None, help="default: this checkout's git commit")
    ap.add_argument("--kiln", default=None, help="the kiln binary (default $KILN, build/kiln)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv[1:])
    if os.path.exists(args.out):
        print(f"research.py: error: '{args.out}' exists already", file=sys.stderr)
        return 2
    try:
        model, f, y, sp, metrics = train(args)
        _, _, val_begin, val_end = sp.ranges[-1]  # with instruments, the last one's
        os.makedirs(args.out)
        mdir = os.path.join(args.out, "model")
        model.save_model_dir(mdir, dataset=args.data, name=args.name,
                             code_version=code_version(args.code_version),
                             train_config=dict(CONFIG, steps=args.steps, batch_size=args.batch,
                                               lr=args.lr, seed=args.seed,
                                               val_fraction=args.val_fraction),
                             metrics=metrics)
        p = subprocess.run([kiln_binary(args.kiln), "golden", "make", "--model", mdir, "--data",
                            args.data, "--windows", str(args.windows)], capture_output=True,
                           text=True)
        if p.returncode:
            raise kiln.Error(p.stderr.strip() or f"kiln golden make exited {p.returncode}")
        ref = os.path.join(args.out, "reference.safetensors")
        model.reference_outputs(mdir, ref)
        # The held-out rows as a kiln dataset (of the last instrument, with several), and the
        # notebook's predictions on them (one sequence from the first row, as kiln infer runs
        # a file).
        held = os.path.join(args.out, "heldout.safetensors")
        kt.write_safetensors(held, {"features": f[val_begin:val_end],
                                    "targets": y[val_begin:val_end]})
        pred = model.predict(f[val_begin:val_end])
        kt.write_safetensors(os.path.join(args.out, "predictions.safetensors"),
                             {"outputs": pred.astype(np.float32)})
    except kiln.Error as e:
        print(f"research.py: error: {e}", file=sys.stderr)
        return 2
    print(f"model directory '{mdir}' (step {model.step}, torch {torch.__version__}); reference "
          f"outputs '{ref}'; held-out rows '{held}' and the notebook's predictions on them "
          f"'{os.path.join(args.out, 'predictions.safetensors')}'")
    return 0


def compare(argv):
    ap = argparse.ArgumentParser(prog="research.py compare",
                                 description="the notebook's predictions against kiln infer's")
    ap.add_argument("predictions")
    ap.add_argument("inferred")
    ap.add_argument("--rtol", type=float, default=1e-4, help="as kiln's reference.rtol")
    ap.add_argument("--atol", type=float, default=1e-5, help="as kiln's reference.atol")
    args = ap.parse_args(argv)
    try:
        a = kt.read_safetensors(args.inferred)[0]["outputs"]
        b = kt.read_safetensors(args.predictions)[0]["outputs"]
        c = kt.compare(a, b, rtol=args.rtol, atol=args.atol)
    except kiln.Error as e:
        print(f"research.py: error: {e}", file=sys.stderr)
        return 2
    print(f"{c['compared']} outputs: max relative error {c['max_rel_err']:.3g}, max abs "
          f"{c['max_abs_err']:.3g} at scale {c['scale']:.3g}, {c['outside']} outside (rtol "
          f"{args.rtol:g}, atol {args.atol:g} x scale): {'within' if c['passed'] else 'OUTSIDE'}")
    return 0 if c["passed"] else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
