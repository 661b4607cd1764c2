"""kiln.torch: kiln-tsmoe/1 in PyTorch, the research twin of kiln's C network.

One plain file to read top to bottom beside docs/model.md (docs/model.md): the same parameter names
as kiln's safetensors files, the same initialisation from a seed (kiln's Philox counter-based
generator, reproduced here in numpy: the same seed gives the same float32 weights as
`kiln train`), the same forward and the same loss with its three terms. It reads kiln's model
directories and checkpoints and writes model directories that `kiln golden make`, `kiln
validate`, `kiln pack`, `kiln sign` and `kiln release --model` take, and the reference outputs
that `kiln validate --reference` holds the C runtime to (docs/python.md, "kiln.torch").

Nothing here calls libkiln but split, which is the trainer's own split (kiln.split): safetensors
is read and written in Python (8-byte little-endian header length, a JSON header, the raw
data).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import math
import os
import shutil
import stat
import struct
import tempfile
from typing import Any, Dict, List, Mapping, Optional, Tuple

import numpy as np
import torch
from torch import nn

from ._dataset import Split
from ._dataset import split as _kiln_split
from ._error import Error
from ._lib import PathLike

Arrays = Dict[str, np.ndarray]

FORMAT = "kiln-tsmoe/1"
CARD_FORMAT = "kiln-card/1"
# The model config's keys (docs/model.md "Config"); norm_eps and format are optional.
MODEL_KEYS = ("n_features", "n_outputs", "d_model", "n_layers", "n_heads", "d_ff", "n_experts",
              "top_k", "seq_len", "attn_window")
STREAM_INIT = 1  # core/philox.h: KILN_STREAM_INIT


# ---- safetensors ---------------------------------------------------------------------------

_DTYPES = {"F32": np.float32, "F64": np.float64, "I32": np.int32, "I64": np.int64}


def _path(path, what="path"):
    """path (str, bytes or os.PathLike) as a str for messages, refusing a NUL byte (no file
    name holds one; the os module would raise ValueError) and anything that is not a path."""
    if not isinstance(path, (str, bytes, os.PathLike)):
        raise Error(f"{what}: expected a path, not {type(path).__name__}")
    p = os.fspath(path)
    s = os.fsdecode(p) if isinstance(p, bytes) else p
    if "\0" in s:
        raise Error(f"{s!r}: a path with a NUL byte, which no file name can hold")
    return s


def _array(x, what, dtype=None):
    """np.asarray(x, dtype) with numpy's refusals (a ragged list, strings as numbers) as
    kiln.Error naming what."""
    try:
        return np.asarray(x, dtype=dtype)
    except (ValueError, TypeError, OverflowError, MemoryError) as e:
        raise Error(f"{what}: not an array of numbers ({e})") from None


def _read_file(path):
    """The bytes of a regular file. A path with a NUL byte, a directory, a FIFO or a device
    (which would block or never end: /dev/zero) is refused naming it, checked on the opened
    descriptor (opened without blocking, so a FIFO with no writer does not hang the open)."""
    spath = _path(path)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError, TypeError) as e:
        raise Error(f"'{spath}': {getattr(e, 'strerror', None) or e}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise Error(f"'{spath}': not a regular file")
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as f:
            fd = -1
            return f.read()
    except OSError as e:
        raise Error(f"'{spath}': {e.strerror}") from None
    finally:
        if fd >= 0:
            os.close(fd)


def read_safetensors(path: PathLike) -> Tuple[Arrays, Dict[str, str]]:
    """(tensors, metadata) of a safetensors file: a dict name -> numpy array (BF16 widened to
    float32 exactly) and the __metadata__ dict of strings. Raises kiln.Error naming the file
    and the problem for anything else: a header that is not what kiln writes (wrong types,
    shapes that are not lists of non-negative integers, offsets outside the data, byte counts
    that do not match the shape) is refused before any array is made."""
    blob = _read_file(path)
    if len(blob) < 8:
        raise Error(f"'{path}': too short for a safetensors header")
    (hlen,) = struct.unpack("<Q", blob[:8])
    if hlen > len(blob) - 8:
        raise Error(f"'{path}': header length {hlen} runs past the end of the file")
    try:
        header = json.loads(blob[8:8 + hlen])
    except (ValueError, RecursionError) as e:
        raise Error(f"'{path}': header is not JSON: {e}") from None
    if not isinstance(header, dict):
        raise Error(f"'{path}': header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise Error(f"'{path}': __metadata__ is not an object of strings")
    data = memoryview(blob)[8 + hlen:]
    tensors = {}
    for name, t in header.items():
        ok = isinstance(t, dict) and isinstance(t.get("dtype"), str) \
            and isinstance(t.get("shape"), list) and isinstance(t.get("data_offsets"), list) \
            and len(t["data_offsets"]) == 2 \
            and all(type(v) is int and v >= 0 for v in t["shape"] + t["data_offsets"])
        if not ok:
            raise Error(f"'{path}': tensor '{name}' has a malformed header entry (dtype a "
                        f"string, shape and data_offsets lists of non-negative integers)")
        dtype, shape, (lo, hi) = t["dtype"], t["shape"], t["data_offsets"]
        if not lo <= hi <= len(data):
            raise Error(f"'{path}': tensor '{name}' lies outside the data section")
        raw = data[lo:hi]
        n = math.prod(shape)  # Python integers: no overflow
        if dtype == "BF16":
            if len(raw) != 2 * n:
                raise Error(f"'{path}': tensor '{name}' has {len(raw)} bytes for {n} BF16 values")
            bits = np.frombuffer(raw, dtype="<u2").astype(np.uint32) << 16
            arr = bits.view(np.float32)
        elif dtype in _DTYPES:
            dt = np.dtype(_DTYPES[dtype]).newbyteorder("<")
            if len(raw) != dt.itemsize * n:
                raise Error(f"'{path}': tensor '{name}' has {len(raw)} bytes for {n} {dtype} "
                            f"values")
            arr = np.frombuffer(raw, dtype=dt)
        else:
            raise Error(f"'{path}': tensor '{name}' has dtype {dtype}, which kiln.torch does "
                        f"not read")
        tensors[name] = np.array(arr.reshape(shape), dtype=arr.dtype.newbyteorder("="))
    return tensors, meta


def write_safetensors(path: PathLike, tensors: Mapping[str, Any],
                      metadata: Optional[Mapping[str, str]] = None) -> None:
    """Write tensors (name -> numpy array, float32 stored F32) the way kiln writes them:
    tensors in name order, metadata keys sorted, compact JSON, the header padded with spaces to
    8 bytes. Written to a temporary file beside path and renamed into place."""
    path = _path(path)
    names = sorted(tensors)
    arrays = []
    header = {}
    off = 0
    for name in names:
        a = np.ascontiguousarray(_array(tensors[name], f"'{path}': tensor '{name}'"))
        code = {np.dtype(np.float32): "F32", np.dtype(np.float64): "F64",
                np.dtype(np.int32): "I32", np.dtype(np.int64): "I64"}.get(a.dtype)
        if code is None:
            raise Error(f"'{path}': tensor '{name}' has dtype {a.dtype}, not one kiln reads")
        b = a.astype(a.dtype.newbyteorder("<"), copy=False).tobytes()
        header[name] = {"dtype": code, "shape": list(a.shape), "data_offsets": [off, off + len(b)]}
        off += len(b)
        arrays.append(b)
    body = json.dumps(header, separators=(",", ":"))
    if metadata:
        meta = json.dumps({k: str(v) for k, v in metadata.items()}, separators=(",", ":"),
                          sort_keys=True)
        text = '{"__metadata__":' + meta + ("," + body[1:] if names else "}")
    else:
        text = body
    raw = text.encode()
    raw += b" " * ((8 - len(raw) % 8) % 8)
    _atomic_write(path, [struct.pack("<Q", len(raw)), raw] + arrays)


def _atomic_write(path, chunks):
    d = os.path.dirname(os.path.abspath(path))
    fd, tmp = tempfile.mkstemp(prefix="." + os.path.basename(path) + ".tmp-", dir=d)
    try:
        with os.fdopen(fd, "wb") as f:
            for c in chunks:
                f.write(c)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def sha256_file(path: PathLike) -> str:
    """The SHA-256 of a file's bytes, lowercase hex (what sha256sum prints)."""
    h = hashlib.sha256()
    path = _path(path)
    try:
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
    except OSError as e:
        raise Error(f"'{path}': {e.strerror}") from None
    return h.hexdigest()


