"""kiln.Error and its kinds: every failure of the package, carrying kiln's message and error
code, as a class per code of ``kiln_err`` (include/kiln.h) that also subclasses the built-in
exception of the same meaning, so that ``except FileNotFoundError`` catches a kiln model file
that is not there and ``except kiln.VerifyError`` a failed check, while ``except kiln.Error``
still catches them all.

The table below is kiln.h's enum, in its order (appended, never renumbered);
tests/python/test_errors.py reads kiln.h and fails where the two differ."""

from typing import Any, Dict, Optional, Tuple, Type


class Error(Exception):
    """A kiln call failed. ``code`` is kiln's error code (``kiln_err``, an int; the bindings
    give arguments they refuse before any C call KILN_ERR_USAGE, 5; 0 where no kiln code
    applies), ``message`` the text kiln reported. ``Error(message, code)`` makes the kind of
    that code (``kiln.Error("...", 8)`` is a ``kiln.NotFoundError``)."""

    code: int
    message: str
    kiln_code: int = 0  # each kind's own code (set below from CODES)

    def __new__(cls, message: str = "", code: int = 0, *args: Any, **kwargs: Any) -> "Error":
        kind = (_KINDS.get(code) if cls is Error else None) or cls
        # The built-in base after Error in the kind's order (OSError.__new__ for the OSError
        # kinds, which refuse Exception.__new__).
        return super(Error, kind).__new__(kind, message)

    def __init__(self, message: str = "", code: int = 0) -> None:
        Exception.__init__(self, message)
        self.message = message
        self.code = code or getattr(type(self), "kiln_code", 0)

    def __str__(self) -> str:
        return self.message

    def __reduce__(self) -> Tuple[Type["Error"], Tuple[str, int]]:
        return (Error, (self.message, self.code))


class IoError(Error, OSError):
    """KILN_ERR_IO: a file or socket operation failed."""


class OutOfMemory(Error):
    """KILN_ERR_NOMEM: allocation failed. (Not a MemoryError: that one is Python's own
    interpreter running out, whose preallocated instances a subclass cannot share.)"""


class FormatError(Error, ValueError):
    """KILN_ERR_FORMAT: bytes that do not follow their documented format."""


class ConfigError(Error, ValueError):
    """KILN_ERR_CONFIG: a config key, value or combination is invalid."""


class UsageError(Error, ValueError):
    """KILN_ERR_USAGE: arguments that make no sense (a wrong shape, a NUL in a path)."""


class VerifyError(Error):
    """KILN_ERR_VERIFY: a check ran and failed: a digest, a signature, a validation."""


class NumericError(Error, ArithmeticError):
    """KILN_ERR_NUMERIC: NaN, infinity or divergence."""


class NotFoundError(Error, FileNotFoundError):
    """KILN_ERR_NOTFOUND: a named thing does not exist."""


class UnsupportedError(Error, NotImplementedError):
    """KILN_ERR_UNSUPPORTED: valid, but not supported by this build."""


class ConflictError(Error, FileExistsError):
    """KILN_ERR_CONFLICT: the thing exists already with other content."""


class AuthError(Error, PermissionError):
    """KILN_ERR_AUTH: missing or insufficient credentials."""


class NetworkError(Error, ConnectionError):
    """KILN_ERR_NETWORK: a connection or protocol failure."""


class DeviceError(Error):
    """KILN_ERR_DEVICE: CUDA, cuBLAS or NCCL failed."""


class InternalError(Error):
    """KILN_ERR_INTERNAL: a bug in kiln."""


class LimitError(Error, ValueError):
    """KILN_ERR_LIMIT: a size, count or length limit was exceeded."""


class Interrupted(Error, InterruptedError):
    """KILN_ERR_INTERRUPTED: stopped by a signal or a caller's request."""


# kiln_err (include/kiln.h): code -> (the name after KILN_ERR_, the class).
CODES: Dict[int, Tuple[str, Type[Error]]] = {
    1: ("IO", IoError),
    2: ("NOMEM", OutOfMemory),
    3: ("FORMAT", FormatError),
    4: ("CONFIG", ConfigError),
    5: ("USAGE", UsageError),
    6: ("VERIFY", VerifyError),
    7: ("NUMERIC", NumericError),
    8: ("NOTFOUND", NotFoundError),
    9: ("UNSUPPORTED", UnsupportedError),
    10: ("CONFLICT", ConflictError),
    11: ("AUTH", AuthError),
    12: ("NETWORK", NetworkError),
    13: ("DEVICE", DeviceError),
    14: ("INTERNAL", InternalError),
    15: ("LIMIT", LimitError),
    16: ("INTERRUPTED", Interrupted),
}
_KINDS: Dict[int, Type[Error]] = {code: cls for code, (_, cls) in CODES.items()}
for _code, _cls in _KINDS.items():
    _cls.kiln_code = _code  # kiln.UsageError("...") has code 5 without being told
del _code, _cls


def kind_of(code: int) -> Optional[Type[Error]]:
    """The class of a kiln_err code; None for 0 or a code this package does not know."""
    return _KINDS.get(code)
