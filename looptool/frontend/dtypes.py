"""Element types: float16, bfloat16, float32 and float64, and how they combine.

The half types (float16, bfloat16) are storage formats: values are widened to
float32 when read, arithmetic and reductions on them run in float32, and a result
is rounded to a half type only where the user asks for it with `.astype()`.
bfloat16 is NumPy's extension dtype from `ml_dtypes` (the one JAX and TensorFlow use).
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

float16 = np.dtype(np.float16)
bfloat16 = np.dtype(ml_dtypes.bfloat16)
float32 = np.dtype(np.float32)
float64 = np.dtype(np.float64)
SUPPORTED_DTYPES = (float16, bfloat16, float32, float64)
HALF_DTYPES = (float16, bfloat16)
ITEM_BYTES = {dtype.name: dtype.itemsize for dtype in SUPPORTED_DTYPES}     # bytes an element, by dtype name
# How far the results of two correct schedules may differ, relative to the largest magnitude:
# float32 and float64 sums that schedules reassociate; half-precision results two roundings
# (2 units in the last place at the top of the range: 2 * 2**-10 and 2 * 2**-7) apart.
SCHEDULE_TOLERANCE = {"float16": 2e-3, "bfloat16": 1.6e-2, "float32": 1e-4, "float64": 1e-10}


def as_dtype(value, what: str) -> np.dtype:
    """A supported dtype from what a user wrote: `lt.bfloat16`, `np.float16`, `"float32"`, ..."""
    try:
        supported = value is not None and np.dtype(value) in SUPPORTED_DTYPES   # np.dtype(None) is float64
    except TypeError:
        supported = False
    if not supported:
        raise TypeError(f"{what}: dtype {value!r} is not supported; use one of "
                        f"{', '.join(d.name for d in SUPPORTED_DTYPES)}")
    return np.dtype(value)


def compute_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype that arithmetic on `dtype` values runs in: float32 for the half types, else itself."""
    return float32 if dtype in HALF_DTYPES else dtype


def mixed_halves(dtypes) -> bool:
    """True when float16 and bfloat16 meet: they differ in range and precision, so looptool refuses
    to pick one silently."""
    present = set(dtypes)
    return float16 in present and bfloat16 in present


def arithmetic_dtype(dtypes) -> np.dtype:
    """The result dtype of arithmetic on values of `dtypes`: float64 if any is float64, else float32."""
    return float64 if float64 in {compute_dtype(d) for d in dtypes} else float32


def view_dtype(dtypes) -> np.dtype:
    """The dtype of a view joining values of `dtypes` (concat): their common dtype when they share
    one, half types included, else the arithmetic dtype."""
    unique = set(dtypes)
    return unique.pop() if len(unique) == 1 else arithmetic_dtype(unique)
