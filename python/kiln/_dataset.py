"""kiln.write_dataset, kiln.read_dataset and kiln.split: dataset files (docs/data.md), with
their time and group columns, through kiln_data_*, the writer and loader `kiln data import` and
`kiln train` use, and the train/validation split `kiln train` makes (kiln_data_split)."""

from __future__ import annotations

import ctypes
import hashlib
import os
from typing import Any, Iterator, List, Optional, Sequence, Tuple, Union

import numpy as np

from . import _lib
from ._error import Error
from ._lib import PathLike, check, lib, usage
from ._runtime import as_real_array, to_f32

_F32 = np.dtype(np.float32)
_F32_MAX = float(np.finfo(np.float32).max)
# The validation windows kiln train evaluates on at most (train/trainer.c VAL_WINDOWS_MAX).
TRAIN_VAL_WINDOWS = 256

Names = Union[str, Sequence[str], None]


def _is_frame(x: Any) -> bool:
    return type(x).__module__.startswith("pandas") and hasattr(x, "columns")


def _is_series(x: Any) -> bool:
    return type(x).__module__.startswith("pandas") and hasattr(x, "name") and x.ndim == 1


def _columns(x: Any, what: str, path: str) -> Tuple[np.ndarray, Optional[List[str]]]:
    """x ([N, C], or [N] as one column; numpy or pandas) as a float32 C-contiguous [N, C] array,
    and the names pandas gave it (None for numpy). Values are rounded to f32 as `kiln data
    import` rounds the numbers it parses; a finite value beyond f32's range is refused, as
    import refuses it."""
    names = None
    if _is_frame(x):
        names = [str(c) for c in x.columns]
        x = x.to_numpy()
    elif _is_series(x):
        names = None if x.name is None else [str(x.name)]
        x = x.to_numpy()
    a = as_real_array(x, f"'{path}': {what}")
    if a.ndim == 1:
        a = a.reshape(-1, 1)
    if a.ndim != 2:
        raise usage(f"'{path}': {what}: shape {tuple(a.shape)}, expected [rows, columns]")
    if a.dtype.kind == "f" and a.dtype.itemsize > 4:
        try:
            big = np.isfinite(a) & (np.abs(a) > _F32_MAX)
        except MemoryError:
            raise Error(f"'{path}': {what}: out of memory checking {a.size} values",
                        _lib.ERR_NOMEM) from None
        if big.any():
            r, c = (int(i) for i in np.argwhere(big)[0])
            raise Error(f"'{path}': {what} row {r} column {c}: {a[r, c]!r} is out of range for "
                        "f32", _lib.ERR_NUMERIC)
    return to_f32(a, f"'{path}': {what}"), names


def _names(given: Names, found: Optional[List[str]], n: int, what: str,
           path: str) -> Optional[List[str]]:
    names = given if given is not None else found
    if names is None:
        return None
    if isinstance(names, str):
        names = names.split(",")
    names = [str(s) for s in names]
    if len(names) != n:
        raise usage(f"'{path}': {what}: {len(names)} names for {n} columns")
    return names


def _times(t: Any, rows: int, spath: str) -> np.ndarray:
    """t (epoch seconds as integers, numpy datetime64, ISO 8601 strings or datetime objects
    read as UTC, or a pandas datetime Series / index, naive as UTC) as int64 [rows] seconds
    since 1970, a fraction of a second dropped as `kiln data import` drops it (to the second
    at or before the time)."""
    if type(t).__module__.startswith("pandas"):
        import pandas as pd

        if pd.api.types.is_datetime64_any_dtype(t.dtype):
            if getattr(t.dtype, "tz", None) is not None:
                t = t.dt.tz_convert("UTC").dt.tz_localize(None) if hasattr(t, "dt") \
                    else t.tz_convert("UTC").tz_localize(None)
        t = t.to_numpy()
    try:
        a = t if isinstance(t, np.ndarray) else np.asarray(t)
        if a.dtype.kind in "USO":
            a = a.astype("datetime64[s]")
    except (ValueError, TypeError, OverflowError) as e:
        raise usage(f"'{spath}': time: not times ({e})") from None
    if a.ndim != 1 or a.shape[0] != rows:
        raise usage(f"'{spath}': time: shape {tuple(a.shape)}, expected [{rows}] (one per row)")
    if a.dtype.kind == "M":
        bad = np.isnat(a)
        if bad.any():
            raise usage(f"'{spath}': time row {int(np.argmax(bad))} is missing (NaT)")
        return a.astype("datetime64[s]").astype(np.int64)
    if a.dtype.kind not in "iu":
        raise usage(f"'{spath}': time: dtype {a.dtype}: give epoch seconds as integers, or "
                    "datetime64")
    if a.dtype.kind == "u" and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise usage(f"'{spath}': time row {int(np.argmax(a))} is {int(a.max())}, outside the "
                    "years 0000 to 9999")
    return np.ascontiguousarray(a, dtype=np.int64)


