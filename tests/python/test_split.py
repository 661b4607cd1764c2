"""Issue 30: a dataset's time and group columns from Python (kiln.write_dataset's time= and
groups=, byte for byte what `kiln data import --time --group` writes; kiln.read_dataset's time,
groups and group_names), and kiln.split / kiln.torch.split against the split `kiln train` records
in run.json: every instrument split at the same moment, windows inside one instrument."""

import json
import os

import numpy as np

import fixtures_bindings as fx
import kiln
from test_bindings import expect_error

S = 16  # seq_len of the runs below
SMALL = ["--set", "steps=1", "--set", f"seq_len={S}", "--set", f"attn_window={S}", "--set",
         "d_model=8", "--set", "n_heads=2", "--set", "d_ff=16", "--set", "n_layers=1", "--set",
         "n_experts=2", "--set", "top_k=1", "--set", "batch_size=2"]
# Three instruments of different lengths, the later ones listed from later dates: long format,
# sorted by date, as a CSV from pandas or R comes.
INSTRUMENTS = (("SPX", 0, 400), ("NDX", 60, 340), ("RUT", 150, 200))


def long_rows():
    """[(date, symbol)] sorted by date, and features [N, 3], targets [N, 1] in that order."""
    day0 = np.datetime64("2000-01-03")
    rows = sorted(((day0 + k, name) for name, first, n in INSTRUMENTS
                   for k in range(first, first + n)), key=lambda r: r[0])
    rng = np.random.default_rng(7)
    return rows, rng.standard_normal((len(rows), 3)), rng.standard_normal((len(rows), 1))


def write_csv(path, rows, x, y):
    with open(path, "w") as f:
        f.write("date,sym,a,b,c,ret\n")
        for (d, name), xr, yr in zip(rows, x, y):
            f.write(f"{d},{name}," + ",".join(repr(float(v)) for v in [*xr, *yr]) + "\n")


def test_split_dataset_time_groups_bytes_equal_import(tmp):
    rows, x, y = long_rows()
    csv = os.path.join(tmp, "long.csv")
    write_csv(csv, rows, x, y)
    want = os.path.join(tmp, "imported.safetensors")
    fx.kiln("data", "import", "--csv", csv, "--features", "a,b,c", "--targets", "ret",
            "--time", "date", "--group", "sym", "--out", want)
    with open(want, "rb") as f:
        want_bytes = f.read()
    dates = np.array([d for d, _ in rows])
    syms = [s for _, s in rows]
    secs = dates.astype("datetime64[s]").astype(np.int64)
    variants = {
        "datetime64": dict(time=dates, groups=syms),
        "epoch seconds, numpy labels": dict(time=secs, groups=np.array(syms)),
        "ISO strings": dict(time=[str(d) for d in dates], groups=tuple(syms)),
    }
    for what, kw in variants.items():
        got = os.path.join(tmp, f"py-{len(what)}.safetensors")
        digest = kiln.write_dataset(got, x, y, "a,b,c", "ret", time_column="date",
                                    group_column="sym", **kw)
        with open(got, "rb") as f:
            assert f.read() == want_bytes, f"write_dataset ({what}) differs from kiln data import"
        assert digest == kiln.read_dataset(want).sha256
    try:
        import pandas as pd
    except ImportError:  # pragma: no cover - Debian's python3-pandas is there in the tests
        pd = None
    if pd is not None:
        df = pd.read_csv(csv, parse_dates=["date"])
        got = os.path.join(tmp, "frame.safetensors")
        kiln.write_dataset(got, df, feature_names=["a", "b", "c"], target_names=["ret"],
                           time="date", groups="sym")
        with open(got, "rb") as f:
            assert f.read() == want_bytes, "write_dataset (DataFrame) differs from kiln data import"

    d = kiln.read_dataset(want)
    order = sorted(range(len(rows)), key=lambda i: [n for n, _, _ in INSTRUMENTS].index(syms[i]))
    assert d.group_names == ["SPX", "NDX", "RUT"]
    assert d.time_column == "date" and d.group_column == "sym"
    assert d.groups.dtype == np.int32 and d.time.dtype == np.int64
    assert d.groups.tolist() == [0] * 400 + [1] * 340 + [2] * 200
    assert d.time.tolist() == secs[order].tolist()
    assert d.features.tobytes() == x[order].astype(np.float32).tobytes()
    if pd is not None:
        frame = d.to_pandas()
        assert list(frame.columns[:3]) == ["date", "sym", "a"]
        assert frame["sym"].tolist() == [syms[i] for i in order]
    # Without time and groups: None, and the file as before.
    plain = kiln.read_dataset(fx.dataset())
    assert plain.time is None and plain.groups is None and plain.group_names is None


