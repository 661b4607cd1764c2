"""The Python suite's runner: every function test_* of every tests/python/test_*.py, each
given a fresh temporary directory (its one argument, when it takes one). Names on the command
line select tests by prefix. Prints "N passed, N failed" last; exits 1 on any failure.

Run with Debian's interpreter: /usr/bin/python3 tests/python/run.py [prefix...]."""

import importlib.util
import inspect
import os
import shutil
import sys
import tempfile
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, os.path.join(ROOT, "python"))
sys.path.insert(0, HERE)


def load(path):
    name = os.path.splitext(os.path.basename(path))[0]
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def main(argv):
    wanted = argv[1:]
    passed = failed = 0
    files = sorted(f for f in os.listdir(HERE) if f.startswith("test_") and f.endswith(".py"))
    for f in files:
        try:
            mod = load(os.path.join(HERE, f))
        except Exception:
            failed += 1
            print(f"FAIL {f} (import)")
            traceback.print_exc()
            continue
        for name, fn in sorted(inspect.getmembers(mod, inspect.isfunction)):
            if not name.startswith("test_") or fn.__module__ != mod.__name__:
                continue
            short = name[5:]
            if wanted and not any(short.startswith(w) for w in wanted):
                continue
            tmp = tempfile.mkdtemp(prefix="kiln-py-")
            t0 = time.monotonic()
            try:
                fn(tmp) if len(inspect.signature(fn).parameters) else fn()
            except Exception:
                failed += 1
                print(f"FAIL {short} ({time.monotonic() - t0:.2f}s; files kept in {tmp})")
                traceback.print_exc()
                continue
            passed += 1
            print(f"ok   {short} ({time.monotonic() - t0:.2f}s)")
            shutil.rmtree(tmp, ignore_errors=True)
    print(f"{passed} passed, {failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
