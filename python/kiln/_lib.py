"""The one place that loads libkiln.so and declares the prototype of every function the
package calls (all of them declared in include/kiln.h). Each call that returns a kiln_err goes
through check(), which raises kiln.Error with kiln's message and code.

ctypes releases the GIL for the length of every call into a CDLL, so a long forward runs
while other Python threads do; kiln_errmsg() is per thread, and check() reads it on the
thread that made the failing call."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import subprocess
import threading
from typing import Optional, Union

from ._error import CODES, Error

# kiln_err (include/kiln.h, through _error.CODES): ERR_IO = 1, ... ERR_INTERRUPTED = 16.
OK = 0
for _code, (_name, _cls) in CODES.items():
    globals()["ERR_" + _name] = _code
del _code, _name, _cls

DEVICE_CPU = -1

# What a path argument may be (str, bytes or os.PathLike, as open() takes).
PathLike = Union[str, bytes, "os.PathLike[str]", "os.PathLike[bytes]"]

c_float_p = ctypes.POINTER(ctypes.c_float)
c_char_pp = ctypes.POINTER(ctypes.c_char_p)


class ModelConfig(ctypes.Structure):
    """kiln_model_config."""

    _fields_ = [
        ("n_features", ctypes.c_int),
        ("n_outputs", ctypes.c_int),
        ("d_model", ctypes.c_int),
        ("n_layers", ctypes.c_int),
        ("n_heads", ctypes.c_int),
        ("d_ff", ctypes.c_int),
        ("n_experts", ctypes.c_int),
        ("top_k", ctypes.c_int),
        ("seq_len", ctypes.c_int),
        ("attn_window", ctypes.c_int),
        ("norm_eps", ctypes.c_float),
    ]


class ModelOpts(ctypes.Structure):
    """kiln_model_opts."""

    _fields_ = [("device", ctypes.c_int)]


class DataExtra(ctypes.Structure):
    """kiln_data_extra."""

    _fields_ = [
        ("time", ctypes.c_void_p),
        ("time_column", ctypes.c_char_p),
        ("group", ctypes.c_void_p),
        ("n_groups", ctypes.c_int),
        ("group_names", c_char_pp),
        ("group_column", ctypes.c_char_p),
    ]


class SplitOpts(ctypes.Structure):
    """kiln_data_split_opts."""

    _fields_ = [
        ("val_fraction", ctypes.c_double),
        ("seq_len", ctypes.c_int),
        ("val_from", ctypes.c_char_p),
        ("purge_rows", ctypes.c_long),
        ("purge_time", ctypes.c_char_p),
    ]


class SplitRange(ctypes.Structure):
    """kiln_data_range."""

    _fields_ = [(n, ctypes.c_size_t) for n in ("train_begin", "train_end", "val_begin", "val_end")]


class SplitInfo(ctypes.Structure):
    """kiln_data_split_info."""

    _fields_ = [
        ("n_ranges", ctypes.c_size_t),
        ("train_rows", ctypes.c_size_t),
        ("val_rows", ctypes.c_size_t),
        ("gap_rows", ctypes.c_size_t),
        ("by_time", ctypes.c_int),
        ("val_from", ctypes.c_int64),
        ("n_val", ctypes.c_size_t),
    ]


# name: (restype, argtypes). A restype of ctypes.c_int for a kiln_err.
_ERR = ctypes.c_int
_VP = ctypes.c_void_p
_PROTOS = {
    "kiln_strerror": (ctypes.c_char_p, [ctypes.c_int]),
    "kiln_errmsg": (ctypes.c_char_p, []),
    "kiln_version": (ctypes.c_char_p, []),
    # runtime
    "kiln_model_open_opts": (_ERR, [ctypes.c_char_p, ctypes.POINTER(ModelOpts), ctypes.POINTER(_VP)]),
    "kiln_model_free": (None, [_VP]),
    "kiln_model_device": (ctypes.c_int, [_VP]),
    "kiln_model_config_get": (ctypes.POINTER(ModelConfig), [_VP]),
    "kiln_model_is_bf16": (ctypes.c_int, [_VP]),
    "kiln_model_forward": (_ERR, [_VP, _VP, ctypes.c_int, ctypes.c_int, _VP]),
    "kiln_stream_open": (_ERR, [_VP, ctypes.POINTER(_VP)]),
    "kiln_stream_push": (_ERR, [_VP, _VP, _VP]),
    "kiln_stream_push_many": (_ERR, [_VP, ctypes.c_size_t, _VP, _VP]),
    "kiln_stream_reset": (None, [_VP]),
    "kiln_stream_ticks": (ctypes.c_uint64, [_VP]),
    "kiln_stream_free": (None, [_VP]),
    # datasets and runs
    "kiln_data_write": (
        _ERR,
        [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _VP, _VP, c_char_pp, c_char_pp],
    ),
    "kiln_data_open": (_ERR, [ctypes.c_char_p, ctypes.POINTER(_VP)]),
    "kiln_data_free": (None, [_VP]),
    "kiln_data_shape": (
        None,
        [_VP, ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_int)],
    ),
    "kiln_data_features": (_VP, [_VP]),
    "kiln_data_targets": (_VP, [_VP]),
    "kiln_data_column": (ctypes.c_char_p, [_VP, ctypes.c_int, ctypes.c_int]),
    "kiln_data_sha256": (ctypes.c_char_p, [_VP]),
    "kiln_data_write_extra": (
        _ERR,
        [ctypes.c_char_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, _VP, _VP, c_char_pp,
         c_char_pp, ctypes.POINTER(DataExtra)],
    ),
    "kiln_data_time": (_VP, [_VP, ctypes.POINTER(ctypes.c_char_p)]),
    "kiln_data_groups": (_VP, [_VP, ctypes.POINTER(ctypes.c_int), ctypes.POINTER(ctypes.c_char_p)]),
    "kiln_data_group_name": (ctypes.c_char_p, [_VP, ctypes.c_int]),
    "kiln_data_split": (
        _ERR,
        [ctypes.c_char_p, ctypes.c_size_t, _VP, _VP, ctypes.c_int, ctypes.POINTER(SplitOpts),
         ctypes.POINTER(SplitRange), ctypes.POINTER(ctypes.c_size_t), ctypes.c_size_t,
         ctypes.POINTER(SplitInfo)],
    ),
    "kiln_run_read": (_ERR, [ctypes.c_char_p, ctypes.POINTER(_VP)]),
    "kiln_runs_list": (
        _ERR,
        [c_char_pp, ctypes.c_size_t, c_char_pp, ctypes.c_size_t, ctypes.c_char_p, ctypes.c_size_t,
         ctypes.POINTER(_VP)],
    ),
    "kiln_free": (None, [_VP]),
}

_lib = None
_lock = threading.Lock()


def _pkg_config_library() -> Optional[str]:
    """libkiln.so.MAJOR where `make install` put it, as pkg-config names its libdir (the
    installed kiln.pc; PKG_CONFIG_PATH finds one under a PREFIX of its own); None without."""
    try:
        out = subprocess.run(["pkg-config", "--variable=libdir", "kiln"], capture_output=True,
                             text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    libdir = out.stdout.strip() if out.returncode == 0 else ""
    sysroot = os.environ.get("PKG_CONFIG_SYSROOT_DIR", "")
    for root in ("", sysroot) if libdir else ():
        for name in ("libkiln.so.0", "libkiln.so"):
            path = root + os.path.join(libdir, name)
            if os.path.exists(path):
                return path
    return None


def library_path() -> Optional[str]:
    """Where libkiln.so is looked for: $KILN_LIB, else build/libkiln.so of the repository this
    package sits in (python/kiln/ -> ../../build), else the system's (ldconfig's `kiln`), else
    the one pkg-config's kiln.pc names (`make install PREFIX=...`)."""
    env = os.environ.get("KILN_LIB")
    if env:
        return env
    here = os.path.dirname(os.path.abspath(__file__))
    repo = os.path.join(os.path.dirname(os.path.dirname(here)), "build", "libkiln.so")
    if os.path.exists(repo):
        return repo
    return ctypes.util.find_library("kiln") or _pkg_config_library()


