"""The lowering computes 1 + tanh(u), tanh(u) + 1 and 1 - tanh(u) as 2 / (1 + exp(∓2u)) (`ir.sigmoid_form`):
GELU's 0.5x(1 + tanh(u)) with one exp and one division. Checked in float32 ulps against SciPy's float64
logistic function over a sweep of the float32 range (both signs, vector and scalar paths), on a GELU
against float64 NumPy, and where the rule must leave tanh alone."""
import numpy as np
import pytest
from scipy import special

import looptool as lt
from looptool import ir
from tests.codegen.test_transcendental import paths, sweep
from tests.helpers import assert_close

# 1 + tanh(u) = 2 / (1 + exp(-2u)): exp's 2 ulp, the add's and the division's half ulp each.
BOUND_ULP = 3.0
MIN_NORMAL = float(np.finfo(np.float32).tiny)


def ulps(got: np.ndarray, ref: np.ndarray) -> float:
    """The largest error of float32 `got` against float64 `ref` in float32 ulps of `ref`, where `ref` is
    a normal float32 number; below, where exp(-2u) overflows, results may be 0: they must be within
    float32's least normal number of `ref`."""
    normal = ref >= MIN_NORMAL
    assert (np.abs(got[~normal] - ref[~normal]) <= MIN_NORMAL).all()
    _, exponent = np.frexp(ref[normal])
    return float((np.abs(got[normal].astype(np.float64) - ref[normal]) / np.ldexp(1.0, exponent - 24)).max())


def stage_exprs(t) -> list:
    return [e for st in ir.lower(t.node)[0].stages for e in ir.subexpressions(st.expr)]


@pytest.mark.parametrize("form, sign", [("1 + tanh", 1), ("tanh + 1", 1), ("1 - tanh", -1)])
def test_one_plus_tanh_is_within_three_ulp_over_the_float32_range(form, sign):
    u = sweep()
    u = u[np.isfinite(u)]
    i, = lt.symbols("i")
    x = lt.Tensor(u).to(i)
    t = {"1 + tanh": lambda: 1.0 + x.tanh(), "tanh + 1": lambda: x.tanh() + 1.0,
         "1 - tanh": lambda: 1 - x.tanh()}[form]()
    assert any(ir.is_sigmoid_form(e) for e in stage_exprs(t))
    assert not any(isinstance(e, ir.Unary) and e.op == "tanh" for e in stage_exprs(t))
    ref = 2.0 * special.expit(2.0 * sign * u.astype(np.float64))
    for name, tree in paths(t).items():
        got = t.numpy(tree)
        assert ulps(got, ref) <= BOUND_ULP, f"{form} ({name} path): {ulps(got, ref):.3f} ulp"


def test_the_rule_keeps_digits_that_one_plus_tanh_in_float32_loses():
    u = np.array([-10.0, -20.0, -40.0], np.float32)
    i, = lt.symbols("i")
    got = (1.0 + lt.Tensor(u).to(i).tanh()).numpy()
    ref = 2.0 * special.expit(2.0 * u.astype(np.float64))
    assert np.all(got > 0) and ulps(got, ref) <= BOUND_ULP
    assert np.all(1.0 + np.tanh(u) == 0.0)          # what float32's own 1 + tanh(u) gives


@pytest.mark.parametrize("shape", [(7, 33), (64, 1024)])
def test_gelu_tanh_matches_float64_and_says_why(rng, shape):
    data = (3 * rng.standard_normal(shape)).astype(np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(data).to(m, n)
    gelu = 0.5 * x * (1.0 + lt.tanh(0.7978845608028654 * (x + 0.044715 * x * x * x)))
    d = data.astype(np.float64)
    assert_close(gelu.numpy(), 0.5 * d * (1 + np.tanh(0.7978845608028654 * (d + 0.044715 * d ** 3))), 1e-5)
    assert "1 ± tanh(u) computed as 2 / (1 + exp(∓2u)), 0.5x times it as x / (1 + exp(∓2u)) (1 place, " \
           "lowered so)" in gelu.loop_tree().auto().explain()


@pytest.mark.parametrize("form", ["0.5 x (1 + tanh)", "x 0.5 (tanh + 1)", "(1 - tanh) (x 0.5)", "x (1 + tanh) 0.5"])
def test_half_x_times_one_plus_tanh_divides_x_with_no_half_and_no_two(rng, form):
    data = (3 * rng.standard_normal(300)).astype(np.float32)
    i, = lt.symbols("i")
    x = lt.Tensor(data).to(i)
    t = {"0.5 x (1 + tanh)": lambda: 0.5 * x * (1.0 + x.tanh()), "x 0.5 (tanh + 1)": lambda: x * 0.5 * (x.tanh() + 1.0),
         "(1 - tanh) (x 0.5)": lambda: (1.0 - x.tanh()) * (x * 0.5),
         "x (1 + tanh) 0.5": lambda: x * (1.0 + x.tanh()) * 0.5}[form]()
    consts = {e.value for e in stage_exprs(t) if isinstance(e, ir.Const)}
    sigmoid, = [e for e in stage_exprs(t) if ir.is_sigmoid_form(e)]
    folded = form != "x (1 + tanh) 0.5"                      # 0.5 last: 2 / (1 + exp(-2u)) times x, times 0.5
    assert isinstance(sigmoid.a, ir.Load) == folded and (0.5 in consts) != folded
    d = data.astype(np.float64)
    assert_close(t.numpy(), 0.5 * d * (1 + (-1 if "1 - tanh" in form else 1) * np.tanh(d)), 1e-5)


@pytest.mark.parametrize("form", ["tanh - 1", "tanh + 2", "2 tanh + 1", "tanh", "1 + exp"])
def test_other_forms_keep_their_tanh(rng, form):
    data = rng.standard_normal(50).astype(np.float32)
    i, = lt.symbols("i")
    x = lt.Tensor(data).to(i)
    t = {"tanh - 1": lambda: x.tanh() - 1.0, "tanh + 2": lambda: x.tanh() + 2.0,
         "2 tanh + 1": lambda: 2.0 * x.tanh() + 1.0, "tanh": lambda: x.tanh(), "1 + exp": lambda: 1.0 + x.exp()}[form]()
    assert not any(ir.is_sigmoid_form(e) for e in stage_exprs(t))
    assert "tanh(u) computed as" not in t.loop_tree().auto().explain()
    d = data.astype(np.float64)
    ref = {"tanh - 1": np.tanh(d) - 1, "tanh + 2": np.tanh(d) + 2, "2 tanh + 1": 2 * np.tanh(d) + 1,
           "tanh": np.tanh(d), "1 + exp": 1 + np.exp(d)}[form]
    assert_close(t.numpy(), ref, 1e-5)
