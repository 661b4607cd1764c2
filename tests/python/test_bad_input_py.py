"""The Python package on bad input (issue 29, item 8): docs/python.md promises kiln.Error naming
the problem, and never numpy's, sqlite's or json's exceptions, a file other than the one named,
or outputs quietly changed. Each case here did one of those before:

- a NUL byte in a path or a column name was cut by ctypes, and the object the prefix names was
  opened or written (bad_input_py_nul_*);
- Model.forward let numpy's exceptions through (a ragged list), and a broadcast view of 2^31
  rows asked for a 32 GiB float32 copy before its shape was looked at (bad_input_py_forward_*);
- Stream.push(x, out=an int32 array) truncated the outputs to integers (bad_input_py_push_out);
- kiln.Run on a metrics.db with values not of their declared types raised ValueError or
  JSONDecodeError, and a 100 KB event message made every row of the events table 400 KB wide
  (bad_input_py_run_*);
- kiln.torch.TSMoE.from_model_dir raised TypeError or ValueError on malformed headers, allocated
  what a config of absurd sizes asked for, and blocked for ever on a FIFO
  (bad_input_py_torch_*)."""

import json
import os
import shutil
import sqlite3
import struct
import threading
import time

import numpy as np

import fixtures_bindings as fx
import kiln
import kiln.torch as kt


def expect_error(fn, *contains):
    """fn() raises kiln.Error whose message holds each of contains; returns the error."""
    try:
        fn()
    except kiln.Error as e:
        for c in contains:
            assert c in str(e), (c, str(e))
        return e
    except Exception as e:  # noqa: BLE001 - the point: nothing but kiln.Error
        raise AssertionError(f"{type(e).__name__} instead of kiln.Error: {e}") from None
    raise AssertionError("no kiln.Error raised")


# ---- NUL bytes ------------------------------------------------------------------------------

def test_bad_input_py_nul_in_paths(tmp):
    """The prefix before a NUL names a real model, dataset, run and output file: each must be
    refused, not opened or written."""
    model, data, run = fx.model(), fx.dataset(), fx.run()
    expect_error(lambda: kiln.Model(model + "\0/elsewhere"), "NUL")
    expect_error(lambda: kiln.Model(os.fsencode(model) + b"\0x"), "NUL")
    expect_error(lambda: kiln.read_dataset(data + "\0.csv"), "NUL")
    expect_error(lambda: kiln.Run(run + "\0x"), "NUL")
    expect_error(lambda: kiln.runs(run + "\0x"), "NUL")
    out = os.path.join(tmp, "out.st")
    x, y = np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)
    expect_error(lambda: kiln.write_dataset(out + "\0.bak", x, y), "NUL")
    assert not os.path.exists(out), "the prefix of a path with a NUL was written"
    expect_error(lambda: kt.TSMoE.from_model_dir(model + "\0x"), "NUL")
    expect_error(lambda: kt.read_safetensors(data + "\0x"), "NUL")
    # kiln.torch's writers: the os module raised ValueError.
    expect_error(lambda: kt.write_safetensors(out + "\0x", {"a": np.zeros(2, np.float32)}),
                 "NUL")
    expect_error(lambda: kt.sha256_file(data + "\0x"), "NUL")
    m = kt.TSMoE.from_model_dir(model)
    expect_error(lambda: m.save_model_dir(os.path.join(tmp, "m\0x")), "NUL")
    expect_error(lambda: m.save_model_dir(os.path.join(tmp, "m"), dataset=data + "\0"), "NUL")
    assert not os.path.exists(out) and not os.path.exists(os.path.join(tmp, "m"))


