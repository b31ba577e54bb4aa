"""ir.flattened: a pointwise program's two innermost dims merged into one where every array lays them
out as one run of elements (what `.cuda()` runs: 16-byte vectors along rows that hold none), and so are a
reduction's two innermost reduced dims (a global pool's h and w); left as it is where any read broadcasts,
transposes, or skips elements between rows, or a reduction's innermost dims are not both reduced."""
import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.autoschedule import gpu_rules
from looptool.codegen import gpu as codegen_gpu
from looptool.analysis.gpu_target import assumed_gpu
from looptool.runtime import gpu
from tests.helpers import assert_close


def gelu(x):
    return 0.5 * x * (1.0 + lt.tanh(0.7978845608 * (x + 0.044715 * x * x * x)))


def test_a_pointwise_chain_over_whole_rows_runs_as_one_flat_dim(rng):
    data = rng.standard_normal((2, 10, 31)).astype(np.float32)
    b, m, n = lt.symbols("b m n")
    x = lt.Tensor(data).to(b, m, n)
    program, arrays = gpu.lowered_for(gelu(x).node)
    assert program.output.dims == ("b_m_n",) and [buf.shape for buf in program.inputs] == [(620,)]
    assert arrays[0].shape == (620,) and np.shares_memory(arrays[0], data)
    tree = gpu_rules.gpu_tree(program, assumed_gpu("sm_90"))
    assert "4-wide vectors along b_m_n" in tree.explain()
    d = data.astype(np.float64)
    ref = 0.5 * d * (1 + np.tanh(0.7978845608 * (d + 0.044715 * d ** 3)))
    assert_close(lt.Kernel(tree, 1)(arrays).reshape(2, 10, 31), ref, 1e-5)
    assert ir.merged_last_two(program) is program


@pytest.mark.parametrize("case", ["broadcast", "transposed", "strided rows", "reduction"])
def test_programs_whose_arrays_do_not_lay_rows_back_to_back_stay_as_they_are(rng, case):
    m, n = lt.symbols("m n")
    x = lt.Tensor(rng.standard_normal((10, 31)).astype(np.float32)).to(m, n)
    other = {"broadcast": lambda: x + lt.Tensor(rng.standard_normal(31).astype(np.float32)).to(n),
             "transposed": lambda: x + lt.Tensor(rng.standard_normal((31, 10)).astype(np.float32)).to(n, m),
             "strided rows": lambda: lt.Tensor(rng.standard_normal((10, 32)).astype(np.float32)[:, :31]).to(m, n) * 2,
             "reduction": lambda: x.sum(n)}[case]()
    program = ir.lower(other.node)[0]
    assert ir.flattened(program) is program


@pytest.mark.parametrize("reduced, axes", [("h w", (2, 3)), ("b h w", (0, 2, 3))])
def test_the_innermost_reduced_dims_of_an_array_laid_out_whole_merge_into_one_row(rng, reduced, axes):
    """A global pool's mean over (h, w) of an NCHW array, or a batch norm's over (b, h, w): h and w become one
    reduced dim of h * w contiguous elements, a row the GPU rules take a block (or a warp) a row; a sum over c,
    not innermost, stays."""
    data = rng.standard_normal((3, 5, 9, 11)).astype(np.float32)
    b, c, h, w = lt.symbols("b c h w")
    x = lt.Tensor(data).to(b, c, h, w)
    pooled = x.mean(*lt.symbols(reduced))
    program, arrays = gpu.lowered_for(pooled.node)
    assert program.stages[0].reduce_dims[-1] == "h_w" and program.stages[0].loop_dims[-1] == "h_w"
    assert [buf.shape for buf in program.inputs] == [(3, 5, 99)] and np.shares_memory(arrays[0], data)
    tree = gpu_rules.gpu_tree(program, assumed_gpu("sm_90"))
    assert ("along contiguous rows of 99 (h_w)" in tree.explain()) == (reduced == "h w"), tree.explain()
    assert_close(lt.Kernel(tree, 1)(arrays), data.astype(np.float64).mean(axes), 1e-5)
    channels = ir.lower(x.sum(c).node)[0]
    assert ir.flattened(channels) is channels


def test_an_instance_norm_and_a_group_norm_run_as_rows_of_their_merged_dims(rng):
    """Normalized over (h, w), or a group's (cg, h, w): those dims merged in every stage, the means and the result
    alike, so the program is softmax-like rows of h * w (or cg * h * w) contiguous elements, one kernel."""
    data = rng.standard_normal((2, 4, 8, 6, 5)).astype(np.float32)
    b, g, cg, h, w = lt.symbols("b g cg h w")
    x = lt.Tensor(data).to(b, g, cg, h, w)
    for dims, axes in (((h, w), (3, 4)), ((cg, h, w), (2, 3, 4))):
        centred = x - x.mean(*dims)
        normed = centred / lt.sqrt((centred * centred).mean(*dims) + 1e-5)
        program, arrays = gpu.lowered_for(normed.node)
        merged = "_".join(d.name for d in dims)
        assert all(st.loop_dims[-1] == merged for st in program.stages), [st.loop_dims for st in program.stages]
        tree = gpu_rules.gpu_tree(program, assumed_gpu("sm_90"))
        assert "placed in its rows" in tree.explain() and merged in tree.explain().splitlines()[-1], tree.explain()
        assert len(codegen_gpu.generate(tree, "sm_90").launches) == 1
        d = data.astype(np.float64) - data.astype(np.float64).mean(axes, keepdims=True)
        ref = d / np.sqrt((d * d).mean(axes, keepdims=True) + 1e-5)
        assert_close(np.asarray(lt.Kernel(tree, 1)(arrays)).reshape(ref.shape), ref, 1e-5)
