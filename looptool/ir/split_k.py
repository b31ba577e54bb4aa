"""A contraction's reduction cut into independent parts (split-k): where a matrix product has too few
output tiles to fill a GPU, its reduction dim k is read as two dims (k_o, k_i) of the same inputs (a view:
k = k_o * K/parts + k_i), a first stage sums each part into its own partial result (a batched product
over k_o, which the GPU runs on blocks of their own) and a second adds the partials up.
"""
from __future__ import annotations

from dataclasses import replace

from .program import Affine, Buffer, Load, Program, Stage, loads, plain_dims, rewritten


def split_k(program: Program, parts: int) -> Program | None:
    """`program`, a sum over one dim k of products of plain reads of its inputs (every index a dim),
    maybe followed by pointwise stages (an epilogue: a bias, relu, a cast), with k cut into `parts` runs
    of equal length (`parts` divides it): stage `<name>.part` [k_o, dims...] (k_o after a dynamic first
    dim, in the split inputs too, so no stride depends on a run-time size) sums each run, the sum's
    stage sums the parts, the epilogue follows unchanged. None where the program is not such a
    contraction, an input it cuts is read by the epilogue too, or `parts` does not divide k."""
    if parts < 2 or not splittable(program):
        return None
    stage, *epilogue = program.stages
    k, = stage.reduce_dims
    size = program.size(k)
    if size % parts:
        return None
    reads = list(loads(stage.expr))
    outer, inner = program.fresh_dim(f"{k}_o"), program.fresh_dim(f"{k}_i")
    run = size // parts
    dynamic = {dim for dim, _ in program.dynamic}

    def load(ld: Load) -> Load:
        if Affine.var(k) not in ld.index:
            return ld
        index = tuple(Affine.var(inner) if affine == Affine.var(k) else affine for affine in ld.index)
        lead = _leading(program.buffer_dims(ld.buffer), dynamic)
        return replace(ld, index=index[:lead] + (Affine.var(outer),) + index[lead:])
    split_inputs = tuple(_split_buffer(buffer, reads, k, outer, inner, parts, run, _leading(buffer.dims, dynamic))
                         for buffer in program.inputs)
    lead = _leading(stage.dims, dynamic)
    dims = (*stage.dims[:lead], outer, *stage.dims[lead:])
    part = Stage(f"{stage.name}.part", dims, (inner,), "sum", rewritten(stage.expr, load),
                 stage.expr.dtype, (outer, *(inner if d == k else d for d in stage.loop_dims)))
    total = Stage(stage.name, stage.dims, (outer,), "sum", Load(part.name, Affine.identity(dims), part.dtype),
                  stage.dtype, (outer, *stage.dims))
    sizes = tuple(item for item in program.sizes if item[0] != k) + ((outer, parts), (inner, run))
    return replace(program, inputs=split_inputs, stages=(part, total, *epilogue), sizes=sizes)


def _leading(dims: tuple[str, ...], dynamic: set[str]) -> int:
    """Where a split's parts axis goes in an array of `dims`: first, or after its dynamic first dim (a
    stride before it would be a size known only at run time)."""
    return 1 if dims and dims[0] in dynamic else 0


def splittable(program: Program) -> bool:
    """Whether `split_k` can cut the program (into parts that divide its k): a sum over one dim of
    products of plain reads of inputs that no later stage reads, the later stages pointwise, k not a dynamic dim."""
    if not program.stages:
        return False
    stage, *epilogue = program.stages
    if stage.reduce_op != "sum" or len(stage.reduce_dims) != 1 or any(st.reduce_dims for st in epilogue) \
            or stage.reduce_dims[0] in {dim for dim, _ in program.dynamic}:
        return False
    inputs = {buffer.name for buffer in program.inputs}
    later = {ld.buffer for st in epilogue for ld in loads(st.expr)}
    return all(ld.buffer in inputs and plain_dims(ld) is not None and ld.buffer not in later
               for ld in loads(stage.expr))


def _split_buffer(buffer: Buffer, reads: list[Load], k: str, outer: str, inner: str, parts: int, run: int,
                  lead: int) -> Buffer:
    """`buffer` with its axis along k (where a read of it has one) viewed as two: the parts at `lead`
    (first, or after a dynamic first axis: a batch of matrices), the run in k's place."""
    read = next((ld for ld in reads if ld.buffer == buffer.name), None)
    if read is None or Affine.var(k) not in read.index:
        return buffer
    axis = read.index.index(Affine.var(k))
    stride = buffer.strides[axis]

    def placed(values: tuple, first, in_place) -> tuple:
        return values[:lead] + (first,) + values[lead:axis] + (in_place,) + values[axis + 1:]
    return Buffer(buffer.name, placed(buffer.dims, outer, inner), placed(buffer.shape, parts, run), buffer.dtype,
                  placed(buffer.strides, stride * run, stride))