def test_bad_input_py_nul_in_names(tmp):
    """A column name with a NUL was stored cut at it ("a\\0b" as "a"); where/sort of kiln.runs
    likewise."""
    out = os.path.join(tmp, "d.st")
    x, y = np.zeros((4, 2), np.float32), np.zeros((4, 1), np.float32)
    expect_error(lambda: kiln.write_dataset(out, x, y, ["a\0b", "c"], ["t"]), "NUL", "feature")
    expect_error(lambda: kiln.write_dataset(out, x, y, ["a", "c"], ["t\0"]), "NUL", "target")
    expect_error(lambda: kiln.write_dataset(out, x, y, ["a", "\ud800"], ["t"]), "UTF-8")
    assert not os.path.exists(out)
    expect_error(lambda: kiln.runs(fx.run(), where="state=finished\0x"), "NUL")
    expect_error(lambda: kiln.runs(fx.run(), sort="val_loss\0x"), "NUL")
    # Good names still go through.
    kiln.write_dataset(out, x, y, ["a", "c"], ["t"])
    assert kiln.read_dataset(out).feature_names == ["a", "c"]


# ---- forward and push -------------------------------------------------------------------------

def test_bad_input_py_forward_numpy_errors(tmp):
    with kiln.Model(fx.model()) as m:
        F = m.n_features
        expect_error(lambda: m.forward([[0.0] * F, [0.0] * (F - 1)]), "features",
                     "not an array of numbers")
        expect_error(lambda: m.forward([[[0.0] * F], [[0.0] * F, [1.0] * F]]), "features")
        expect_error(lambda: m.forward([["a"] * F]), "features")
        with m.stream() as s:
            expect_error(lambda: s.push([[0.0], [1.0, 2.0]]), "features")
            expect_error(lambda: kiln.push_many([s], [[0.0] * F, [0.0]]), "features")
        # A good call after the refusals.
        assert m.forward(np.zeros((3, F))).shape == (3, m.n_outputs)
    # kiln.torch's array arguments alike.
    t = kt.TSMoE.from_model_dir(fx.model())
    ragged = [[0.0] * 6, [0.0]]
    expect_error(lambda: t.predict(ragged), "inputs")
    expect_error(lambda: t.set_input_norm(ragged), "features")
    expect_error(lambda: t.set_target_norm(ragged), "targets")
    expect_error(lambda: kt.compare(ragged, ragged), "compare")
    expect_error(lambda: kt.write_safetensors(os.path.join(tmp, "w.st"), {"a": ragged}), "'a'")


def test_bad_input_py_forward_huge_view(tmp):
    """A broadcast view of 2^31 rows takes no memory; its float32 copy would take 2^31 x F x 4
    bytes. Its shape is refused first, in milliseconds."""
    with kiln.Model(fx.model()) as m:
        F = m.n_features
        big = np.broadcast_to(np.zeros(F), (1 << 31, F))
        t0 = time.monotonic()
        expect_error(lambda: m.forward(big), "rows")
        expect_error(lambda: m.forward(np.broadcast_to(np.zeros(F), (1 << 16, 1 << 15, F))),
                     "rows")
        with m.stream() as s:
            expect_error(lambda: kiln.push_many([s], big), "shape")
        assert time.monotonic() - t0 < 5, "refused only after copying"


def test_bad_input_py_push_out(tmp):
    with kiln.Model(fx.model()) as m, m.stream() as s:
        F, O = m.n_features, m.n_outputs
        x = np.linspace(-1, 1, F)
        for bad in (np.zeros(O, np.int32), np.zeros(O, np.float64), np.zeros(O + 1, np.float32)):
            expect_error(lambda: s.push(x, out=bad), "out", "float32")
        ro = np.zeros(O, np.float32)
        ro.flags.writeable = False
        expect_error(lambda: s.push(x, out=ro), "out", "writable")
        assert s.ticks == 0, "a refused push moved the stream"
        out = np.zeros(O, np.float32)
        assert s.push(x, out=out) is out and np.any(out != 0)


# ---- kiln.Run on a hostile metrics.db --------------------------------------------------------

def hostile_run(tmp, sql, *args):
    d = os.path.join(tmp, "run")
    shutil.copytree(fx.run(), d)
    con = sqlite3.connect(os.path.join(d, "metrics.db"))
    con.execute(sql, args)
    con.commit()
    con.close()
    return kiln.Run(d)


