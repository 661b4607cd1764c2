"""kiln from Python: models, streams, datasets and runs over libkiln.so (ctypes), and
kiln.torch, a PyTorch twin of kiln-tsmoe/1 (docs/python.md)."""

from ._error import (AuthError, ConfigError, ConflictError, DeviceError, Error, FormatError,
                     InternalError, Interrupted, IoError, LimitError, NetworkError, NotFoundError,
                     NumericError, OutOfMemory, UnsupportedError, UsageError, VerifyError)

_ERRORS = ["Error", "IoError", "OutOfMemory", "FormatError", "ConfigError", "UsageError",
           "VerifyError", "NumericError", "NotFoundError", "UnsupportedError", "ConflictError",
           "AuthError", "NetworkError", "DeviceError", "InternalError", "LimitError",
           "Interrupted"]
__all__ = _ERRORS + ["Model", "Stream", "push_many", "write_dataset", "read_dataset", "Dataset",
           "split", "Split",
           "Run", "runs", "Checkpoint", "version", "library_path"]

try:  # the bindings need numpy; kiln.Error (and kiln.torch) do not
    from ._runtime import Model, Stream, push_many
    from ._dataset import Dataset, Split, read_dataset, split, write_dataset
    from ._runs import Checkpoint, Run, runs
except ImportError as _e:  # pragma: no cover - a Python without numpy
    _missing = _e

    def __getattr__(name: str) -> object:
        if name in __all__:
            raise ImportError(f"kiln.{name} needs numpy ({_missing})")
        raise AttributeError(name)

from ._lib import library_path


def version() -> str:
    """libkiln's version string (kiln_version(): KILN_VERSION and the git revision)."""
    from ._lib import lib

    return lib().kiln_version().decode()
