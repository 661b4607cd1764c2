"""kiln.Run and kiln.runs: training runs read back (docs/train.md, "The run directory").

run.json, the state, the checkpoints and the best one come from kiln_run_read, the code `kiln
runs show` reads with; kiln.runs is `kiln runs list --json` (kiln_runs_list). The metrics
tables are read with Python's sqlite3 from metrics.db opened read-only (a `mode=ro` URI), all
four in one read transaction, as kiln's own readers do: a run being trained (SQLite in WAL
mode) can be read at any moment, and never sees half of a step."""

from __future__ import annotations

import ctypes
import json
import os
import sqlite3
import urllib.parse
from typing import Any, Dict, Iterable, List, NamedTuple, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._lib import PathLike, check, lib, usage


class Checkpoint(NamedTuple):
    """A checkpoint of a run: its step and the path of its safetensors file."""

    step: int
    path: str


# metrics.db (runs/metrics.c; its schema is a contract in docs/formats.md, which
# tests/python/test_runs_schema.py checks this reader against) is read by its own schema, so
# that a table or column the trainer adds comes through without a change here: each column by its declared type, INTEGER as int64
# (NULL read as -1), REAL as float64 (NULL read as NaN), TEXT as Python str objects (a
# fixed-width unicode field would make every row as wide as the longest: one 100 KB event
# message asked for 7.45 GiB), and layers.expert_load (a JSON array of reals in TEXT) as
# float64 [E]; rows in primary-key order. A value that is not of its column's declared type (a
# file not written by kiln) is kiln.Error naming the table, column and row.
_KINDS = {"INTEGER": "i", "REAL": "f", "TEXT": "s"}
_KIND_NAMES = {"i": "an INTEGER", "f": "a REAL", "s": "TEXT", "j": "a JSON array of numbers"}
# expert_load holds one value per expert: kiln's n_experts is at most 4096.
_MAX_EXPERTS = 4096


def _internal(table: str) -> bool:
    """A table the trainer keeps for its readers' speed, not a metric: the per-bucket sums of
    the curves (step_sums, layer_sums, tensor_sums, and how far each is done) and the index
    of tensor names."""
    return table.endswith("_sums") or table.endswith("_sums_done") or table == "tensor_names"


def _schema(con: sqlite3.Connection) -> Dict[str, Tuple[str, List[Tuple[str, str]]]]:
    """{table: (order, [(column, kind)])} for every table of the database."""
    out = {}
    names = [r[0] for r in con.execute(
        "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%' "
        "ORDER BY name")]
    for t in names:
        info = con.execute(f"PRAGMA table_info(\"{t}\")").fetchall()  # cid, name, type, _, _, pk
        cols = [(r[1], "j" if (t, r[1]) == ("layers", "expert_load")
                 else _KINDS.get(str(r[2]).upper(), "s")) for r in info]
        pk = [r[1] for r in sorted(info, key=lambda r: r[5]) if r[5]]
        out[t] = (", ".join(f'"{c}"' for c in pk) or "rowid", cols)
    return out


class Table(np.ndarray):
    """A metrics table: a numpy structured array (one field per column, rows in key order),
    with to_pandas()."""

    def to_pandas(self) -> Any:
        """The table as a pandas DataFrame, one column per field (expert_load as lists)."""
        import pandas as pd

        cols = {}
        for name in self.dtype.names:
            v = np.asarray(self[name])
            cols[name] = list(v) if v.ndim > 1 else v
        return pd.DataFrame(cols)


def _bad(db: str, table: str, name: str, row: int, kind: str, v: object) -> _lib.Error:
    shown = repr(v)
    if len(shown) > 60:
        shown = shown[:57] + "..."
    return _lib.Error(f"'{db}': table '{table}' column '{name}' row {row}: {shown} is not "
                      f"{_KIND_NAMES[kind]}", _lib.ERR_FORMAT)


def _expert_load(db: str, table: str, name: str, r: int, v: object) -> List[float]:
    if v is None or v == "":
        return []
    if not isinstance(v, str):
        raise _bad(db, table, name, r, "j", v)
    try:
        a = json.loads(v)
    except (ValueError, RecursionError):
        raise _bad(db, table, name, r, "j", v) from None
    if not isinstance(a, list) or len(a) > _MAX_EXPERTS or not all(
            isinstance(x, (int, float)) and not isinstance(x, bool) for x in a):
        raise _bad(db, table, name, r, "j", v)
    return a


