"""The frontend layer: symbols, named-dimension tensors, their operations, dtypes and the lazy graph."""
from .dtypes import bfloat16, float16, float32, float64
from .tensor import (BACKEND, Symbol, Symbols, Tensor, abs, concat, erf, exp, log, maximum, minimum, reciprocal,
                     relu, sqrt, symbols, tanh)

__all__ = ["BACKEND", "Symbol", "Symbols", "Tensor", "symbols", "concat", "exp", "log", "tanh", "erf", "sqrt", "abs",
           "reciprocal", "relu", "maximum", "minimum", "float16", "bfloat16", "float32", "float64"]