def _group_codes(g: Any, rows: int, spath: str) -> Tuple[np.ndarray, List[str]]:
    """Each row's instrument (any labels: str, int, a pandas Series or Categorical) as int32
    group indices in order of first appearance, and the names (str(label)), as `kiln data
    import --group` numbers them."""
    if type(g).__module__.startswith("pandas"):
        g = g.to_numpy() if hasattr(g, "to_numpy") else np.asarray(g)
    try:
        labels = g if isinstance(g, np.ndarray) else np.asarray(g, dtype=object)
    except (ValueError, TypeError) as e:
        raise usage(f"'{spath}': groups: not one label per row ({e})") from None
    if labels.ndim != 1 or labels.shape[0] != rows:
        raise usage(f"'{spath}': groups: shape {tuple(labels.shape)}, expected [{rows}] (one "
                    "per row)")
    text = []
    for i, v in enumerate(labels.tolist()):
        if v is None or (isinstance(v, float) and v != v):
            raise usage(f"'{spath}': groups row {i} is missing")
        text.append(v.decode("utf-8", "surrogateescape") if isinstance(v, bytes) else str(v))
    names, first, inverse = np.unique(np.array(text, dtype=object), return_index=True,
                                      return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int32)
    rank[order] = np.arange(len(order), dtype=np.int32)
    return rank[inverse].astype(np.int32), [str(names[i]) for i in order]


def _frame_column(frame: Any, v: Any, what: str, spath: str) -> Tuple[Any, Optional[str]]:
    """A column of frame when v names one (the DataFrame form), else v; and its name."""
    if isinstance(v, str):
        if frame is None:
            raise usage(f"'{spath}': {what} {v!r} names a column, but features is not a "
                        "DataFrame")
        if v not in frame.columns:
            raise usage(f"'{spath}': no column {v!r} in the DataFrame")
        return frame[v], v
    name = getattr(v, "name", None) if type(v).__module__.startswith("pandas") else None
    return v, None if name is None else str(name)


