"""The Python bindings' cost against C in the same run (make bench-python; figures on stdout,
which the Makefile keeps in build/bench/python.txt).

1. kiln.Model.forward over 20000 rows (one sequence) against `kiln infer` on the same file:
   the command's wall time (start, load, read, forward, write) against Python doing the same
   work in a warm interpreter (Model + read_dataset + forward), and forward alone against
   kiln_model_forward timed in C (bench_push) on the same model and rows: what the binding
   adds to the call.
2. One Stream.push from Python against kiln_stream_push timed in C (bench_push), with what the
   difference is made of: the bare ctypes call (kiln_stream_push through ctypes with the
   pointers ready), the output array, the input's pointer.

Every figure is the best of ROUNDS interleaved rounds (on a shared machine the least disturbed
round is the closest to the work's own cost; a median moves with the neighbours' load);
OPENBLAS_NUM_THREADS=1 for all (one core). Usage: bench_python.py BUILD_DIR."""

import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ["OPENBLAS_NUM_THREADS"] = "1"
BUILD = sys.argv[1] if len(sys.argv) > 1 else os.path.join(ROOT, "build")
os.environ.setdefault("KILN_LIB", os.path.join(os.path.abspath(BUILD), "libkiln.so"))
sys.path.insert(0, os.path.join(ROOT, "python"))

import numpy as np  # noqa: E402

import kiln  # noqa: E402
from kiln import _lib  # noqa: E402

KILN = os.path.join(BUILD, "kiln")
ROUNDS = 9
ROWS = 20000
PUSHES = 20000
CHUNK = 1000


def sh(*args):
    subprocess.run([*map(str, args)], check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)


def median_time(fn, rounds=ROUNDS):
    ts = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t0)
    return statistics.median(ts)


