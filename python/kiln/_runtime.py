"""kiln.Model, kiln.Stream and kiln.push_many: the runtime of include/kiln.h (kiln_model_*,
kiln_stream_*) from numpy."""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
import weakref
from typing import Any, Dict, Iterable, Iterator, Optional, TypeVar

import numpy as np

from . import _lib
from ._error import Error
from ._lib import PathLike, check, fail, lib, usage

_F32 = np.dtype(np.float32)
_H = TypeVar("_H", bound="_Handle")


def as_real_array(x: Any, what: str) -> np.ndarray:
    """x as a numpy array of real numbers (float, int), without a copy where it is one: what
    numpy cannot make an array of (a ragged list, an object that refuses) and anything but
    real numbers (strings, objects, complex, bool) are refused by kiln.Error naming it, never
    numpy's own exceptions."""
    if isinstance(x, np.ndarray):
        a = x
    else:
        try:
            a = np.asarray(x)
        except (ValueError, TypeError, OverflowError, MemoryError) as e:
            raise usage(f"{what}: not an array of numbers ({e})") from None
    if a.dtype.kind not in "fiu":
        raise usage(f"{what}: dtype {a.dtype} is not a real number type (give float32 or "
                    "float64)")
    return a


def to_f32(a: np.ndarray, what: str) -> np.ndarray:
    """a (checked by as_real_array, and its shape by the caller) as a C-contiguous float32
    array, not copied where it is one already; a copy that cannot be made (a broadcast view
    of 2^31 rows asks for gigabytes) is kiln.Error, never numpy's MemoryError."""
    try:
        return np.ascontiguousarray(a, dtype=np.float32)
    except MemoryError:
        raise Error(f"{what}: out of memory for a float32 copy of shape {tuple(a.shape)} "
                    f"({a.size * 4} bytes)", _lib.ERR_NOMEM) from None


def as_f32(x: Any, what: str) -> np.ndarray:
    """x as a C-contiguous float32 array: no copy when it is one already. Real numbers only
    (float, int); anything else (strings, objects, complex, bool) is refused by name."""
    return to_f32(as_real_array(x, what), what)


def parse_device(device: str) -> int:
    """"cpu", "cuda" (device 0) or "cuda:N", as `kiln infer --device` takes it."""
    if device == "cpu":
        return _lib.DEVICE_CPU
    if device == "cuda":
        return 0
    if isinstance(device, str) and device.startswith("cuda:") and device[5:].isdigit() \
            and len(device) <= 9:
        return int(device[5:])
    raise usage(f"device must be cpu, cuda or cuda:N, not {device!r}")


class _Handle:
    """An object over a C handle (self._h): a context manager that closes it, and freed by
    _FREE at garbage collection when close() was never called (not at interpreter exit, when
    the library may be gone)."""

    _FREE = None

    _h: Optional[int]

    def close(self) -> None:
        """Free the handle (the subclass says how)."""
        raise NotImplementedError

    def __enter__(self: _H) -> _H:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __del__(self) -> None:
        if getattr(self, "_h", None) is not None and _lib is not None and _lib._lib is not None:
            getattr(_lib._lib, self._FREE)(self._h)
            self._h = None