def write_dataset(path: PathLike, features: Any, targets: Any = None, feature_names: Names = None,
                  target_names: Names = None, *, time: Any = None, groups: Any = None,
                  time_column: Optional[str] = None,
                  group_column: Optional[str] = None) -> str:
    """Write a dataset file: features [N, F] and targets [N, O] (numpy arrays of any real dtype,
    or pandas DataFrames / Series, whose column names are taken unless names are given; [N] is
    one column). The bytes, and so the digest, are those `kiln data import` writes for the same
    numbers and names. With names, kiln.columns records them (both or neither). With targets
    None, features is a DataFrame and feature_names and target_names pick its columns, as
    `kiln data import --features a,b --targets x` picks a CSV's.

    time (one per row: epoch seconds as integers, datetime64, a pandas datetime Series; or, in
    the DataFrame form, the name of a column) is the tensor `time` of `kiln data import
    --time`; groups (one label per row, each row's instrument; or a column's name) the tensor
    `group` of `--group`: the rows are regrouped stably, each instrument's rows in the order
    given, instruments in order of first appearance, exactly as import regroups a CSV, so the
    same rows give the same bytes. time_column and group_column name them in kiln.time and
    kiln.groups (else the DataFrame column's or Series' name, else "time" and "group"). A time
    earlier than the one before it of the same instrument is refused, naming both rows.

    Written atomically: a refused or failed write leaves an existing file as it was. Returns
    the dataset's sha256 (hex)."""
    p = _lib.path_bytes(path, "path")
    spath = os.fsdecode(p)
    frame = features if _is_frame(features) else None
    if targets is None:
        if frame is None or feature_names is None or target_names is None:
            raise usage(f"'{spath}': no targets: give targets, or a DataFrame with "
                        "feature_names and target_names naming its columns")
        fcols = feature_names.split(",") if isinstance(feature_names, str) else feature_names
        tcols = target_names.split(",") if isinstance(target_names, str) else target_names
        missing = [c for c in list(fcols) + list(tcols) if c not in frame.columns]
        if missing:
            raise usage(f"'{spath}': no column {missing[0]!r} in the DataFrame")
        features, targets = frame[list(fcols)], frame[list(tcols)]
    x, fn = _columns(features, "features", spath)
    y, tn = _columns(targets, "targets", spath)
    if x.shape[0] != y.shape[0]:
        raise usage(f"'{spath}': features have {x.shape[0]} rows but targets have {y.shape[0]}")
    fn = _names(feature_names, fn, x.shape[1], "feature_names", spath)
    tn = _names(target_names, tn, y.shape[1], "target_names", spath)
    if (fn is None) != (tn is None):
        raise usage(f"'{spath}': give the names of both the features and the targets, or neither")
    rows = x.shape[0]
    t = g = None
    gnames: List[str] = []
    if time is not None:
        time, found = _frame_column(frame, time, "time", spath)
        time_column = time_column or found
        t = _times(time, rows, spath)
    if groups is not None:
        groups, found = _frame_column(frame, groups, "groups", spath)
        group_column = group_column or found
        g, gnames = _group_codes(groups, rows, spath)
        order = np.argsort(g, kind="stable")
        if np.any(order != np.arange(rows)):
            x, y, g = x[order], y[order], g[order]
            t = None if t is None else t[order]
        else:
            order = None
        if t is not None:
            back = np.flatnonzero((g[1:] == g[:-1]) & (t[1:] < t[:-1]))
            if back.size:
                i = int(back[0]) + 1
                r, q = (i, i - 1) if order is None else (int(order[i]), int(order[i - 1]))
                raise usage(f"'{spath}': time row {r} goes backwards "
                            f"({np.datetime64(int(t[i]), 's')} after "
                            f"{np.datetime64(int(t[i - 1]), 's')} on row {q}, group "
                            f"'{gnames[g[i]]}')")

    def cnames(names: Optional[List[str]], what: str) -> Optional[ctypes.Array]:
        if names is None:
            return None
        return (ctypes.c_char_p * len(names))(*[_lib.text_bytes(s, f"'{spath}': {what} name")
                                                for s in names])

    extra = None
    if t is not None or g is not None:
        extra = _lib.DataExtra()
        if t is not None:
            extra.time = t.ctypes.data
            extra.time_column = _lib.text_bytes(time_column or "time", f"'{spath}': time_column")
        if g is not None:
            extra.group = g.ctypes.data
            extra.n_groups = len(gnames)
            extra.group_names = cnames(gnames, "group")
            extra.group_column = _lib.text_bytes(group_column or "group",
                                                 f"'{spath}': group_column")
    check(lib().kiln_data_write_extra(p, rows, x.shape[1], y.shape[1], x.ctypes.data,
                                      y.ctypes.data, cnames(fn, "feature"), cnames(tn, "target"),
                                      None if extra is None else ctypes.byref(extra)))
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Dataset:
    """A dataset file as read by kiln_data_open (every check kiln train makes).

    Attributes: features float32 [N, F], targets float32 [N, O], feature_names and
    target_names (lists from kiln.columns, or None when the file has none), sha256 of the
    file's bytes, path; and, for a file `kiln data import --time --group` (or write_dataset's
    time= and groups=) wrote, time (int64 [N], seconds since 1970 UTC, or None), groups (int32
    [N], each row's instrument as 0, 1, ... in contiguous runs, or None), group_names (the
    instruments' names, or None), time_column and group_column (the names the file records).
    split() is the train/validation split kiln train makes of it."""

    def __init__(self, path: str, features: np.ndarray, targets: np.ndarray,
                 feature_names: Optional[List[str]], target_names: Optional[List[str]],
                 sha256: str, *, time: Optional[np.ndarray] = None,
                 groups: Optional[np.ndarray] = None, group_names: Optional[List[str]] = None,
                 time_column: Optional[str] = None, group_column: Optional[str] = None) -> None:
        self.path = path
        self.features = features
        self.targets = targets
        self.feature_names = feature_names
        self.target_names = target_names
        self.sha256 = sha256
        self.time = time
        self.groups = groups
        self.group_names = group_names
        self.time_column = time_column
        self.group_column = group_column

    @property
    def rows(self) -> int:
        """The number of rows, N."""
        return int(self.features.shape[0])

    def split(self, val_fraction: float, seq_len: int, **kw: Any) -> "Split":
        """kiln.split(self, val_fraction, seq_len, ...): the split kiln train makes."""
        return split(self, val_fraction, seq_len, **kw)

    def to_pandas(self) -> Any:
        """One DataFrame: the time column (datetime64, UTC) and the instrument's name when the
        file has them, then the feature columns and the target columns, named from
        kiln.columns (else feature[i] and target[i], as `kiln data inspect` names them)."""
        import pandas as pd

        fn = self.feature_names or [f"feature[{i}]" for i in range(self.features.shape[1])]
        tn = self.target_names or [f"target[{i}]" for i in range(self.targets.shape[1])]
        parts = []
        if self.time is not None:
            parts.append(pd.DataFrame({self.time_column or "time":
                                       self.time.astype("datetime64[s]")}))
        if self.groups is not None and self.group_names is not None:
            parts.append(pd.DataFrame({self.group_column or "group":
                                       np.array(self.group_names, dtype=object)[self.groups]}))
        return pd.concat(parts + [pd.DataFrame(self.features, columns=fn),
                                  pd.DataFrame(self.targets, columns=tn)], axis=1)

    def __repr__(self) -> str:
        extra = "" if self.groups is None else f", groups={len(self.group_names or ())}"
        extra += "" if self.time is None else ", time"
        return (f"kiln.Dataset({self.path!r}, rows={self.rows}, F={self.features.shape[1]}, "
                f"O={self.targets.shape[1]}{extra}, sha256={self.sha256[:12]}...)")