def test_split_dataset_time_groups_refused(tmp):
    rows, x, y = long_rows()
    dates = np.array([d for d, _ in rows])
    syms = [s for _, s in rows]
    out = os.path.join(tmp, "bad.safetensors")
    back = dates.copy()
    back[[5, 8]] = back[[8, 5]]  # rows 5 and 8: SPX, NDX, ... on days 2 and 3: one goes back
    e = expect_error(lambda: kiln.write_dataset(out, x, y, time=back, groups=syms),
                     5,
                     ["'" + out + "'", "goes backwards", "group '"])
    assert "row " in str(e)
    nat = dates.copy().astype("datetime64[s]")
    nat[3] = np.datetime64("NaT")
    expect_error(lambda: kiln.write_dataset(out, x, y, time=nat), 5, ["time row 3 is missing"])
    expect_error(lambda: kiln.write_dataset(out, x, y, time=dates[:-1]), 5, ["time: shape"])
    expect_error(lambda: kiln.write_dataset(out, x, y, groups=[None] + syms[1:]), 5,
                 ["groups row 0 is missing"])
    expect_error(lambda: kiln.write_dataset(out, x, y, time=dates.astype(float)), 5,
                 ["epoch seconds"])
    # No groups: C's check of the file's rule, naming the row.
    expect_error(lambda: kiln.write_dataset(out, x, y, time=back), 5,
                 ["tensor 'time' goes back at row 6"])
    assert not os.path.exists(out)


def trained_split(tmp, data, name, *sets):
    """The split `kiln train` records in run.json for data with these config settings."""
    run = os.path.join(tmp, name)
    fx.kiln("train", "--data", data, "--run-dir", run, *SMALL, *sets)
    with open(os.path.join(run, "run.json")) as f:
        return json.load(f)["split"]


def day(t):
    """kiln_time_format of a midnight: the date."""
    s = str(np.datetime64(int(t), "s"))
    return s[:10] if s.endswith("T00:00:00") else s + "Z"


def recorded(sp, ds, purge_time=None):
    """What run.json's "split" would say of a kiln.Split of ds (train/trainer.c split_json)."""
    j = {} if not purge_time else {"purge_time": purge_time}
    j |= {"by": "rows" if sp.val_from is None else "time", "train_rows": sp.train_rows,
         "val_rows": sp.val_rows, "gap_rows": sp.gap_rows, "val_windows": len(sp.val_starts)}
    if sp.grouped:
        j["groups"] = len(sp.ranges)
    else:
        j.update(train_end=sp.train_end, val_begin=sp.val_begin, val_end=sp.val_end)
    if sp.val_from is not None:
        j["val_from"] = day(sp.val_from)
    if ds.time is not None:
        for k, idx in (("train", sp.train_index()), ("val", sp.val_index())):
            if idx.size:
                j[k + "_first"], j[k + "_last"] = day(ds.time[idx].min()), day(ds.time[idx].max())
    return j


def by_construction(sp, ds, purge_secs=0):
    """Every training window and validation window inside one instrument's own rows, every
    instrument with validation rows, a training row never within the purge of val_from."""
    g = ds.groups
    for tb, te, vb, ve in sp.ranges:
        assert tb < te <= vb < ve, (tb, te, vb, ve)  # each instrument trains and validates
        assert vb - te >= S
        assert g[tb] == g[ve - 1]
        if sp.val_from is not None:
            assert ds.time[vb] >= sp.val_from and ds.time[vb - 1] < sp.val_from
            assert ds.time[te - 1] < sp.val_from - purge_secs
    st = sp.train_starts
    assert st.size == sum(te - tb - S + 1 for tb, te, _, _ in sp.ranges)
    assert np.all(g[st] == g[st + S - 1]), "a training window crosses instruments"
    vi = set(sp.val_index().tolist())
    assert not vi & set((st[:, None] + np.arange(S)).ravel().tolist())
    for s in sp.val_starts:
        assert g[s] == g[s + S - 1] and s in vi and s + S - 1 in vi
    assert len({int(g[s]) for s in sp.val_starts}) == len(sp.ranges)


