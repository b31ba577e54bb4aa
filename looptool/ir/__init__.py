"""The IR layer: stages of pointwise-plus-reduction statements over named dims, and lowering to them."""
from .flatten import flattened, merged_last_two
from .apart import Apart, weights_apart
from .im2col import Im2col, im2col
from .split_k import split_k, splittable
from .lowering import (COSTLY, TRANSCENDENTAL, element_strides, is_sigmoid_form, lower, sigmoid_form,
                       whole_aligned_elements, with_fixed_sizes)
from .program import (REPRESENTATIVE_SIZE, SIZE_CLASS_RATIO, Size, size_class, Affine, Binary, Buffer, Cast, Const, Expr, Guard, Load, Program,
                      REDUCE_IDENTITY, Select, Stage, Unary, guards, hoistable_factor, index_vars, loaded_buffers, loads, rewritten, row_major_strides,
                      subexpressions, substituted)

__all__ = ["REPRESENTATIVE_SIZE", "SIZE_CLASS_RATIO", "Size", "size_class", "Affine", "Binary", "Buffer", "Cast", "Const", "Expr", "Guard", "Load",
           "Program", "REDUCE_IDENTITY", "Select", "Stage", "Unary", "guards", "hoistable_factor", "index_vars", "loaded_buffers", "loads", "element_strides", "lower", "rewritten", "row_major_strides",
           "substituted", "whole_aligned_elements", "with_fixed_sizes", "flattened", "merged_last_two", "Im2col",
           "im2col", "Apart", "weights_apart", "split_k", "splittable", "TRANSCENDENTAL", "COSTLY", "is_sigmoid_form", "sigmoid_form", "subexpressions"]
