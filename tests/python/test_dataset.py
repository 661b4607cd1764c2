"""kiln.write_dataset and kiln.read_dataset against `kiln data import`, `inspect` and `export`."""

import hashlib
import json
import os

import numpy as np

import fixtures_bindings as fx
import kiln
from test_bindings import expect_error


def numbers(rows=257, seed=3):
    """Values of many magnitudes, with some not exactly representable in f32."""
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((rows, 5)) * 10.0 ** rng.integers(-8, 9, (rows, 5))
    a[0] = [0.1, -0.0, 1e-40, 3.4028234e38, 123456789.123]  # rounding, a subnormal, f32 max
    return a


def write_csv(path, header, a):
    with open(path, "w") as f:
        f.write(",".join(header) + "\n")
        for row in a:
            f.write(",".join(repr(float(v)) for v in row) + "\n")


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def test_dataset_bytes_equal_import(tmp):
    a = numbers()
    names = ["open", "flow", "vol", "ret_fwd", "ret_fwd2"]
    csv = os.path.join(tmp, "x.csv")
    write_csv(csv, names, a)
    want = os.path.join(tmp, "imported.safetensors")
    fx.kiln("data", "import", "--csv", csv, "--features", "open,flow,vol", "--targets",
            "ret_fwd,ret_fwd2", "--out", want)
    with open(want, "rb") as f:
        want_bytes = f.read()

    got = os.path.join(tmp, "numpy.safetensors")
    digest = kiln.write_dataset(got, a[:, :3], a[:, 3:], feature_names=names[:3],
                                target_names=names[3:])
    with open(got, "rb") as f:
        assert f.read() == want_bytes, "write_dataset differs from kiln data import"
    assert digest == sha256(want)
    inspect = json.loads(fx.kiln("data", "inspect", "--json", got).stdout)
    assert inspect["sha256"] == digest

    # float32 input, non-contiguous, names as "a,b,c" text: the same bytes.
    f32 = np.asfortranarray(a.astype(np.float32))
    got2 = os.path.join(tmp, "f32.safetensors")
    kiln.write_dataset(got2, f32[:, :3], f32[:, 3:], "open,flow,vol", "ret_fwd,ret_fwd2")
    assert sha256(got2) == digest

    # read back: kiln's loader, values and names.
    d = kiln.read_dataset(got)
    assert d.sha256 == digest and d.rows == len(a)
    assert d.features.tobytes() == a[:, :3].astype(np.float32).tobytes()
    assert d.targets.tobytes() == a[:, 3:].astype(np.float32).tobytes()
    assert d.feature_names == names[:3] and d.target_names == names[3:]


def test_dataset_pandas(tmp):
    import pandas as pd

    a = numbers(rows=40)
    names = ["open", "flow", "vol", "ret_fwd", "ret_fwd2"]
    csv = os.path.join(tmp, "x.csv")
    write_csv(csv, ["time"] + names, np.column_stack([np.arange(len(a)), a]))
    want = os.path.join(tmp, "imported.safetensors")
    fx.kiln("data", "import", "--csv", csv, "--features", "vol,open", "--targets", "ret_fwd",
            "--out", want)
    df = pd.DataFrame(a, columns=names)
    df.insert(0, "time", pd.date_range("2026-01-01", periods=len(a), freq="min"))
    # Columns picked by name, as import picks them; or two frames; or a frame and a Series.
    p1, p2, p3 = (os.path.join(tmp, f"{i}.safetensors") for i in range(3))
    kiln.write_dataset(p1, df, feature_names=["vol", "open"], target_names=["ret_fwd"])
    kiln.write_dataset(p2, df[["vol", "open"]], df[["ret_fwd"]])
    kiln.write_dataset(p3, df[["vol", "open"]], df["ret_fwd"])
    for p in (p1, p2, p3):
        assert sha256(p) == sha256(want), p
    back = kiln.read_dataset(p1).to_pandas()
    assert list(back.columns) == ["vol", "open", "ret_fwd"]
    assert back["open"].to_numpy().tobytes() == a[:, 0].astype(np.float32).tobytes()


def test_dataset_read_synth(tmp):
    """read_dataset of a `kiln data synth` file: the values `kiln data export` prints exactly."""
    d = kiln.read_dataset(fx.dataset())
    text = fx.kiln("data", "export", fx.dataset(), "--rows", 50).stdout.splitlines()
    assert text[0].split(",") == d.feature_names + d.target_names
    csv = np.array([[float(v) for v in line.split(",")] for line in text[1:]], dtype=np.float32)
    assert csv.tobytes() == np.hstack([d.features[:50], d.targets[:50]]).tobytes()
    assert d.sha256 == sha256(fx.dataset())


def test_dataset_without_names(tmp):
    p = os.path.join(tmp, "n.safetensors")
    x, y = np.arange(12.0).reshape(6, 2), np.arange(6.0)
    kiln.write_dataset(p, x, y)
    d = kiln.read_dataset(p)
    assert d.feature_names is None and d.target_names is None
    assert d.targets.shape == (6, 1)
    assert list(d.to_pandas().columns) == ["feature[0]", "feature[1]", "target[0]"]


def test_dataset_bad_input(tmp):
    p = os.path.join(tmp, "keep.safetensors")
    kiln.write_dataset(p, np.ones((4, 2)), np.ones((4, 1)), ["a", "b"], ["t"])
    before = sha256(p)
    x = np.ones((4, 2))
    x[2, 1] = np.inf
    expect_error(lambda: kiln.write_dataset(p, x, np.ones((4, 1))), 7,
                 [f"'{p}': features row 2 column 1 is not finite"])
    expect_error(lambda: kiln.write_dataset(p, np.ones((4, 2)), np.ones((3, 1))), 5,
                 ["4 rows", "3"])
    expect_error(lambda: kiln.write_dataset(p, np.ones((4, 2)), np.ones((4, 1)), ["a", "a"], ["t"]),
                 None, ["name 'a' is used twice"])
    expect_error(lambda: kiln.write_dataset(p, np.ones((4, 2)), np.ones((4, 1)), ["a", "b"]), 5,
                 ["both the features and the targets, or neither"])
    expect_error(lambda: kiln.write_dataset(p, np.ones((4, 2)), np.ones((4, 1)), ["a"], ["t"]), 5,
                 ["1 names for 2 columns"])
    expect_error(lambda: kiln.write_dataset(p, np.array([["x", "y"]] * 4), np.ones((4, 1))), 5,
                 ["dtype <U1"])
    expect_error(lambda: kiln.write_dataset(p, np.full((4, 2), 1e39), np.ones((4, 1))), 7,
                 ["out of range for f32"])
    expect_error(lambda: kiln.write_dataset(p, np.ones((0, 2)), np.ones((0, 1))), 5,
                 ["at least one row"])
    expect_error(lambda: kiln.write_dataset(os.path.join(tmp, "no", "dir.st"), np.ones((4, 2)),
                                            np.ones((4, 1))), 1)
    assert sha256(p) == before, "a refused write changed the file"

    # Reading: kiln's messages, the same as the CLI prints for the same file.
    missing = os.path.join(tmp, "missing.safetensors")
    e = expect_error(lambda: kiln.read_dataset(missing))
    assert str(e) == fx.cli_error("data", "export", missing), str(e)
    model = os.path.join(fx.model(), "model.safetensors")
    e = expect_error(lambda: kiln.read_dataset(model), 3, ["tensor 'features' is missing"])
    assert str(e) == fx.cli_error("data", "export", model)
