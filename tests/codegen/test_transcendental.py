"""Accuracy of the inline float32 exp, log, tanh and erf (codegen/llvm.py): error in units in the last
place (ulp) against float64 NumPy/SciPy over a dense sweep of the whole float32 range (every 997th bit
pattern, both signs: normals, subnormals, zeros, the largest finite values), exact special values (0,
±inf, NaN, negatives for log), on both the vector path (the automatic schedule vectorizes) and the
scalar path (the default loop tree). The GPU runs the same builder code, but for exp's 2**f, which it takes from
the hardware's ex2.approx: test_gpu_accuracy holds it to the same bound."""
import numpy as np
import pytest
from scipy import special

import looptool as lt
from looptool.codegen import gpu
from tests.gpu_helpers import cupy_or_skip

BOUND_ULP = 2.0          # the documented bound (docs/frontend.md), for every function
STRIDE = 997             # every 997th float32 bit pattern: 2.1 million values of each sign
REFERENCE = {"exp": np.exp, "log": np.log, "tanh": np.tanh, "erf": special.erf}
SPECIALS = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, np.finfo(np.float32).max,
                     np.finfo(np.float32).smallest_subnormal], np.float32)


def sweep() -> np.ndarray:
    positive = np.arange(0, 0x7F800000, STRIDE, dtype=np.uint32).view(np.float32)
    return np.concatenate([positive, -positive, SPECIALS])


def ulp_error(got: np.ndarray, x: np.ndarray, op: str) -> tuple[float, np.ndarray]:
    """The largest error in float32 ulps where the float64 reference is finite in float32, and the
    mask of the other inputs (whose results must equal the rounded reference exactly: inf, NaN)."""
    with np.errstate(all="ignore"):
        ref = REFERENCE[op](x.astype(np.float64))
        finite = np.abs(ref) <= np.finfo(np.float32).max
        rounded = ref[~finite].astype(np.float32)
    _, exponent = np.frexp(ref[finite])
    ulp = np.maximum(np.ldexp(1.0, exponent - 24), 2.0 ** -149)
    error = np.abs(got[finite].astype(np.float64) - ref[finite]) / ulp
    same = (got[~finite] == rounded) | (np.isnan(got[~finite]) & np.isnan(rounded))
    return float(error.max()), ~same


def annotations(tree) -> set:
    return {lp.annotation for _, sched in tree.schedule.stages for lp in sched.loops}


def paths(t):
    """The vector path (automatic schedule) and the scalar path (default loop tree) of `t`."""
    vector, scalar = t.loop_tree().auto(), t.loop_tree()
    assert "vectorize" in annotations(vector) and "vectorize" not in annotations(scalar)
    return {"vector": vector, "scalar": scalar}


@pytest.mark.parametrize("op", list(REFERENCE))
def test_float32_functions_are_within_two_ulp_over_the_whole_range(op):
    x = sweep()
    i, = lt.symbols("i")
    t = getattr(lt.Tensor(x).to(i), op)()
    for name, tree in paths(t).items():
        worst, wrong = ulp_error(t.numpy(tree), x, op)
        assert worst <= BOUND_ULP, f"{op} ({name} path): {worst:.3f} ulp"
        assert not wrong.any(), f"{op} ({name} path) at {x[~np.isfinite(x) | wrong][:5]}"


def test_special_values_are_exact():
    x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -1e-30], np.float32)
    i, = lt.symbols("i")
    t = lt.Tensor(x).to(i)
    log = t.log().numpy()
    assert np.array_equal(log[:4], [-np.inf, -np.inf, np.inf, np.nan], equal_nan=True) and np.isnan(log[4:]).all()
    assert np.array_equal(t.exp().numpy()[:5], [1, 1, np.inf, 0, np.nan], equal_nan=True)
    for op in ("tanh", "erf"):
        got = getattr(t, op)().numpy()
        assert np.array_equal(got[:5], [0, -0.0, 1, -1, np.nan], equal_nan=True)
        assert np.signbit(got[1]) and got[6] < 0


def test_exp_reaches_subnormal_results_and_log_reads_subnormal_inputs():
    i, = lt.symbols("i")
    tiny = np.array([-100.0, -103.0, -87.5], np.float32)
    got = lt.Tensor(tiny).to(i).exp().numpy()
    assert (got > 0).all() and (got < np.finfo(np.float32).tiny).all()
    sub = np.array([1e-40, 1e-45], np.float32)
    assert np.allclose(lt.Tensor(sub).to(i).log().numpy(), np.log(sub.astype(np.float64)), rtol=1e-7)


