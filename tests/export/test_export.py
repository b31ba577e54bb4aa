"""Exported kernels: `lt.export` / `lt.load` / `LoadedKernel`, the C ABI, the CLI, tuned exports.

* Round trips: an artifact loaded in a fresh interpreter (with islpy and optuna blocked)
  computes bit for bit what the in-process kernel computes, for a split/vectorized/parallel
  matmul, a float64 softmax with placed reductions and a strided, padded conv2d.
* Errors are `ArtifactError`s (ValueErrors) whose messages say what is wrong, and they
  touch nothing: the artifact's files are byte for byte the same afterwards.
* Inputs by keyword or position; non-contiguous inputs are relaid.
* A C program built against kernel.h and libkernel.so.
* A tuned study's best schedule, exported with no schedule given.
* `python -m looptool export` and `python -m looptool run`.

No test reads ~/.cache: LOOPTOOL_TUNING_DB and LOOPTOOL_STORAGE point into tmp_path.
"""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

import looptool as lt
from looptool import ArtifactError, ir
from looptool.codegen import cpu
from tests.helpers import assert_close, conv2d_nchw_ref, misaligned, softmax_ref

TESTS = Path(__file__).resolve().parents[1]
REPO = TESTS.parent


@pytest.fixture(autouse=True)
def private_databases(tmp_path, monkeypatch):
    """Never read or write the user's tuning database or study storage."""
    monkeypatch.setenv("LOOPTOOL_TUNING_DB", str(tmp_path / "tuned.sqlite"))
    monkeypatch.setenv("LOOPTOOL_STORAGE", f"sqlite:///{tmp_path / 'studies.sqlite'}")


def subprocess_env() -> dict:
    """This process's environment (with the tmp databases) and a PYTHONPATH on which a child
    imports the same looptool and tuner as this process (a checkout or an installed package)."""
    import tuner
    roots = [str(Path(lt.__file__).resolve().parent.parent), str(Path(tuner.__file__).resolve().parent.parent),
             str(REPO)]
    env = dict(os.environ)
    if env.get("PYTHONPATH"):
        roots.append(env["PYTHONPATH"])
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(roots))
    return env


def run_python(args: list[str], cwd: Path, check: bool = True) -> subprocess.CompletedProcess:
    result = subprocess.run([sys.executable, *args], cwd=cwd, env=subprocess_env(), capture_output=True,
                            text=True, timeout=120)
    if check:
        assert result.returncode == 0, f"exit code {result.returncode}\nstdout:\n{result.stdout}\n" \
                                       f"stderr:\n{result.stderr}"
    return result


def snapshot(path: Path) -> dict[str, bytes]:
    """Every file of an artifact directory, by name, with its bytes."""
    return {p.name: p.read_bytes() for p in sorted(path.iterdir())}


def edit_manifest(path: Path, change, sign: bool = True) -> None:
    """Change the manifest; with `sign`, store the SHA-256 of the new content as export does
    (JSON with sorted keys, without manifest_sha256), so that the checks behind it are reached."""
    manifest = json.loads((path / "manifest.json").read_text())
    change(manifest)
    if sign:
        content = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
        manifest["manifest_sha256"] = hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()
    (path / "manifest.json").write_text(json.dumps(manifest, indent=2))


# ------------------------------------------------------------------ computations


@dataclass
class Case:
    tensor: lt.Tensor
    tree: lt.LoopTree          # the schedule to export
    inputs: list[np.ndarray]   # in the order of the kernel's inputs
    reference: np.ndarray      # float64 NumPy result, in tensor.dims order


def matmul_case(rng, m=64, k=48, n=80) -> Case:
    """(a * b).sum(k): m split and parallel, k split with a tail, n split and vectorized."""
    a = rng.standard_normal((m, k), dtype=np.float32)
    b = rng.standard_normal((k, n), dtype=np.float32)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k)
    tree = c.loop_tree().split("m", 16).parallel("m.0").split("k", 10).split("n", 16).vectorize("n.1")
    return Case(c, tree, [a, b], a.astype(np.float64) @ b.astype(np.float64))


def softmax_case(rng, m=32, n=40) -> Case:
    """float64 row softmax; both reductions placed in the row loop of the (parallel) output."""
    x = rng.standard_normal((m, n))
    sm, sn = lt.symbols("m n")
    xt = lt.Tensor(x).to(sm, sn)
    e = (xt - xt.max(sn)).exp()
    y = e / e.sum(sn)
    tree = (y.loop_tree().split("n", 16).vectorize("n.1").split("n", 16, stage="t1")
            .vectorize("n.1", stage="t1").place("t1", "t2", 1).place("t0", "t2", 1).parallel("m"))
    return Case(y, tree, [x], softmax_ref(x, 1))