def test_bad_input_py_run_wrong_types(tmp):
    cases = [
        ("UPDATE steps SET loss = 'abc' WHERE step = (SELECT min(step) FROM steps)",
         "steps", "'loss'", "a REAL"),
        ("UPDATE steps SET applied = 'x' WHERE step = (SELECT max(step) FROM steps)",
         "steps", "'applied'", "an INTEGER"),
        ("UPDATE steps SET applied = 2.5 WHERE step = (SELECT max(step) FROM steps)",
         "steps", "'applied'", "an INTEGER"),
        ("UPDATE steps SET lr = x'00ff' WHERE step = (SELECT min(step) FROM steps)",
         "steps", "'lr'", "a REAL"),
        ("UPDATE layers SET expert_load = 'not json'", "layers", "'expert_load'", "JSON"),
        ("UPDATE layers SET expert_load = '{\"a\": 1}'", "layers", "'expert_load'", "JSON"),
        ("UPDATE layers SET expert_load = '[\"x\", 1]'", "layers", "'expert_load'", "JSON"),
        ("UPDATE layers SET expert_load = '" + "[" * 100000 + "'", "layers", "'expert_load'",
         "JSON"),
        ("UPDATE events SET message = x'00ff'", "events", "'message'", "TEXT"),
    ]
    for i, (sql, *words) in enumerate(cases):
        sub = os.path.join(tmp, str(i))
        os.mkdir(sub)
        run = hostile_run(sub, sql)
        e = expect_error(run.metrics, "metrics.db", *words)
        assert "row " in str(e), str(e)
    # A table the trainer never writes, of a type kiln does not know, still reads (as TEXT).
    os.mkdir(os.path.join(tmp, "ok"))
    run = hostile_run(os.path.join(tmp, "ok"), "CREATE TABLE extra (k INTEGER PRIMARY KEY, v BLOBBY)")
    assert len(run.metrics()["extra"]) == 0


def test_bad_input_py_run_long_messages(tmp):
    """TEXT columns are str objects: one 100 KB message among 200 short ones costs its own
    100 KB, not 200 x 400 KB of fixed-width unicode (80 MB; 7.45 GiB in the attack's run)."""
    d = os.path.join(tmp, "run")
    shutil.copytree(fx.run(), d)
    con = sqlite3.connect(os.path.join(d, "metrics.db"))
    cols = [r[1] for r in con.execute("PRAGMA table_info(events)")]
    assert "message" in cols, cols
    base = con.execute("SELECT coalesce(max(id), 0) FROM events").fetchone()[0]
    for k in range(200):
        con.execute("INSERT INTO events (id, step, time, kind, message) VALUES (?, 1, 0, 'note', ?)",
                    (base + 1 + k, "x" * (100_000 if k == 7 else 10)))
    con.commit()
    con.close()
    ev = kiln.Run(d).events
    assert ev["message"].dtype == object, ev["message"].dtype
    assert ev.nbytes < 1 << 20, f"events table takes {ev.nbytes} bytes"
    assert max(len(m) for m in ev["message"]) == 100_000
    assert len(kiln.Run(d).to_pandas()["events"]) == len(ev)


# ---- kiln.torch model files -----------------------------------------------------------------

def st_bytes(header, data=b""):
    h = json.dumps(header).encode()
    return struct.pack("<Q", len(h)) + h + data


