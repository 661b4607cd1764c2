"""kiln from Python: models, streams, datasets and runs over libkiln.so (ctypes), and
kiln.torch, a PyTorch twin of kiln-tsmoe/1 (docs/python.md)."""

from ._error import Error

__all__ = ["Error"]
