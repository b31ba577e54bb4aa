"""float16 and bfloat16 tensors on the CPU: the dtype rules, rounding bit for bit as ml_dtypes and
NumPy round, float32 accumulation, pointwise, reductions, matmul and softmax under several
schedules, mixed dtypes and the combinations refused.

Tolerances. A kernel reads half-precision values exactly and computes in float32, so against a
float64 reference computed from the same half-precision inputs a float32 result must agree to
float32 accuracy (1e-5 relative to the largest magnitude, as everywhere in the suite). A result
rounded to a half type may differ by that rounding as well: u * |ref| with the unit roundoff
u = 2**-11 for float16 and 2**-8 for bfloat16. Against the float64 inputs before they were rounded
to half precision, a matmul's error is bounded by the input rounding: 2u * (|A| @ |B|).
"""
import numpy as np
import pytest

import looptool as lt
from tests.helpers import assert_close, f64, mentions, randn, softmax_ref

HALVES = [lt.float16, lt.bfloat16]
UNIT_ROUNDOFF = {lt.float16: 2.0 ** -11, lt.bfloat16: 2.0 ** -8}


def assert_half_close(got, ref, dtype):
    """A result rounded to the half type `dtype`: one rounding of a float32-accurate value."""
    assert got.dtype == dtype
    ref = f64(ref)
    bound = UNIT_ROUNDOFF[dtype] * np.abs(ref) + 1e-5 * np.abs(ref).max()
    excess = np.abs(f64(got) - ref) - bound
    assert (excess <= 0).all(), f"off by {excess.max():.3g} beyond the rounding bound at {np.argmax(excess)}"


def matmul(a, b):
    m, k, n = lt.symbols("m k n")
    return (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)


def special_floats(rng) -> np.ndarray:
    """Random float32 bit patterns, exact ties of both half types, and the edge cases."""
    random_bits = rng.integers(0, 2 ** 32, 4096, dtype=np.uint64).astype(np.uint32)
    bfloat16_ties = (rng.integers(0, 2 ** 16, 512, dtype=np.uint64).astype(np.uint32) << 16) | 0x8000
    float16_ties = np.float32(1.0) + np.arange(1, 512, 2, dtype=np.float32) * np.float32(2.0 ** -11)
    edges = [np.inf, -np.inf, np.nan, 0.0, -0.0, 3.4e38, -3.4e38, 1e-40, 65504, 65520, -65520, 6e-8, 1e-8]
    return np.concatenate([random_bits.view(np.float32), bfloat16_ties.view(np.float32), float16_ties,
                           np.array(edges, np.float32)])


# ------------------------------------------------------------------ dtype rules

def test_arithmetic_on_half_values_is_float32_and_astype_rounds_back(rng):
    m, k = lt.symbols("m k")
    x = lt.Tensor(randn(rng, (3, 4), lt.bfloat16)).to(m, k)
    h = lt.Tensor(randn(rng, (3, 4), lt.float16)).to(m, k)
    d = lt.Tensor(randn(rng, (3, 4), np.float64)).to(m, k)
    assert x.dtype == lt.bfloat16 and h.dtype == lt.float16
    assert (x * x).dtype == lt.float32 and (x + 1.5).dtype == lt.float32 and x.exp().dtype == lt.float32
    assert (h * lt.Tensor(randn(rng, (3, 4))).to(m, k)).dtype == lt.float32
    assert (x + d).dtype == lt.float64 and (h - d).dtype == lt.float64
    assert x.sum(k).dtype == lt.float32 and x.max(k).dtype == lt.float32 and d.sum(k).dtype == lt.float64
    assert x.sum(k, dtype=lt.bfloat16).dtype == lt.bfloat16 and x.sum(k, dtype="float64").dtype == lt.float64
    assert (x * x).sum(k).astype(lt.bfloat16).dtype == lt.bfloat16
    assert x.astype(lt.bfloat16) is x
    i, p = lt.symbols("i p")
    assert x.pad(k, p, 1).dtype == lt.bfloat16
    assert lt.concat([x, x], [k, k], p).dtype == lt.bfloat16
    assert lt.concat([x, d], [k, k], p).dtype == lt.float64
    text = str((x * x).sum(k).astype(lt.bfloat16).loop_tree())
    assert "bf16[3, 4] input" in text and "f32[3] " in text and "bf16[3] output" in text


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_rounding_to_half_matches_ml_dtypes_and_numpy_bit_for_bit(rng, dtype):
    i, = lt.symbols("i")
    x = special_floats(rng)
    with np.errstate(all="ignore"):                      # NumPy warns on overflow and NaN casts
        want = x.astype(dtype)
    t = lt.Tensor(x).to(i).astype(dtype)
    vectorized = t.loop_tree().split("i", 8).vectorize("i.1")
    nan = np.isnan(x)
    for got in (t.numpy(), t.numpy(vectorized), lt.interpret(t)):
        assert got.dtype == dtype
        assert np.array_equal(got.view(np.uint16)[~nan], want.view(np.uint16)[~nan])
        assert np.isnan(got[nan].astype(np.float32)).all()
    back = lt.Tensor(want).to(i).astype(lt.float64)               # widening is exact
    assert np.array_equal(back.numpy(), want.astype(np.float64), equal_nan=True)


