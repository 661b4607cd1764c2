"""A model trained in PyTorch, released by kiln: examples/research.py trains kiln-tsmoe/1 in
float32 for a few hundred steps and saves a model directory, its golden set and its reference
outputs; kiln validate --reference passes; kiln release --model publishes it to a registry on
loopback and promotes it; kiln pull fetches it and kiln infer on the pulled model reproduces
the notebook's predictions within the parity thresholds. A reference that the runtime does not
reproduce stops the release at validate, before anything is published.

Everything of kiln is reached through the CLI (env KILN, default build/kiln)."""

import json
import os
import re
import subprocess
import sys
import time

import numpy as np

import kiln.torch as kt

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILN = os.environ.get("KILN", os.path.join(ROOT, "build", "kiln"))
RESEARCH = os.path.join(ROOT, "examples", "research.py")


def run(args, ok=(0,), **kw):
    p = subprocess.run(args, capture_output=True, text=True, **kw)
    if p.returncode not in ok:
        raise AssertionError(f"{' '.join(args)}: exit {p.returncode}\n{p.stdout}{p.stderr}")
    return p


def kiln(*args, ok=(0,)):
    return run([KILN, *args], ok=ok)


def check(what, cond):
    if not cond:
        raise AssertionError(what)


class Registry:
    """`kiln registry serve` of a fresh store on a free loopback port."""

    def __init__(self, tmp, trust):
        self.root = os.path.join(tmp, "reg")
        self.pub = kiln("registry", "token", "create", "--root", self.root, "--name", "ci",
                        "--scope", "publish").stdout.strip()
        self.prom = kiln("registry", "token", "create", "--root", self.root, "--name", "rm",
                         "--scope", "promote").stdout.strip()
        self.out = open(os.path.join(tmp, "serve.out"), "w+")
        self.proc = subprocess.Popen([KILN, "registry", "serve", "--root", self.root, "--listen",
                                      "127.0.0.1:0", "--trust", trust], stdout=self.out,
                                     stderr=subprocess.STDOUT)
        for _ in range(200):
            self.out.seek(0)
            m = re.search(r" on (http://127\.0\.0\.1:\d+)", self.out.read())
            if m:
                self.url = m.group(1)
                return
            if self.proc.poll() is not None:
                break
            time.sleep(0.05)
        self.close()
        self.out.seek(0)
        raise AssertionError("registry did not start: " + self.out.read())

    def close(self):
        self.proc.terminate()
        self.proc.wait()
        self.out.close()


def test_torch_release(tmp):
    # The commands run in tmp, as a user's shell would; the suite's working directory is
    # given back after.
    cwd = os.getcwd()
    os.chdir(tmp)
    try:
        release(tmp)
    finally:
        os.chdir(cwd)