class Model(_Handle):
    """A frozen kiln-tsmoe/1 model: kiln_model_open_opts on a model directory (or its
    model.safetensors), with every check it makes. Read-only once open: forward and
    stream() may be called from several threads at once. Close with close() or a with
    block (also done when it is collected); its streams are closed with it.

    Model(path, device="cpu"): device "cpu", "cuda" or "cuda:N" as `kiln infer --device`
    takes it. Attributes: config (dict: n_features, n_outputs, d_model, ...), n_features,
    n_outputs, device, is_bf16, path. model(x) is model.forward(x)."""

    _FREE = "kiln_model_free"

    def __init__(self, path: PathLike, device: str = "cpu") -> None:
        self._h = None
        self._cv = threading.Condition()
        self._busy = 0
        self._streams: "weakref.WeakSet[Stream]" = weakref.WeakSet()
        dev = parse_device(device)
        self.path = os.fspath(path) if isinstance(path, (str, bytes, os.PathLike)) else path
        p = _lib.path_bytes(path, "model path")
        h = ctypes.c_void_p()
        check(lib().kiln_model_open_opts(p, ctypes.byref(_lib.ModelOpts(dev)), ctypes.byref(h)))
        self._h = h.value
        c = lib().kiln_model_config_get(self._h).contents
        self.config: Dict[str, Any] = {name: getattr(c, name)
                                       for name, _ in _lib.ModelConfig._fields_}
        self.n_features = c.n_features
        self.n_outputs = c.n_outputs
        self.device = "cpu" if dev == _lib.DEVICE_CPU else f"cuda:{dev}"
        self.is_bf16 = bool(lib().kiln_model_is_bf16(self._h))

    @contextlib.contextmanager
    def _use(self) -> Iterator[int]:
        """The handle for one call; close() waits for every call in flight."""
        with self._cv:
            if self._h is None:
                raise usage(f"'{self.path}': the model is closed")
            self._busy += 1
            h = self._h
        try:
            yield h
        finally:
            with self._cv:
                self._busy -= 1
                if not self._busy:
                    self._cv.notify_all()

    def forward(self, features: Any) -> np.ndarray:
        """Outputs float32 [S, O] for features [S, F], or [B, S, O] for [B, S, F] (any real
        dtype, contiguous or not; float32 C-contiguous input is not copied). Each sequence
        starts from its first row. One kiln_model_forward call over all B sequences: the runtime
        gives a row the same bits whatever rows share its batch (docs/runtime.md), so each
        sequence's outputs are bit for bit what `kiln infer` writes for a file of its rows.
        Non-finite inputs are refused naming the position."""
        # Shape and size first, on the array as given: a broadcast view of 2^31 rows is
        # refused here, before a float32 copy of it asks for gigabytes.
        x = as_real_array(features, "features")
        F, O = self.n_features, self.n_outputs
        if x.ndim not in (2, 3) or x.shape[-1] != F or 0 in x.shape:
            raise usage(f"features: shape {tuple(x.shape)}, expected [S, {F}] or [B, S, {F}] "
                        f"(S, B >= 1; {F} is the model's n_features)")
        B, S = (1, x.shape[0]) if x.ndim == 2 else x.shape[:2]
        if S > 1 << 30:
            raise Error(f"features: {S} rows is more than one sequence may hold", _lib.ERR_USAGE)
        if B * S > 1 << 30:
            raise Error(f"features: {B} x {S} rows is more than one call may hold",
                        _lib.ERR_USAGE)
        x = to_f32(x, "features")
        try:
            y = np.empty((B, S, O), dtype=_F32)
        except MemoryError:
            raise Error(f"outputs: out of memory for [{B}, {S}, {O}] float32",
                        _lib.ERR_NOMEM) from None
        with self._use() as h:
            check(lib().kiln_model_forward(h, x.ctypes.data, B, S, y.ctypes.data))
        return y[0] if x.ndim == 2 else y

    __call__ = forward

    def stream(self) -> Stream:
        """A new Stream on this model (kiln_stream_open)."""
        return Stream(self)

    def close(self) -> None:
        """Free the model (after its streams); waits for forward calls in flight. Idempotent."""
        with self._cv:
            if self._h is None:
                return
            h, self._h = self._h, None
            while self._busy:
                self._cv.wait()
        for s in list(self._streams):
            s.close()
        lib().kiln_model_free(h)

    def __repr__(self) -> str:
        state = "closed" if self._h is None else self.device
        return f"kiln.Model({self.path!r}, {state}, F={self.n_features}, O={self.n_outputs})"