def test_float64_rounds_to_half_through_float32(rng):
    i, = lt.symbols("i")
    x = rng.standard_normal(2000)
    for dtype in HALVES:
        got = lt.Tensor(x).to(i).astype(dtype).numpy()
        assert np.array_equal(got, x.astype(np.float32).astype(dtype))


# ------------------------------------------------------------------ accumulation

def test_sums_of_half_values_accumulate_in_float32_unless_asked(rng):
    k, = lt.symbols("k")
    ones = lt.Tensor(np.ones(4096, lt.bfloat16)).to(k)
    assert ones.sum(k).numpy() == 4096.0
    # in bfloat16 (8 significant bits) 256 + 1 rounds back to 256: a serial sum stalls there (the
    # default schedule; the automatic one sums in vector lanes, each of which would stall)
    in_bf16 = ones.sum(k, dtype=lt.bfloat16)
    for got in (in_bf16.numpy(in_bf16.loop_tree()), lt.interpret(in_bf16)):
        assert got.dtype == lt.bfloat16 and float(got) == 256.0
    halves = lt.Tensor(np.ones(4096, lt.float16)).to(k)
    in_f16 = halves.sum(k, dtype=lt.float16)
    assert halves.sum(k).numpy() == 4096.0 and float(in_f16.numpy(in_f16.loop_tree())) == 2048.0


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_reductions_over_half_values(rng, dtype):
    m, k = lt.symbols("m k")
    x_np = randn(rng, (17, 300), dtype)
    x = lt.Tensor(x_np).to(m, k)
    ref = f64(x_np)
    tree = x.sum(k).loop_tree().split("k", 8).vectorize("k.1")
    assert_close(x.sum(k).numpy(tree), ref.sum(1), 1e-5)
    assert_close(x.mean(k).numpy(), ref.mean(1), 1e-5)
    assert np.array_equal(x.max(k).numpy(), ref.max(1)) and np.array_equal(x.min(k).numpy(), ref.min(1))
    assert np.array_equal(x.max(k, dtype=dtype).numpy(), x_np.max(1))
    assert_half_close(x.sum(k).astype(dtype).numpy(), ref.sum(1), dtype)


# ------------------------------------------------------------------ computations