def conv_case(rng) -> Case:
    """3x3 conv2d, stride 2, padding 1, through window views; output channels vectorized."""
    x = rng.standard_normal((2, 3, 9, 10), dtype=np.float32)
    w = rng.standard_normal((16, 3, 3, 3), dtype=np.float32)
    n, c, h, wd, o, oh, ow, kh, kw = lt.symbols("n c h w o oh ow kh kw")
    xw = (lt.Tensor(x).to(n, c, h, wd).window(h, oh, kh, 3, stride=2, padding=1)
          .window(wd, ow, kw, 3, stride=2, padding=1))
    conv = (xw * lt.Tensor(w).to(o, c, kh, kw)).sum(c, kh, kw)            # dims (n, oh, ow, o)
    tree = conv.loop_tree().reorder("oh", "ow", "c").vectorize("o").parallel("oh")
    reference = conv2d_nchw_ref(x, w, stride=2, padding=1).transpose(0, 2, 3, 1)
    return Case(conv, tree, [x, w], reference)


CASES = {"matmul": matmul_case, "softmax": softmax_case, "conv2d": conv_case}


@pytest.fixture(scope="module")
def small_matmul(tmp_path_factory):
    """A 6x5x7 matmul exported (default schedule) with inputs named a and b, and its inputs."""
    rng = np.random.default_rng(7)
    case = matmul_case(rng, 6, 5, 7)
    path = lt.export(case.tensor, tmp_path_factory.mktemp("small") / "mm", case.tensor.loop_tree(),
                     input_names=["a", "b"])
    return path, case


@pytest.fixture
def artifact(small_matmul, tmp_path):
    """A private copy of the small matmul artifact, free to damage."""
    path, case = small_matmul
    return Path(shutil.copytree(path, tmp_path / "artifact")), case


# ------------------------------------------------------------------ 1. round trips

CHILD = """
import sys
sys.modules["islpy"] = None     # loading must need neither
sys.modules["optuna"] = None
import numpy as np
import looptool as lt
artifact, out, *inputs = sys.argv[1:]
kernel = lt.load(artifact)
np.save(out, kernel(*[np.load(p) for p in inputs]))
print(kernel.input_names)
"""


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trip_in_fresh_process_is_bit_identical(name, tmp_path, rng):
    case = CASES[name](rng)
    path = lt.export(case.tensor, tmp_path / name, case.tree)
    assert {"kernel.h", "kernel.ll", "kernel.o", "manifest.json"} <= {p.name for p in path.iterdir()}
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["schedule"] == json.loads(case.tree.schedule.to_json())
    assert manifest["output"]["shape"] == list(case.tensor.shape)
    files = []
    for i, array in enumerate(case.inputs):
        files.append(str(tmp_path / f"in{i}.npy"))
        np.save(files[-1], array)
    before = snapshot(path)
    result = run_python(["-c", CHILD, str(path), str(tmp_path / "out.npy"), *files], cwd=tmp_path)
    assert result.stdout.strip() == str([f"in{i}" for i in range(len(case.inputs))])
    got = np.load(tmp_path / "out.npy")
    want = case.tensor.numpy(case.tree)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want), f"max difference {np.abs(got - want).max()}"
    assert_close(got, case.reference, 1e-5)
    assert snapshot(path) == before


def test_loading_imports_neither_islpy_nor_optuna(small_matmul, tmp_path):
    path, _ = small_matmul
    code = ("import sys; import looptool as lt; k = lt.load(sys.argv[1]); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('islpy', 'optuna')))")
    assert run_python(["-c", code, str(path)], cwd=tmp_path).stdout.strip() == "[]"


def test_in_process_load_matches_kernel_and_manifest(small_matmul):
    path, case = small_matmul
    kernel = lt.load(path)
    assert kernel.input_names == ["a", "b"]
    assert [spec["shape"] for spec in kernel.inputs] == [[6, 5], [5, 7]]
    assert [spec["strides"] for spec in kernel.inputs] == [[5, 1], [7, 1]]
    assert kernel.output == {"dims": ["m", "n"], "shape": [6, 7], "dtype": "float32"}
    manifest = kernel.manifest
    assert manifest["format_version"] == 2 and manifest["looptool_version"] == lt.__version__
    assert manifest["target"]["triple"] == cpu.HostTarget.get().triple
    assert set(manifest["files"]) >= {"kernel.ll", "kernel.o", "pool.o", "kernel.h"}
    got = kernel(*case.inputs)
    assert np.array_equal(got, case.tensor.numpy(case.tensor.loop_tree()))
    assert got.flags.c_contiguous
    assert kernel(*case.inputs) is not got     # a new array each call


