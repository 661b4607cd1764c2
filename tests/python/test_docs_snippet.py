"""docs/python.md's kiln.torch snippet runs as it is written (issue 30: it used names it
never defined): in a fresh directory with a synthetic market.safetensors, the block is run
with Debian's interpreter, `kiln` on PATH; it trains, saves nb/model, makes its golden set and
reference outputs, and kiln validate --reference passes on what it wrote."""

import os
import re
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))


def test_docs_torch_snippet_runs(tmp):
    text = open(os.path.join(ROOT, "docs", "python.md")).read()
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "kiln.torch" in b]
    assert len(blocks) == 1, f"expected one kiln.torch block in docs/python.md, found {len(blocks)}"
    with open(os.path.join(tmp, "snippet.py"), "w") as f:
        f.write(blocks[0])
    subprocess.run([KILN, "data", "synth", "--seed", "1", "--rows", "3000", "--features", "8",
                    "--outputs", "2", "--out", os.path.join(tmp, "market.safetensors")],
                   check=True, capture_output=True)
    env = dict(os.environ, PATH=os.path.dirname(os.path.abspath(KILN)) + os.pathsep +
               os.environ.get("PATH", ""),
               PYTHONPATH=os.path.join(ROOT, "python"))
    p = subprocess.run([sys.executable, "snippet.py"], cwd=tmp, env=env, capture_output=True,
                       text=True)
    assert p.returncode == 0, p.stdout + p.stderr
    for f in ("nb/model/model.safetensors", "nb/model/card.json", "nb/model/golden/golden.json",
              "nb/reference.safetensors"):
        assert os.path.exists(os.path.join(tmp, f)), f"the snippet did not write {f}"
    p = subprocess.run([KILN, "validate", "--model", "nb/model", "--data", "market.safetensors",
                        "--reference", "nb/reference.safetensors"], cwd=tmp, capture_output=True,
                       text=True)
    assert p.returncode == 0 and "parity_reference         passed" in p.stdout, p.stdout + p.stderr