@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_pointwise_on_half_values(rng, dtype):
    m, n = lt.symbols("m n")
    a_np, b_np, c_np = randn(rng, (9, 37), dtype), randn(rng, (9, 37), dtype), randn(rng, (37,), dtype)
    a, b, c = lt.Tensor(a_np).to(m, n), lt.Tensor(b_np).to(m, n), lt.Tensor(c_np).to(n)
    t = ((a * b + c).relu() / (a.abs() + 1.0)).exp()
    ref = np.exp(np.maximum(f64(a_np) * f64(b_np) + f64(c_np), 0) / (np.abs(f64(a_np)) + 1.0))
    vectorized = t.loop_tree().split("n", 8).vectorize("n.1")
    for got in (t.numpy(), t.numpy(vectorized), lt.interpret(t)):
        assert got.dtype == np.float32
        assert_close(got, ref, 1e-5)
    assert_half_close(t.astype(dtype).numpy(vectorized), ref, dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_matmul_of_half_inputs_under_schedules(rng, dtype):
    a64, b64 = rng.standard_normal((64, 96)), rng.standard_normal((96, 80))
    a, b = a64.astype(dtype), b64.astype(dtype)
    c = matmul(a, b)
    assert c.dtype == np.float32
    ref = f64(a) @ f64(b)
    fast = (c.loop_tree().split("n", 16).split("n.1", 8).reorder("m", "n.0", "k", "n.1.0", "n.1.1")
            .vectorize("n.1.1").unroll("n.1.0").parallel("m"))
    assert fast.check() == (True, "legal")
    for got in (c.numpy(), c.numpy(fast), lt.interpret(c, fast)):
        assert_close(got, ref, 1e-5)
    # against the inputs before rounding to half precision: the input rounding bounds the error
    got = c.numpy(fast)
    bound = 2 * UNIT_ROUNDOFF[dtype] * (np.abs(a64) @ np.abs(b64)) + 1e-5 * np.abs(ref).max()
    assert (np.abs(got - a64 @ b64) <= bound).all()
    assert (np.abs(got - a64 @ b64) > UNIT_ROUNDOFF[dtype] / 8).any()    # the inputs really were rounded
    rounded = c.astype(dtype)
    assert_half_close(rounded.numpy(rounded.loop_tree().split("n", 8).vectorize("n.1")), ref, dtype)


@pytest.mark.parametrize("dtype", HALVES, ids=str)
def test_softmax_of_half_inputs(rng, dtype):
    m, n = lt.symbols("m n")
    x_np = (randn(rng, (33, 65), np.float64) * 4.0).astype(dtype)
    x = lt.Tensor(x_np).to(m, n)
    e = (x - x.max(n)).exp()
    sm = e / e.sum(n)
    ref = softmax_ref(f64(x_np), 1)
    assert_close(sm.numpy(), ref, 1e-5)
    assert_close(lt.interpret(sm), ref, 1e-5)
    assert_half_close(sm.astype(dtype).numpy(), ref, dtype)


def test_half_inputs_mixed_with_float32_and_float64(rng):
    m, n = lt.symbols("m n")
    h, b = randn(rng, (5, 6), lt.float16), randn(rng, (5, 6), lt.bfloat16)
    s, d = randn(rng, (5, 6), np.float32), randn(rng, (5, 6), np.float64)
    t32 = lt.Tensor(h).to(m, n) * lt.Tensor(s).to(m, n) + lt.Tensor(b).to(m, n).astype(lt.float32)
    assert t32.dtype == np.float32
    assert_close(t32.numpy(), f64(h) * f64(s) + f64(b), 1e-5)
    t64 = lt.Tensor(b).to(m, n) * lt.Tensor(d).to(m, n)
    assert t64.dtype == np.float64
    assert_close(t64.numpy(), f64(b) * d, 1e-12)
    i, p = lt.symbols("i p")
    padded = lt.Tensor(b[0]).to(i).pad(i, p, 2, value=0.1)                    # the value as bfloat16 holds it
    assert np.array_equal(padded.numpy(), np.pad(b[0], 2, constant_values=lt.bfloat16.type(0.1)))


# ------------------------------------------------------------------ refused

def test_float16_with_bfloat16_is_refused_naming_both(rng):
    m, n, p = lt.symbols("m n p")
    h = lt.Tensor(randn(rng, (2, 3), lt.float16)).to(m, n)
    b = lt.Tensor(randn(rng, (3,), lt.bfloat16)).to(n)
    with pytest.raises(TypeError, match=mentions("mul", "float16", "bfloat16", "dims=(m, n)", "dims=(n)", "astype")):
        h * b
    with pytest.raises(TypeError, match=mentions("concat", "float16", "bfloat16")):
        lt.concat([h, lt.Tensor(randn(rng, (2, 3), lt.bfloat16)).to(m, n)], [n, n], p)
    assert (h * b.astype(lt.float16)).dtype == np.float32          # an explicit conversion is fine


@pytest.mark.parametrize("bad", [np.int32, "int8", "complex64", "half-ish"])
def test_unsupported_dtypes_for_astype_and_accumulators_are_refused(rng, bad):
    m, = lt.symbols("m")
    x = lt.Tensor(randn(rng, (4,), lt.bfloat16)).to(m)
    with pytest.raises(TypeError, match=mentions("astype", "not supported", "bfloat16", "float16")):
        x.astype(bad)
    with pytest.raises(TypeError, match=mentions("sum", "not supported")):
        x.sum(m, dtype=bad)
