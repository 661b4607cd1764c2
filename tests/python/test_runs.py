"""kiln.Run and kiln.runs against the sqlite3 shell and `kiln runs show` / `kiln runs list`."""

import json
import os
import shutil
import signal
import subprocess
import time

import numpy as np

import fixtures_bindings as fx
import kiln
from test_bindings import expect_error


def sqlite_rows(db, table, cols, order):
    """The table as the sqlite3 shell reads it: reals printed exactly (%!.17g reads back the
    same double), NULL as 'null'."""
    sel = ", ".join(
        f"CASE WHEN {c} IS NULL THEN 'null' ELSE printf('%!.17g', {c}) END" if k == "f"
        else f"coalesce({c}, 'null')" for c, k in cols)
    out = subprocess.run(["sqlite3", "-readonly", "-separator", "\x1f", "-newline", "\x1e", db,
                          f"SELECT {sel} FROM {table} ORDER BY {order}"],
                         capture_output=True, text=True, check=True).stdout
    return [r.split("\x1f") for r in out.split("\x1e") if r]


def sqlite_tables(db):
    """{table: (order, [(column, kind)])} from the schema, as the sqlite3 shell reads it: kind f
    (REAL), i (INTEGER), s (TEXT), j (expert_load, a JSON array in TEXT); order the primary
    key."""
    def shell(sql):
        return subprocess.run(["sqlite3", "-readonly", "-separator", "|", db, sql],
                              capture_output=True, text=True, check=True).stdout.splitlines()

    kinds = {"REAL": "f", "INTEGER": "i", "TEXT": "s"}
    out = {}
    for t in shell("SELECT name FROM sqlite_master WHERE type = 'table'"):
        info = [r.split("|") for r in shell(f"PRAGMA table_info({t})")]
        cols = [(r[1], "j" if r[1] == "expert_load" else kinds[r[2]]) for r in info]
        pk = [r[1] for r in sorted(info, key=lambda r: int(r[5])) if int(r[5])]
        out[t] = (", ".join(pk), cols)
    return out


def test_runs_metrics_equal_sqlite3(tmp):
    run = kiln.Run(fx.run())
    db = os.path.join(fx.run(), "metrics.db")
    schema = sqlite_tables(db)
    # By default the metrics a run logs; the trainer's summary and index tables only by name
    # (issue 30: to_pandas() handed a researcher step_sums and tensor_names too).
    logged = set(run.metrics())
    assert {"steps", "layers", "tensors", "events"} <= logged, logged
    assert not {t for t in logged if t.endswith("_sums") or t.endswith("_sums_done")}, logged
    assert "step_sums" in schema and "tensor_names" not in logged, logged
    assert set(run.to_pandas()) == logged
    tables = run.metrics(list(schema))
    assert set(tables) == set(schema)
    for name, (order, cols) in schema.items():
        want = sqlite_rows(db, name, cols, order)
        got = tables[name]
        assert len(want) == len(got) > 0, (name, len(want), len(got))
        assert list(got.dtype.names) == [c for c, _ in cols]
        for r, row in enumerate(want):
            for (c, kind), text in zip(cols, row):
                v = got[c][r]
                if kind == "f":
                    w = float("nan") if text == "null" else float(text)
                    assert (np.isnan(v) and np.isnan(w)) or v == w, (name, r, c, v, text)
                elif kind == "i":
                    assert int(v) == int(text), (name, r, c, v, text)
                elif kind == "s":
                    assert str(v) == text, (name, r, c, v, text)
                else:  # expert_load: JSON array
                    assert list(v) == json.loads(text), (name, r, c, v, text)
    # The single-table properties read the same; pandas sees the same values.
    assert run.steps.tobytes() == tables["steps"].tobytes()
    frames = run.to_pandas()
    assert frames["steps"]["loss"].to_numpy().tobytes() == tables["steps"]["loss"].tobytes()
    assert len(frames["layers"]["expert_load"][0]) == run.config["n_experts"]