def main():
    tmp = tempfile.mkdtemp(prefix="kiln-bench-python-")
    data = os.path.join(tmp, "d.safetensors")
    sh(KILN, "data", "synth", "--seed", 1, "--rows", ROWS, "--features", 8, "--outputs", 2,
       "--out", data)
    run = os.path.join(tmp, "run")
    sh(KILN, "train", "--data", data, "--run-dir", run, "--set", "steps=5", "--set",
       "eval_every=0")
    model = os.path.join(tmp, "model")
    sh(KILN, "export", run, "--out", model)
    out = os.path.join(tmp, "o.safetensors")

    # ---- batch ----
    x = kiln.read_dataset(data).features
    m = kiln.Model(model)
    L = _lib.lib()
    y = np.empty((ROWS, m.n_outputs), np.float32)
    xp, yp, h = x.ctypes.data, y.ctypes.data, m._h

    def raw():
        assert L.kiln_model_forward(h, xp, 1, ROWS, yp) == 0

    def whole():
        with kiln.Model(model) as mm:
            mm.forward(kiln.read_dataset(data).features)

    def c_side():
        """bench_push once: kiln_stream_push (us, the fastest chunk) and kiln_model_forward (s)."""
        out = subprocess.run([os.path.join(BUILD, "bench_push"), model, data, "1"], check=True,
                             capture_output=True, text=True).stdout.split()
        got = dict(zip(out[::2], map(float, out[1::2])))
        return got["push_ns"] / 1e3, got["forward_ms"] / 1e3

    cli, py_whole, py_fwd, ct_fwd, c_fwd, c_push = [], [], [], [], [], []
    for _ in range(ROUNDS):  # interleaved, so that the machine's load hits all alike
        cp, cf = c_side()
        c_push.append(cp)
        c_fwd.append(cf)
        cli.append(median_time(lambda: sh(KILN, "infer", "--model", model, "--input", data,
                                          "--out", out), 1))
        py_whole.append(median_time(whole, 1))
        py_fwd.append(median_time(lambda: m.forward(x), 1))
        ct_fwd.append(median_time(raw, 1))
    with open(out, "rb") as f:
        infer_bytes = f.read()
    assert m.forward(x).tobytes() in infer_bytes, "forward differs from kiln infer"
    cli, py_whole, py_fwd, ct_fwd, c_fwd = map(min, (cli, py_whole, py_fwd, ct_fwd, c_fwd))

    # ---- stream ----
    xs = [np.ascontiguousarray(r) for r in x[:PUSHES]]
    s = m.stream()
    push, sp = s.push, s._h
    o = np.empty(m.n_outputs, np.float32)
    op = o.ctypes.data
    xptr = [r.ctypes.data for r in xs]
    cpush, cticks = L.kiln_stream_push, L.kiln_stream_ticks

    def py_push(a, b):
        for r in xs[a:b]:
            push(r)

    def py_push_out(a, b):
        for r in xs[a:b]:
            push(r, out=o)

    def ct_push(a, b):
        for p in xptr[a:b]:
            cpush(sp, p, op)

    def ct_noop(a, b):  # a ctypes call that does nothing: the bare price of crossing into C
        for _ in xptr[a:b]:
            cticks(sp)

    def np_empty(a, b):
        for _ in xptr[a:b]:
            np.empty(2, np.float32)

    def np_ptr(a, b):
        for r in xs[a:b]:
            r.ctypes.data

    # Each figure: one call's mean over the fastest CHUNK consecutive calls, as bench_push
    # times the C push.
    per = {k: float("inf") for k in ("push", "push_out", "ctypes_push", "ctypes_noop",
                                     "np_empty", "np_ptr")}
    for _ in range(ROUNDS):  # interleaved with the C side's pushes
        c_push.append(c_side()[0])
        for name, fn in (("push", py_push), ("push_out", py_push_out), ("ctypes_push", ct_push),
                         ("ctypes_noop", ct_noop), ("np_empty", np_empty), ("np_ptr", np_ptr)):
            s.reset()
            for k in range(0, PUSHES, CHUNK):
                t = median_time(lambda: fn(k, k + CHUNK), 1) / CHUNK * 1e6
                per[name] = min(per[name], t)
    c_push = min(c_push)
    s.close()
    m.close()
    shutil.rmtree(tmp, ignore_errors=True)

    r = lambda a, b: a / b  # noqa: E731
    print(f"kiln Python bindings against C, same run (OPENBLAS_NUM_THREADS=1, best of {ROUNDS} interleaved rounds)")
    print(f"model: kiln-tsmoe/1 F=8 O=2 D={m.config['d_model']} L={m.config['n_layers']} "
          f"E={m.config['n_experts']} K={m.config['top_k']}; data: {ROWS} rows (kiln data synth)")
    print()
    print(f"batch over {ROWS} rows as one sequence")
    print(f"  kiln infer (whole command)             {cli * 1e3:9.2f} ms")
    print(f"  Python Model+read_dataset+forward      {py_whole * 1e3:9.2f} ms   "
          f"{r(py_whole, cli):.3f}x kiln infer")
    print(f"  Python Model.forward                   {py_fwd * 1e3:9.2f} ms   "
          f"{r(py_fwd, cli):.3f}x kiln infer")
    print(f"  kiln_model_forward via bare ctypes     {ct_fwd * 1e3:9.2f} ms")
    print(f"  kiln_model_forward in C (bench_push)   {c_fwd * 1e3:9.2f} ms   "
          f"Model.forward is {r(py_fwd, c_fwd):.3f}x C")
    print()
    print(f"one Stream.push: the mean over the fastest {CHUNK} consecutive ticks of {ROUNDS} passes over {PUSHES}")
    print(f"  kiln_stream_push in C (bench_push)     {c_push:9.3f} us")
    print(f"  Stream.push (new output array)         {per['push']:9.3f} us   "
          f"{r(per['push'], c_push):.2f}x C, +{per['push'] - c_push:.3f} us")
    print(f"  Stream.push(out=buffer)                {per['push_out']:9.3f} us   "
          f"+{per['push_out'] - c_push:.3f} us")
    print(f"  kiln_stream_push via bare ctypes       {per['ctypes_push']:9.3f} us   "
          f"+{per['ctypes_push'] - c_push:.3f} us")
    print(f"  parts of the difference: a ctypes call doing nothing {per['ctypes_noop']:.3f} us, "
          f"np.empty(O) {per['np_empty']:.3f} us, array.ctypes.data {per['np_ptr']:.3f} us")


if __name__ == "__main__":
    main()