# ------------------------------------------------------------------ 2. errors that touch nothing


CALL_ERRORS = ["wrong shape", "wrong shape second", "wrong rank", "wrong dtype", "too few", "too many", "none",
               "unknown keyword", "missing keyword", "wrong keyword", "mixed"]


def call_error_cases(case):
    a, b = case.inputs
    return {
        "wrong shape": (((np.zeros((6, 4), np.float32), b), {}),
                        "input a: dimension 'k' has size 4, the kernel was built for 5 (shape [6, 5])"),
        "wrong shape second": (((a, np.zeros((5, 8), np.float32)), {}),
                               "input b: dimension 'n' has size 8, the kernel was built for 7"),
        "wrong rank": (((a[None], b), {}), "input a has dims (m, k) = 2 dimensions, got an array with 3"),
        "wrong dtype": (((a.astype(np.float64), b), {}),
                        "input a: dtype float64 but the kernel was built for float32"),
        "too few": (((a,), {}), "kernel takes 2 inputs ['a', 'b'], got 1"),
        "too many": (((a, b, b), {}), "kernel takes 2 inputs ['a', 'b'], got 3"),
        "none": (((), {}), "kernel takes 2 inputs ['a', 'b'], got 0"),
        "unknown keyword": (((), {"a": a, "b": b, "c": b}), "kernel inputs are ['a', 'b']; unknown ['c'], missing []"),
        "missing keyword": (((), {"a": a}), "kernel inputs are ['a', 'b']; unknown [], missing ['b']"),
        "wrong keyword": (((), {"a": a, "x": b}), "unknown ['x'], missing ['b']"),
        "mixed": (((a,), {"b": b}), "either by position or by name, not both"),
    }


@pytest.mark.parametrize("what", CALL_ERRORS)
def test_call_errors_are_clear_and_touch_nothing(what, artifact):
    path, case = artifact
    assert sorted(call_error_cases(case)) == sorted(CALL_ERRORS)
    (args, kwargs), message = call_error_cases(case)[what]
    kernel = lt.load(path)
    before = snapshot(path)
    inputs_before = [x.copy() for x in case.inputs]
    with pytest.raises(ArtifactError, match=re.escape(message)):
        kernel(*args, **kwargs)
    assert snapshot(path) == before
    assert all(np.array_equal(x, y) for x, y in zip(case.inputs, inputs_before))
    assert np.array_equal(kernel(*case.inputs), case.tensor.numpy(case.tensor.loop_tree()))  # still usable


def test_artifact_error_is_a_value_error(artifact):
    path, case = artifact
    assert issubclass(lt.ArtifactError, ValueError)
    with pytest.raises(ValueError, match="dtype"):
        lt.load(path)(*[x.astype(np.float64) for x in case.inputs])


def flip_byte(path: Path, position: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * position)] ^= 0x40
    path.write_bytes(bytes(data))


def truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[:len(data) // 2])


def set_files(manifest, files):
    manifest["files"] = files


DAMAGE = {
    "kernel.o deleted": (lambda p: (p / "kernel.o").unlink(), r"artifact: kernel\.o is missing"),
    "kernel.ll deleted": (lambda p: (p / "kernel.ll").unlink(), r"kernel\.ll is missing"),
    "manifest deleted": (lambda p: (p / "manifest.json").unlink(),
                         r"is not a looptool kernel: .*manifest\.json is missing"),
    "kernel.o byte flipped": (lambda p: flip_byte(p / "kernel.o"),
                              r"kernel\.o is corrupted \(its SHA-256 does not match the manifest\)"),
    "kernel.o first byte flipped": (lambda p: flip_byte(p / "kernel.o", 0.0), r"kernel\.o is corrupted .*SHA-256"),
    "kernel.o truncated": (lambda p: truncate(p / "kernel.o"), r"kernel\.o is corrupted .*SHA-256"),
    "kernel.ll byte flipped": (lambda p: flip_byte(p / "kernel.ll"), r"kernel\.ll is corrupted .*SHA-256"),
    "manifest truncated": (lambda p: truncate(p / "manifest.json"), r"manifest\.json is corrupted"),
    "manifest not utf-8": (lambda p: (p / "manifest.json").write_bytes(b"\xff\xfe" + (p / "manifest.json")
                                                                       .read_bytes()[2:]),
                           r"manifest\.json is corrupted"),
    "manifest not an object": (lambda p: (p / "manifest.json").write_text("[1, 2]"),
                               r"manifest\.json is corrupted: not a JSON object"),
    "manifest without keys": (lambda p: edit_manifest(p, lambda m: m.pop("target")),
                              r"manifest\.json is corrupted: .*missing keys \['target'\]"),
    # without a hash list, nothing would stop junk object code reaching the JIT (it segfaulted)
    "no hashes, junk object": (lambda p: (edit_manifest(p, lambda m: set_files(m, {})),
                                          (p / "kernel.o").write_bytes(b"\x7fELF junk")),
                               r"manifest\.json is corrupted: no SHA-256 listed for kernel\.ll, kernel\.o"),
    "libkernel.so truncated": (lambda p: truncate(p / "libkernel.so"), r"libkernel\.so is corrupted .*SHA-256"),
    # a signature edited by hand would make the kernel write past the output it is given
    "manifest shape edited": (lambda p: edit_manifest(p, lambda m: m["output"].update(shape=[2, 2]), sign=False),
                              r"manifest\.json is corrupted: its content does not match its manifest_sha256"),
    "manifest digest removed": (lambda p: edit_manifest(p, lambda m: m.pop("manifest_sha256"), sign=False),
                                r"manifest\.json is corrupted: its content does not match"),
    "newer format": (lambda p: edit_manifest(p, lambda m: m.update(format_version=999)),
                     r"artifact format version 999; this looptool \(.*\) reads versions up to 3: upgrade looptool"),
}


@pytest.mark.parametrize("what", sorted(DAMAGE))
@pytest.mark.parametrize("rebuild", [False, True])
def test_damaged_artifacts_are_refused_and_left_alone(what, rebuild, artifact):
    path, _ = artifact
    damage, message = DAMAGE[what]
    damage(path)
    before = snapshot(path)
    with pytest.raises(ArtifactError, match=message):
        lt.load(path, rebuild=rebuild)
    assert snapshot(path) == before


def test_missing_directory(tmp_path):
    with pytest.raises(ArtifactError, match="is not a looptool kernel"):
        lt.load(tmp_path / "nowhere")
    assert not (tmp_path / "nowhere").exists()


def foreign_features() -> list[str]:
    """CPU features this host lacks (amx-tile and avx10.2 where possible)."""
    host = cpu.HostTarget.get().features.split(",")
    lacking = [f[1:] for f in host if f.startswith("-")]
    preferred = [f for f in ("amx-tile", "avx10.2") if f in lacking]
    chosen = preferred or lacking[:2]
    if not chosen:
        pytest.skip("this CPU reports no feature it lacks")
    return chosen


def make_foreign(path: Path) -> list[str]:
    """Edit an artifact's manifest as if built on a CPU with features this host lacks (the
    manifest itself is not in the hash list, so the artifact stays intact otherwise)."""
    extra = foreign_features()

    def add(manifest):
        features = [f for f in manifest["target"]["features"].split(",") if f[1:] not in extra]
        manifest["target"]["features"] = ",".join(features + [f"+{f}" for f in extra])
        manifest["target"]["cpu"] = "futurecpu"
    edit_manifest(path, add)
    return extra


def test_foreign_cpu_features_are_refused_then_rebuilt(artifact):
    path, case = artifact
    extra = make_foreign(path)
    before = snapshot(path)
    with pytest.raises(ArtifactError, match=r"futurecpu") as info:
        lt.load(path)
    message = str(info.value)
    assert all(f in message for f in extra), message
    assert "lacks" in message and "rebuild=True" in message
    assert snapshot(path) == before
    kernel = lt.load(path, rebuild=True)
    assert snapshot(path) == before           # rebuilding writes nothing
    got = kernel(*case.inputs)
    assert_close(got, case.reference, 1e-5)
    assert np.array_equal(got, kernel(a=case.inputs[0], b=case.inputs[1]))


def test_rebuild_of_a_native_artifact_gives_the_same_result(small_matmul):
    path, case = small_matmul
    assert np.array_equal(lt.load(path, rebuild=True)(*case.inputs), lt.load(path)(*case.inputs))


def test_export_rejects_wrong_number_of_names(tmp_path, rng):
    case = matmul_case(rng, 4, 3, 5)
    with pytest.raises(ArtifactError, match=re.escape("2 inputs but 3 input_names ['a', 'b', 'c']")):
        lt.export(case.tensor, tmp_path / "k", input_names=["a", "b", "c"])
    assert not (tmp_path / "k").exists()


def test_export_rejects_illegal_schedule(tmp_path, rng):
    case = softmax_case(rng, 4, 6)
    illegal = case.tensor.loop_tree().place("t1", "t2", 2)     # the sum placed inside the loop that reads it
    with pytest.raises(lt.IllegalScheduleError):
        lt.export(case.tensor, tmp_path / "k", illegal)
    assert not (tmp_path / "k").exists()


# ------------------------------------------------------------------ 3. names and layouts


def test_keyword_and_positional_calls_agree(small_matmul):
    path, case = small_matmul
    a, b = case.inputs
    kernel = lt.load(path)
    want = case.tensor.numpy(case.tensor.loop_tree())
    assert np.array_equal(kernel(a, b), want)
    assert np.array_equal(kernel(a=a, b=b), want)
    assert np.array_equal(kernel(b=b, a=a), want)


def test_non_contiguous_inputs_are_relaid(small_matmul, rng):
    path, case = small_matmul
    a, b = case.inputs
    kernel = lt.load(path)
    want = kernel(a, b)
    big = rng.standard_normal((20, 30), dtype=np.float32)
    big[1:13:2, 2:17:3] = a
    strided = big[1:13:2, 2:17:3]                              # strides (60, 3) elements
    transposed = np.ascontiguousarray(b.T).T                   # Fortran order
    assert not strided.flags.c_contiguous and not transposed.flags.c_contiguous
    assert np.array_equal(kernel(strided, transposed), want)
    assert np.array_equal(kernel(a=np.asfortranarray(a), b=b[::-1][::-1]), want)
    assert np.array_equal(big[1:13:2, 2:17:3], a)              # inputs are not written


def test_kernel_built_for_strided_inputs_accepts_contiguous_ones(tmp_path, rng):
    """Export from a transposed view and a strided slice; call with plain arrays."""
    a = rng.standard_normal((5, 6), dtype=np.float32)
    b_big = rng.standard_normal((6, 14), dtype=np.float32)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a.T).to(s.k, s.m) * lt.Tensor(b_big[:, ::2]).to(s.k, s.n)).sum(s.k)   # a @ b
    path = lt.export(c, tmp_path / "k", c.loop_tree().vectorize("n"), input_names=["at", "b"])
    kernel = lt.load(path)
    assert [spec["strides"] for spec in kernel.inputs] == [[1, 6], [14, 2]]
    want = c.numpy(c.loop_tree().vectorize("n"))
    assert np.array_equal(kernel(a.T, b_big[:, ::2]), want)                        # as exported
    assert np.array_equal(kernel(np.ascontiguousarray(a.T), np.ascontiguousarray(b_big[:, ::2])), want)
    assert_close(want, a.astype(np.float64) @ b_big[:, ::2].astype(np.float64), 1e-5)