def test_runs_config_and_checkpoints(tmp):
    run = kiln.Run(fx.run())
    with open(os.path.join(fx.run(), "run.json")) as f:
        want = json.load(f)
    assert run.run == want and run.config == want["config"]
    assert run.run_id == want["run_id"] and run.dataset_sha256 == want["dataset_sha256"]
    assert run.state == "finished" and run.step == 20 and run.message is None
    assert [c.step for c in run.checkpoints] == [15, 20]
    for c in run.checkpoints:
        assert os.path.samefile(c.path, os.path.join(fx.run(), "ckpt", f"step-{c.step:08d}.safetensors"))
    show = fx.kiln("runs", "show", fx.run()).stdout
    assert f"(best validation loss: {run.best_checkpoint.step}," in show, show
    # The best is the one kiln export --best takes.
    out = fx.kiln("export", fx.run(), "--best", "--out", os.path.join(tmp, "m")).stdout
    assert f"step-{run.best_checkpoint.step:08d}" in out, out


def test_runs_list_equal_cli(tmp):
    sweep = os.path.join(tmp, "sweep")
    os.mkdir(sweep)
    shutil.copytree(fx.run(), os.path.join(sweep, "a"))
    fx.kiln("train", "--data", fx.dataset(), "--run-dir", os.path.join(sweep, "b"),
            "--set", "steps=10", "--set", "eval_every=5", "--set", "lr=0.01")
    for args in ([], ["--sort", "-step"], ["--where", "lr=0.01"], ["--top", "1"]):
        want = json.loads(fx.kiln("runs", "list", "--json", *args, sweep).stdout)
        kw = {}
        if args and args[0] == "--sort":
            kw = {"sort": args[1]}
        elif args and args[0] == "--where":
            kw = {"where": [args[1]]}
        elif args:
            kw = {"top": int(args[1])}
        assert kiln.runs(sweep, **kw) == want, args
    assert kiln.runs([os.path.join(sweep, "a"), os.path.join(sweep, "b")]) == json.loads(
        fx.kiln("runs", "list", "--json", os.path.join(sweep, "a"), os.path.join(sweep, "b")).stdout)
    # A damaged run is a row, as the CLI lists it (which exits 1).
    with open(os.path.join(sweep, "b", "run.json"), "w") as f:
        f.write("{")
    p = fx.kiln("runs", "list", "--json", sweep, check=False)
    assert p.returncode == 1
    got = kiln.runs(sweep)
    assert got == json.loads(p.stdout) and got["errors"] == 1
    # Refusals: kiln's messages.
    nowhere = os.path.join(tmp, "nowhere")
    e = expect_error(lambda: kiln.runs(nowhere), 8)
    assert str(e) == fx.cli_error("runs", "list", nowhere)
    e = expect_error(lambda: kiln.runs(sweep, sort="bogus"), 5)
    assert str(e) == fx.cli_error("runs", "list", "--sort", "bogus", sweep)


def test_runs_bad_dir(tmp):
    e = expect_error(lambda: kiln.Run(tmp), 8, ["no run.json"])
    assert str(e) == fx.cli_error("runs", "show", tmp)
    expect_error(lambda: kiln.Run(fx.run()).metrics(["nope"]), 5, ["no metrics table 'nope'"])


def test_runs_while_training(tmp):
    """A run read while kiln train writes it: state running, tables that only grow, each read a
    whole step (every step row has its layer rows); then stopped with SIGTERM, interrupted."""
    d = os.path.join(tmp, "live")
    p = subprocess.Popen([fx.KILN, "train", "--data", fx.dataset(), "--run-dir", d,
                          "--set", "steps=100000", "--set", "eval_every=0", "--set", "ckpt_every=0"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        seen, states = [], set()
        while len(set(seen)) < 3:
            assert p.poll() is None, "the trainer stopped"
            if not os.path.exists(os.path.join(d, "metrics.db")):
                time.sleep(0.01)  # a pause, not a deadline
                continue
            try:
                run = kiln.Run(d)
            except kiln.Error:
                # Before run.json lands, or metrics.db's tables (kiln runs show fails there
                # too); once a read has succeeded, every later one must.
                assert not seen, "a read failed after one succeeded"
                continue
            states.add(run.state)
            m = run.metrics(("steps", "layers"))
            n = len(m["steps"])
            assert list(m["steps"]["step"]) == list(range(1, n + 1))
            assert len(m["layers"]) == n * run.config["n_layers"], (n, len(m["layers"]))
            assert not seen or n >= seen[-1]
            seen.append(n)
        assert states == {"running"}, states
    finally:
        p.send_signal(signal.SIGTERM)
        p.wait()
    run = kiln.Run(d)
    assert run.state == "interrupted" and run.step >= seen[-1]
    assert [c.step for c in run.checkpoints] == [run.step]
