"""Shared files for the bindings' tests (test_bindings*, test_dataset*, test_runs*): a synthetic
dataset, a short run and its exported models, made once per suite run with the real `kiln`
and removed at exit. Also: running kiln, reading a safetensors file by hand, and catching
anything written to the process's stderr (fd 2), where a library that prints would write."""

import atexit
import contextlib
import json
import os
import shutil
import struct
import subprocess
import tempfile

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))

_dir = None
_made = {}


def kiln(*args, check=True):
    """Run the CLI; returns the CompletedProcess (text). check: a non-zero exit raises."""
    p = subprocess.run([KILN, *map(str, args)], capture_output=True, text=True)
    if check and p.returncode:
        raise AssertionError(f"kiln {' '.join(map(str, args))}: exit {p.returncode}: {p.stderr}")
    return p


def cli_error(*args):
    """The message of the one `kiln: error:` line a failing command prints."""
    p = kiln(*args, check=False)
    assert p.returncode != 0, f"kiln {args} succeeded"
    lines = [l for l in p.stderr.splitlines() if l.startswith("kiln: error: ")]
    assert len(lines) == 1, p.stderr
    return lines[0][len("kiln: error: "):]


def shared_dir():
    global _dir
    if _dir is None:
        _dir = tempfile.mkdtemp(prefix="kiln-py-shared-")
        atexit.register(shutil.rmtree, _dir, True)
    return _dir


def _once(name, make):
    if name not in _made:
        _made[name] = make(os.path.join(shared_dir(), name))
    return _made[name]


def dataset():
    """3000 rows, 6 features, 2 targets: longer than one forward block (1024 rows)."""
    def make(p):
        kiln("data", "synth", "--seed", 1, "--rows", 3000, "--features", 6, "--outputs", 2,
             "--out", p)
        return p
    return _once("d.safetensors", make)


def run():
    """A finished 20-step run with validations at 10 and 20 and checkpoints at 15 and 20."""
    def make(p):
        kiln("train", "--data", dataset(), "--run-dir", p, "--set", "steps=20",
             "--set", "ckpt_every=5", "--set", "eval_every=10", "--set", "keep=2")
        return p
    return _once("run", make)


def model(dtype="f32"):
    def make(p):
        kiln("export", run(), "--out", p, "--dtype", dtype)
        return p
    return _once(f"model-{dtype}", make)


def read_safetensors(path):
    """{name: numpy array} and the metadata, read by hand (F32 only)."""
    with open(path, "rb") as f:
        data = f.read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    meta = header.pop("__metadata__", {})
    out = {}
    for name, t in header.items():
        assert t["dtype"] == "F32", t
        a, b = t["data_offsets"]
        out[name] = np.frombuffer(data[8 + n + a:8 + n + b], dtype="<f4").reshape(t["shape"])
    return out, meta


def infer(model_dir, features, tmp, stream=False):
    """`kiln infer` on a file holding features [N, F]: its outputs [N, O]."""
    import kiln as k

    src = os.path.join(tmp, "infer-in.safetensors")
    out = os.path.join(tmp, "infer-out.safetensors")
    k.write_dataset(src, features, np.zeros((features.shape[0], 1), np.float32))
    kiln("infer", "--model", model_dir, "--input", src, "--out", out, *(["--stream"] if stream else []))
    return read_safetensors(out)[0]["outputs"]


@contextlib.contextmanager
def stderr_captured():
    """Whatever the process writes to fd 2 inside the block, in the list yielded (one str)."""
    got = []
    with tempfile.TemporaryFile() as f:
        saved = os.dup(2)
        os.dup2(f.fileno(), 2)
        try:
            yield got
        finally:
            os.dup2(saved, 2)
            os.close(saved)
            f.seek(0)
            got.append(f.read().decode("utf-8", "replace"))