def test_kernel_built_for_a_broadcast_input(tmp_path):
    """An input exported with stride 0 takes any array constant along that dim, and refuses others."""
    m, k = lt.symbols("m k")
    v = np.arange(1, 4, dtype=np.float32)
    y = lt.Tensor(np.broadcast_to(v, (4, 3))).to(m, k) * 2.0
    kernel = lt.load(lt.export(y, tmp_path / "k", input_names=["x"]))
    assert kernel.inputs[0]["strides"] == [0, 1]
    want = np.tile(v * 2, (4, 1))
    assert np.array_equal(kernel(np.broadcast_to(v, (4, 3))), want)
    assert np.array_equal(kernel(np.tile(v, (4, 1))), want)
    varying = np.arange(12, dtype=np.float32).reshape(4, 3)
    with pytest.raises(ArtifactError, match=re.escape("input x: the kernel was built for an input broadcast "
                                                      "along (m) (stride 0)")):
        kernel(varying)


# ------------------------------------------------------------------ 4. C


def c_compiler() -> str:
    cc = shutil.which("cc")
    if cc is None:
        pytest.skip("no C compiler (cc) on PATH")
    return cc


def test_header_declares_the_entry_with_input_names(small_matmul, tmp_path, rng):
    path, _ = small_matmul
    header = (path / "kernel.h").read_text()
    assert "int looptool_kernel(const float *a, const float *b, float *out);" in header
    assert "/* a: dims (m, k), shape [6, 5], strides [5, 1] */" in header
    assert "/* out: dims (m, n), shape [6, 7], C-contiguous */" in header
    case = softmax_case(rng, 3, 4)
    other = lt.export(case.tensor, tmp_path / "sm", case.tree, input_names=["logits"])
    assert "int looptool_kernel(const double *logits, double *out);" in (other / "kernel.h").read_text()


