"""kiln.Model, kiln.Stream, kiln.push_many against `kiln infer` on the same files: bit for bit."""

import os
import threading

import numpy as np

import fixtures_bindings as fx
import kiln


def expect_error(fn, code=None, contains=()):
    """fn() must raise kiln.Error (with code, whose message holds each of contains) and print
    nothing; returns the error."""
    with fx.stderr_captured() as err:
        try:
            fn()
        except kiln.Error as e:
            got = e
        else:
            raise AssertionError("no kiln.Error raised")
    assert err[0] == "", f"printed on stderr: {err[0]!r}"
    assert code is None or got.code == code, (got.code, str(got))
    for c in contains:
        assert c in str(got), (c, str(got))
    return got


def test_bindings_forward_bitwise_infer(tmp):
    d = fx.dataset()
    x = kiln.read_dataset(d).features
    out = os.path.join(tmp, "o.safetensors")
    fx.kiln("infer", "--model", fx.model(), "--input", d, "--out", out)
    want = fx.read_safetensors(out)[0]["outputs"]
    with kiln.Model(fx.model()) as m:
        y = m.forward(x)
        assert y.dtype == np.float32 and y.shape == want.shape
        assert y.tobytes() == want.tobytes(), "forward differs from kiln infer"
        # float64, Fortran order, a strided view: the same f32 rows, the same bits.
        assert m.forward(x.astype(np.float64)).tobytes() == want.tobytes()
        assert m.forward(np.asfortranarray(x)).tobytes() == want.tobytes()
        wide = np.zeros((x.shape[0], 2 * x.shape[1]), np.float32)
        wide[:, ::2] = x
        assert m.forward(wide[:, ::2]).tobytes() == want.tobytes()
        assert m(x[None]).shape == (1,) + want.shape


def test_bindings_forward_batch_bitwise_infer(tmp):
    """[B, S, F] in one call: each sequence is what `kiln infer` gives for a file of its rows
    (a row's bits do not depend on the rows batched with it, docs/runtime.md)."""
    x = kiln.read_dataset(fx.dataset()).features
    seqs = np.stack([x[0:300], x[1000:1300], x[2500:2800]])
    with kiln.Model(fx.model()) as m:
        y = m.forward(seqs)
        assert y.shape == (3, 300, m.n_outputs)
        for b in range(3):
            want = fx.infer(fx.model(), seqs[b], tmp)
            assert y[b].tobytes() == want.tobytes(), f"sequence {b} differs from kiln infer"
        # Longer than a block (1024 rows): each sequence is cut into chunks.
        long = np.stack([x[0:1100], x[1500:2600]])
        y = m.forward(long)
        for b in range(2):
            want = fx.infer(fx.model(), long[b], tmp)
            assert y[b].tobytes() == want.tobytes(), f"long sequence {b} differs from kiln infer"
    with kiln.Model(fx.model("bf16")) as m:
        y = m.forward(seqs)
        for b in range(3):
            want = fx.infer(fx.model("bf16"), seqs[b], tmp)
            assert y[b].tobytes() == want.tobytes(), f"bf16 sequence {b} differs from kiln infer"


def test_bindings_bf16_bitwise_infer(tmp):
    x = kiln.read_dataset(fx.dataset()).features[:500]
    with kiln.Model(fx.model("bf16")) as m:
        assert m.is_bf16
        assert m.forward(x).tobytes() == fx.infer(fx.model("bf16"), x, tmp).tobytes()


def test_bindings_stream_bitwise_infer(tmp):
    x = kiln.read_dataset(fx.dataset()).features[:1500]
    want = fx.infer(fx.model(), x, tmp, stream=True)
    with kiln.Model(fx.model()) as m, m.stream() as s:
        got = np.stack([s.push(row) for row in x])
        assert got.tobytes() == want.tobytes(), "Stream.push differs from kiln infer --stream"
        assert s.ticks == len(x)
        s.reset()
        assert s.ticks == 0
        buf = np.empty(m.n_outputs, np.float32)
        assert s.push(x[0].astype(np.float64), out=buf) is buf
        assert buf.tobytes() == want[0].tobytes()