def read_dataset(path: PathLike) -> Dataset:
    """Open a dataset file with kiln's checks (missing tensors, dtypes, shapes, NaN, bad
    kiln.columns, times that go back or groups out of order all raise kiln.Error naming the
    file) and return a Dataset (the values copied into numpy arrays, the time and group
    columns too; the file is not kept open)."""
    p = _lib.path_bytes(path, "path")
    L = lib()
    h = ctypes.c_void_p()
    check(L.kiln_data_open(p, ctypes.byref(h)))
    try:
        rows, F, O = ctypes.c_size_t(), ctypes.c_int(), ctypes.c_int()
        L.kiln_data_shape(h, ctypes.byref(rows), ctypes.byref(F), ctypes.byref(O))
        n, F, O = rows.value, F.value, O.value

        def copy(ptr, ctype, dtype, cols=None):  # [n, cols], or [n] for a column
            buf = (ctype * (n * (cols or 1))).from_address(ptr)
            a = np.frombuffer(buf, dtype=dtype).copy()
            return a if cols is None else a.reshape(n, cols)

        x = copy(L.kiln_data_features(h), ctypes.c_float, _F32, F)
        y = copy(L.kiln_data_targets(h), ctypes.c_float, _F32, O)

        def names(target, cols):
            got = [L.kiln_data_column(h, target, i) for i in range(cols)]
            return None if got and got[0] is None else [s.decode("utf-8") for s in got]

        fn, tn = names(0, F), names(1, O)
        digest = L.kiln_data_sha256(h).decode()
        tcol, gcol, ng = ctypes.c_char_p(), ctypes.c_char_p(), ctypes.c_int()
        tp = L.kiln_data_time(h, ctypes.byref(tcol))
        gp = L.kiln_data_groups(h, ctypes.byref(ng), ctypes.byref(gcol))
        t = None if not tp else copy(tp, ctypes.c_int64, np.int64)
        g = None if not gp else copy(gp, ctypes.c_int32, np.int32)
        gn = None if not gp else [L.kiln_data_group_name(h, i).decode("utf-8")
                                  for i in range(ng.value)]
        tc = tcol.value.decode("utf-8") if tp else None  # owned by h: read before it is freed
        gc = gcol.value.decode("utf-8") if gp else None
    finally:
        L.kiln_data_free(h)
    return Dataset(os.fsdecode(p), x, y, fn, tn, digest, time=t, groups=g, group_names=gn,
                   time_column=tc, group_column=gc)