def test_half_precision_kernels_pass_16_bit_elements(tmp_path, rng):
    s = lt.symbols("m k n")
    a = rng.standard_normal((6, 5)).astype(lt.bfloat16)
    b = rng.standard_normal((5, 7)).astype(lt.float16)
    c = (lt.Tensor(a).to(s.m, s.k).astype(lt.float32) * lt.Tensor(b).to(s.k, s.n)).sum(s.k).astype(lt.bfloat16)
    path = lt.export(c, tmp_path / "half", input_names=["a", "b"])
    header = (path / "kernel.h").read_text()
    assert "#include <stdint.h>" in header
    assert "int looptool_kernel(const uint16_t *a, const uint16_t *b, uint16_t *out);" in header
    assert "strides [5, 1], bfloat16 bits" in header and "strides [7, 1], IEEE binary16 bits" in header
    got = lt.load(path)(a, b)
    assert got.dtype == lt.bfloat16 and np.array_equal(got, c.numpy())
    with pytest.raises(ArtifactError, match="dtype float32 but the kernel was built for bfloat16"):
        lt.load(path)(a.astype(np.float32), b)


def test_c_program_against_header_and_shared_library(tmp_path):
    cc = c_compiler()
    M, K, N = 13, 17, 19
    i, j = np.arange(M * K), np.arange(K * N)                 # the inputs of tests/c/matmul_main.c
    a = (1 + i % 7 / 8 + i % 11 / 128).astype(np.float32).reshape(M, K)
    b = (0.5 + j % 5 / 4 + j % 13 / 64).astype(np.float32).reshape(K, N)
    s = lt.symbols("m k n")
    c = (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k)
    tree = c.loop_tree().split("m", 4).parallel("m.0").split("n", 8).vectorize("n.1")   # tails on both
    path = lt.export(c, tmp_path / "artifact", tree, input_names=["a", "b"])
    manifest = json.loads((path / "manifest.json").read_text())
    if manifest["shared_library"] is None:
        pytest.skip("export built no libkernel.so")
    exe = tmp_path / "matmul_main"
    build = subprocess.run([cc, "-O1", "-std=c99", "-Wall", "-Werror", f"-DM={M}", f"-DK={K}", f"-DN={N}",
                            "-I", str(path), "-o", str(exe), str(TESTS / "c" / "matmul_main.c"), "-L", str(path),
                            "-lkernel", f"-Wl,-rpath,{path}"], capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    ran = subprocess.run([str(exe)], capture_output=True, text=True, timeout=60)
    assert ran.returncode == 0, ran.stderr
    got = np.array([float(line) for line in ran.stdout.split()], dtype=np.float32).reshape(M, N)
    reference = a.astype(np.float64) @ b.astype(np.float64)
    assert np.all(reference != 0) and len(np.unique(reference)) > M * N * 9 // 10     # checks that can fail
    assert_close(got, reference, 1e-5)
    assert np.array_equal(got, c.numpy(tree))                                   # "%.9g" is exact for float


# ------------------------------------------------------------------ bad input: copies and refusals

def odd_strides(array: np.ndarray) -> np.ndarray:
    """A view of `array`'s values with byte strides that are not whole elements (a record field)."""
    record = np.zeros(array.shape, dtype=[("value", array.dtype), ("tag", np.uint8)])
    record["value"] = array
    view = record["value"]
    assert any(s % view.itemsize for s in view.strides)
    return view


@pytest.mark.parametrize("layout", [misaligned, odd_strides, np.asfortranarray])
def test_loaded_kernel_copies_inputs_it_cannot_address(layout, small_matmul):
    """Misaligned arrays, strides of part of an element and other layouts are copied into the
    kernel's layout (documented in docs/export.md); the result is the same, the inputs untouched."""
    path, case = small_matmul
    a, b = case.inputs
    given = layout(a)
    got = lt.load(path)(given, b)
    assert np.array_equal(got, lt.load(path)(a, b))
    assert_close(got, case.reference, 1e-5)
    assert np.array_equal(given, a)


@pytest.mark.parametrize("value, message", [
    ([[1, 2, 3, 4, 5]] * 6, "input a: dtype int64 but the kernel was built for float32"),
    (np.ones((6, 5), np.float16), "input a: dtype float16"),
    (None, "input a has dims (m, k) = 2 dimensions, got an array with 0"),
    (np.ones((5, 6), np.float32), "input a: dimension 'm' has size 5, the kernel was built for 6"),
])
def test_loaded_kernel_refuses_what_is_not_its_input(value, message, small_matmul):
    path, case = small_matmul
    with pytest.raises(ArtifactError, match=re.escape(message)):
        lt.load(path)(value, case.inputs[1])


def test_c_library_refuses_null_and_misaligned_pointers(small_matmul):
    """libkernel.so cannot see sizes (kernel.h lists them), but it checks what it can: a NULL
    pointer returns 2, one not aligned to its element size 3, and nothing is written."""
    path, case = small_matmul
    if not (path / "libkernel.so").is_file():
        pytest.skip("export built no libkernel.so")
    library = ctypes.CDLL(str(path / "libkernel.so"))
    entry = library.looptool_kernel
    entry.restype, entry.argtypes = ctypes.c_int, [ctypes.c_void_p] * 3
    a, b = (np.ascontiguousarray(x) for x in case.inputs)
    out = np.full((6, 7), 7.0, np.float32)
    assert entry(None, b.ctypes.data, out.ctypes.data) == 2
    assert entry(a.ctypes.data, b.ctypes.data, None) == 2
    assert entry(a.ctypes.data + 1, b.ctypes.data, out.ctypes.data) == 3
    assert entry(a.ctypes.data, b.ctypes.data, out.ctypes.data + 2) == 3
    assert np.all(out == 7.0)
    assert entry(a.ctypes.data, b.ctypes.data, out.ctypes.data) == 0
    assert_close(out, case.reference, 1e-5)


def test_format_1_artifacts_without_a_manifest_digest_still_load(artifact):
    path, case = artifact
    edit_manifest(path, lambda m: (m.pop("manifest_sha256"), m.update(format_version=1)), sign=False)
    assert_close(lt.load(path)(*case.inputs), case.reference, 1e-5)


def out_cases(a: np.ndarray, b: np.ndarray) -> dict:
    """{what: (inputs, out, message)} for a 6x5 by 5x7 matmul kernel given inputs a, b."""
    read_only = np.zeros((6, 7), np.float32)
    read_only.flags.writeable = False
    shared = np.zeros(30 + 42 - 12, np.float32)       # out overlaps the last 18 elements of a
    shared[:30] = a.reshape(-1)
    return {
        "read-only": ([a, b], read_only, "out (shape (6, 7)) is read-only"),
        "aliasing an input": ([shared[:30].reshape(6, 5), b], shared[18:].reshape(6, 7),
                              "out shares memory with input in0 (shape (6, 5))"),
        "misaligned": ([a, b], misaligned(np.zeros((6, 7), np.float32)), "out must be an aligned, C-contiguous"),
        "transposed": ([a, b], np.zeros((7, 6), np.float32).T, "out must be an aligned, C-contiguous"),
        "wrong dtype": ([a, b], np.zeros((6, 7), np.float64), "out must be an aligned, C-contiguous float32"),
    }


@pytest.mark.parametrize("what", ["read-only", "aliasing an input", "misaligned", "transposed", "wrong dtype"])
def test_compiled_kernel_refuses_bad_outputs(what, small_matmul):
    """Kernel(arrays, out=...) writes into `out`: a read-only, misaligned, non-contiguous or
    wrongly typed array, or one sharing memory with an input, is refused before anything runs."""
    _, case = small_matmul
    kernel = case.tensor.compile()
    arrays, out, message = out_cases(*ir.lower(case.tensor.node)[1])[what]
    before = [x.copy() for x in arrays]
    with pytest.raises(ValueError, match=re.escape(message)):
        kernel(arrays, out=out)
    assert all(np.array_equal(x, y) for x, y in zip(arrays, before))


def test_compiled_kernel_refuses_misaligned_inputs(small_matmul):
    _, case = small_matmul
    kernel = case.tensor.compile()
    a, b = ir.lower(case.tensor.node)[1]
    with pytest.raises(ValueError, match=re.escape("kernel input in0 expects shape (6, 5), dtype float32, "
                                                   "strides (5, 1), aligned; got")):
        kernel([misaligned(a), b])


def test_tensors_of_misaligned_arrays_are_copied(small_matmul):
    _, case = small_matmul
    a, b = case.inputs
    s = lt.symbols("m k n")
    c = (lt.Tensor(misaligned(a)).to(s.m, s.k) * lt.Tensor(odd_strides(b)).to(s.k, s.n)).sum(s.k)
    assert_close(c.numpy(), case.reference, 1e-5)


# ------------------------------------------------------------------ 5. tuned export


def test_export_of_a_tuned_study_best_kernel(tmp_path):
    tuner = pytest.importorskip("tuner")
    from tuner import workloads
    work = workloads.matmul(64, 48, 80)
    result = tuner.tune(work.tensor, trials=6, storage=f"sqlite:///{tmp_path / 'studies.sqlite'}", seed=0,
                        progress=False)
    assert result.best_tree is not None, tuner.study.trial_table(result.study)
    assert (tmp_path / "tuned.sqlite").exists()                 # recorded where LOOPTOOL_TUNING_DB says
    best = result.best_tree.schedule.to_json()
    assert best == tuner.study.best_schedule_json(result.study)
    tuning = {"study": result.study.study_name, "best_seconds": result.best_seconds,
              "default_seconds": result.default_seconds, "trials": len(result.study.trials)}
    path = lt.export(work.tensor, tmp_path / "tuned", tuning=tuning, input_names=["a", "b"])
    manifest = json.loads((path / "manifest.json").read_text())
    assert manifest["schedule"] == json.loads(best)
    assert manifest["schedule"]["steps"], "the tuned schedule should not be the default one"
    assert manifest["tuning"] == tuning
    assert manifest["loop_tree"] == str(result.best_tree)
    _, arrays = ir.lower(work.tensor.node)
    got = lt.load(path)(*arrays)
    assert_close(got, work.baseline().astype(np.float64), 1e-5)
    assert np.array_equal(got, work.tensor.numpy())              # .numpy() uses the tuned schedule too


def test_export_without_a_tuned_schedule_uses_the_automatic_one(small_matmul, tmp_path):
    _, case = small_matmul
    path = lt.export(case.tensor, tmp_path / "k")
    manifest = json.loads((path / "manifest.json").read_text())
    automatic = json.loads(lt.auto_schedule(case.tensor).schedule.to_json())["steps"]
    assert automatic and manifest["schedule"]["steps"] == automatic and manifest["tuning"] is None
    assert [spec["name"] for spec in manifest["inputs"]] == ["in0", "in1"]


# ------------------------------------------------------------------ 6. the command line


def test_cli_export_and_run(tmp_path):
    from tuner import workloads
    work = workloads.matmul(24, 16, 40)
    tree = work.tensor.loop_tree().split("n", 8).vectorize("n.1").parallel("m")
    (tmp_path / "schedule.json").write_text(tree.schedule.to_json())
    out = tmp_path / "artifact"
    exported = run_python(["-m", "looptool", "export", "matmul:24x16x40", str(out), "--schedule",
                           str(tmp_path / "schedule.json"), "--names", "a", "b"], cwd=tmp_path)
    assert f"exported matmul:24x16x40 to {out}" in exported.stdout
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["schedule"] == json.loads(tree.schedule.to_json())
    assert [spec["name"] for spec in manifest["inputs"]] == ["a", "b"]
    _, arrays = ir.lower(work.tensor.node)
    for name, array in zip("ab", arrays):
        np.save(tmp_path / f"{name}.npy", array)
    ran = run_python(["-m", "looptool", "run", str(out), str(tmp_path / "a.npy"), str(tmp_path / "b.npy"),
                      "--output", str(tmp_path / "c.npy")], cwd=tmp_path)
    assert "wrote" in ran.stdout and "(24, 40)" in ran.stdout
    got = np.load(tmp_path / "c.npy")
    assert_close(got, work.baseline().astype(np.float64), 1e-5)
    assert np.array_equal(got, work.tensor.numpy(tree))


def test_cli_export_automatic_schedule_and_run_errors(tmp_path):
    from tuner import workloads
    out = tmp_path / "artifact"
    run_python(["-m", "looptool", "export", "softmax:8x12", str(out)], cwd=tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    work = workloads.softmax(8, 12)
    automatic = json.loads(lt.auto_schedule(work.tensor).schedule.to_json())["steps"]
    assert automatic and manifest["schedule"]["steps"] == automatic     # the tmp tuning database is empty
    _, (x,) = ir.lower(work.tensor.node)
    np.save(tmp_path / "bad.npy", x[:, :11])
    before = snapshot(out)
    bad = run_python(["-m", "looptool", "run", str(out), str(tmp_path / "bad.npy"), "--output",
                      str(tmp_path / "y.npy")], cwd=tmp_path, check=False)
    assert bad.returncode != 0
    assert "input in0: dimension 'n' has size 11, the kernel was built for 12" in bad.stderr
    assert not (tmp_path / "y.npy").exists() and snapshot(out) == before
    # a kernel for CPU features this host lacks: refused, then rebuilt with --rebuild
    extra = make_foreign(out)
    np.save(tmp_path / "x.npy", x)
    args = ["-m", "looptool", "run", str(out), str(tmp_path / "x.npy"), "--output", str(tmp_path / "y.npy")]
    refused = run_python(args, cwd=tmp_path, check=False)
    assert refused.returncode != 0 and "rebuild=True" in refused.stderr and extra[0] in refused.stderr
    assert not (tmp_path / "y.npy").exists()
    run_python(args + ["--rebuild"], cwd=tmp_path)
    assert_close(np.load(tmp_path / "y.npy"), work.baseline().astype(np.float64), 1e-5)
