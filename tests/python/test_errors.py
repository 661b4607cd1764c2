"""kiln's errors as Python users expect them (issue 33): a class per kiln_err code that also
subclasses the built-in exception of its meaning; the table is include/kiln.h's enum, read
from the header here, so a code added in C and not in Python (the package stopped at 9 while
kiln.h went to 16) fails this test."""

import os
import pickle
import re

import kiln
from kiln import _error, _lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_errors_table_is_kiln_h():
    text = open(os.path.join(ROOT, "include", "kiln.h")).read()
    enum = dict((int(v), n) for n, v in re.findall(r"KILN_ERR_([A-Z]+) = (\d+)", text))
    assert enum and max(enum) >= 16, enum
    assert {c: n for c, (n, _) in _error.CODES.items()} == enum
    for code, name in enum.items():
        assert getattr(_lib, "ERR_" + name) == code, name


def test_errors_kinds_and_builtins():
    builtin = {"IO": OSError, "FORMAT": ValueError, "CONFIG": ValueError,
               "USAGE": ValueError, "NUMERIC": ArithmeticError, "NOTFOUND": FileNotFoundError,
               "UNSUPPORTED": NotImplementedError, "CONFLICT": FileExistsError,
               "AUTH": PermissionError, "NETWORK": ConnectionError, "LIMIT": ValueError,
               "INTERRUPTED": InterruptedError}
    for code, (name, cls) in _error.CODES.items():
        e = kiln.Error(f"failure {name}", code)
        assert type(e) is cls and isinstance(e, kiln.Error), (code, type(e))
        assert e.code == code and str(e) == f"failure {name}" and e.message == str(e)
        if name in builtin:
            assert isinstance(e, builtin[name]), (name, type(e).__mro__)
        assert cls.__name__ in kiln.__all__ and getattr(kiln, cls.__name__) is cls
        direct = cls("said directly")
        assert direct.code == code, (name, direct.code)
        back = pickle.loads(pickle.dumps(e))
        assert type(back) is cls and back.code == code and str(back) == str(e)
    assert type(kiln.Error("no code")) is kiln.Error and kiln.Error("no code").code == 0
    assert type(kiln.Error("unknown", 99)) is kiln.Error


def test_errors_raised_by_the_bindings(tmp):
    # A NUL in a path is refused before C: a usage error, and a ValueError.
    try:
        kiln.Model("model\0dir")
    except ValueError as e:
        assert isinstance(e, kiln.UsageError) and e.code == 5, (type(e), e.code)
    else:
        raise AssertionError("a NUL in a path was accepted")
    # A file that is not a model: kiln's format error, a ValueError too.
    p = os.path.join(tmp, "notes.txt")
    with open(p, "w") as f:
        f.write("these are notes, not a model\n")
    try:
        kiln.Model(p)
    except kiln.Error as e:
        assert isinstance(e, kiln.FormatError) and isinstance(e, ValueError), type(e)
        assert "notes.txt" in str(e)
    else:
        raise AssertionError("a text file opened as a model")