# ---- config ---------------------------------------------------------------------------------

def check_config(config: Mapping[str, Any]) -> Dict[str, Any]:
    """The model config as kiln checks it (core/model_format.c): a dict of MODEL_KEYS,
    optional norm_eps and format. Returns a clean copy; raises kiln.Error naming the key."""
    if not isinstance(config, dict):
        raise Error("model config must be a dict")
    c = {}
    for k, v in config.items():
        if k == "format":
            if v != FORMAT:
                raise Error(f"model format must be \"{FORMAT}\"")
        elif k == "norm_eps":
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not v > 0 \
                    or not v <= float(np.finfo(np.float32).max):
                raise Error("norm_eps must be a positive number")
            c[k] = float(v)
        elif k in MODEL_KEYS:
            if isinstance(v, bool) or not isinstance(v, int) or not 0 <= v <= 1 << 30:
                raise Error(f"{k} must be a non-negative integer (at most 2^30)")
            c[k] = v
        else:
            raise Error(f"unknown model config key '{k}'")
    for k in MODEL_KEYS:
        if k not in c:
            raise Error(f"model config lacks '{k}'")
    c.setdefault("norm_eps", 1e-5)
    for k in ("n_features", "n_outputs", "d_model", "n_layers", "n_heads", "d_ff", "seq_len",
              "attn_window"):
        if c[k] < 1:
            raise Error(f"{k} must be at least 1 (is {c[k]})")
    if c["d_model"] % c["n_heads"]:
        raise Error(f"d_model {c['d_model']} is not a multiple of n_heads {c['n_heads']}")
    if c["n_experts"] == 0 and c["top_k"] != 0:
        raise Error(f"top_k must be 0 when n_experts is 0 (is {c['top_k']})")
    if c["n_experts"] and not 1 <= c["top_k"] <= c["n_experts"]:
        raise Error(f"top_k must be between 1 and n_experts {c['n_experts']} (is {c['top_k']})")
    if c["attn_window"] > c["seq_len"]:
        raise Error(f"attn_window {c['attn_window']} is larger than seq_len {c['seq_len']}")
    # kiln's own bound (core/model_format.c kiln_model_config_check): every tensor and count
    # well inside 32 bits of elements, so that no config asks for terabytes.
    if max(c["n_experts"], 1) * c["d_ff"] * c["d_model"] > 1e9 \
            or 3 * c["d_model"] * c["d_model"] > 1e9 or c["n_layers"] > 4096 \
            or c["n_experts"] > 4096 or c["seq_len"] > 1 << 20:
        raise Error("model sizes are too large (kiln's limits: experts x d_ff x d_model and 3 "
                    "d_model^2 at most 1e9 elements, n_layers and n_experts at most 4096, "
                    "seq_len at most 2^20)")
    return c


def config_text(config: Mapping[str, Any]) -> str:
    """The config as kiln's canonical JSON (keys sorted, compact; norm_eps as jansson prints a
    real: 17 significant digits)."""
    c = dict(check_config(config), format=FORMAT)
    eps = c.pop("norm_eps")
    # The shortest decimal that reads back as the same float32, as kiln_model_config_json.
    f32 = float(np.float32(eps))
    for prec in range(1, 10):
        s = "%.*g" % (prec, f32)
        if float(np.float32(float(s))) == f32:
            break
    r = "%.17g" % float(s)
    if "." not in r and "e" not in r:
        r += ".0"
    items = [(k, json.dumps(v)) for k, v in c.items()] + [("norm_eps", r)]
    return "{" + ",".join(f'"{k}":{v}' for k, v in sorted(items)) + "}"