def release(tmp):
    kiln("data", "synth", "--seed", "2", "--rows", "6000", "--features", "6", "--outputs", "2",
         "--out", "d.st")
    # The notebook: 200 AdamW steps in float32, a model directory, golden set, reference.
    p = run([sys.executable, RESEARCH, "--data", "d.st", "--out", "nb", "--steps", "200",
             "--batch", "8", "--windows", "16", "--name", "torchy", "--code-version", "nb-1"],
            env=dict(os.environ, KILN=KILN))
    check("research.py reports its step: " + p.stdout, "step 200/200" in p.stdout)
    for f in ("model/model.safetensors", "model/card.json", "model/golden/golden.safetensors",
              "reference.safetensors", "heldout.safetensors", "predictions.safetensors"):
        check(f"research.py wrote {f}", os.path.exists(os.path.join("nb", f)))
    card = json.load(open("nb/model/card.json"))
    check("card: code version", card["lineage"]["code_version"] == "nb-1")
    check("card: dataset", card["lineage"]["dataset_sha256"] == kt.sha256_file("d.st"))
    check("card: step", card["lineage"]["step"] == 200)

    p = kiln("validate", "--model", "nb/model", "--data", "d.st", "--reference",
             "nb/reference.safetensors")
    check("validate --reference: " + p.stdout, re.search(r"^parity_reference +passed", p.stdout,
                                                         re.M))

    for k in ("rel", "prom"):
        kiln("keygen", "--out", k, "--no-password")
    pub = {k: open(k + ".pub").read().splitlines()[-1] for k in ("rel", "prom")}
    with open("trust.json", "w") as f:
        json.dump({"format": "kiln-trust/1", "keys": [
            {"name": "rel", "pubkey": pub["rel"], "roles": ["release"]},
            {"name": "prom", "pubkey": pub["prom"], "roles": ["promote"]}],
            "channels": {"staging": {"threshold": 1}, "production": {"threshold": 1}}}, f)
    reg = Registry(tmp, "trust.json")
    try:
        common = ["--name", "torchy", "--registry", reg.url, "--key", "rel.key", "--trust",
                  "trust.json", "--token", reg.pub, "--state", "st", "--windows", "16",
                  "--data", "d.st"]
        promote = ["--promote", "production", "--promote-key", "prom.key", "--promote-token",
                   reg.prom]

        # A reference the runtime does not reproduce (every output moved by 1%): stopped at
        # validate, nothing published.
        t, meta = kt.read_safetensors("nb/reference.safetensors")
        kt.write_safetensors("bad-ref.safetensors", {"outputs": t["outputs"] * 1.01}, meta)
        p = kiln("release", "--model", "nb/model", "--version", "0.9.0", "--reference",
                 "bad-ref.safetensors", "--out-dir", "r0", *common, ok=(1,))
        check("stopped at validate: " + p.stderr,
              "release stopped at stage 'validate'" in p.stderr and "parity_reference" in p.stderr)
        check("nothing published: " + p.stderr, "nothing was published" in p.stderr)
        check("no archive", not os.path.exists("r0/torchy-0.9.0.kiln"))

        # Usage: a run and --model at once, or a model directory that is not there.
        p = kiln("release", "nb", "--model", "nb/model", "--version", "1.0.0", *common, ok=(2,))
        check("one of run and --model: " + p.stderr, "one of the two" in p.stderr)
        p = kiln("release", "--model", "nope", "--version", "1.0.0", *common, ok=(2,))
        check("missing model directory named: " + p.stderr, "'nope'" in p.stderr)
        check("nothing made for it", not os.path.exists("release-torchy-1.0.0"))

        p = kiln("release", "--model", "nb/model", "--version", "1.0.0", "--reference",
                 "nb/reference.safetensors", "--out-dir", "r1", *common, *promote)
        out = p.stdout
        for s in ("check", "export", "golden", "baseline", "validate", "pack", "sign",
                  "publish", "promote"):
            check(f"stage {s}: {out}", re.search(rf"^\[\d/9\] {s} ", out, re.M))
        check("copied, not exported: " + out, "model directory 'nb/model' copied" in out)
        check("validated with parity_reference: " + out,
              re.search(r"^\[5/9\] validate +passed: .*parity_reference", out, re.M))
        check("promoted: " + out, "torchy/production -> 1.0.0 seq 1" in out)
        rep = json.load(open("r1/model/validation.json"))
        check("report: parity_reference passed",
              rep["checks"]["parity_reference"]["status"] == "passed" and rep["passed"])

        p = kiln("pull", "torchy@production", "--registry", reg.url, "--trust", "trust.json",
                 "--state", "st", "--out", "pulled")
        check("pulled 1.0.0: " + p.stdout, "pulled torchy@1.0.0" in p.stdout)
        check("the pulled card says where it came from",
              json.load(open("pulled/card.json"))["lineage"]["code_version"] == "nb-1")
        kiln("infer", "--model", "pulled", "--input", "nb/heldout.safetensors", "--out",
             "inf.safetensors")
        p = run([sys.executable, RESEARCH, "compare", "nb/predictions.safetensors",
                 "inf.safetensors"])
        check("kiln infer within the parity thresholds of the notebook: " + p.stdout,
              "within" in p.stdout)
        print("  " + p.stdout.strip())
        a = kt.read_safetensors("inf.safetensors")[0]["outputs"]
        b = kt.read_safetensors("nb/predictions.safetensors")[0]["outputs"]
        check("as many predictions as held-out rows", a.size == b.size and a.size > 1000)
        check("compare can fail", not kt.compare(a * 1.001, b)["passed"])
    finally:
        reg.close()
