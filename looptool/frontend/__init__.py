"""The frontend layer: symbols, named-dimension tensors, their operations and the lazy graph."""
from .tensor import (BACKEND, Symbol, Symbols, Tensor, abs, concat, exp, log, maximum, minimum, reciprocal,
                     relu, sqrt, symbols)

__all__ = ["BACKEND", "Symbol", "Symbols", "Tensor", "symbols", "concat", "exp", "log", "sqrt", "abs",
           "reciprocal", "relu", "maximum", "minimum"]