class Split:
    """A train/validation split as `kiln train` makes it (kiln_data_split over
    kiln_dataset_split_ex; docs/data.md, "Train and validation split"), from kiln.split.

    ranges: one (train_begin, train_end, val_begin, val_end) per instrument (one without
    groups): training rows [train_begin, train_end), then the purge gap, then validation rows
    [val_begin, val_end), every instrument split at the same moment. A training window of
    seq_len rows never holds rows of two instruments: train_starts holds every start the
    trainer draws from (uniformly), val_starts the fixed validation windows it evaluates on
    (spread over the instruments in proportion to their validation rows). train_rows,
    val_rows and gap_rows are the totals kiln train records in run.json's "split"; val_from
    is the time (seconds since 1970) at which validation starts, or None for a split by rows.

    Without groups a Split unpacks as the old 3-tuple: train_end, val_begin, val_end = split.
    """

    def __init__(self, seq_len: int, ranges: List[Tuple[int, int, int, int]], train_rows: int,
                 val_rows: int, gap_rows: int, val_from: Optional[int],
                 val_starts: np.ndarray, grouped: bool) -> None:
        self.seq_len = seq_len
        self.ranges = ranges
        self.train_rows = train_rows
        self.val_rows = val_rows
        self.gap_rows = gap_rows
        self.val_from = val_from
        self.val_starts = val_starts
        self.grouped = grouped
        S = seq_len
        self.train_starts = np.concatenate(
            [np.arange(b, e - S + 1, dtype=np.int64) for b, e, _, _ in ranges]
            + [np.zeros(0, np.int64)])

    def _one(self) -> Tuple[int, int, int, int]:
        if self.grouped:
            raise usage(f"a split of {len(self.ranges)} instruments has a range for each: use "
                        "split.ranges, split.train_starts and split.val_starts, not one "
                        "train_end, val_begin and val_end")
        return self.ranges[0]

    @property
    def train_end(self) -> int:
        """Without groups: the end of the training rows [0, train_end)."""
        return self._one()[1]

    @property
    def val_begin(self) -> int:
        """Without groups: the first validation row."""
        return self._one()[2]

    @property
    def val_end(self) -> int:
        """Without groups: the end of the validation rows (the dataset's rows)."""
        return self._one()[3]

    def __iter__(self) -> Iterator[int]:
        """train_end, val_begin, val_end (without groups only: kiln.torch.split's old tuple)."""
        return iter(self._one()[1:])

    def train_index(self) -> np.ndarray:
        """The training rows, every instrument's in order (int64): the rows kiln train takes
        its input and target standardisation from (features[split.train_index()])."""
        return np.concatenate([np.arange(b, e, dtype=np.int64) for b, e, _, _ in self.ranges])

    def val_index(self) -> np.ndarray:
        """The validation rows, every instrument's in order (int64)."""
        return np.concatenate([np.arange(b, e, dtype=np.int64) for _, _, b, e in self.ranges])

    def windows(self, array: Any, starts: Any) -> np.ndarray:
        """array's windows of seq_len rows at starts ([B] rows of a [N, ...] array):
        [B, seq_len, ...], as the trainer gathers a batch."""
        a = np.asarray(array)
        idx = np.asarray(starts, dtype=np.int64)[:, None] + np.arange(self.seq_len)
        return a[idx]

    def __repr__(self) -> str:
        return (f"kiln.Split(ranges={len(self.ranges)}, train_rows={self.train_rows}, "
                f"val_rows={self.val_rows}, gap_rows={self.gap_rows}, "
                f"val_windows={len(self.val_starts)})")