def param_table(config: Mapping[str, Any]) -> List[Tuple[str, Tuple[int, ...], bool]]:
    """[(name, shape, trained)] in kiln's order (core/model_format.c kiln_param_table), the
    order in which parameters sit in kiln's one parameter block: the init generator's counter
    is the element's index in that block."""
    c = check_config(config)
    F, O, D, Fh, E = c["n_features"], c["n_outputs"], c["d_model"], c["d_ff"], c["n_experts"]
    t = [("norm.in_mean", (F,), False), ("norm.in_std", (F,), False),
         ("embed.weight", (D, F), True), ("embed.bias", (D,), True)]
    for l in range(c["n_layers"]):
        b = f"blocks.{l}."
        t += [(b + "attn_norm.weight", (D,), True), (b + "attn.qkv.weight", (3 * D, D), True),
              (b + "attn.qkv.bias", (3 * D,), True), (b + "attn.out.weight", (D, D), True),
              (b + "attn.out.bias", (D,), True), (b + "ffn_norm.weight", (D,), True)]
        if E == 0:
            t += [(b + "ffn.fc.weight", (Fh, D), True), (b + "ffn.fc.bias", (Fh,), True),
                  (b + "ffn.proj.weight", (D, Fh), True), (b + "ffn.proj.bias", (D,), True)]
        else:
            t += [(b + "moe.router.weight", (E, D), True), (b + "moe.fc.weight", (E, Fh, D), True),
                  (b + "moe.fc.bias", (E, Fh), True), (b + "moe.proj.weight", (E, D, Fh), True),
                  (b + "moe.proj.bias", (E, D), True)]
    t += [("final_norm.weight", (D,), True), ("head.weight", (O, D), True),
          ("head.bias", (O,), True)]
    return t


# ---- kiln's random numbers ----------------------------------------------------------------

_M32 = np.uint64(0xFFFFFFFF)


def philox(seed: int, stream: int, counters: Any) -> np.ndarray:
    """Philox4x32-10 (core/philox.h): four uint32 words per counter, as an array [n, 4]."""
    ctr = np.asarray(counters, dtype=np.uint64)
    c0, c1 = ctr & _M32, ctr >> np.uint64(32)
    c2 = np.full_like(c0, stream & 0xFFFFFFFF)
    c3 = np.full_like(c0, stream >> 32)
    k0, k1 = seed & 0xFFFFFFFF, (seed >> 32) & 0xFFFFFFFF
    m0, m1 = np.uint64(0xD2511F53), np.uint64(0xCD9E8D57)
    for _ in range(10):
        p0, p1 = m0 * c0, m1 * c2
        hi0, lo0 = p0 >> np.uint64(32), p0 & _M32
        hi1, lo1 = p1 >> np.uint64(32), p1 & _M32
        c0, c1, c2, c3 = hi1 ^ c1 ^ np.uint64(k0), lo1, hi0 ^ c3 ^ np.uint64(k1), lo0
        k0, k1 = (k0 + 0x9E3779B9) & 0xFFFFFFFF, (k1 + 0xBB67AE85) & 0xFFFFFFFF
    return np.stack([c0, c1, c2, c3], axis=-1).astype(np.uint32)


def init_params(config: Mapping[str, Any], seed: int) -> Arrays:
    """kiln's initialisation (train/model.c kiln_tsmoe_init) as numpy float32 arrays by name:
    N(0, 0.02) from Philox(seed, KILN_STREAM_INIT, element index) by Box-Muller in double on
    words 0 and 1; attn.out.weight and proj.weight N(0, 0.02/sqrt(2L)); biases 0; gains 1;
    norm.in_mean 0, norm.in_std 1."""
    c = check_config(config)
    base, scaled = 0.02, 0.02 / math.sqrt(2.0 * c["n_layers"])
    out, off = {}, 0
    for name, shape, _ in param_table(c):
        n = int(np.prod(shape))
        if name == "norm.in_mean" or name.endswith(".bias"):
            w = np.zeros(n, np.float32)
        elif name == "norm.in_std" or name.endswith("norm.weight"):
            w = np.ones(n, np.float32)
        else:
            std = scaled if name.endswith("attn.out.weight") or name.endswith("proj.weight") \
                else base
            r = philox(seed, STREAM_INIT, np.arange(off, off + n, dtype=np.uint64))
            u1 = (r[:, 0].astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
            u2 = (r[:, 1].astype(np.float64) + 0.5) * (1.0 / 4294967296.0)
            z = np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * math.pi * u2)
            w = (std * z).astype(np.float32)
        out[name] = w.reshape(shape)
        off += n
    return out


def split(data: Any, val_fraction: float, seq_len: int, **kw: Any) -> Split:
    """The trainer's split with its purge gap, by the trainer's own code: kiln.split (the one
    call into libkiln here; docs/python.md). data is a kiln.Dataset (its time and group
    columns are used: every instrument split at the same moment, windows inside one
    instrument), a dataset's path, or a number of rows; kw are kiln.split's (val_from,
    purge_rows, purge_time, time, groups, val_windows). Returns a kiln.Split, which without
    groups unpacks as (train_end, val_begin, val_end)."""
    return _kiln_split(data, val_fraction, seq_len, **kw)


# ---- the network ----------------------------------------------------------------------------

def rmsnorm(u: torch.Tensor, g: torch.Tensor, eps: float) -> torch.Tensor:
    """docs/model.md's RMSNorm: u / sqrt(mean(u^2) + eps) * g over the last dimension."""
    return u / torch.sqrt((u * u).mean(dim=-1, keepdim=True) + eps) * g


