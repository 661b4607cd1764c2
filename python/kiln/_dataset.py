"""kiln.write_dataset and kiln.read_dataset: dataset files (docs/data.md) through kiln_data_*,
the writer and loader `kiln data import` and `kiln train` use."""

import ctypes
import hashlib
import os

import numpy as np

from . import _lib
from ._error import Error
from ._lib import check, lib, usage
from ._runtime import as_real_array, to_f32

_F32 = np.dtype(np.float32)
_F32_MAX = float(np.finfo(np.float32).max)


def _is_frame(x):
    return type(x).__module__.startswith("pandas") and hasattr(x, "columns")


def _is_series(x):
    return type(x).__module__.startswith("pandas") and hasattr(x, "name") and x.ndim == 1


def _columns(x, what, path):
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


def _names(given, found, n, what, path):
    names = given if given is not None else found
    if names is None:
        return None
    if isinstance(names, str):
        names = names.split(",")
    names = [str(s) for s in names]
    if len(names) != n:
        raise usage(f"'{path}': {what}: {len(names)} names for {n} columns")
    return names


def write_dataset(path, features, targets=None, feature_names=None, target_names=None):
    """Write a dataset file: features [N, F] and targets [N, O] (numpy arrays of any real dtype,
    or pandas DataFrames / Series, whose column names are taken unless names are given; [N] is
    one column). The bytes, and so the digest, are those `kiln data import` writes for the same
    numbers and names. With names, kiln.columns records them (both or neither). With targets
    None, features is a DataFrame and feature_names and target_names pick its columns, as
    `kiln data import --features a,b --targets x` picks a CSV's. Written atomically: a refused
    or failed write leaves an existing file as it was. Returns the dataset's sha256 (hex)."""
    p = _lib.path_bytes(path, "path")
    spath = os.fsdecode(p)
    if targets is None:
        if not _is_frame(features) or feature_names is None or target_names is None:
            raise usage(f"'{spath}': no targets: give targets, or a DataFrame with "
                        "feature_names and target_names naming its columns")
        frame = features
        missing = [c for c in list(feature_names) + list(target_names) if c not in frame.columns]
        if missing:
            raise usage(f"'{spath}': no column {missing[0]!r} in the DataFrame")
        features, targets = frame[list(feature_names)], frame[list(target_names)]
    x, fn = _columns(features, "features", spath)
    y, tn = _columns(targets, "targets", spath)
    if x.shape[0] != y.shape[0]:
        raise usage(f"'{spath}': features have {x.shape[0]} rows but targets have {y.shape[0]}")
    fn = _names(feature_names, fn, x.shape[1], "feature_names", spath)
    tn = _names(target_names, tn, y.shape[1], "target_names", spath)
    if (fn is None) != (tn is None):
        raise usage(f"'{spath}': give the names of both the features and the targets, or neither")

    def cnames(names, what):
        if names is None:
            return None
        return (ctypes.c_char_p * len(names))(*[_lib.text_bytes(s, f"'{spath}': {what} name")
                                                for s in names])

    check(lib().kiln_data_write(p, x.shape[0], x.shape[1], y.shape[1], x.ctypes.data,
                                y.ctypes.data, cnames(fn, "feature"), cnames(tn, "target")))
    h = hashlib.sha256()
    with open(p, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


class Dataset:
    """A dataset file as read by kiln_data_open (every check kiln train makes): features
    float32 [N, F], targets float32 [N, O], feature_names and target_names (lists from
    kiln.columns, or None when the file has none), sha256 of the file's bytes, path."""

    def __init__(self, path, features, targets, feature_names, target_names, sha256):
        self.path = path
        self.features = features
        self.targets = targets
        self.feature_names = feature_names
        self.target_names = target_names
        self.sha256 = sha256

    @property
    def rows(self):
        return self.features.shape[0]

    def to_pandas(self):
        """One DataFrame: the feature columns then the target columns, named from kiln.columns
        (else feature[i] and target[i], as `kiln data inspect` names them)."""
        import pandas as pd

        fn = self.feature_names or [f"feature[{i}]" for i in range(self.features.shape[1])]
        tn = self.target_names or [f"target[{i}]" for i in range(self.targets.shape[1])]
        return pd.concat([pd.DataFrame(self.features, columns=fn),
                          pd.DataFrame(self.targets, columns=tn)], axis=1)

    def __repr__(self):
        return (f"kiln.Dataset({self.path!r}, rows={self.rows}, F={self.features.shape[1]}, "
                f"O={self.targets.shape[1]}, sha256={self.sha256[:12]}...)")


def read_dataset(path):
    """Open a dataset file with kiln's checks (missing tensors, dtypes, shapes, NaN, bad
    kiln.columns all raise kiln.Error naming the file) and return a Dataset (the values
    copied into numpy arrays; the file is not kept open)."""
    p = _lib.path_bytes(path, "path")
    L = lib()
    h = ctypes.c_void_p()
    check(L.kiln_data_open(p, ctypes.byref(h)))
    try:
        rows, F, O = ctypes.c_size_t(), ctypes.c_int(), ctypes.c_int()
        L.kiln_data_shape(h, ctypes.byref(rows), ctypes.byref(F), ctypes.byref(O))
        n, F, O = rows.value, F.value, O.value

        def copy(ptr, cols):
            buf = (ctypes.c_float * (n * cols)).from_address(ptr)
            return np.frombuffer(buf, dtype=_F32).reshape(n, cols).copy()

        x = copy(L.kiln_data_features(h), F)
        y = copy(L.kiln_data_targets(h), O)

        def names(target, cols):
            got = [L.kiln_data_column(h, target, i) for i in range(cols)]
            return None if got and got[0] is None else [s.decode("utf-8") for s in got]

        fn, tn = names(0, F), names(1, O)
        digest = L.kiln_data_sha256(h).decode()
    finally:
        L.kiln_data_free(h)
    return Dataset(os.fsdecode(p), x, y, fn, tn, digest)