def split(data: Union[int, Dataset, PathLike], val_fraction: float, seq_len: int, *,
          val_from: Optional[str] = None, purge_rows: int = 0, purge_time: Optional[str] = None,
          time: Any = None, groups: Any = None,
          val_windows: int = TRAIN_VAL_WINDOWS) -> Split:
    """The train/validation split `kiln train` makes, with its purge gap, by the trainer's own
    code (kiln_data_split): data is a kiln.Dataset (its time and group columns are used), a
    dataset file's path (read with read_dataset), or a number of rows with optional time
    (int64 [rows] epoch seconds) and groups (int32 [rows], 0, 1, ... in contiguous runs). The
    options are kiln train's config keys: val_fraction, seq_len, val_from (a time: "1985-01-01",
    needs a time column), purge_rows (the gap in rows, at least seq_len) and purge_time (a
    duration: "10d"). val_windows caps the fixed validation windows (kiln train's 256).
    A split that leaves no training or validation window raises kiln.UsageError as `kiln
    train` refuses it. Returns a kiln.Split."""
    label = None
    if isinstance(data, (str, bytes, os.PathLike)):
        data = read_dataset(data)
    if isinstance(data, Dataset):
        label, rows = data.path, data.rows
        time = data.time if time is None else time
        groups = data.groups if groups is None else groups
    elif isinstance(data, (int, np.integer)) and not isinstance(data, bool) and data >= 0:
        rows = int(data)
    else:
        raise usage(f"split: data must be a kiln.Dataset, a dataset's path or a number of rows, "
                    f"not {type(data).__name__}")
    try:
        vf, S, pr, cap = float(val_fraction), int(seq_len), int(purge_rows), int(val_windows)
    except (TypeError, ValueError) as e:
        raise usage(f"split: {e}") from None
    if S < 1 or cap < 0 or pr < 0:
        raise usage(f"split: seq_len {S} must be at least 1, purge_rows {pr} and val_windows "
                    f"{cap} at least 0")
    t = None if time is None else _times(time, rows, label or "split")
    g = None if groups is None else np.ascontiguousarray(as_real_array(groups, "split: groups"),
                                                          dtype=np.int32)
    if g is not None and g.shape != (rows,):
        raise usage(f"split: groups has shape {tuple(g.shape)}, expected [{rows}]")
    n_groups = int(g[-1]) + 1 if g is not None and rows else 0
    opts = _lib.SplitOpts(vf, S, None if not val_from else _lib.text_bytes(val_from, "val_from"),
                          pr, None if not purge_time else _lib.text_bytes(purge_time,
                                                                           "purge_time"))
    ranges = (_lib.SplitRange * max(1, n_groups))()
    starts = (ctypes.c_size_t * max(1, cap))()
    info = _lib.SplitInfo()
    check(lib().kiln_data_split(None if label is None else _lib.path_bytes(label), rows,
                                None if t is None else t.ctypes.data,
                                None if g is None else g.ctypes.data, n_groups,
                                ctypes.byref(opts), ranges, starts, cap, ctypes.byref(info)))
    rg = [(r.train_begin, r.train_end, r.val_begin, r.val_end)
          for r in ranges[:info.n_ranges]]
    vs = np.array(starts[:info.n_val], dtype=np.int64)
    return Split(S, rg, info.train_rows, info.val_rows, info.gap_rows,
                 info.val_from if info.by_time else None, vs, g is not None)
