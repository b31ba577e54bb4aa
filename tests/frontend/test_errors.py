"""Error reporting: exception types and message content."""

import numpy as np
import pytest

import looptool as lt
from tests.helpers import mentions

# ------------------------------------------------- one symbol, two sizes

CONFLICTS = {
    "mul": lambda A, B, s: A * B,
    "add": lambda A, B, s: A + B,
    "sub-reversed": lambda A, B, s: B - A,
    "maximum": lambda A, B, s: A.maximum(B),
    "lt.minimum": lambda A, B, s: lt.minimum(A, B),
    "nested-exprs": lambda A, B, s: (A.exp() * 2.0) + B.relu(),
    "after-reduction": lambda A, B, s: A * B.sum(s.n),
    "matmul": lambda A, B, s: (A * B).sum(s.k),
}


@pytest.mark.parametrize("name", list(CONFLICTS))
def test_symbol_bound_to_two_sizes(name):
    s = lt.symbols("m k n")
    A = lt.Tensor(np.ones((2, 300), np.float32)).to(s.m, s.k)
    B = lt.Tensor(np.ones((301, 3), np.float32)).to(s.k, s.n)
    with pytest.raises(ValueError, match=mentions("k", "300", "301")):
        CONFLICTS[name](A, B, s)


def test_symbol_bound_to_two_sizes_in_concat():
    m, n, k, j = lt.symbols("m n k j")
    A = lt.Tensor(np.ones((2, 300), np.float64)).to(m, k)
    B = lt.Tensor(np.ones((3, 301), np.float64)).to(n, k)
    with pytest.raises(ValueError, match=mentions("k", "300", "301")):
        lt.concat([A, B], [m, n], j)


# --------------------------------------------------------- naming errors

@pytest.mark.parametrize("shape, nnames", [((4, 5), 3), ((4, 5, 6), 1), ((7,), 2)])
def test_to_with_wrong_number_of_names(shape, nnames):
    syms = list(lt.symbols("p q r"))[:nnames]
    with pytest.raises(ValueError, match=mentions(len(shape), nnames)):
        lt.Tensor(np.zeros(shape, np.float32)).to(*syms)


@pytest.mark.parametrize("ndim", [2, 3])
def test_to_with_repeated_symbol(ndim):
    row, col = lt.symbols("row col")
    names = (row, row) if ndim == 2 else (row, col, row)
    with pytest.raises(ValueError, match=mentions("row")):
        lt.Tensor(np.zeros((3,) * ndim, np.float32)).to(*names)


@pytest.mark.parametrize("op", ["sum", "max", "min", "mean"])
def test_reduce_over_missing_name(op):
    m, k, absent = lt.symbols("m k absent")
    t = lt.Tensor(np.ones((2, 3), np.float32)).to(m, k)
    with pytest.raises(ValueError, match=mentions("absent")):
        getattr(t, op)(absent)
    with pytest.raises(ValueError, match=mentions("absent")):
        getattr(t, op)(k, absent)


# ------------------------------------------------------------ type errors

@pytest.mark.parametrize("dtype", [np.int32, np.int64, np.uint8, np.bool_, np.int16,
                                   np.complex64, np.complex128])
def test_unsupported_dtype(dtype):
    m, k = lt.symbols("m k")
    x = np.ones((2, 3), dtype=dtype)
    with pytest.raises(TypeError, match=mentions(np.dtype(dtype).name)):
        lt.Tensor(x).to(m, k)


def test_python_int_list_is_int64_and_rejected():
    m, k = lt.symbols("m k")
    with pytest.raises(TypeError, match=mentions(np.asarray([[1, 2]]).dtype.name)):
        lt.Tensor([[1, 2], [3, 4]]).to(m, k)


@pytest.mark.parametrize("obj", ["abc", None, object(), [["a", "b"]], {"a": 1.0}],
                         ids=["str", "None", "object", "str-list", "dict"])
def test_non_numeric_input_rejected(obj):
    with pytest.raises(TypeError, match=r"\w"):  # a non-empty message
        lt.Tensor(obj)


# ------------------------------------------------------------ window size

@pytest.mark.parametrize("size, kwargs", [
    (8, {}),                      # 8 > 5
    (8, {"padding": 1}),          # 8 > 5 + 2
    (8, {"padding": (2, 0)}),     # 8 > 5 + 2
    (3, {"dilation": 3}),         # dilated extent 7 > 5
], ids=["plain", "padded", "asym-padded", "dilated"])
def test_window_larger_than_padded_extent(size, kwargs):
    m, width, o, r = lt.symbols("m width o r")
    t = lt.Tensor(np.ones((4, 5), np.float32)).to(m, width)
    with pytest.raises(ValueError, match=mentions("width")):
        t.window(width, o, r, size, **kwargs)


def test_window_exactly_fitting_padded_extent_is_fine():
    m, width, o, r = lt.symbols("m width o r")
    t = lt.Tensor(np.ones((4, 5), np.float32)).to(m, width)
    assert t.window(width, o, r, 7, padding=1).shape == (4, 1, 7)
    assert t.window(width, o, r, 3, dilation=2).shape == (4, 1, 3)