class Stream(_Handle):
    """One sequence fed tick by tick (kiln_stream_*): push(features [F]) -> outputs [O], row t
    of the batch forward over every tick pushed since open or reset. One thread at a time per
    stream (a second one is refused, not waited for); any number of streams per model.

    Stream(model), or model.stream(). Attributes: model, ticks."""

    _FREE = "kiln_stream_free"  # at collection: the stream holds its model, still open then

    def __init__(self, model: Model) -> None:
        self._h = None
        self._lock = threading.Lock()
        if not isinstance(model, Model):
            raise usage(f"Stream: expected a kiln.Model, not {type(model).__name__}")
        self.model = model
        self._F, self._O = model.n_features, model.n_outputs
        h = ctypes.c_void_p()
        with model._use() as mh:
            check(lib().kiln_stream_open(mh, ctypes.byref(h)))
            self._h = h.value
            model._streams.add(self)
        self._push = lib().kiln_stream_push
        self._xshape, self._yshape = (self._F,), (self._O,)
        self._xb, self._yb = np.zeros(self._F, _F32), np.zeros(self._O, _F32)
        self._xp, self._yp = self._xb.ctypes.data, self._yb.ctypes.data

    def _busy(self) -> Error:
        return Error("stream: in use by another thread (one thread at a time per stream)",
                     _lib.ERR_USAGE)

    def push(self, features: Any, out: Optional[np.ndarray] = None) -> np.ndarray:
        """Feed one tick: features [F] in (any real dtype), outputs float32 [O] returned (a new
        array; or written into out, a writable float32 [O] array, and out returned). A
        non-finite feature is refused and leaves the stream as it was. The features are copied
        (and rounded to f32) into a buffer the stream owns and the outputs copied out of
        another, which costs less than asking numpy for an array's address."""
        x = features
        if type(x) is not np.ndarray or x.dtype.kind not in "fiu":
            x = as_real_array(x, "features")
        if x.shape != self._xshape:
            raise usage(f"features: shape {tuple(x.shape)}, expected [{self._F}] (the model's "
                        "n_features)")
        # float32 only: an int32 out would take the outputs truncated to integers, silently.
        if out is not None and (type(out) is not np.ndarray or out.shape != self._yshape
                                or out.dtype != _F32 or not out.flags.writeable):
            raise usage(f"out: expected a writable float32 array of shape [{self._O}], not "
                        + (f"{out.dtype} {tuple(out.shape)}" if isinstance(out, np.ndarray)
                           else type(out).__name__))
        if not self._lock.acquire(False):
            raise self._busy()
        try:
            if self._h is None:
                raise usage("stream: closed")
            self._xb[...] = x
            rc = self._push(self._h, self._xp, self._yp)
            if rc:
                raise fail(rc)
            if out is None:
                return self._yb.copy()
            out[...] = self._yb
            return out
        finally:
            self._lock.release()

    def reset(self) -> None:
        """Forget every tick: the next push is a sequence's first row again."""
        with self._held() as h:
            lib().kiln_stream_reset(h)

    @property
    def ticks(self) -> int:
        """Ticks pushed since open or reset."""
        with self._held() as h:
            return int(lib().kiln_stream_ticks(h))

    @contextlib.contextmanager
    def _held(self) -> Iterator[int]:
        if not self._lock.acquire(False):
            raise self._busy()
        try:
            if self._h is None:
                raise usage("stream: closed")
            yield self._h
        finally:
            self._lock.release()

    def close(self) -> None:
        """Free the stream (waits for a push in flight). Idempotent."""
        with self._lock:
            h, self._h = self._h, None
        if h is not None:
            lib().kiln_stream_free(h)


def push_many(streams: Iterable[Stream], features: Any,
              out: Optional[np.ndarray] = None) -> np.ndarray:
    """One tick for each of n streams of one model (kiln_stream_push_many): streams[i] takes
    features[i] ([n, F]) and gives outputs[i] ([n, O], float32, returned). Bit for bit what
    pushing each stream in turn gives, with each weight matrix read from memory once per call.
    Refused before any stream changes: streams of different models, a stream twice, a
    non-finite feature, a stream in use by another thread."""
    streams = list(streams)
    n = len(streams)
    for i, s in enumerate(streams):
        if not isinstance(s, Stream):
            raise usage(f"push_many: streams[{i}] is a {type(s).__name__}, not a kiln.Stream")
    F = streams[0]._F if n else 0
    O = streams[0]._O if n else 0
    x = as_real_array(features, "features")
    if x.shape != (n, F) and not (n == 0 and x.ndim == 2 and x.shape[0] == 0):
        raise usage(f"features: shape {tuple(x.shape)}, expected [{n}, {F}] (one row per "
                    "stream, the model's n_features)")
    x = to_f32(x, "features")
    if out is None:
        y = np.empty((n, O), dtype=_F32)
    else:
        y = out
        if type(y) is not np.ndarray or y.dtype != _F32 or y.shape != (n, O) \
                or not y.flags.c_contiguous or not y.flags.writeable:
            raise usage(f"out: expected a writable C-contiguous float32 array of shape [{n}, {O}]")
    if n == 0:
        return y
    seen = {}
    for i, s in enumerate(streams):
        j = seen.setdefault(id(s), i)
        if j != i:
            raise usage(f"push_many: streams[{i}] is streams[{j}] again (one tick per stream per "
                        "call); no stream was changed")
    held = []
    try:
        for s in streams:
            if not s._lock.acquire(False):
                raise s._busy()
            held.append(s)
            if s._h is None:
                raise usage("push_many: a stream is closed; no stream was changed")
        handles = (ctypes.c_void_p * n)(*[s._h for s in streams])
        rc = lib().kiln_stream_push_many(handles, n, x.ctypes.data, y.ctypes.data)
        if rc:
            raise fail(rc)
    finally:
        for s in held:
            s._lock.release()
    return y