def test_float32_functions_are_inline_with_no_libm_call():
    i, = lt.symbols("i")
    x = lt.Tensor(np.linspace(0.5, 2, 64, dtype=np.float32)).to(i)
    ir_text = (x.exp() + x.log() + x.tanh() + x.erf()).compile().llvm_ir
    for name in ("expf", "logf", "tanhf", "erff", "llvm.log", "llvm.tanh", "llvm.exp"):
        assert f"@{name}(" not in ir_text and f"@{name}." not in ir_text, name


def test_float64_tanh_and_erf_use_libm_on_the_cpu(rng):
    i, = lt.symbols("i")
    x = rng.uniform(-5, 5, 301)
    t = lt.Tensor(x).to(i)
    for op in ("tanh", "erf"):
        for tree in paths(getattr(t, op)()).values():
            np.testing.assert_allclose(getattr(t, op)().numpy(tree), REFERENCE[op](x), rtol=1e-15, atol=1e-300)


@pytest.mark.parametrize("op", list(REFERENCE))
def test_gpu_ptx_of_float32_functions_has_no_call(op):
    """Inline on the GPU too; exp (and tanh and erf through it) takes 2**f of its reduced argument from the
    hardware's ex2.approx (codegen.gpu's `exp_core`), log its own polynomial."""
    i, = lt.symbols("i")
    t = getattr(lt.Tensor(np.ones(256, np.float32)).to(i), op)()
    tree = t.loop_tree().split("i", 128).bind("i.0", "block.x").bind("i.1", "thread.x")
    ptx = gpu.generate(tree, "sm_80").ptx
    assert "call" not in ptx and "lg2" not in ptx
    assert ("ex2.approx.ftz.f32" in ptx) == (op != "log")


def test_gpu_refuses_float64_transcendentals_in_plain_words():
    i, = lt.symbols("i")
    t = lt.Tensor(np.ones(256)).to(i).erf()
    tree = t.loop_tree().split("i", 128).bind("i.0", "block.x").bind("i.1", "thread.x")
    with pytest.raises(ValueError, match="erf of float64 is not supported on the GPU backend"):
        gpu.generate(tree, "sm_80")


@pytest.mark.gpu
@pytest.mark.parametrize("op", list(REFERENCE))
def test_gpu_accuracy(op):
    cp = cupy_or_skip()
    x = sweep()
    i, = lt.symbols("i")
    t = getattr(lt.Tensor(x).to(i), op)()
    worst, wrong = ulp_error(cp.asnumpy(t.cuda()), x, op)
    assert worst <= BOUND_ULP, f"{op} on the GPU: {worst:.3f} ulp"
    assert not wrong.any(), f"{op} on the GPU at {x[wrong][:5]}"


def test_a_division_by_a_row_fixed_divisor_is_within_one_and_a_half_ulp():
    """x / y[row] is x times y's reciprocal (`codegen.llvm.DIVISION`, inverted once a row): two roundings,
    within 1.5 ulp of float64, on the vector and the scalar path; x / 0 is still inf and 0 / 0 NaN."""
    rng = np.random.default_rng(0)
    x = (rng.standard_normal((64, 1000)) * 10.0 ** rng.uniform(-20, 20, (64, 1))).astype(np.float32)
    y = (rng.standard_normal(64) * 10.0 ** rng.uniform(-8, 8, 64)).astype(np.float32)
    x[0, :2], y[0] = (1.0, 0.0), 0.0
    r, c = lt.symbols("r c")
    t = lt.Tensor(x).to(r, c) / lt.Tensor(y).to(r)
    with np.errstate(all="ignore"):
        ref = x.astype(np.float64) / y.astype(np.float64)[:, None]
    finite = np.isfinite(ref)
    _, exponent = np.frexp(ref[finite])
    ulp = np.maximum(np.ldexp(1.0, exponent - 24), 2.0 ** -149)
    for name, tree in paths(t).items():
        got = t.numpy(tree)
        assert float((np.abs(got[finite] - ref[finite]) / ulp).max()) <= 1.5, name
        assert np.isinf(got[0, 0]) and np.isnan(got[0, 1]), name