def _select(con: sqlite3.Connection, db: str, table: str, order: str,
            cols: List[Tuple[str, str]]) -> Table:
    sql = ", ".join(f'coalesce("{n}", -1)' if k == "i" else f'"{n}"' for n, k in cols)
    rows = con.execute(f'SELECT {sql} FROM "{table}" ORDER BY {order}').fetchall()
    fields, data = [], []
    for i, (name, kind) in enumerate(cols):
        col = [r[i] for r in rows]
        if kind == "i":
            for r, v in enumerate(col):
                if type(v) is not int or not -(1 << 63) <= v < (1 << 63):
                    raise _bad(db, table, name, r, kind, v)
            a = np.array(col, dtype=np.int64)
        elif kind == "f":
            for r, v in enumerate(col):
                if v is not None and type(v) not in (int, float):
                    raise _bad(db, table, name, r, kind, v)
            a = np.array([np.nan if v is None else float(v) for v in col], dtype=np.float64)
        elif kind == "s":
            for r, v in enumerate(col):
                if isinstance(v, bytes):
                    raise _bad(db, table, name, r, kind, v)
            a = np.empty(len(col), dtype=object)
            a[:] = ["" if v is None else str(v) for v in col]
        else:
            lists = [_expert_load(db, table, name, r, v) for r, v in enumerate(col)]
            width = max([0] + [len(v) for v in lists])
            a = np.full((len(rows), width), np.nan)
            for r, v in enumerate(lists):
                a[r, :len(v)] = v
        fields.append((name, a.dtype, a.shape[1:]))
        data.append(a)
    out = np.empty(len(rows), dtype=[(n, t, s) if s else (n, t) for n, t, s in fields])
    for (name, _, _), a in zip(fields, data):
        out[name] = a
    return out.view(Table)