def gelu(u: torch.Tensor) -> torch.Tensor:
    """docs/model.md's GELU: the tanh form."""
    return 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * u * u * u)))


def alibi_slopes(n_heads: int) -> List[float]:
    """m_h = 2^(-8 hh / H) for hh = h + 1."""
    return [2.0 ** (-8.0 * (h + 1) / n_heads) for h in range(n_heads)]


def top_k_gates(p: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The K largest probabilities of each row (equal values: the lower expert first) and
    their gates, renormalised over the K chosen: (idx [N,K], gates [N,K])."""
    order = torch.sort(p, dim=-1, descending=True, stable=True).indices[:, :k]
    chosen = torch.gather(p, 1, order)
    return order, chosen / chosen.sum(dim=-1, keepdim=True)


class _Linear(nn.Module):
    def __init__(self, n_out, n_in):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(n_out))


class _Gain(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(d))


class _InputNorm(nn.Module):
    """norm.in_mean, norm.in_std: fixed standardisation, buffers (never trained)."""

    def __init__(self, f):
        super().__init__()
        self.register_buffer("in_mean", torch.zeros(f))
        self.register_buffer("in_std", torch.ones(f))


class _Attention(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.qkv = _Linear(3 * d, d)
        self.out = _Linear(d, d)


class _Dense(nn.Module):
    def __init__(self, d, fh):
        super().__init__()
        self.fc = _Linear(fh, d)
        self.proj = _Linear(d, fh)


class _Router(nn.Module):
    def __init__(self, e, d):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(e, d))


class _Experts(nn.Module):
    def __init__(self, e, n_out, n_in):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(e, n_out, n_in))
        self.bias = nn.Parameter(torch.zeros(e, n_out))


class _MoE(nn.Module):
    def __init__(self, e, d, fh):
        super().__init__()
        self.router = _Router(e, d)
        self.fc = _Experts(e, fh, d)
        self.proj = _Experts(e, d, fh)


class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        D, Fh, E = c["d_model"], c["d_ff"], c["n_experts"]
        self.attn_norm = _Gain(D)
        self.attn = _Attention(D)
        self.ffn_norm = _Gain(D)
        if E:
            self.moe = _MoE(E, D, Fh)
        else:
            self.ffn = _Dense(D, Fh)



def target_norm_of(meta: Mapping[str, str], n_outputs: int,
                   path: str) -> Optional[Tuple[np.ndarray, np.ndarray]]:
    """(mean, std) as float32 arrays [O] from a checkpoint's kiln.target_norm (the training
    split's mean and population std of each target, which the trainer fitted the head to), or
    None when the key is absent (a checkpoint written before targets were standardised).
    Raises kiln.Error naming the file when it is malformed."""
    text = meta.get("kiln.target_norm")
    if text is None:
        return None
    try:
        tn = json.loads(text)
        mean = np.asarray(tn["mean"], dtype=np.float64)
        std = np.asarray(tn["std"], dtype=np.float64)
    except (ValueError, KeyError, TypeError, RecursionError):
        raise Error(f"'{path}': kiln.target_norm is not {{\"mean\": [...], \"std\": [...]}}") from None
    if mean.shape != (n_outputs,) or std.shape != (n_outputs,) or not np.all(np.isfinite(mean)) \
            or not np.all(std > 0) or not np.all(np.isfinite(std)):
        raise Error(f"'{path}': kiln.target_norm needs {n_outputs} finite means and positive stds")
    return mean.astype(np.float32), std.astype(np.float32)


def fold_head(weight: np.ndarray, bias: np.ndarray, mean: np.ndarray,
              std: np.ndarray) -> Tuple[np.ndarray, np.ndarray]:
    """head.weight [O,D] and head.bias [O] trained on standardised targets, (y - mean) / std,
    with the standardisation folded in: W' = std W, b' = std b + mean, in float32 as kiln
    export folds them (export/freeze.c): the head then predicts in the data's own units."""
    mean32 = np.asarray(mean, dtype=np.float32)
    std32 = np.asarray(std, dtype=np.float32)
    w = np.asarray(weight, dtype=np.float32)
    b = np.asarray(bias, dtype=np.float32)
    return (w * std32[:, None]).astype(np.float32), (b * std32 + mean32).astype(np.float32)


def fold_target_norm(tensors: Arrays, meta: Mapping[str, str], n_outputs: int,
                     path: str) -> Arrays:
    """A checkpoint's tensors (name -> numpy array) with its target standardisation
    (``meta["kiln.target_norm"]``, target_norm_of) folded into head.weight and head.bias
    (fold_head): bit for bit the head ``kiln export`` writes, so the model predicts in the
    data's units. Tensors without the key are returned as they are; ``path`` names the file
    in errors. TSMoE.from_checkpoint uses it; save_model_dir folds a model's own
    set_target_norm the same way."""
    tn = target_norm_of(meta, n_outputs, path)
    if tn is None:
        return tensors
    out = dict(tensors)
    out["head.weight"], out["head.bias"] = fold_head(tensors["head.weight"], tensors["head.bias"],
                                                     *tn)
    return out

class TSMoE(nn.Module):
    """kiln-tsmoe/1 (docs/model.md). ``state_dict()`` names are kiln's safetensors names.

    ``TSMoE(config, seed=1)`` initialises as ``kiln train`` does with that seed (bitwise, in
    float32); ``seed=None`` leaves the zeros and ones of construction. Parameters are float32;
    ``.double()`` makes a float64 twin. ``forward(x, targets=None)`` returns ``(y, loss)``:
    ``y`` [B,S,O] and, with targets, a dict of the loss and its terms (``loss``, ``mse``,
    ``load_balance`` = sum of lb_l, ``z`` = sum of z_l), else None.

    Targets at any scale, as ``kiln train`` fits them (docs/train.md): ``set_target_norm``
    takes the training rows' targets and the head then fits (y - mean) / std, so ``mse`` is
    about 1 whatever the data's units (daily returns, std ~0.01, would otherwise leave an MSE
    of ~1e-4 under a load-balance term of ~0.02, and the model would learn nothing). ``y`` is
    always in the data's units (the head's output times std plus mean); ``mse`` and ``loss``
    are in standardised units, as kiln's metrics. ``save_model_dir`` folds the
    standardisation into the head as ``kiln export`` does. The mean and std are buffers
    outside ``state_dict()`` (not tensors of kiln's files); without ``set_target_norm`` they
    are 0 and 1, which change no bit.

    The pieces a variant might change are overridable methods (``gelu``, ``alibi_slopes``,
    ``top_k_gates``), so that a researcher's change (or a deliberate mistake, in the tests) is
    one method of a subclass."""

    def __init__(self, config: Mapping[str, Any], seed: Optional[int] = 1,
                 aux_loss_coef: float = 0.01, z_loss_coef: float = 0.001) -> None:
        super().__init__()
        self.config = check_config(config)
        c = self.config
        self.aux_loss_coef = aux_loss_coef
        self.z_loss_coef = z_loss_coef
        self.step = 0  # optimizer steps taken; save_model_dir records it
        self.norm = _InputNorm(c["n_features"])
        self.embed = _Linear(c["d_model"], c["n_features"])
        self.blocks = nn.ModuleList(_Block(c) for _ in range(c["n_layers"]))
        self.final_norm = _Gain(c["d_model"])
        self.head = _Linear(c["n_outputs"], c["d_model"])
        # The targets' standardisation the head fits (set_target_norm): not kiln tensors.
        self.register_buffer("target_mean", torch.zeros(c["n_outputs"]), persistent=False)
        self.register_buffer("target_std", torch.ones(c["n_outputs"]), persistent=False)
        if seed is not None:
            self.load_arrays(init_params(c, seed))

    # -- the pieces of docs/model.md a variant may change --
    def gelu(self, u: torch.Tensor) -> torch.Tensor:
        """The GELU the model uses (module gelu); a variant overrides it."""
        return gelu(u)

    def alibi_slopes(self, n_heads: int) -> List[float]:
        """The ALiBi slopes the model uses (module alibi_slopes); a variant overrides it."""
        return alibi_slopes(n_heads)

    def top_k_gates(self, p: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
        """The routing the model uses (module top_k_gates); a variant overrides it."""
        return top_k_gates(p, k)

    # -- forward --
    def attention(self, blk: nn.Module, u: torch.Tensor) -> torch.Tensor:
        """Block blk's windowed multi-head attention with ALiBi over u [B,S,D] (docs/model.md,
        "Attention"): [B,S,D]."""
        c = self.config
        B, S, D = u.shape
        H, W = c["n_heads"], c["attn_window"]
        Dh = D // H
        qkv = u @ blk.attn.qkv.weight.T + blk.attn.qkv.bias
        q, k, v = (t.view(B, S, H, Dh).transpose(1, 2) for t in qkv.split(D, dim=-1))
        slopes = torch.tensor(self.alibi_slopes(H), dtype=u.dtype, device=u.device)
        # Query rows in blocks, each against the keys its window reaches, so that a long
        # sequence (a whole held-out file) costs S*W, not S*S.
        C = max(W, 256)
        blocks = []
        for i0 in range(0, S, C):
            i1, j0 = min(S, i0 + C), max(0, i0 - W + 1)
            i = torch.arange(i0, i1, device=u.device)
            j = torch.arange(j0, i1, device=u.device)
            dist = (i[:, None] - j[None, :]).to(u.dtype)  # i - j
            score = q[:, :, i0:i1] @ k[:, :, j0:i1].transpose(-1, -2) / math.sqrt(Dh)
            score = score - slopes[:, None, None] * dist
            score = score.masked_fill(~((dist >= 0) & (dist < W)), float("-inf"))
            blocks.append(torch.softmax(score, dim=-1) @ v[:, :, j0:i1])  # [B,H,i1-i0,Dh]
        o = torch.cat(blocks, dim=2).transpose(1, 2).reshape(B, S, D)
        return o @ blk.attn.out.weight.T + blk.attn.out.bias

    def mixture(self, blk: nn.Module,
                u: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The mixture branch for rows u [N,D]: (output [N,D], lb_l, z_l)."""
        c = self.config
        E, K = c["n_experts"], c["top_k"]
        moe = blk.moe
        r = u @ moe.router.weight.T  # [N,E]
        p = torch.softmax(r, dim=-1)
        idx, gates = self.top_k_gates(p, K)
        out = torch.zeros_like(u)
        for e in range(E):
            tok, slot = (idx == e).nonzero(as_tuple=True)
            if tok.numel() == 0:
                continue
            x = u[tok]
            h = self.gelu(x @ moe.fc.weight[e].T + moe.fc.bias[e])
            y = h @ moe.proj.weight[e].T + moe.proj.bias[e]
            out = out.index_add(0, tok, gates[tok, slot].unsqueeze(-1) * y)
        N = u.shape[0]
        f = torch.bincount(idx.reshape(-1), minlength=E).to(u.dtype) / (N * K)  # no gradient
        P = p.mean(dim=0)
        lb = E * (f * P).sum()
        z = (torch.logsumexp(r, dim=-1) ** 2).mean()
        return out, lb, z

    def forward(self, x: Any, targets: Any = None
                ) -> Tuple[torch.Tensor, Optional[Dict[str, torch.Tensor]]]:
        """(y [B,S,O], loss) for inputs x [B,S,F] (numpy or torch): y in the data's units;
        loss None without targets [B,S,O], else a dict of tensors loss, mse, load_balance and
        z (docs/model.md "Loss"), in standardised units once set_target_norm was called."""
        c = self.config
        dt = self.embed.weight.dtype
        try:
            x = torch.as_tensor(x).to(dt)
        except (TypeError, ValueError, RuntimeError) as e:
            raise Error(f"inputs are not numbers: {e}") from None
        if x.dim() != 3 or x.shape[-1] != c["n_features"]:
            raise Error(f"inputs have shape {list(x.shape)}, expected [B, S, {c['n_features']}]")
        B, S, _ = x.shape
        eps = c["norm_eps"]
        h = ((x - self.norm.in_mean) / self.norm.in_std) @ self.embed.weight.T + self.embed.bias
        lb_sum = torch.zeros((), dtype=dt)
        z_sum = torch.zeros((), dtype=dt)
        for blk in self.blocks:
            h = h + self.attention(blk, rmsnorm(h, blk.attn_norm.weight, eps))
            u = rmsnorm(h, blk.ffn_norm.weight, eps)
            if c["n_experts"]:
                out, lb, z = self.mixture(blk, u.reshape(B * S, -1))
                h = h + out.view(B, S, -1)
                lb_sum = lb_sum + lb
                z_sum = z_sum + z
            else:
                a = self.gelu(u @ blk.ffn.fc.weight.T + blk.ffn.fc.bias)
                h = h + a @ blk.ffn.proj.weight.T + blk.ffn.proj.bias
        ys = rmsnorm(h, self.final_norm.weight, eps) @ self.head.weight.T + self.head.bias
        y = ys * self.target_std + self.target_mean  # the data's units
        if targets is None:
            return y, None
        try:
            t = torch.as_tensor(targets).to(dt)
        except (TypeError, ValueError, RuntimeError) as e:
            raise Error(f"targets are not numbers: {e}") from None
        if t.shape != y.shape:
            raise Error(f"targets have shape {list(t.shape)}, expected {list(y.shape)}")
        mse = ((ys - (t - self.target_mean) / self.target_std) ** 2).mean()
        loss = mse + self.aux_loss_coef * lb_sum + self.z_loss_coef * z_sum
        return y, {"loss": loss, "mse": mse, "load_balance": lb_sum, "z": z_sum}

    # -- parameters by kiln's names --
    def arrays(self) -> Arrays:
        """Every parameter and norm.in_* as float32 numpy arrays by kiln's names."""
        return {k: v.detach().cpu().to(torch.float32).numpy().copy()
                for k, v in self.state_dict().items()}

    def load_arrays(self, arrays: Mapping[str, Any], source: str = "arrays") -> None:
        """Set every parameter from numpy arrays by kiln's names (each must be there, with
        its shape; extra names are refused)."""
        sd = self.state_dict()
        want = set(sd)
        have = set(arrays)
        if want - have:
            raise Error(f"'{source}': tensor '{sorted(want - have)[0]}' is missing")
        if have - want:
            raise Error(f"'{source}': unexpected tensor '{sorted(have - want)[0]}'")
        with torch.no_grad():
            for k, v in sd.items():
                a = _array(arrays[k], f"'{source}': tensor '{k}'")
                if tuple(a.shape) != tuple(v.shape):
                    raise Error(f"'{source}': tensor '{k}' has shape {list(a.shape)}, expected "
                                f"{list(v.shape)}")
                if not np.all(np.isfinite(a)):
                    raise Error(f"'{source}': tensor '{k}' holds a non-finite value")
                v.copy_(torch.from_numpy(np.array(a)).to(v.dtype))
        if not torch.all(self.norm.in_std > 0):
            raise Error(f"'{source}': norm.in_std must be positive")

    def set_input_norm(self, features: Any) -> None:
        """norm.in_mean / norm.in_std from the training rows [N, F] as the trainer sets them:
        mean and population standard deviation in double, floored at 1e-6."""
        f = _array(features, "features", np.float32).astype(np.float64)
        mu = f.mean(axis=0)
        sd = np.sqrt(((f - mu) ** 2).mean(axis=0))
        with torch.no_grad():
            self.norm.in_mean.copy_(torch.from_numpy(mu.astype(np.float32)))
            self.norm.in_std.copy_(torch.from_numpy(np.maximum(sd, 1e-6).astype(np.float32)))

    def set_target_norm(self, targets: Any) -> None:
        """The targets' standardisation from the training rows [N, O] as the trainer sets it
        (train/trainer.c set_target_norm): mean and population standard deviation in double,
        stored as float32; a constant target keeps std 1. The head then fits standardised
        targets; outputs stay in the data's units (see the class)."""
        t = _array(targets, "targets", np.float32).astype(np.float64)
        O = self.config["n_outputs"]
        if t.ndim != 2 or t.shape[1] != O or t.shape[0] < 1:
            raise Error(f"targets have shape {list(t.shape)}, expected [N, {O}] with N >= 1")
        if not np.all(np.isfinite(t)):
            raise Error("targets hold a non-finite value")
        mu = t.mean(axis=0)
        sd = np.sqrt(((t - mu) ** 2).mean(axis=0))
        sd32 = sd.astype(np.float32)
        sd32 = np.where((sd > 0) & (sd32 > 0), sd32, np.float32(1))
        with torch.no_grad():
            self.target_mean.copy_(torch.from_numpy(mu.astype(np.float32)))
            self.target_std.copy_(torch.from_numpy(sd32.astype(np.float32)))

    def target_norm(self) -> Tuple[np.ndarray, np.ndarray]:
        """(mean, std), float32 numpy arrays [O]: what set_target_norm set (0 and 1 unset)."""
        return (self.target_mean.detach().cpu().to(torch.float32).numpy().copy(),
                self.target_std.detach().cpu().to(torch.float32).numpy().copy())

    def _has_target_norm(self) -> bool:
        mean, std = self.target_norm()
        return bool(np.any(mean != 0) or np.any(std != 1))

    def folded_arrays(self) -> Arrays:
        """arrays() with the target standardisation folded into head.weight and head.bias
        (fold_head), what save_model_dir writes: kiln's runtime then predicts what this model
        predicts, in the data's units."""
        a = self.arrays()
        if self._has_target_norm():
            a["head.weight"], a["head.bias"] = fold_head(a["head.weight"], a["head.bias"],
                                                         *self.target_norm())
        return a

    # -- kiln's files --
    @classmethod
    def from_model_dir(cls, path: PathLike) -> "TSMoE":
        """A model directory (or its model.safetensors) as kiln export writes it; bf16
        weights are widened exactly."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise Error(f"model directory: expected a path, not {type(path).__name__}")
        f = os.path.join(path, "model.safetensors") if os.path.isdir(path) else path
        return cls._from_file(f, checkpoint=False)

    @classmethod
    def from_checkpoint(cls, path: PathLike, fold_targets: bool = True) -> "TSMoE":
        """A training checkpoint (RUN/ckpt/step-N.safetensors): its data digest is checked as
        kiln export checks it; the AdamW moments (m.*, v.*) are left behind; ``step`` is
        kiln.step. The trainer's target standardisation (kiln.target_norm) is folded into the
        head as kiln export folds it, so the model predicts in the data's units;
        ``fold_targets=False`` keeps the head as trained (on standardised targets) and sets the
        model's target standardisation from the checkpoint instead (set_target_norm), so that
        it predicts in the data's units and trains on as the trainer would."""
        if not isinstance(path, (str, bytes, os.PathLike)):
            raise Error(f"checkpoint: expected a path, not {type(path).__name__}")
        return cls._from_file(path, checkpoint=True, fold_targets=fold_targets)

    @classmethod
    def _from_file(cls, path: PathLike, checkpoint: bool, fold_targets: bool = True) -> "TSMoE":
        tensors, meta = read_safetensors(path)
        if "kiln.config" not in meta:
            raise Error(f"'{path}': no kiln.config in __metadata__")
        try:
            cfg = json.loads(meta["kiln.config"])
        except (ValueError, RecursionError):
            raise Error(f"'{path}': kiln.config is not JSON") from None
        try:
            cfg = check_config(cfg)
        except Error as e:
            raise Error(f"'{path}': {e.message}") from None
        # Every parameter of the config, with its shape, before the module is made: a config
        # of sizes the file does not hold must not allocate them first.
        for pname, shape, _ in param_table(cfg):
            t = tensors.get(pname)
            if t is None:
                raise Error(f"'{path}': tensor '{pname}' is missing")
            if tuple(t.shape) != tuple(shape):
                raise Error(f"'{path}': tensor '{pname}' has shape {list(t.shape)}, expected "
                            f"{list(shape)} (kiln.config)")
        if checkpoint:
            want = meta.get("kiln.data_sha256")
            if want is None:
                raise Error(f"'{path}': no kiln.data_sha256 in __metadata__ (not a checkpoint)")
            blob = _read_file(path)
            (hlen,) = struct.unpack("<Q", blob[:8])
            if hashlib.sha256(blob[8 + hlen:]).hexdigest() != want:
                raise Error(f"'{path}': tensor data digest mismatch (corrupted checkpoint)")
            tensors = {k: v for k, v in tensors.items()
                       if not k.startswith("m.") and not k.startswith("v.")}
            tn = target_norm_of(meta, cfg["n_outputs"], path)
            if fold_targets:
                tensors = fold_target_norm(tensors, meta, cfg["n_outputs"], path)
        m = cls(cfg, seed=None)
        m.load_arrays(tensors, source=path)
        if checkpoint and not fold_targets and tn is not None:
            with torch.no_grad():
                m.target_mean.copy_(torch.from_numpy(tn[0]))
                m.target_std.copy_(torch.from_numpy(tn[1]))
        try:
            m.step = int(meta.get("kiln.step", 0))
        except ValueError:
            raise Error(f"'{path}': kiln.step is not a step number") from None
        m.meta = meta
        return m

    def save_model_dir(self, path: PathLike, dataset: Optional[PathLike] = None,
                       lineage: Optional[Mapping[str, Any]] = None, name: Optional[str] = None,
                       code_version: Optional[str] = None,
                       train_config: Optional[Mapping[str, Any]] = None,
                       metrics: Optional[Mapping[str, Any]] = None,
                       created: Optional[str] = None, force: bool = False) -> None:
        """Write a model directory: model.safetensors (F32, kiln.config, kiln.step) and
        card.json (kiln-card/1) whose lineage says where the model came from: the framework
        and its version, ``code_version`` (the researcher's, e.g. a git commit), the dataset's
        sha256 (``dataset``: the kiln dataset file trained on), the step, ``train_config``
        (its ``val_fraction`` places the held-out split for golden make and validate) and
        ``metrics``; ``lineage`` (a dict) adds or overrides keys. The target standardisation
        (set_target_norm) is folded into the head (folded_arrays), as kiln export folds it,
        and recorded as ``lineage.target_norm`` {mean, std, folded_into}, so the saved model
        predicts in the data's units and validate reports its loss in the units ``metrics``
        are in. Written into a temporary directory beside ``path`` and renamed into place; an
        existing non-empty directory is refused unless ``force``."""
        path = _path(path, "model directory")
        if dataset is not None:
            dataset = _path(dataset, "dataset")
        if os.path.lexists(path) and not (os.path.isdir(path) and not os.listdir(path)):
            if not force or not os.path.isdir(path):
                raise Error(f"'{path}' exists and is not an empty directory")
        if name is None:
            name = "torch-model"
        lin = {
            "source": "kiln.torch",
            "framework": "torch " + torch.__version__,
            "code_version": code_version,
            "step": int(self.step),
            "dataset_sha256": None,
            "config": dict(train_config) if train_config else None,
            "metrics": dict(metrics) if metrics else None,
        }
        if dataset is not None:
            lin["dataset_sha256"] = sha256_file(dataset)
            lin["dataset_path"] = os.path.abspath(dataset)
        if self._has_target_norm():
            mean, std = self.target_norm()
            lin["target_norm"] = {"mean": [float(v) for v in mean],
                                  "std": [float(v) for v in std],
                                  "folded_into": "head.weight, head.bias"}
        if lineage:
            lin.update(lineage)
        if created is None:
            created = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        card = {"format": CARD_FORMAT, "name": name, "created": created, "dtype": "f32",
                "config": json.loads(config_text(self.config)), "lineage": lin}
        parent = os.path.dirname(os.path.abspath(path))
        # The directories above it, as kiln export makes them ("nb/model" in a fresh notebook).
        try:
            os.makedirs(parent, exist_ok=True)
        except OSError as e:
            raise Error(f"'{parent}': cannot make the directory for '{path}': "
                        f"{e.strerror or e}") from None
        tmp = tempfile.mkdtemp(prefix="." + os.path.basename(os.path.abspath(path)) + ".save-",
                               dir=parent)
        try:
            os.chmod(tmp, 0o755)
            write_safetensors(os.path.join(tmp, "model.safetensors"), self.folded_arrays(),
                              {"kiln.config": config_text(self.config),
                               "kiln.step": str(int(self.step)),
                               "kiln.source": "kiln.torch (torch " + torch.__version__ + ")"})
            text = json.dumps(card, indent=2, sort_keys=True) + "\n"
            _atomic_write(os.path.join(tmp, "card.json"), [text.encode()])
            if os.path.isdir(path) and os.listdir(path):
                old = tempfile.mkdtemp(prefix="." + os.path.basename(path) + ".old-", dir=parent)
                os.rename(path, os.path.join(old, "d"))
                os.rename(tmp, path)
                shutil.rmtree(old, ignore_errors=True)
            else:
                if os.path.isdir(path):
                    os.rmdir(path)
                os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise

    @torch.no_grad()
    def predict(self, x: Any) -> np.ndarray:
        """Outputs for raw inputs [B,S,F] or [S,F] as a numpy array (float32 for a float32
        model), in eval mode, without gradients."""
        try:
            a = np.asarray(x)
        except (ValueError, TypeError, OverflowError, MemoryError) as e:
            raise Error(f"inputs are not an array of numbers: {e}") from None
        if a.dtype.kind not in "biuf":
            raise Error(f"inputs have dtype {a.dtype}, not numbers")
        if a.ndim not in (2, 3) or a.shape[-1] != self.config["n_features"]:
            raise Error(f"inputs have shape {list(a.shape)}, expected [S, "
                        f"{self.config['n_features']}] or [B, S, {self.config['n_features']}]")
        try:
            y, _ = self.forward(torch.from_numpy(np.ascontiguousarray(a[None] if a.ndim == 2
                                                                      else a)))
        except (MemoryError, RuntimeError) as e:
            raise Error(f"inputs of shape {list(a.shape)}: {e}") from None
        y = y.cpu().numpy()
        return y[0] if a.ndim == 2 else y

    def reference_outputs(self, model_dir: PathLike, out: PathLike) -> np.ndarray:
        """Write REF for ``kiln validate --reference``: this model's outputs [W,S,O] on the
        inputs of ``model_dir/golden/golden.safetensors`` (made by ``kiln golden make``),
        stored as F32 ``outputs``, with the digest of the inputs used (kiln.inputs_sha256)
        so that kiln can tell a REF computed on another golden set."""
        g = os.path.join(model_dir, "golden", "golden.safetensors")
        tensors, _ = read_safetensors(g)
        if "inputs" not in tensors:
            raise Error(f"'{g}': no tensor 'inputs'")
        x = tensors["inputs"].astype(np.float32)
        y = self.predict(x).astype(np.float32)
        write_safetensors(out, {"outputs": y}, {
            "kiln.format": "kiln-reference/1",
            "kiln.inputs_sha256": hashlib.sha256(np.ascontiguousarray(x).tobytes()).hexdigest(),
            "kiln.engine": "kiln.torch TSMoE, torch %s, %s" % (
                torch.__version__, str(self.embed.weight.dtype).replace("torch.", "")),
        })
        return y


def compare(a: Any, b: Any, rtol: float = 1e-4, atol: float = 1e-5) -> Dict[str, Any]:
    """kiln's comparison rule (validate/thresholds.c kiln_compare_f32), a candidate a against a
    reference b of the same shape: with M = max |b|, an element agrees when |a - b| <=
    max(atol M, rtol |b|). Returns compared, max_abs_err, max_rel_err (|a - b| / max(|b|,
    atol M / rtol)), scale M, outside (elements that disagree), nonfinite and passed (no
    element outside, none non-finite). No router near-tie is excused here."""
    a = _array(a, "compare: a", np.float64)
    b = _array(b, "compare: b", np.float64)
    if a.shape != b.shape and a.size == b.size:
        a, b = a.reshape(-1), b.reshape(-1)
    if a.shape != b.shape:
        raise Error(f"shapes differ: {list(a.shape)} against {list(b.shape)}")
    finite = np.isfinite(a) & np.isfinite(b)
    M = float(np.abs(b[finite]).max()) if finite.any() else 0.0
    d = np.abs(a - b)
    floor = atol * M / rtol if rtol > 0 else 0.0
    den = np.maximum(np.abs(b), floor)
    with np.errstate(divide="ignore", invalid="ignore"):
        rel = np.where(den > 0, d / np.where(den > 0, den, 1), np.where(d > 0, np.inf, 0))
    out = ~finite | (d > np.maximum(atol * M, rtol * np.abs(b)))
    return {"compared": int(a.size), "max_abs_err": float(d[finite].max()) if finite.any() else 0,
            "max_rel_err": float(rel[finite].max()) if finite.any() else 0, "scale": M,
            "outside": int(out.sum()), "nonfinite": bool((~finite).any()),
            "passed": bool(finite.all() and not out.any())}