def test_bad_input_py_torch_malformed_headers(tmp):
    good_cfg = json.dumps({"format": "kiln-tsmoe/1", "n_features": 2, "n_outputs": 1,
                           "d_model": 4, "n_layers": 1, "n_heads": 1, "d_ff": 4, "n_experts": 0,
                           "top_k": 0, "seq_len": 4, "attn_window": 4})
    t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    cases = {
        "header a list": ([1, 2], "not a JSON object"),
        "shape of strings": ({"a": dict(t, shape=["2"])}, "malformed"),
        "shape an object": ({"a": dict(t, shape={"x": 1})}, "malformed"),
        "negative dimension": ({"a": dict(t, shape=[-2])}, "malformed"),
        "bool dimension": ({"a": dict(t, shape=[True, 2])}, "malformed"),
        "float offset": ({"a": dict(t, data_offsets=[0.5, 8])}, "malformed"),
        "three offsets": ({"a": dict(t, data_offsets=[0, 4, 8])}, "malformed"),
        "dtype a number": ({"a": dict(t, dtype=7)}, "malformed"),
        "entry a string": ({"a": "F32"}, "malformed"),
        "huge shape": ({"a": dict(t, shape=[1 << 62, 1 << 62])}, "bytes for"),
        "metadata not strings": ({"__metadata__": {"kiln.config": {"n": 1}}, "a": t},
                                 "__metadata__"),
        "config not an object": ({"__metadata__": {"kiln.config": "[1]"}, "a": t},
                                 "model config must be a dict"),
        "config with a string size": ({"__metadata__": {"kiln.config": good_cfg.replace(
            '"d_model": 4', '"d_model": "4"')}, "a": t}, "d_model"),
        "config nested deep": ({"__metadata__": {"kiln.config": "[" * 100000}, "a": t},
                               "kiln.config"),
        "config of a tensor missing": ({"__metadata__": {"kiln.config": good_cfg}, "a": t},
                                       "is missing"),
    }
    for name, (header, words) in cases.items():
        d = os.path.join(tmp, name.replace(" ", "-"))
        os.mkdir(d)
        with open(os.path.join(d, "model.safetensors"), "wb") as f:
            f.write(st_bytes(header, b"\0" * 8))
        e = expect_error(lambda: kt.TSMoE.from_model_dir(d), words)
        assert "model.safetensors" in str(e), (name, str(e))


def test_bad_input_py_torch_absurd_sizes(tmp):
    """A config of sizes kiln's C check refuses is refused here too, before any allocation; one
    within kiln's limits whose tensors the file does not hold is refused by the tensor's name,
    also before the module is made."""
    cfg = {"format": "kiln-tsmoe/1", "n_features": 2, "n_outputs": 1, "d_model": 1 << 20,
           "n_layers": 1, "n_heads": 1, "d_ff": 4, "n_experts": 0, "top_k": 0, "seq_len": 4,
           "attn_window": 4}
    t0 = time.monotonic()
    for k, v, words in (("d_model", 1 << 20, "too large"), ("n_layers", 1 << 30, "too large"),
                        ("seq_len", 1 << 40, "at most 2^30"), ("norm_eps", 1e300, "norm_eps")):
        p = os.path.join(tmp, f"{k}.safetensors")
        c = dict(cfg, d_model=4)
        c[k] = v
        with open(p, "wb") as f:
            f.write(st_bytes({"__metadata__": {"kiln.config": json.dumps(c)}}))
        expect_error(lambda: kt.TSMoE.from_model_dir(p), words)
    # Within kiln's limits (d_model 16384: 3 x 16384^2 elements of qkv, 3 GiB) but not in the
    # file: named, not allocated.
    p = os.path.join(tmp, "big.safetensors")
    with open(p, "wb") as f:
        f.write(st_bytes({"__metadata__": {"kiln.config": json.dumps(
            dict(cfg, d_model=16384, d_ff=16))}}))
    expect_error(lambda: kt.TSMoE.from_model_dir(p), "norm.in_mean", "missing")
    assert time.monotonic() - t0 < 5


def test_bad_input_py_torch_not_a_file(tmp):
    """A FIFO with no writer and /dev/zero are refused as not regular files, at once (a read
    of either would block or never end)."""
    fifo = os.path.join(tmp, "fifo")
    os.mkfifo(fifo)
    done = []

    def go():
        for p in (fifo, "/dev/zero", tmp):
            try:
                kt.read_safetensors(p)
            except kiln.Error as e:
                done.append(str(e))

    th = threading.Thread(target=go, daemon=True)
    th.start()
    th.join(10)
    if th.is_alive():
        with open(fifo, "wb"):  # let a blocked open return, so the thread can end
            pass
        raise AssertionError("read_safetensors blocked on a FIFO or /dev/zero")
    assert len(done) == 3 and all("not a regular file" in m for m in done), done