def lib() -> ctypes.CDLL:
    """The loaded library, every prototype declared; loaded on first use, so that `import kiln`
    works (kiln.Error, kiln.torch) on a machine without it."""
    global _lib
    if _lib is not None:
        return _lib
    with _lock:
        if _lib is None:
            path = library_path()
            if not path:
                raise Error("libkiln.so not found: set KILN_LIB, or build it (make) in the "
                            "repository this package belongs to", ERR_NOTFOUND)
            try:
                l = ctypes.CDLL(path)
            except OSError as e:
                raise Error(f"'{path}': cannot load libkiln: {e}", ERR_IO) from None
            for name, (res, args) in _PROTOS.items():
                try:
                    f = getattr(l, name)
                except AttributeError:
                    raise Error(f"'{path}': no function {name} (a libkiln older than this "
                                "package?)", ERR_UNSUPPORTED) from None
                f.restype = res
                f.argtypes = args
            _lib = l
    return _lib


def fail(code: int) -> Error:
    """kiln.Error for a kiln_err just returned on this thread."""
    msg = lib().kiln_errmsg()
    text = msg.decode("utf-8", "replace") if msg else ""
    if not text:
        s = lib().kiln_strerror(code)
        text = s.decode() if s else f"kiln error {code}"
    return Error(text, code)


def check(code: int) -> None:
    """Raise kiln.Error for a kiln_err that is not KILN_OK (0)."""
    if code:
        raise fail(code)


def usage(message: str) -> Error:
    """kiln.Error for arguments refused in Python before any C call."""
    return Error(message, ERR_USAGE)


def path_bytes(path: object, what: str = "path") -> bytes:
    """path as the bytes a kiln call takes. A NUL byte is refused: C would read the path only
    up to it, and open the file the prefix names."""
    try:
        b = os.fsencode(path)
    except TypeError:
        raise usage(f"{what}: expected a path (str, bytes or os.PathLike), not "
                    f"{type(path).__name__}") from None
    if b"\0" in b:
        raise usage(f"{what} {os.fsdecode(b)!r} holds a NUL byte, which no file name can hold")
    return b


def text_bytes(s: object, what: str) -> bytes:
    """s as the UTF-8 a kiln call takes: a NUL byte (C would cut the text there) and what is
    not text in UTF-8 (a lone surrogate) are refused, naming what it was."""
    s = str(s)
    try:
        b = s.encode("utf-8")
    except UnicodeEncodeError:
        raise usage(f"{what} {s!r} is not text in UTF-8") from None
    if b"\0" in b:
        raise usage(f"{what} {s!r} holds a NUL byte")
    return b


def take_text(p: int) -> str:
    """The text a kiln call returned in memory the caller frees, freed."""
    try:
        return ctypes.string_at(p).decode("utf-8")
    finally:
        lib().kiln_free(p)
