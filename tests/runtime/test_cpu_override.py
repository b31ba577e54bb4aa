"""Kernels compiled for another CPU (LOOPTOOL_CPU=znver2: AVX2, 16 vector registers) in a fresh process,
as `python -m bench.peers` runs them: AVX2 code, scheduled for that CPU, whose results match float64 NumPy."""
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close

HOST = dict(llvm.get_host_cpu_features().items())
pytestmark = pytest.mark.skipif(not (llvm.get_process_triple().startswith("x86_64") and HOST.get("avx2")
                                     and HOST.get("fma")), reason="needs an x86 host that runs AVX2 code")

CHILD = """
import json, sys
import numpy as np
import looptool as lt
from looptool.analysis.target import host
from looptool.codegen.cpu import HostTarget

inputs = dict(np.load(sys.argv[1]))
s = lt.symbols("m k n")
matmul = (lt.Tensor(inputs["a"]).to(s.m, s.k) * lt.Tensor(inputs["b"]).to(s.k, s.n)).sum(s.k)
x = lt.Tensor(inputs["x"]).to(s.m, s.n)
e = (x - x.max(s.n)).exp()
softmax = e / e.sum(s.n)
gelu = x * 0.5 * ((x * 0.7071067811865476).erf() + 1.0)
report = {"target": host().describe(), "name": HostTarget.get().name,
          "explain": lt.auto_schedule(matmul).explain().splitlines()[0], "assembly": {}}
outputs = {}
for label, tensor in (("matmul", matmul), ("softmax", softmax), ("gelu", gelu)):
    kernel = tensor.compile()
    outputs[label] = tensor.numpy()
    report["assembly"][label] = {"ymm": "ymm" in kernel.assembly, "zmm": "zmm" in kernel.assembly}
np.savez(sys.argv[2], **outputs)
print(json.dumps(report))
"""


def test_kernels_compiled_for_znver2_are_avx2_code_and_match_float64(tmp_path, rng):
    a, b = rng.standard_normal((67, 45), dtype=np.float32), rng.standard_normal((45, 131), dtype=np.float32)
    x = rng.standard_normal((37, 300), dtype=np.float32)
    np.savez(tmp_path / "inputs.npz", a=a, b=b, x=x)
    root = str(Path(lt.__file__).resolve().parent.parent)
    env = {**os.environ, "LOOPTOOL_CPU": "znver2", "LOOPTOOL_TUNING_DB": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    run = subprocess.run([sys.executable, "-c", CHILD, str(tmp_path / "inputs.npz"), str(tmp_path / "out.npz")],
                         env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    report = json.loads(run.stdout.splitlines()[-1])
    assert report["target"].startswith("x86_64: 16 vector registers of 256 bits, FMA")
    assert report["explain"] == report["target"] and report["name"].startswith("cpu:znver2:")
    for label, seen in report["assembly"].items():
        assert seen == {"ymm": True, "zmm": False}, f"{label}: {seen} (AVX2 code has ymm registers, no zmm)"
    out = np.load(tmp_path / "out.npz")
    a64, b64, x64 = a.astype(np.float64), b.astype(np.float64), x.astype(np.float64)
    shifted = np.exp(x64 - x64.max(1, keepdims=True))
    erf = np.vectorize(math.erf)
    assert_close(out["matmul"], a64 @ b64, 1e-5)
    assert_close(out["softmax"], shifted / shifted.sum(1, keepdims=True), 1e-5)
    assert_close(out["gelu"], x64 * 0.5 * (erf(x64 * math.sqrt(0.5)) + 1.0), 1e-5)


def test_an_unknown_cpu_stops_the_first_compile_with_the_variable_named(tmp_path):
    root = str(Path(lt.__file__).resolve().parent.parent)
    env = {**os.environ, "LOOPTOOL_CPU": "zenver9", "LOOPTOOL_TUNING_DB": "",
           "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")]))}
    code = ("import numpy as np, looptool as lt; i, = lt.symbols('i'); "
            "lt.Tensor(np.ones(8, np.float32)).to(i).exp().numpy()")
    run = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode != 0
    assert "looptool.errors.TargetError: LOOPTOOL_CPU='zenver9': 'zenver9' is not a recognized processor" in run.stderr
