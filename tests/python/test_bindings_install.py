"""`pip install ./python` into a virtual environment: the package installs (pure Python, no
compiler) and works there against the build's libkiln.so (KILN_LIB)."""

import os
import shutil
import subprocess
import sys

import numpy as np

import fixtures_bindings as fx
import kiln


def test_bindings_pip_install(tmp):
    # A copy, so that setuptools' build/ and egg-info land outside the repository.
    src = os.path.join(tmp, "python")
    shutil.copytree(os.path.join(fx.ROOT, "python"), src,
                    ignore=shutil.ignore_patterns("__pycache__", "build", "*.egg-info"))
    venv = os.path.join(tmp, "venv")
    # Debian's interpreter (python3-venv); numpy and setuptools from its packages
    # (--system-site-packages). Debian's pip installs into the venv (--python): what the venv's
    # own pip does, without the seconds of copying one in. No index: nothing is downloaded.
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", "--system-site-packages",
                    venv], check=True)
    p = subprocess.run(["/usr/bin/python3", "-m", "pip", "--python", os.path.join(venv, "bin", "python"),
                        "install", "--no-build-isolation", "--no-index", src],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    x = kiln.read_dataset(fx.dataset()).features[:64]
    np.save(os.path.join(tmp, "x.npy"), x)
    code = ("import kiln, numpy as np, sys; assert 'site-packages' in kiln.__file__, kiln.__file__; "
            f"m = kiln.Model({fx.model()!r}); "
            f"sys.stdout.buffer.write(m.forward(np.load({os.path.join(tmp, 'x.npy')!r})).tobytes())")
    env = dict(os.environ, KILN_LIB=kiln.library_path())
    env.pop("PYTHONPATH", None)
    p = subprocess.run([os.path.join(venv, "bin", "python"), "-c", code], capture_output=True,
                       env=env, cwd=tmp)
    assert p.returncode == 0, p.stderr.decode()
    with kiln.Model(fx.model()) as m:
        assert p.stdout == m.forward(x).tobytes()