def test_split_matches_kiln_train(tmp):
    rows, x, y = long_rows()
    data = os.path.join(tmp, "long.safetensors")
    kiln.write_dataset(data, x, y, time=np.array([d for d, _ in rows]),
                       groups=[s for _, s in rows], time_column="date", group_column="sym")
    ds = kiln.read_dataset(data)
    try:
        import kiln.torch as kt
        splitter = kt.split  # what a notebook calls
    except ImportError:  # pragma: no cover - torch is there in the tests
        splitter = kiln.split
    cases = [
        ("fraction", dict(val_fraction=0.2), ["--set", "val_fraction=0.2"], 0),
        ("purge time", dict(val_fraction=0.25, purge_time="10d"),
         ["--set", "val_fraction=0.25", "--set", "purge_time=10d"], 10 * 86400),
        ("val_from", dict(val_fraction=0.2, val_from="2000-11-20", purge_rows=24),
         ["--set", "val_from=2000-11-20", "--set", "purge_rows=24"], 0),
    ]
    for name, kw, sets, purge in cases:
        want = trained_split(tmp, data, name.replace(" ", "-"), *sets)
        vf = kw.pop("val_fraction")
        sp = splitter(ds, vf, S, **kw)
        got = recorded(sp, ds, kw.get("purge_time"))
        assert got == want, (name, got, want)
        by_construction(sp, ds, purge)
        assert splitter(data, vf, S, **kw).ranges == sp.ranges  # a path: the same
        arrays = kiln.split(ds.rows, vf, S, time=ds.time.astype("datetime64[s]"),
                            groups=ds.groups, **kw)  # the columns as arrays: the same
        assert arrays.ranges == sp.ranges and arrays.val_starts.tolist() == sp.val_starts.tolist()
    # The test can fail: the split of the rows alone (what kiln.torch did before, blind to
    # the instruments) puts every validation row in the last instrument, and run.json says
    # otherwise.
    want = trained_split(tmp, data, "blind", "--set", "val_fraction=0.2")
    blind = kiln.split(ds.rows, 0.2, S)
    assert recorded(blind, ds) != want
    assert set(ds.groups[blind.val_index()].tolist()) == {2}
    # Without groups: the old row rule, and a Split that unpacks as kiln.torch.split's tuple.
    plain = kiln.read_dataset(fx.dataset())
    want = trained_split(tmp, fx.dataset(), "plain", "--set", "val_fraction=0.2")
    sp = splitter(plain, 0.2, S)
    assert recorded(sp, plain) == want
    train_end, val_begin, val_end = splitter(plain.rows, 0.2, S)
    assert (train_end, val_begin, val_end) == (want["train_end"], want["val_begin"],
                                               want["val_end"])
    assert sp.train_starts.tolist() == list(range(train_end - S + 1))
    grouped = kiln.split(ds, 0.2, S)
    expect_error(lambda: tuple(grouped), 5, ["3 instruments", "split.ranges"])


def test_split_refusals(tmp):
    rows, x, y = long_rows()
    data = os.path.join(tmp, "long.safetensors")
    kiln.write_dataset(data, x, y, time=np.array([d for d, _ in rows]),
                       groups=[s for _, s in rows])
    ds = kiln.read_dataset(data)
    # kiln train's own refusals, word for word.
    for sets, kw in ((["--set", "val_from=2010-01-01"], dict(val_from="2010-01-01")),
                     (["--set", "val_fraction=0.2", "--set", "seq_len=150",
                       "--set", "attn_window=150"], dict())):
        seq = 150 if not kw else S
        msg = fx.cli_error("train", "--data", data, "--run-dir", os.path.join(tmp, "r"),
                           *SMALL, *sets)
        e = expect_error(lambda: kiln.split(ds, 0.2, seq, **kw), 5)
        assert str(e) in msg, (str(e), msg)
    expect_error(lambda: kiln.split(ds, 0.2, S, purge_time="ten days"), 5,
                 ["purge_time 'ten days' is not a duration"])
    expect_error(lambda: kiln.split(ds.rows, 0.2, S, val_from="2000-06-01"), 5,
                 ["no time column"])
    expect_error(lambda: kiln.split(10, 0.2, S, groups=[0, 1, 0, 1, 1, 1, 1, 1, 1, 1]), 5,
                 ["tensor 'group' row 2 is 0"])
    expect_error(lambda: kiln.split("nope.safetensors", 0.2, S), 1, ["nope.safetensors"])
    expect_error(lambda: kiln.split(ds, 0.2, 0), 5, ["seq_len 0"])
    expect_error(lambda: kiln.split(2.5, 0.2, S), 5, ["number of rows"])