def test_bindings_push_many_bitwise(tmp):
    """push_many over 3 streams: each stream's outputs are kiln infer --stream's of its rows."""
    x = kiln.read_dataset(fx.dataset()).features
    seqs = [x[0:200], x[700:900], x[2000:2200]]
    with kiln.Model(fx.model()) as m:
        streams = [m.stream() for _ in seqs]
        got = np.stack([kiln.push_many(streams, np.stack([s[t] for s in seqs]))
                        for t in range(200)], axis=1)
        for i, s in enumerate(seqs):
            want = fx.infer(fx.model(), s, tmp, stream=True)
            assert got[i].tobytes() == want.tobytes(), f"streams[{i}] differs"
        assert kiln.push_many([], np.zeros((0, m.n_features))).shape[0] == 0


def test_bindings_threads(tmp):
    """One model, several Python threads at once: forward and streams give what one thread
    does (ctypes lets go of the GIL in the calls)."""
    x = kiln.read_dataset(fx.dataset()).features[:1200]
    with kiln.Model(fx.model()) as m:
        want = m.forward(x)
        with m.stream() as s:
            want_s = np.stack([s.push(r) for r in x[:300]])
        results, errors = [None] * 8, []

        def work(i):
            try:
                if i % 2:
                    results[i] = m.forward(x)
                else:
                    with m.stream() as s:
                        results[i] = np.stack([s.push(r) for r in x[:300]])
            except Exception as e:  # reported below
                errors.append(e)

        threads = [threading.Thread(target=work, args=(i,)) for i in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors, errors
        for i, r in enumerate(results):
            assert r.tobytes() == (want if i % 2 else want_s).tobytes(), f"thread {i}"


def test_bindings_bad_input(tmp):
    """Each refusal is a kiln.Error with kiln's message and code, and nothing printed."""
    with kiln.Model(fx.model()) as m:
        F = m.n_features
        expect_error(lambda: m.forward(np.zeros((10, F + 1))), 5, ["[S, 6]", "(10, 7)"])
        expect_error(lambda: m.forward(np.zeros(F)), 5, ["expected [S, 6] or [B, S, 6]"])
        expect_error(lambda: m.forward(np.zeros((0, F))), 5)
        expect_error(lambda: m.forward(np.array([["a"] * F])), 5, ["dtype <U1", "float32"])
        expect_error(lambda: m.forward(np.zeros((3, F), dtype=object)), 5, ["dtype object"])
        expect_error(lambda: m.forward(np.zeros((3, F), dtype=complex)), 5)
        bad = np.zeros((5, F))
        bad[3, 2] = np.nan
        expect_error(lambda: m.forward(bad), 7, ["input [0,3,2] is not finite"])
        expect_error(lambda: m.forward(np.stack([np.zeros_like(bad), bad])), 7,
                     ["input [1,3,2] is not finite"])
        with m.stream() as s:
            expect_error(lambda: s.push(np.zeros(F - 1)), 5, ["expected [6]"])
            expect_error(lambda: s.push(bad[3]), 7, ["feature 2 is not finite"])
            assert s.ticks == 0
            expect_error(lambda: kiln.push_many([s, s], np.zeros((2, F))), 5,
                         ["streams[1] is streams[0] again"])
            expect_error(lambda: kiln.push_many([s], np.zeros((2, F))), 5, ["expected [1, 6]"])
            with kiln.Model(fx.model()) as other, other.stream() as s2:
                e = expect_error(lambda: kiln.push_many([s, s2], np.zeros((2, F))), 5)
                assert "streams[1] is on model" in str(e), str(e)
        expect_error(lambda: s.push(np.zeros(F)), 5, ["closed"])
    expect_error(lambda: m.forward(np.zeros((3, F))), 5, ["closed"])
    m.close()  # twice is fine

    # A missing model: the message kiln infer prints for it.
    missing = os.path.join(tmp, "no-such-model")
    want = fx.cli_error("infer", "--model", missing, "--input", fx.dataset(), "--out",
                        os.path.join(tmp, "o"))
    e = expect_error(lambda: kiln.Model(missing))
    assert str(e) == want and e.message == want, (str(e), want)
    assert e.code != 0
    # A damaged model file: kiln_model_open's check, named.
    broken = os.path.join(tmp, "broken")
    os.mkdir(broken)
    with open(os.path.join(broken, "model.safetensors"), "wb") as f:
        f.write(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      ")
    want = fx.cli_error("infer", "--model", broken, "--input", fx.dataset(), "--out",
                        os.path.join(tmp, "o"))
    assert str(expect_error(lambda: kiln.Model(broken), 3)) == want
    expect_error(lambda: kiln.Model(fx.model(), device="gpu"), 5, ["cpu, cuda or cuda:N"])
    expect_error(lambda: kiln.Model(42), 5, ["expected a path"])


def test_bindings_library(tmp):
    assert kiln.version().startswith("0.")
    assert os.path.exists(kiln.library_path())
    s = repr(kiln.Model(fx.model()))
    assert "F=6, O=2" in s, s


def test_bindings_device(tmp):
    """device="cuda": on a machine with a GPU, the CUDA runtime's outputs to f32 rounding of the
    CPU's; elsewhere the refusal `kiln infer --device cuda` prints (DEVICE or UNSUPPORTED)."""
    x = kiln.read_dataset(fx.dataset()).features[:400]
    try:
        gpu = kiln.Model(fx.model(), device="cuda")
    except kiln.Error as e:
        assert e.code in (9, 13), (e.code, str(e))
        want = fx.cli_error("infer", "--model", fx.model(), "--input", fx.dataset(), "--out",
                            os.path.join(tmp, "o"), "--device", "cuda")
        assert str(e) == want, (str(e), want)
        expect_error(lambda: kiln.Model(fx.model(), device="cuda"), e.code)
        return
    with gpu, kiln.Model(fx.model()) as cpu:
        assert gpu.device == "cuda:0"
        want = cpu.forward(x)
        scale = max(float(np.sqrt(np.mean(want ** 2))), 1e-6)
        assert np.max(np.abs(gpu.forward(x) - want)) <= 1e-4 * scale
        with gpu.stream() as s:
            got = np.stack([s.push(r) for r in x[:50]])
        assert np.max(np.abs(got - want[:50])) <= 1e-4 * scale


def test_bindings_lifetimes(tmp):
    """Objects own their handles: a stream keeps its model alive, collection frees both, a
    stream busy on another thread is refused rather than shared, close() is final."""
    x = kiln.read_dataset(fx.dataset()).features[:20]
    s = kiln.Model(fx.model()).stream()  # the model's only reference is the stream's
    want = np.stack([s.push(r) for r in x])
    del s
    for _ in range(50):  # open and drop without close: freed by collection
        m = kiln.Model(fx.model())
        m.stream().push(x[0])
    with kiln.Model(fx.model()) as m:
        s, t = m.stream(), m.stream()
        assert np.stack([s.push(r) for r in x]).tobytes() == want.tobytes()
        s._lock.acquire()  # as a push in flight on another thread holds it
        try:
            expect_error(lambda: s.push(x[0]), 5, ["in use by another thread"])
            expect_error(lambda: kiln.push_many([t, s], x[:2]), 5, ["in use by another thread"])
            assert t.ticks == 0, "push_many changed a stream before refusing"
        finally:
            s._lock.release()
        m.close()
        expect_error(lambda: s.push(x[0]), 5, ["closed"])
        expect_error(lambda: m.stream(), 5, ["closed"])
