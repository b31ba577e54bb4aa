"""Shape-generic export (issue 28): one artifact of a function with a dynamic batch dim runs every batch
size from 1 to 1024, from C (kernel.h's entry takes the size as an argument) and from Python in a process
without islpy or optuna, against float64 references; sizes it cannot take are refused in words."""
from __future__ import annotations

import json
import shutil
import subprocess

import numpy as np
import pytest

import looptool as lt
from looptool import ArtifactError
from tests.export.test_export import TESTS, c_compiler, private_databases, run_python  # noqa: F401
from tests.helpers import assert_close

K, N, MAX_BATCH = 24, 40, 1024
b = lt.symbols("b", dynamic=True)[0]
k, n = lt.symbols("k n")


@lt.function
def layer(x: lt.In[b, k], w: lt.In[k, n]):
    return lt.relu((x * w).sum(k))


def c_inputs(size: int) -> tuple[np.ndarray, np.ndarray]:
    """The inputs tests/c/batch_main.c makes (its first `size` rows of x)."""
    p, q = np.arange(size * K), np.arange(K * N)
    x = ((p % 13 - 6) / 8 + p % 7 / 64).astype(np.float32).reshape(size, K)
    w = ((q % 11 - 5) / 4 + q % 5 / 32).astype(np.float32).reshape(K, N)
    return x, w


@pytest.fixture(scope="module")
def artifact(tmp_path_factory):
    """The layer exported once, traced on a batch of 5 rows."""
    path = tmp_path_factory.mktemp("dynamic") / "layer"
    return lt.export(layer, path, example=c_inputs(5))


def test_the_artifact_records_its_dynamic_dim_and_the_header_takes_its_size(artifact):
    manifest = json.loads((artifact / "manifest.json").read_text())
    assert manifest["dynamic"] == [{"dim": "b", "min": 1}] and manifest["format_version"] == 3
    assert [spec["shape"] for spec in manifest["inputs"]] == [["b", K], [K, N]]
    assert manifest["output"]["shape"] == ["b", N]
    header = (artifact / "kernel.h").read_text()
    assert "int looptool_kernel(const float *x, const float *w, float *out, int64_t b);" in header
    assert "/* x: dims (b, k), shape [b, 24], strides [24, 1] */" in header and "b >= 1" in header


CHILD = """
import sys
sys.modules["islpy"] = None     # loading and running must need neither
sys.modules["optuna"] = None
import numpy as np
import looptool as lt
kernel = lt.load(sys.argv[1])
rng = np.random.default_rng(0)
w = rng.standard_normal((24, 40)).astype(np.float32)
worst = 0.0
for size in range(1, 1025):
    x = rng.standard_normal((size, 24)).astype(np.float32)
    reference = np.maximum(x.astype(np.float64) @ w, 0)
    got = kernel(x, w)
    assert got.shape == (size, 40) and got.dtype == np.float32
    worst = max(worst, float(np.abs(got - reference).max() / np.abs(reference).max()))
print(worst)
"""


def test_python_runs_every_batch_size_without_islpy_or_optuna(artifact, tmp_path):
    assert float(run_python(["-c", CHILD, str(artifact)], cwd=tmp_path).stdout) < 1e-5


def test_c_runs_every_batch_size_against_its_own_reference(artifact, tmp_path):
    cc = c_compiler()
    if not (artifact / "libkernel.so").is_file():
        pytest.skip("export built no libkernel.so")
    exe = tmp_path / "batch_main"
    build = subprocess.run([cc, "-O1", "-std=c99", "-Wall", "-Werror", f"-DK={K}", f"-DN={N}", f"-DMAXB={MAX_BATCH}",
                            "-I", str(artifact), "-o", str(exe), str(TESTS / "c" / "batch_main.c"), "-L",
                            str(artifact), "-lkernel", f"-Wl,-rpath,{artifact}", "-lm"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=120)
    assert ran.returncode == 0, f"exit {ran.returncode}: {ran.stdout}{ran.stderr}"
    assert float(ran.stdout) < 1e-5
    x, w = c_inputs(37)                                  # the C program's inputs, here: the same results
    assert_close(lt.load(artifact)(x, w), np.maximum(x.astype(np.float64) @ w, 0), 1e-5)


def test_sizes_the_artifact_cannot_take_are_refused(artifact):
    kernel = lt.load(artifact)
    x, w = c_inputs(6)
    with pytest.raises(ArtifactError, match=r"dynamic dim 'b' has size 0 in input x \(shape \(0, 24\)\); this "
                                            r"kernel takes sizes from 1 up"):
        kernel(x[:0], w)
    with pytest.raises(ArtifactError, match=r"input w: dimension 'k' has size 23, the kernel was built for 24"):
        kernel(x, w[:23])
    with pytest.raises(ArtifactError, match=r"input x has dims \(b, k\) = 2 dimensions, got an array with 1"):
        kernel(x[0], w)


def test_inputs_sharing_a_dynamic_dim_must_agree_and_a_minimum_holds(tmp_path):
    rows = lt.symbols("r", dynamic=True, min=3)[0]

    @lt.function
    def add(x: lt.In[rows, k], y: lt.In[rows, k]):
        return x + y
    x = np.arange(20, dtype=np.float32).reshape(5, 4)
    kernel = lt.load(lt.export(add, tmp_path / "add", example=(x, x)))
    assert_close(kernel(x, 2 * x), 3 * x.astype(np.float64), 1e-5)
    with pytest.raises(ArtifactError, match=r"dim 'r' has size 5 in input x \(shape \(5, 4\)\) but 4 in input y"):
        kernel(x, x[:4])
    with pytest.raises(ArtifactError, match=r"dynamic dim 'r' has size 2 in input x .*; this kernel takes sizes "
                                            r"from 3 up"):
        kernel(x[:2], x[:2])
    assert "(r >= 3)" in (tmp_path / "add" / "kernel.h").read_text()


def test_a_function_export_needs_example_arrays(tmp_path):
    with pytest.raises(ArtifactError, match="give example="):
        lt.export(layer, tmp_path / "none")
    shutil.rmtree(tmp_path, ignore_errors=True)