class Run:
    """A training run directory (docs/train.md): run (run.json as a dict), config (its
    "config"), state ("finished", "running", "interrupted", "diverged", "failed"), message
    (the trainer's, for diverged and failed), step (the newest logged), checkpoints (a list of
    Checkpoint, ascending) and best_checkpoint (the one `kiln export --best` takes, or None),
    read when the Run is made and again by refresh(). The metrics tables steps, layers,
    tensors and events are read from metrics.db on each access (a run being trained grows);
    metrics() reads all four in one transaction.

    Run(path): path is the run directory (`kiln train --run-dir`)."""

    run: Dict[str, Any]
    config: Dict[str, Any]
    state: str
    message: Optional[str]
    step: int
    checkpoints: List[Checkpoint]
    best_checkpoint: Optional[Checkpoint]

    def __init__(self, path: PathLike) -> None:
        self.dir = os.fsdecode(_lib.path_bytes(path, "run directory"))
        self.refresh()

    def refresh(self) -> "Run":
        """Read run.json, the state and the checkpoints again; returns the Run."""
        out = ctypes.c_void_p()
        check(lib().kiln_run_read(os.fsencode(self.dir), ctypes.byref(out)))
        doc = json.loads(_lib.take_text(out.value))
        self.run = doc["run"]
        self.config = self.run["config"]
        self.state = doc["state"]
        self.message = doc["message"]
        self.step = doc["step"]
        self.checkpoints = [Checkpoint(c["step"], c["path"]) for c in doc["checkpoints"]]
        best = doc["best_checkpoint"]
        self.best_checkpoint = next((c for c in self.checkpoints if c.step == best), None)
        return self

    @property
    def run_id(self) -> Optional[str]:
        """run.json's run_id."""
        return self.run.get("run_id")

    @property
    def dataset_sha256(self) -> Optional[str]:
        """run.json's dataset_sha256: the digest of the dataset the run trained on."""
        return self.run.get("dataset_sha256")

    def _connect(self) -> sqlite3.Connection:
        db = os.path.join(self.dir, "metrics.db")
        if not os.path.exists(db):
            raise _lib.Error(f"'{self.dir}': no metrics.db: the run has logged no step yet",
                             _lib.ERR_NOTFOUND)
        uri = "file:" + urllib.parse.quote(os.path.abspath(db)) + "?mode=ro"
        try:
            # 5 s for a writer's lock, as kiln's readers wait (runs/metrics.c).
            return sqlite3.connect(uri, uri=True, timeout=5.0, isolation_level=None)
        except sqlite3.Error as e:
            raise _lib.Error(f"'{db}': cannot open: {e}", _lib.ERR_IO) from None

    def metrics(self, tables: Optional[Iterable[str]] = None) -> Dict[str, Table]:
        """The metrics tables named (None: the metrics a run logs: steps, layers, tensors,
        events, val_targets where present, and any table a later trainer adds; not the
        trainer's own summary and index tables, *_sums, *_sums_done and tensor_names, which
        hold nothing a step did not log), as a dict of Table, read in one read transaction."""
        con = self._connect()
        try:
            con.execute("BEGIN")
            schema = _schema(con)
            if tables is None:
                tables = [t for t in schema if not _internal(t)]
            for t in tables or ():
                if t not in schema:
                    raise usage(f"no metrics table {t!r} in '{self.dir}/metrics.db' (tables: "
                                f"{', '.join(schema)})")
            db = os.path.join(self.dir, "metrics.db")
            out = {t: _select(con, db, t, *schema[t]) for t in tables}
            con.execute("COMMIT")
            return out
        except sqlite3.Error as e:
            raise _lib.Error(f"'{self.dir}/metrics.db': {e}", _lib.ERR_IO) from None
        finally:
            con.close()

    @property
    def steps(self) -> Table:
        """metrics.db's steps table: one row per logged step (loss, lr, val_loss, ...)."""
        return self.metrics(("steps",))["steps"]

    @property
    def layers(self) -> Table:
        """metrics.db's layers table: one row per logged step and layer."""
        return self.metrics(("layers",))["layers"]

    @property
    def tensors(self) -> Table:
        """metrics.db's tensors table: one row per logged step and tensor."""
        return self.metrics(("tensors",))["tensors"]

    @property
    def events(self) -> Table:
        """metrics.db's events table: the run's events (start, resume, preemption, ...)."""
        return self.metrics(("events",))["events"]

    def to_pandas(self) -> Dict[str, Any]:
        """The metrics tables (metrics(): steps, layers, tensors, events, val_targets) as a
        dict of pandas DataFrames, read in one read transaction; not the summary tables."""
        return {k: v.to_pandas() for k, v in self.metrics().items()}

    def __repr__(self) -> str:
        return f"kiln.Run({self.dir!r}, {self.state}, step {self.step})"


def runs(*paths: Union[PathLike, Sequence[PathLike]], where: Union[str, Sequence[str]] = (),
         sort: Optional[str] = None, top: int = 0) -> Dict[str, Any]:
    """`kiln runs list --json PATH...` as a dict (format "kiln-runs-list/1"): each path a run
    directory or a directory of runs (a sweep); where: "KEY=VALUE" filters (a str or a list),
    sort: a column or config key ("-KEY" descending; default val_loss), top: the first N. A
    run that cannot be read is a row in state "error" (its message in the row), not an
    exception."""
    if len(paths) == 1 and isinstance(paths[0], (list, tuple)):
        paths = tuple(paths[0])
    if not paths:
        raise usage("runs: give at least one path")
    if isinstance(where, str):
        where = (where,)
    if not isinstance(top, int) or top < 0:
        raise usage(f"runs: top must be a non-negative int, not {top!r}")
    cp = (ctypes.c_char_p * len(paths))(*[_lib.path_bytes(p, "runs path") for p in paths])
    cw = (ctypes.c_char_p * max(1, len(where)))(*[_lib.text_bytes(w, "runs: where") for w in where])
    out = ctypes.c_void_p()
    check(lib().kiln_runs_list(cp, len(paths), cw, len(where),
                               None if sort is None else _lib.text_bytes(sort, "runs: sort"), top,
                               ctypes.byref(out)))
    return json.loads(_lib.take_text(out.value))
