"""The automatic GPU scheduler's choices, on any machine: each workload family gets the rule it should
(read from the tree and `explain()`), the legality check accepts it, the CPU runs it (GPU-bound loops
as plain loops) against a float64 reference, and its PTX builds for the GPU it was made for."""
import dataclasses
import json
import math
import re

import ml_dtypes
import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.analysis.gpu_target import GpuTarget, assumed_gpu
from looptool.autoschedule import gpu as templates
from looptool.autoschedule import gpu_rules
from looptool.codegen import gpu as codegen_gpu
from looptool.schedule import LoopTree
from tests.gpu_host import run_tree
from tests.helpers import assert_close, row_softmax, scaled_layer_norm, viewed

H100 = assumed_gpu("sm_90")


def split_product(rng, m, k, n, dtype):
    """A product of random m x k and k x n matrices of `dtype` as `.cuda()` plans it on an H100 (k cut into
    `split_k_parts`): (its tree, the parts, a function running the tree on this CPU with GPU-bound loops as plain
    loops, the float64 product)."""
    a, b = rng.standard_normal((m, k)).astype(dtype), rng.standard_normal((k, n)).astype(dtype)
    sm, sk, sn = lt.symbols("m k n")
    program, arrays = ir.lower((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk).node)
    parts = templates.split_k_parts(program, H100.sms)
    split = ir.split_k(program, parts) if parts > 1 else program
    tree = gpu_rules.gpu_tree(split, H100)
    return (tree, parts, lambda: lt.Kernel(tree, 1)([viewed(x, buffer) for x, buffer in zip(arrays, split.inputs)]),
            a.astype(np.float64) @ b.astype(np.float64))


def scheduled(tensor, gpu=H100):
    tree = gpu_rules.gpu_tree(ir.lower(tensor.node)[0], gpu)      # the program the GPU runtime lowers
    assert tree.check() == (True, "legal"), tree.explain()
    return tree, codegen_gpu.generate(tree, gpu.arch)


def test_the_assumed_gpus_follow_their_architecture():
    assert assumed_gpu("sm_90").sms == 132 and assumed_gpu("sm_90a").tensor_cores == "wgmma"
    assert assumed_gpu("sm_86").tensor_cores == "mma" and assumed_gpu("sm_75").tensor_cores is None
    assert "132 SMs" in assumed_gpu("sm_90").describe()


def test_a_dot_product_is_a_grid_wide_reduction_in_two_kernels(rng):
    x, y = rng.standard_normal(100_001).astype(np.float32), rng.standard_normal(100_001).astype(np.float32)
    c, = lt.symbols("c")
    dot = (lt.Tensor(x).to(c) * lt.Tensor(y).to(c)).sum(c)
    tree, module = scheduled(dot)
    assert "rfactor" in tree.explain() and "t0.rf" in str(tree)
    assert len(module.launches) == 2 and module.launches[0].grid[0] > 16
    assert module.launches[1].grid == (1, 1, 1) and module.launches[1].block[0] >= 32
    assert "shfl.sync.bfly" in module.ptx
    assert_close(dot.numpy(tree), x.astype(np.float64) @ y.astype(np.float64), 1e-5)
    assert_close(run_tree(dot, tree, module), x.astype(np.float64) @ y.astype(np.float64), 1e-5)   # shuffles too


@pytest.mark.parametrize("shape, split", [((64, 16, 1024), True), ((8, 300, 1024), False), ((2, 16, 1024), False)])
def test_a_sum_over_an_outer_dim_and_short_rows_of_few_outputs_splits_the_outer_dim(rng, shape, split):
    """A batch norm's means of (b, c, h*w) over (b, h*w) with fewer channels than half the SMs: a block a channel
    would leave most SMs idle and rows of 1024 are too short to split, so b is cut into partial results, each a
    block walking its rows (64x16x1024: 16 blocks before); 300 channels keep a block each, and 2x16x1024 is too
    small to split. Run on this CPU (shuffles included) against float64."""
    x = rng.standard_normal(shape).astype(np.float32)
    sb, sc, ss = lt.symbols("b c s")
    means = lt.Tensor(x).to(sb, sc, ss).mean(sb, ss)
    tree, module = scheduled(means)
    assert ("b split into" in tree.explain()) == split
    if split:
        assert math.prod(module.launches[0].grid) >= 2 * H100.sms
    assert_close(run_tree(means, tree, module), x.astype(np.float64).mean((0, 2)), 1e-5)


@pytest.mark.parametrize("rows, cols, described", [
    (1001, 50, "16 lanes a row (2 rows a warp), 16 rows a block (m.1 on thread.y; n contiguous, 50 long)"),
    (777, 100, "a warp a row, 8 rows a block (m.1 on thread.y; n contiguous, 100 long)"),
    (13, 300, "a warp a row, 8 rows a block (m.1 on thread.y; n contiguous, 300 long)"),
    (40, 600, "reduction along n (contiguous): a block an output, 32 threads")])
def test_rows_a_warp_takes_alone_are_summed_a_warp_a_row_several_a_block(rng, rows, cols, described):
    """Rows of 32 to 511 a warp a row (up to 64 half a warp), 256 threads a block, the total combined by shuffles
    into a register copy and stored (H100, session 33: row sum 2000x50 0.70 -> 1.46x torch against a thread a row,
    65536x64 0.63 -> 1.91); run on the host with a tail of rows (1001: the last warp's second row left out). Rows of
    600 keep a block a row."""
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x).to(m, n).sum(n)
    tree, module = scheduled(total)
    assert described in tree.explain() and len(module.launches) == 1, tree.explain()
    assert ("bar.sync" in module.ptx) == (cols >= 512)
    assert_close(run_tree(total, tree, module), x.astype(np.float64).sum(1), 1e-5)


@pytest.mark.parametrize("dtype", [np.float64, ml_dtypes.bfloat16])
def test_rows_half_a_warp_takes_combine_other_dtypes_within_their_lanes(rng, dtype):
    """A float64 max (shuffled as two 32-bit halves, each naming the half warp's lanes) and a bfloat16 sum (added
    in float32) over rows of 40, half a warp a row, a tail of rows leaving a warp's second half out."""
    x = (rng.standard_normal((37, 40)) * 10).astype(dtype)
    m, n = lt.symbols("m n")
    reduced = lt.Tensor(x).to(m, n).max(n) if dtype == np.float64 else lt.Tensor(x).to(m, n).sum(n)
    tree, module = scheduled(reduced)
    assert "16 lanes a row (2 rows a warp)" in tree.explain(), tree.explain()
    ref = x.astype(np.float64).max(1) if dtype == np.float64 else x.astype(np.float64).sum(1)
    assert_close(run_tree(reduced, tree, module).astype(np.float64), ref, 1e-6)


def test_a_small_product_keeps_a_thread_an_output_where_b_is_read_along_its_rows(rng):
    """A warp a row along k would read B (k x n, n contiguous) a column at a time: threads along n read it
    coalesced."""
    a, b = rng.standard_normal((67, 45)).astype(np.float32), rng.standard_normal((45, 53)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree, _ = scheduled(c)
    assert "a thread an output" in tree.explain() and "a warp a row" not in tree.explain(), tree.explain()


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_a_small_reduction_to_a_scalar_runs_in_one_block(rng, dtype):
    x = rng.standard_normal((7, 9)).astype(dtype)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x).to(m, n).max(m, n)
    tree, module = scheduled(total)
    assert len(module.launches) == 1 and module.launches[0].grid == (1, 1, 1)
    assert_close(total.numpy(tree), x.max(), 1e-6)
    assert_close(run_tree(total, tree, module), x.max(), 1e-6)


def test_softmax_rows_shorter_than_a_warp_run_a_thread_a_row_in_registers(rng):
    """Rows of 10: a block a row would leave 22 of its 32 lanes idle and launch a block for each of 3000
    rows; a thread a row keeps its row's values in registers (its loops unrolled), 256 rows a block, and
    reads and writes them in pairs (a row of 40 bytes holds no whole 16-byte vectors)."""
    sm, ref = row_softmax(rng.standard_normal((3000, 10)).astype(np.float32))
    tree, module = scheduled(sm)
    assert "n is 10 long, so a thread takes one m (256 a block) and walks n, 8 bytes at a time" in tree.explain()
    assert len(module.launches) == 1 and module.launches[0].grid == (12, 1, 1) and ".local" not in module.ptx
    assert module.ptx.count("ld.global.nc.v2.b32") == 5 and module.ptx.count("st.global.v2.b32") == 5
    assert_close(sm.numpy(tree), ref, 1e-5)
    assert_close(run_tree(sm, tree, module), ref, 1e-5)


@pytest.mark.parametrize("cols, vectors", [(16, 4), (12, 3), (7, 0)])
def test_a_thread_a_rows_short_row_moves_in_16_byte_vectors_where_it_holds_them(rng, cols, vectors, monkeypatch):
    """Rows of 16 and 12 float32 values are 4 and 3 whole 16-byte vectors; a row of 7 holds none (scalars,
    where it is not staged through shared memory)."""
    monkeypatch.setattr(gpu_rules, "STAGED_ROWS", 0)
    sm, ref = row_softmax(rng.standard_normal((300, cols)).astype(np.float32))
    tree, module = scheduled(sm)
    assert module.ptx.count("st.global.v4.b32") == vectors and module.ptx.count("ld.global.nc.v4.b32") == vectors
    assert module.ptx.count("st.global.b32") == (0 if vectors else cols)
    assert_close(run_tree(sm, tree, module), ref, 1e-5)


def test_softmax_rows_run_as_one_kernel_with_a_block_a_row(rng):
    sm, ref = row_softmax(rng.standard_normal((37, 1000)).astype(np.float32))
    tree, module = scheduled(sm)
    assert "one kernel" in tree.explain() and len(module.launches) == 1
    assert module.launches[0].grid == (37, 1, 1) and module.launches[0].block[0] % 32 == 0
    assert "shfl.sync.bfly" in module.ptx
    assert "in0 read once, its row kept in shared memory" in tree.explain() and "in0.t0: f32[1, 1000] local" in str(tree)
    assert "t1: its exp (or other costly value) computed once, into t1.e" in tree.explain()
    assert str(tree).count("exp(") == 1 and "t2[m, n] = (t1.e[m, n] / t1[m])" in str(tree)
    global_reads = [line for line in module.ptx.splitlines() if "ld.global" in line]
    assert len(global_reads) <= gpu_rules.STRIDED_UNROLL and "ld.shared" in module.ptx     # one pass over the row in global memory
    assert_close(sm.numpy(tree), ref, 1e-5)
    assert_close(run_tree(sm, tree, module), ref, 1e-5)


def test_a_thread_a_rows_short_row_with_no_whole_vectors_is_read_and_written_through_shared_memory(rng):
    """Rows of 31 floats: the block's 128 rows of the input are copied into shared memory and its results
    written there first, both copies a warp a row (a lane an element), so each global access is coalesced."""
    sm, ref = row_softmax(rng.standard_normal((1000, 31)).astype(np.float32))
    tree, module = scheduled(sm)
    assert "n is 31 long and holds no whole vectors, so a thread takes one m (128 a block) and walks n in shared " \
           "memory, where in0 and the results are copied a warp a row" in tree.explain(), tree.explain()
    assert "in0.t2: f32[128, 31] local" in str(tree) and "t2.acc: f32[128, 31] local" in str(tree)
    assert [(launch.grid, launch.block) for launch in module.launches] == [((8, 1, 1), (32, 4, 1))]
    assert "ld.shared" in module.ptx and "st.shared" in module.ptx
    assert_close(run_tree(sm, tree, module), ref, 1e-5)


def test_a_layer_norm_over_short_rows_reads_its_rows_through_shared_memory_and_its_scale_as_given(rng):
    y, ref = scaled_layer_norm(rng, 300, 17)
    tree, module = scheduled(y)
    assert "where in0 and the results are copied a warp a row" in tree.explain() and "in1.t" not in str(tree)
    assert_close(run_tree(y, tree, module), ref, 1e-5)


@pytest.mark.parametrize("rows, cols, block", [(41, 48, (16, 16, 1)), (27, 33, (16, 16, 1)), (19, 127, (32, 8, 1)),
                                               (29, 64, (16, 16, 1)), (19, 200, (32, 8, 1))])
def test_softmax_rows_of_33_to_511_go_a_warp_a_row_several_a_block(rows, cols, block, rng):
    """A warp a row (up to 64: half a warp, two rows a warp), 256 threads a block, rows on thread.y: the max and the
    sum combined by shuffles within the warp into each lane's own copy, no barrier; each lane's short walk
    predicated, one path for the warp (H100: softmax 65536x48 0.77 -> 0.99x torch, 32768x100 0.93 -> 1.10x); run on
    the host (a tail of rows, which may leave half a warp out; lanes with fewer elements). Rows of 512 keep a block
    a row."""
    sm, ref = row_softmax(rng.standard_normal((rows, cols)).astype(np.float32))
    tree, module = scheduled(sm)
    taken = "a warp a row" if block[0] == 32 else "16 lanes a row (2 rows a warp)"
    assert f"{taken}, {block[1]} rows a block (m.1 on thread.y" in tree.explain(), tree.explain()
    assert module.launches[0].block == block and module.launches[0].grid == (-(-rows // block[1]), 1, 1)
    steps = block[0].bit_length() - 1
    assert "bar.sync" not in module.ptx and module.ptx.count("shfl.sync.bfly") == 2 * steps
    assert module.ptx.count("ex2.approx") == -(-cols // block[0])
    assert_close(run_tree(sm, tree, module), ref, 1e-5)
    norm, norm_ref = scaled_layer_norm(rng, rows, cols)
    tree, module = scheduled(norm)
    assert taken in tree.explain() and "bar.sync" not in module.ptx
    assert_close(run_tree(norm, tree, module), norm_ref, 1e-5)
    wide, _ = row_softmax(rng.standard_normal((rows, 512)).astype(np.float32))
    assert "a block a row" in scheduled(wide)[0].explain()


@pytest.mark.parametrize("rows, fused", [(4, False), (17, True)])
def test_a_few_long_rows_are_split_across_blocks_not_fused(rng, rows, fused):
    """4 rows of 70000 would be 4 blocks on 132 SMs: each reduction is split into partial results over
    many blocks, the result a pointwise kernel (H100: softmax 4x3000000 0.54 -> 10.7x torch); 17 rows
    (more than one an 8 SMs) stay one kernel."""
    sm, ref = row_softmax(rng.standard_normal((rows, 70_000)).astype(np.float32))
    tree, module = scheduled(sm)
    assert ("one kernel" in tree.explain()) == fused and (len(module.launches) == 1) == fused
    if not fused:
        assert "t0: 4 outputs leave the GPU idle: n split into" in tree.explain()
        assert "t1: 4 outputs leave the GPU idle: n split into" in tree.explain()
        assert module.launches[0].grid[0] * module.launches[0].grid[1] >= 4 * 16
    assert_close(sm.numpy(tree), ref, 1e-5)


def test_layer_norm_rows_run_as_one_kernel(rng):
    y, ref = scaled_layer_norm(rng, 9, 301)
    tree, module = scheduled(y)
    assert len(module.launches) == 1
    assert_close(y.numpy(tree), ref, 1e-5)


@pytest.mark.parametrize("rows, cols, kernels", [(40, 40000, 1), (300, 70, 5)])
def test_softmax_over_the_outer_dim_gives_each_thread_a_column_where_they_fill_the_gpu(rng, rows, cols, kernels):
    """40000 columns of 40: a thread a column walks it (one kernel). 70 columns of 300: 70 threads walking 300 rows
    three times would leave the GPU idle (8192 columns of 8192 took 32 blocks on 132 SMs), so each stage runs by
    its own rules: the max and the sum split into partial results across blocks, the result a pointwise kernel."""
    x_np = rng.standard_normal((rows, cols)).astype(np.float32)
    m, n = lt.symbols("m n")
    x = lt.Tensor(x_np).to(m, n)
    e = (x - x.max(m)).exp()
    sm = e / e.sum(m)
    tree, module = scheduled(sm)
    assert ("walks m" in tree.explain()) == (kernels == 1) and len(module.launches) == kernels, tree.explain()
    x64 = x_np.astype(np.float64)
    ref = np.exp(x64 - x64.max(0))
    assert_close(sm.numpy(tree) if kernels == 1 else run_tree(sm, tree, module), ref / ref.sum(0), 1e-5)


def test_sums_over_the_rows_of_a_tall_matrix_are_split_to_fill_the_gpu(rng):
    x_np = rng.standard_normal((4000, 64)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x_np).to(m, n).sum(m)
    tree, module = scheduled(total)
    assert "not contiguous" in tree.explain() and "rfactor" in tree.explain() and len(module.launches) == 2
    assert_close(total.numpy(tree), x_np.astype(np.float64).sum(0), 1e-5)


@pytest.mark.parametrize("rows, cols, parts", [(200000, 3, 25000), (20000, 50, 2500)])
def test_the_many_partial_sums_of_few_outputs_are_added_by_a_block_an_output(rng, rows, cols, parts):
    """Column sums of many rows: thousands of partial results each, which one thread an output would add alone,
    leaving the GPU idle (a 10^7 x 3 matrix's took 1.8 ms; 200000 x 50 on an H100 0.27x torch, 1.51x by blocks);
    a block of threads an output shares them out."""
    x_np = rng.standard_normal((rows, cols)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x_np).to(m, n).sum(m)
    tree, module = scheduled(total)
    assert f"{parts} partial results" in tree.explain() and len(module.launches) == 2
    assert "t0: reduction along m_o (not contiguous): a block an output" in tree.explain(), tree.explain()
    assert module.launches[1].grid == (cols, 1, 1) and module.launches[1].block[0] > 32
    assert_close(total.numpy(tree), x_np.astype(np.float64).sum(0), 1e-5)


def test_partial_sums_along_a_dim_that_is_not_contiguous_take_interleaved_rows(rng):
    """Column sums of a 100003 x 3 matrix: partial result p sums rows p, p + parts, ... (neighbouring
    threads read neighbouring rows at each step: a 10^7 x 3 matrix's partials of 250 consecutive rows each
    read 0.57x torch on an H100); the last rows of each partial past the end add zeros."""
    x_np = rng.standard_normal((100003, 3)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x_np).to(m, n).sum(m)
    tree, _ = scheduled(total)
    parts = tree.program.buffer_shape("t0.rf")[0]
    assert "so that neighbouring threads read neighbouring rows" in tree.explain()
    assert f"in0[{parts}*m_i + m_o, n] if 0 <= {parts}*m_i + m_o < 100003" in str(tree), str(tree)
    assert_close(total.numpy(tree), x_np.astype(np.float64).sum(0), 1e-5)


@pytest.mark.parametrize("shape, parts", [((4096, 4096), 128), ((3001, 1000), 131)])
def test_partial_results_are_counted_by_a_threads_vector_where_the_final_sum_keeps_the_threads(shape, parts):
    """4096 column sums take 1024 threads of 4-wide vectors: 132 partials each fill an H100's half-resident
    threads (32 by outputs alone left it a quarter busy); 1000 sums would take 541 partials for 250 final
    threads, so those are counted by outputs (135: 131 of 23 rows)."""
    m, n = lt.symbols("m n")
    program = lt.Tensor(np.empty(shape, np.float32)).to(m, n).sum(m).loop_tree().program
    tree = gpu_rules.gpu_tree(program, assumed_gpu("sm_90"))
    assert tree.program.buffer_shape("t0.rf")[0] == parts, tree.explain()


def test_interleaved_partial_results_round_trip_through_json(rng):
    x_np = rng.standard_normal((1001, 5)).astype(np.float32)
    m, n = lt.symbols("m n")
    total = lt.Tensor(x_np).to(m, n).sum(m)
    tree = total.loop_tree().rfactor("m", 16, interleaved=True)
    replayed = lt.Tensor(x_np).to(m, n).sum(m).loop_tree(tree.schedule.to_json())
    assert ["rfactor", "t0", "m", 16, True] in json.loads(tree.schedule.to_json())["steps"]
    assert str(replayed) == str(tree)
    assert_close(total.numpy(replayed), x_np.astype(np.float64).sum(0), 1e-5)


def test_a_gpu_with_more_sms_gets_more_partial_results(rng):
    x_np = rng.standard_normal((4000, 64)).astype(np.float32)
    m, n = lt.symbols("m n")
    program = lt.Tensor(x_np).to(m, n).sum(m).loop_tree().program
    small = gpu_rules.gpu_tree(program, GpuTarget("sm_90", 16))
    large = gpu_rules.gpu_tree(program, GpuTarget("sm_90", 132))
    assert small.program.buffer_shape("t0.rf")[0] < large.program.buffer_shape("t0.rf")[0]


@pytest.mark.parametrize("shape, vector", [((64, 1000), 4), ((65, 999), 1)])
def test_pointwise_stages_use_16_byte_vectors_where_rows_hold_whole_vectors(rng, shape, vector):
    x_np = rng.standard_normal(shape).astype(np.float32)
    m, n = lt.symbols("m n")
    y = (lt.Tensor(x_np).to(m, n) * 2.0 + 1.0).exp()
    tree, module = scheduled(y)
    assert f"{vector}-wide vectors" in tree.explain()
    assert ("ld.global.nc.v4.f32" in module.ptx or "ld.global.nc.v4.b32" in module.ptx) == (vector == 4)
    assert_close(y.numpy(tree), np.exp(x_np.astype(np.float64) * 2 + 1), 1e-5)


@pytest.mark.parametrize("size", [4099, 1024 * 3 + 1])
def test_a_flat_pointwise_stage_of_an_odd_length_takes_vectors_and_a_tail(rng, size):
    """A flat stage (rows flattened by the runtime: 777 x 7777 is 6042729 elements) takes 16-byte vectors,
    the last thread's short one element by element (H100, session 23: gelu 777x7777 0.76-0.84 -> 0.92x
    torch, its copy bandwidth 0.85 -> 1.04); a GPU run on the host checks every element, the tail's too."""
    x_np = rng.standard_normal(size).astype(np.float32)
    y = (lt.Tensor(x_np).to(*lt.symbols("m")) * 2.0 + 1.0).exp()
    tree, module = scheduled(y)
    assert "4-wide vectors" in tree.explain() and "ld.global.nc.v4" in module.ptx
    assert_close(run_tree(y, tree, module), np.exp(x_np.astype(np.float64) * 2 + 1), 1e-6)


@pytest.mark.parametrize("shape, dtype", [((45, 70), np.float32), ((3, 40, 70), ml_dtypes.bfloat16)])
def test_a_transpose_goes_through_swizzled_shared_tiles(rng, shape, dtype):
    """Reads along one dim, writes along another: a block a 32x32 tile, copied into shared memory along
    the input's rows and written along the result's from it, the tile swizzled (XOR) so that neither
    side conflicts on banks; tails at both ends of odd sizes."""
    x_np = rng.standard_normal(shape).astype(dtype)
    b, m, n = lt.symbols("b m n")
    outer = (b,) if len(shape) == 3 else ()
    y = lt.Tensor(np.zeros(shape[:-2] + shape[-1:], dtype)).to(*outer, n) + lt.Tensor(x_np).to(*outer, m, n)
    tree, module = scheduled(y)
    assert "a transpose: reads in1 along n, writes along m; 32x32 tiles" in tree.explain()
    assert len(module.launches) == 1 and module.launches[0].block == (32, 8, 1)
    assert "st.shared" in module.ptx and "xor" in module.ptx
    assert_close(run_tree(y, tree, module), np.swapaxes(x_np.astype(np.float64), -1, -2), 1e-12)


def test_a_transpose_copies_the_arrays_contiguous_along_one_dim_and_reads_the_others_as_they_are(rng):
    """x[m, p, n] is contiguous along n, w[p, m] along m: the tiles are over (n, p), so x goes through shared
    memory and w, which has no n, is read directly (copying it too once failed the rule, and the whole
    program fell back to an element a thread)."""
    x_np, w_np = rng.standard_normal((40, 48, 36)).astype(np.float32), rng.standard_normal((48, 40)).astype(np.float32)
    m, n, p = lt.symbols("m n p")
    y = lt.Tensor(np.zeros((40, 36, 48), np.float32)).to(m, n, p) + lt.Tensor(x_np).to(m, p, n) \
        + lt.Tensor(w_np).to(p, m)
    tree, module = scheduled(y)
    assert "a transpose: reads in1 along n, writes along p" in tree.explain()
    assert "in2.t0" not in str(tree) and "one output element per thread" not in tree.explain()
    ref = x_np.astype(np.float64).transpose(0, 2, 1) + w_np.astype(np.float64).T[:, None, :]
    assert_close(run_tree(y, tree, module), ref, 1e-6)              # (one float32 rounding of the sum)


def test_a_narrow_transpose_stays_pointwise(rng):
    x_np = rng.standard_normal((1000, 20)).astype(np.float32)
    m, n = lt.symbols("m n")
    y = lt.Tensor(np.zeros(20, np.float32)).to(n) + lt.Tensor(x_np).to(m, n)
    tree, module = scheduled(y)
    assert "transpose" not in tree.explain() and "pointwise" in tree.explain()
    assert_close(y.numpy(tree), x_np.T.astype(np.float64), 1e-12)


def test_a_narrow_array_shares_blocks_between_rows(rng):
    x_np = rng.standard_normal((5000, 3)).astype(np.float32)
    m, n = lt.symbols("m n")
    y = lt.relu(lt.Tensor(x_np).to(m, n))
    tree, module = scheduled(y)
    grid, block = module.launches[0].grid, module.launches[0].block
    assert block[0] * block[1] >= 128 and grid[1] <= 65535
    assert_close(y.numpy(tree), np.maximum(x_np, 0), 1e-12)


def test_with_edge_tiles_off_narrow_edges_take_mma_on_hopper(rng, monkeypatch):
    monkeypatch.setattr(templates, "WGMMA_EDGE_TILES", False)
    a = rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 200)).astype(ml_dtypes.bfloat16)     # 200 columns: whole 8-wide mma tiles
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree = gpu_rules.gpu_tree(c.loop_tree().program, H100)
    assert "[mma.m16n8k16." in str(tree) and tree.check() == (True, "legal")


def test_with_edge_tiles_on_narrow_edges_take_wgmma_with_guarded_edge_tiles(rng, monkeypatch):
    monkeypatch.setattr(templates, "WGMMA_EDGE_TILES", True)
    a = rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((64, 200)).astype(ml_dtypes.bfloat16)     # 200 columns: no whole 128-wide tile
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree = gpu_rules.gpu_tree(c.loop_tree().program, H100)
    assert re.search(r"< 200  \[wgmma\.m64n\d+k16\.n\]", str(tree))
    assert tree.check() == (True, "legal")
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_with_edge_tiles_odd_half_precision_contractions_on_hopper_are_one_kernel(rng, monkeypatch):
    monkeypatch.setattr(templates, "WGMMA_EDGE_TILES", True)
    a = rng.standard_normal((257, 136)).astype(ml_dtypes.bfloat16)     # k padded to 192 by TMA's zero fill
    b = rng.standard_normal((136, 200)).astype(ml_dtypes.bfloat16)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree, module = scheduled(c, assumed_gpu("sm_90"))
    assert "edge tiles are computed whole and stored under guards" in tree.explain()
    assert "by TMA's zero fill (in0, in1, no copy); the padded result written straight" in tree.explain()
    names = [stage.name for stage in tree.program.stages]
    assert len(module.launches) == 1 and names == ["in0.t0.pad.t0.pad.acc", "in1.t0.pad.t0.pad.acc", "t0.pad.acc", "t0"]
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


@pytest.mark.parametrize("m, k, n, kernels", [(300, 100, 250, 3), (256, 128, 333, 2)])
def test_an_operand_whose_rows_tma_cannot_address_is_copied_ahead_with_k_last(rng, m, k, n, kernels):
    """B's rows of 250 or 333 bfloat16 values do not start on 16-byte boundaries: B is copied ahead k-major (its pad,
    where k is padded, done in that copy), and the product stays one wgmma kernel with edge tiles, its result
    written straight (H100, session 33: 2500x100x2500 four kernels, 0.67x torch -> three, 0.85x)."""
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree, module = scheduled(c, assumed_gpu("sm_90"))
    assert "edge tiles are computed whole and stored under guards" in tree.explain(), tree.explain()
    assert "copied ahead with k last (its rows are not whole 16-byte vectors" in tree.explain()
    assert len(module.launches) == kernels and "operands padded" not in tree.explain()
    copy = next(stage for stage in tree.program.stages if stage.dims[0] == "n")
    assert copy.dims[-1].startswith("k") and tree.buffers[copy.name].shape[-1] % 8 == 0
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_contractions_in_larger_programs_get_their_template(rng):
    x, w = rng.standard_normal((256, 128)).astype(np.float32), rng.standard_normal((128, 256)).astype(np.float32)
    bias = rng.standard_normal(256).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    y = lt.relu((lt.Tensor(x).to(m, k) * lt.Tensor(w).to(k, n)).sum(k) + lt.Tensor(bias).to(n))
    tree, module = scheduled(y)
    assert "t0: a contraction: register tiles" in tree.explain()
    assert "t1: fused into the contraction's write-back" in tree.explain()
    assert "copied as stored" in tree.explain() and len(module.launches) == 1     # (k 128: no transposing kernel)
    ref = np.maximum(x.astype(np.float64) @ w + bias, 0)
    assert_close(y.numpy(tree), ref, 1e-5)
    assert_close(run_tree(y, tree, module), ref, 1e-5)


@pytest.mark.parametrize("arch", ["sm_90", "sm_80"])
def test_a_tensor_core_contraction_takes_its_bias_relu_and_cast_in_its_write_back(rng, arch):
    x, w = rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16), rng.standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    bias = rng.standard_normal(256).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    y = lt.relu((lt.Tensor(x).to(m, k) * lt.Tensor(w).to(k, n)).sum(k) + lt.Tensor(bias).to(n)).astype(lt.bfloat16)
    tree, module = scheduled(y, assumed_gpu(arch))
    assert "fused into the contraction's write-back" in tree.explain() and len(module.launches) == 1
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64) + bias, 0)
    assert_close(y.numpy(tree).astype(np.float64), ref, 2.0 ** -7)


@pytest.mark.parametrize("rounded", [False, True])
def test_a_wgmma_write_back_stores_16_bytes_a_lane(rng, rounded):
    """The lanes of a group trade pairs of columns by shuffles, so every store of the result is one
    16-byte vector: 4 float32 or 8 bfloat16 consecutive columns of a row."""
    x, w = rng.standard_normal((256, 64)).astype(ml_dtypes.bfloat16), rng.standard_normal((64, 256)).astype(ml_dtypes.bfloat16)
    m, k, n = lt.symbols("m k n")
    y = (lt.Tensor(x).to(m, k) * lt.Tensor(w).to(k, n)).sum(k)
    y = y.astype(lt.bfloat16) if rounded else y
    tree, module = scheduled(y, assumed_gpu("sm_90"))
    stores = re.findall(r"st\.global[.\w]*", module.ptx)
    assert "[wgmma" in str(tree) and stores and set(stores) == {"st.global.v2.b64" if not rounded else "st.global.v4.b32"}
    assert "shfl.sync.bfly" in module.ptx


def test_a_contraction_narrower_than_a_block_takes_a_wgmma_tile_as_wide_as_it(rng):
    """40 columns (a convolution's output channels) with B k-major: one 64 x 40 wgmma tile, not a 64-wide
    one its n loop cannot fill."""
    a = rng.standard_normal((300, 128)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((40, 128)).astype(ml_dtypes.bfloat16)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(n, k)).sum(k)
    tree, module = scheduled(c, assumed_gpu("sm_90"))
    assert "[wgmma.m64n40k16." in str(tree) and len(module.launches) == 1
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64).T, 1e-5)


@pytest.mark.parametrize("k, described", [(64, "wgmma tensor-core tiles 64x128x64, 2 stages by cp.async"),
                                          (128, "wgmma tensor-core tiles 128x")])
def test_a_contraction_of_one_k_tile_takes_small_wgmma_blocks_copied_by_cp_async(rng, k, described):
    """A batch of products whose k is one wgmma k tile (attention's q.k^T with 64-wide heads) has nothing to
    pipeline: one warpgroup's 64 x 128 blocks, cp.async; a longer k keeps the 128-row TMA template."""
    a = rng.standard_normal((3, 200, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((3, k, 256)).astype(ml_dtypes.bfloat16)
    sb, m, sk, n = lt.symbols("b m k n")
    c = (lt.Tensor(a).to(sb, m, sk) * lt.Tensor(b).to(sb, sk, n)).sum(sk)
    tree, module = scheduled(c, assumed_gpu("sm_90"))
    assert described in tree.explain() and len(module.launches) == 1
    ref = np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64))
    assert_close(c.numpy(tree), ref, 1e-5)


def test_a_schedule_the_legality_check_refuses_falls_back_to_the_next_rule(rng, monkeypatch):
    sm, ref = row_softmax(rng.standard_normal((5, 40)).astype(np.float32))
    monkeypatch.setattr(gpu_rules._Planner, "fused_rows", lambda self: self.tree.bind("n", "block.x", stage="t0"))
    tree, _ = scheduled(sm)
    assert "fused rows: refused by the legality check" in tree.explain()
    assert_close(sm.numpy(tree), ref, 1e-5)


@pytest.mark.parametrize("m, k, n, padded", [(100, 70, 45, False), (130, 64, 200, False), (700, 300, 500, True)])
def test_small_half_precision_contractions_off_the_mma_grid_are_not_padded(rng, m, k, n, padded):
    """Padding takes four kernels: 100 x 70 x 45 runs on the rules below instead (bf16 100^3 on an H100: 0.61 ->
    0.99x torch); 130 x 64 x 200 keeps its one wgmma kernel with guarded edges; 700 x 300 x 500 is padded."""
    a = rng.standard_normal((m, k)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((k, n)).astype(ml_dtypes.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree = gpu_rules.gpu_tree(ir.lower(c.node)[0], H100)
    assert ("padded with zeros" in tree.explain()) == padded
    assert ("too small to pad" in tree.explain()) == (m * k * n <= templates.SMALL_CONTRACTION_MACS and m != 130)
    if not padded:
        assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


@pytest.mark.parametrize("arch, instruction", [("sm_90", "wgmma"), ("sm_80", "mma.m16n8k16")])
def test_half_precision_contractions_off_the_mma_grid_run_padded_on_tensor_cores(rng, monkeypatch, arch, instruction):
    monkeypatch.setattr(templates, "SMALL_CONTRACTION_MACS", 0)      # (this one is small enough not to be padded)
    a = rng.standard_normal((100, 70)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((70, 45)).astype(ml_dtypes.bfloat16)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree, module = scheduled(c, assumed_gpu(arch))
    assert "padded with zeros" in tree.explain() and f"[{instruction}" in str(tree)
    assert len(module.launches) == 4
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_on_hopper_tma_zero_fills_the_padding_of_operands_whose_rows_it_can_address(rng, monkeypatch):
    monkeypatch.setattr(templates, "SMALL_CONTRACTION_MACS", 0)
    a = rng.standard_normal((100, 72)).astype(ml_dtypes.bfloat16)        # rows of 144 and 96 bytes: TMA takes them
    b = rng.standard_normal((72, 48)).astype(ml_dtypes.bfloat16)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(a).to(m, k) * lt.Tensor(b).to(k, n)).sum(k)
    tree, module = scheduled(c, assumed_gpu("sm_90"))
    assert "in0, in1 padded by TMA's zero fill, not copied" in tree.explain()
    assert len(module.launches) == 2 and {copy.source for copy in module.tensor_maps} == {"in0", "in1"}
    assert ".pad[" not in str(tree).split("t0.pad.acc: ")[0]        # no pad copy kernel before the product
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_an_attention_head_runs_its_softmax_and_weighted_sum_as_one_kernel(rng):
    q, k, v = (rng.standard_normal((256, 64)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d) * 0.125
    e = (scores - scores.max(j)).exp()
    out = (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j)
    tree, module = scheduled(out)
    assert "t0: a contraction: register tiles" in tree.explain() and "t1, t2.e, t2 placed in its rows" in tree.explain()
    assert "reading t3.f (the factor of its product that leaves out d" in tree.explain()
    assert "t3.f: f32[1, 256] local" in str(tree) and "exp" not in str(tree).split("t3[i, d] += ")[1]
    assert module.launches[-1].grid == (256, 1, 1) and len(module.launches) == 2      # (q, k copied as stored)
    s = q.astype(np.float64) @ k.T.astype(np.float64) * 0.125
    p = np.exp(s - s.max(1, keepdims=True))
    # the tree's own loops on this CPU (bound loops run as plain loops), on the program the GPU lowers
    assert_close(lt.Kernel(tree, 1)(ir.lower(out.node)[1]), p / p.sum(1, keepdims=True) @ v, 1e-5)


@pytest.mark.parametrize("cols, shared", [(1000, True), (32768, True), (50257, False)])
def test_a_softmax_computes_its_exp_once_where_the_row_stays_in_registers(rng, cols, shared):
    """Shared, exp(x - max) is one stage read by the sum and the division; a row longer than 1024 threads
    unroll (32 each) would keep it in memory, which was slower (50257: 0.70 -> 1.01 ms on an H100)."""
    sm, ref = row_softmax(rng.standard_normal((4, cols)).astype(np.float32))
    tree, _ = scheduled(sm)
    assert ("computed once, into t1.e" in tree.explain()) == shared
    assert str(tree).count("exp(") == (1 if shared else 2)
    if cols < 5000:
        assert_close(lt.Kernel(tree, 1)(ir.lower(sm.node)[1]), ref, 1e-5)


def test_an_attention_head_whose_product_takes_no_contraction_template_stays_fused(rng):
    """bfloat16 v against the float32 softmax: the product has no template, so the walk stays in the rows
    (not the per-stage fallback) even where it reads too much."""
    q, k, v = (rng.standard_normal((1024, 64)).astype(ml_dtypes.bfloat16) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    e = ((lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d) * 0.125)
    e = (e - e.max(j)).exp()
    out = (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j)
    tree, module = scheduled(out, dataclasses.replace(H100, sms=1))
    assert "walked in the rows although that reads 128 MiB" in tree.explain() and "t3: one kernel" in tree.explain()
    assert module.launches[-1].grid == (1024, 1, 1)


def _attention_head(rng, length, width):
    q, k, v = (rng.standard_normal((length, width)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d) * width ** -0.5
    e = (scores - scores.max(j)).exp()
    s = q.astype(np.float64) @ k.T.astype(np.float64) * width ** -0.5
    p = np.exp(s - s.max(1, keepdims=True))
    return (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j), p / p.sum(1, keepdims=True) @ v


@pytest.mark.parametrize("sms, fused", [(132, True), (8, False)])
def test_an_attention_head_s_weighted_sum_is_a_product_of_its_own_where_walking_it_in_the_rows_reads_too_much(
        rng, sms, fused):
    """A block a row reads all of v once for each row: 1024 rows of a 1024 x 64 v read 256 MiB, 2 MiB an SM of
    an H100, which runs it fused; on 8 SMs (32 MiB an SM) the softmax is written whole and p . v is a contraction."""
    out, ref = _attention_head(rng, 1024, 64)
    tree, module = scheduled(out, dataclasses.replace(H100, sms=sms))
    assert ("t3: not walked in t3.f's rows" in tree.explain()) != fused, tree.explain()
    assert ("t3.f: f32[1024, 1024] temp" in str(tree)) != fused
    assert ("t3: a contraction" in tree.explain()) != fused
    assert_close(lt.Kernel(tree, 1)(ir.lower(out.node)[1]), ref, 1e-5)       # the tree's loops on this CPU


@pytest.mark.parametrize("m, k, n, block", [(1000, 1000, 1000, "128x128"), (3000, 2000, 1000, "128x256"),
                                           (2048, 576, 64, "128x64")])
def test_wgmma_takes_128x64_blocks_only_for_products_at_most_64_wide(m, k, n, block):
    """Waves alone would give 1000^3 and 3000x2000x1000 128 x 64 blocks, which ran 5-24% slower on an H100."""
    a, b = np.zeros((m, k), ml_dtypes.bfloat16), np.zeros((k, n), ml_dtypes.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree = gpu_rules.gpu_tree(ir.lower(c.node)[0], H100)
    assert f"wgmma tensor-core tiles {block}x64" in tree.explain()


@pytest.mark.parametrize("m, k, n, block", [(6000, 6000, 6000, "128x256"), (5952, 5952, 5952, "128x256"),
                                           (4096, 4096, 4096, "128x256"), (1024, 1024, 1024, "128x128"),
                                           (3072, 2000, 1024, "128x256")])
def test_wgmma_blocks_are_those_whose_sm_loads_the_fewest_operand_rows(m, k, n, block):
    """An SM loads rows + columns of k a block each k step, over its waves: 5952^2 takes 9 waves of 128 x 256
    (3456 rows) rather than 17 of 128 x 128 (4352), though the latter compute fewer outputs an SM (278528
    against 294912) and were chosen until session 20 (1.4x slower on an H200); 1024^2 fills the SMs in
    one wave of 128 x 128 (256 rows against 384)."""
    a, b = np.zeros((m, k), ml_dtypes.bfloat16), np.zeros((k, n), ml_dtypes.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree = gpu_rules.gpu_tree(ir.lower(c.node)[0], H100)
    assert f"wgmma tensor-core tiles {block}x64" in tree.explain()


@pytest.mark.parametrize("batch, m, k, n, paired", [(1, 8192, 768, 768, True), (32, 2048, 128, 2048, True),
                                                     (1, 5952, 128, 5952, True), (1, 4096, 4096, 4096, False),
                                                     (1, 2048, 4096, 11008, False), (1, 1024, 1024, 1024, False),
                                                     (1, 6000, 6000, 6000, False)])
def test_wgmma_takes_128x128_blocks_two_an_sm_where_their_waves_are_fuller(batch, m, k, n, paired):
    """Past one wave of 128 x 256 blocks, 128 x 128 ones in 3 stages (two fit an H100 SM's shared memory)
    where an SM's tiles of them, each counted 0.55 of a 128 x 256 tile (0.45 where k is at most 4 k tiles:
    write-back bound), come to fewer: 8192x768x768 takes 3 x 0.55 against 2 waves; 4096^3 8 x 0.55 against
    4; a batch of products of k = 128 63 x 0.45 against 32. Within one wave (1024^3) nothing changes."""
    a, b = np.zeros((batch, m, k), ml_dtypes.bfloat16), np.zeros((batch, k, n), ml_dtypes.bfloat16)
    sb, sm, sk, sn = lt.symbols("b m k n")
    c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
    tree = gpu_rules.gpu_tree(ir.lower(c.node)[0], H100)
    assert ("128x128x64, 3 stages by tma, two blocks an SM" in tree.explain()) == paired, tree.explain()
    assert ("4 stages by tma" in tree.explain()) != paired
    smaller = dataclasses.replace(H100, shared_per_sm=96 * 1024)       # two blocks of 2 stages would not fit: never paired
    assert "two blocks an SM" not in gpu_rules.gpu_tree(ir.lower(c.node)[0], smaller).explain()


@pytest.mark.parametrize("batch, m, k, n, rounded, blocks", [
    (1, 4096, 512, 4096, False, 132), (1, 4096, 256, 4096, False, 264), (32, 2048, 128, 2048, True, 264),
    (1, 4096, 4096, 4096, False, 132), (1, 2048, 4096, 11008, False, 132), (1, 6000, 6000, 6000, False, 0),
    (1, 2048, 768, 3072, False, 0), (32, 2048, 128, 2048, False, 0), (1, 1000, 1000, 1000, False, 0)])
def test_wgmma_kernels_of_many_whole_tiles_are_persistent(batch, m, k, n, rounded, blocks):
    """At least two waves of blocks of whole tiles and a write-back at most half a tile's loads: as many
    blocks as the SMs hold run the tiles in turn (two an SM for 128x128 blocks in 3 stages); a block alone on
    its SM issues its copies from a producer warpgroup of its own, the warpgroups computing taking its
    registers (`setmaxnreg`) and synchronizing among themselves (named barrier 1). Not with edge
    tiles (6000^3), at 1.45 waves (2048x768x3072), with float32 results as heavy as the loads (the batched
    product of k = 128), nor in one wave (1000^3)."""
    a, b = np.zeros((batch, m, k), ml_dtypes.bfloat16), np.zeros((batch, k, n), ml_dtypes.bfloat16)
    sb, sm, sk, sn = lt.symbols("b m k n")
    c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
    c = c.astype(lt.bfloat16) if rounded else c
    tree = gpu_rules.gpu_tree(ir.lower(c.node)[0], H100)
    assert (f"persistent: {blocks} blocks run the tiles in turn" in tree.explain()) == bool(blocks), tree.explain()
    assert ("persistent:" in tree.explain()) == bool(blocks)
    if blocks:
        module = codegen_gpu.generate(tree, H100.arch)
        alone = blocks == H100.sms              # a block an SM: a producer warpgroup besides the two computing
        assert module.launches[-1].grid == (blocks, 1, 1)
        assert module.launches[-1].block == ((32, 12, 1) if alone else (32, 8, 1))
        assert ("setmaxnreg.dec.sync.aligned.u32 40;" in module.ptx) == alone
        assert ("setmaxnreg.inc.sync.aligned.u32 232;" in module.ptx) == alone
        assert ("bar.sync 1, 256;" in module.ptx) == alone
    smaller = dataclasses.replace(H100, sms=16)         # the same tiles take more waves on fewer SMs
    if blocks:
        assert f"persistent: {blocks * 16 // 132} blocks" in gpu_rules.gpu_tree(ir.lower(c.node)[0], smaller).explain()


def test_a_persistent_wgmma_kernel_runs_on_the_cpu(rng):
    """The persistent schedule is the same loops: the CPU runs them as they are (k zero-filled to 640)."""
    sm, sk, sn = lt.symbols("m k n")
    a, b = rng.standard_normal((512, 600)).astype(ml_dtypes.bfloat16), rng.standard_normal((600, 256)).astype(ml_dtypes.bfloat16)
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    small = dataclasses.replace(H100, sms=1)
    tree = gpu_rules.gpu_tree(ir.lower(c.node)[0], small)
    assert "persistent: 1 blocks" in tree.explain(), tree.explain()
    assert tree.check() == (True, "legal")
    assert_close(c.numpy(tree), a.astype(np.float64) @ b.astype(np.float64), 1e-5)
    assert [launch.grid for launch in codegen_gpu.generate(tree, H100.arch).launches] == [(1, 1, 1)]


@pytest.mark.parametrize("m, n, sms, block", [(1024, 1024, 132, (128, 64)), (4096, 4096, 132, (128, 128)),
                                               (512, 512, 132, (64, 64)), (1024, 1024, 16, (128, 128)),
                                               (1000, 777, 108, (128, 64))])
def test_float32_matmuls_take_the_block_tile_that_leaves_each_sm_least_work(rng, m, n, sms, block):
    """Blocks run in waves of one an SM: 64 tiles of 128 x 128 leave half of 132 SMs idle, 128 of 128 x 64
    do not; 512 x 512 takes 64 of 64 x 64; a GPU of 16 SMs is filled by the largest tile."""
    a, b = rng.standard_normal((m, 40)).astype(np.float32), rng.standard_normal((40, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    gpu = dataclasses.replace(H100, sms=sms)
    tree = gpu_rules.gpu_tree(c.loop_tree().program, gpu)
    assert f"register tiles on CUDA cores, {block[0]}x{block[1]} a block" in tree.explain()
    assert tree.check() == (True, "legal")
    if m <= 1024:
        assert_close(c.numpy(tree), a.astype(np.float64) @ b, 1e-5)


@pytest.mark.parametrize("m, k, n", [(300, 200, 32), (260, 100, 40)])
def test_a_float32_product_narrower_than_the_blocks_takes_the_narrow_block(rng, m, k, n):
    """n below 64 columns (an attention head's p . v with a 32-wide v) takes 128 x 32 blocks of 8 x 16
    threads (8 x 4 outputs each), n = 40 with a tail, instead of a thread an output walking k (8192 x 8192 x
    32 took 857 us so on an H200, torch 139)."""
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree, module = scheduled(c)
    assert "register tiles on CUDA cores, 128x32 a block" in tree.explain()
    assert module.launches[-1].block == (8, 16, 1) and "cp.async" in module.ptx
    assert_close(run_tree(c, tree, module), a.astype(np.float64) @ b, 1e-5)


@pytest.mark.parametrize("m, k, n, kernels", [(512, 1024, 32, 1), (1024, 1024, 100, 2)])
def test_an_input_whose_tiles_one_block_reads_is_not_transposed_ahead(rng, m, k, n, kernels):
    """With k long (1024) A is transposed ahead by a kernel of its own only where more than one block column
    reads each of its tiles: n = 32 fits one 128 x 32 block column, so A's k tiles are copied as stored (a
    transposing kernel would read it twice: 8192 x 8192 x 32 0.36 -> 0.16 ms on an H100); n = 100 takes two
    of 64 x 64."""
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree, module = scheduled(c)
    assert len(module.launches) == kernels
    assert ("read by one block" in tree.explain()) == (kernels == 1)
    assert_close(run_tree(c, tree, module), a.astype(np.float64) @ b, 1e-5)


@pytest.mark.parametrize("block, threads, y_groups", [((128, 128), (16, 16), 2), ((128, 64), (16, 16), 2),
                                                     ((64, 64), (16, 8), 2), ((128, 32), (8, 16), 2)])
def test_a_threads_rows_of_a_float32_block_run_in_whole_vectors(block, threads, y_groups):
    """Each thread takes 8 rows in runs of 4, copied in vectors (64 rows in runs of 2 made A's copy scalar, by
    32 threads, and the kernel 4x slower per output), and the block as many threads as that leaves (64 x 64:
    128 threads, 8 x 4 outputs each; in 256 threads of 4 x 4 it was 24 % slower)."""
    tiles = templates.float32_tiles(block)
    assert (tiles["x_threads"], tiles["y_threads"]) == threads and (tiles["y_tile"], tiles["y_groups"]) == (8, y_groups)
    assert tiles["x_threads"] * tiles["x_groups"] * tiles["vector"] == block[1] and tiles["y_threads"] * 8 == block[0]
    assert tiles["y_tile"] // tiles["y_groups"] % tiles["vector"] == 0


@pytest.mark.parametrize("m, k, n, arch, k_tile", [(1000, 1500, 777, "sm_90", 64), (333, 444, 555, "sm_90", 64),
                                                   (1000, 1500, 777, "sm_80", 32), (4096, 4096, 4096, "sm_90", 32),
                                                   (512, 512, 512, "sm_90", 32), (1024, 64, 1024, "sm_90", 32)])
def test_a_float32_k_tile_is_64_where_its_stages_leave_an_sm_its_blocks(m, k, n, arch, k_tile):
    """k tiles of 64 where two stages of them leave an SM's shared memory room for the blocks its registers hold
    (128 x 64 blocks on an H100: 2 of 97 KiB; an A100's 164 KiB holds one) and k fills them; 128 x 128 and
    64 x 64 blocks (one, three an SM at 64 instead of two, four) and k of 64 keep 32, as does a schedule made
    without a GPU."""
    gpu = assumed_gpu(arch)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((m, k), np.float32)).to(sm, sk) * lt.Tensor(np.ones((k, n), np.float32)).to(sk, sn)).sum(sk)
    program = ir.lower(c.node)[0]
    parts = templates.split_k_parts(program, gpu.sms, gpu.tensor_cores == "wgmma")
    split = ir.split_k(program, parts) if parts > 1 else program
    stage = split.stages[0].name
    block = templates.float32_block(split, stage, gpu.sms)
    assert templates.float32_k_tile(split, stage, block, gpu) == k_tile
    assert templates.float32_k_tile(split, stage, block, None) == templates.FLOAT32_TILES["k_tile"]


@pytest.mark.parametrize("m, k, n, groups", [(1000, 1500, 777, 1), (512, 512, 512, 1), (4096, 4096, 4096, 2),
                                             (8192, 8192, 32, 2)])
def test_a_threads_rows_are_one_run_where_a_is_copied_as_stored(m, k, n, groups):
    """A thread's 8 rows come in runs of 4 so that A's tile, stored along m, is copied in vectors of a run: A
    transposed ahead (4096^3). Where A is copied as stored with k last (split-k's parts) they are one run, but
    on the narrow 128 x 32 block (8192x8192x32), where one run was slower."""
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((m, k), np.float32)).to(sm, sk) * lt.Tensor(np.ones((k, n), np.float32)).to(sk, sn)).sum(sk)
    program = ir.lower(c.node)[0]
    parts = templates.split_k_parts(program, H100.sms)
    split = ir.split_k(program, parts) if parts > 1 else program
    stage = split.stages[0].name
    block = templates.float32_block(split, stage, H100.sms)
    assert templates.float32_plan(LoopTree(split), stage, block, H100)["y_groups"] == groups


@pytest.mark.parametrize("m, k, n, block, parts", [(32, 4096, 4096, (32, 128), 16), (48, 4096, 4096, (32, 128), 8),
                                                   (24, 4096, 4096, (16, 128), 8), (8, 4096, 4096, (8, 128), 16),
                                                   (40, 2000, 3000, (32, 128), 10), (32, 1024, 131072, (32, 128), 1)])
def test_a_float32_product_of_8_to_63_rows_takes_short_blocks_in_parts_for_several_blocks_an_sm(m, k, n, block, parts):
    """The most rows of FLOAT32_SHORT_BLOCKS m holds, k cut into the fewest parts giving SHORT_SPLIT_K_BLOCKS
    blocks an SM (none where n alone gives them); the reduction rules took these at 0.07-0.33x torch."""
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((m, k), np.float32)).to(sm, sk) * lt.Tensor(np.ones((k, n), np.float32)).to(sk, sn)).sum(sk)
    program = ir.lower(c.node)[0]
    assert templates.split_k_parts(program, H100.sms) == parts
    split = ir.split_k(program, parts) if parts > 1 else program
    assert templates.float32_block(split, split.stages[0].name, H100.sms) == block
    if parts > 1:
        assert f"{block[0]}x{block[1]} a block (its {m} rows short" in gpu_rules.gpu_tree(split, H100).explain()


@pytest.mark.parametrize("m, n", [(1, 4096), (7, 4096), (64, 4096), (32, 100)])
def test_a_float32_product_of_fewer_than_8_rows_or_of_64_or_narrower_than_a_short_block_takes_none(m, n):
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((m, 4096), np.float32)).to(sm, sk) * lt.Tensor(np.ones((4096, n), np.float32)).to(sk, sn)).sum(sk)
    program = ir.lower(c.node)[0]
    assert not templates.short_rows(program, program.stages[0].name)


@pytest.mark.parametrize("m, k, n", [(32, 512, 256), (8, 300, 200), (63, 96, 130)])
def test_a_float32_product_of_few_rows_runs_right_on_short_blocks(rng, m, k, n):
    """Short blocks with tails of n and k, split or whole (a tail of m: the -m gpu test), run on this CPU (GPU-bound loops as
    plain loops) against float64."""
    tree, _, run, reference = split_product(rng, m, k, n, np.float32)
    assert tree.check() == (True, "legal")
    codegen_gpu.generate(tree, "sm_90")
    assert_close(run(), reference, 1e-5)


@pytest.mark.parametrize("m, k, n, parts", [(24, 4096, 4096, 4), (32, 4096, 4096, 4), (8, 4096, 4096, 4),
                                           (4, 4096, 4096, 4), (40, 2000, 3000, 1)])
def test_a_bfloat16_product_of_fewer_than_64_rows_is_split_then_padded_to_64_row_wgmma_blocks(m, k, n, parts):
    """On Hopper, where it is not small (`small_contraction`: 4x4096x4096 is not, 1x4096x4096 is): k cut as
    `_half_parts` cuts others (counting 64 x 128 blocks), the parts padded to 64 rows on
    wgmma blocks of one warpgroup, and their sum reading the padded parts in place: two kernels (was: padded
    whole to 128-row blocks, 32 of them on 132 SMs, 0.4-0.5x torch; 32 rows on mma's 128 x 256)."""
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((m, k), lt.bfloat16)).to(sm, sk) * lt.Tensor(np.ones((k, n), lt.bfloat16)).to(sk, sn)).sum(sk)
    program = ir.lower(c.node)[0]
    assert templates.split_k_parts(program, H100.sms) == parts
    tree = gpu_rules.gpu_tree(ir.split_k(program, parts) if parts > 1 else program, H100)
    assert "then wgmma tensor-core tiles 64x128x64" in tree.explain()
    assert ("read the padded result in place" in tree.explain()) == (parts > 1)
    assert len(codegen_gpu.generate(tree, "sm_90").launches) == 2


@pytest.mark.parametrize("m, k, n, parts", [(200, 4096, 200, 4), (1000, 4096, 200, 4), (130, 2048, 136, 2),
                                           (1000, 1000, 1000, 1)])
def test_a_bfloat16_product_off_the_mma_grid_is_split_on_hopper_its_parts_one_wgmma_kernel_with_edges(rng, m, k, n, parts):
    """Off the mma grid (m or n not multiples of 16, 8), where k is whole k tiles of 64 and its blocks keep few SMs
    busy: split as on the grid, the parts one wgmma kernel with guarded edge tiles, then their sum; run on this CPU
    against float64 (1000^3: k = 1000 is no whole k tiles, whole)."""
    tree, planned_parts, run, reference = split_product(rng, m, k, n, lt.bfloat16)
    assert planned_parts == parts
    assert tree.check() == (True, "legal") and "off the tensor cores' grid: wgmma tensor-core tiles" in tree.explain()
    assert len(codegen_gpu.generate(tree, "sm_90").launches) == (2 if parts > 1 else 1)
    if parts > 1:
        assert_close(run(), reference, 1e-5)


def test_a_bfloat16_product_of_one_row_keeps_the_reduction_rules_and_an_a100_keeps_mma():
    sm, sk, sn = lt.symbols("m k n")
    one = (lt.Tensor(np.ones((1, 4096), lt.bfloat16)).to(sm, sk) * lt.Tensor(np.ones((4096, 4096), lt.bfloat16)).to(sk, sn)).sum(sk)
    program = ir.lower(one.node)[0]
    assert templates.split_k_parts(program, H100.sms) == 1 and "tensor-core" not in gpu_rules.gpu_tree(program, H100).explain()
    rows = (lt.Tensor(np.ones((32, 4096), lt.bfloat16)).to(sm, sk) * lt.Tensor(np.ones((4096, 4096), lt.bfloat16)).to(sk, sn)).sum(sk)
    program = ir.lower(rows.node)[0]
    a100 = assumed_gpu("sm_80")
    parts = templates.split_k_parts(program, a100.sms, False)
    assert "mma tensor-core tiles" in gpu_rules.gpu_tree(ir.split_k(program, parts), a100).explain()


@pytest.mark.parametrize("m, k, n", [(24, 4096, 1024), (32, 4096, 520)])
def test_a_short_bfloat16_product_in_parts_on_padded_wgmma_blocks_runs_right(rng, m, k, n):
    """Run on this CPU (GPU-bound loops as plain loops, each wgmma tile as its multiply-adds) against float64, the
    sum of the parts reading the padded parts in place."""
    tree, _, run, reference = split_product(rng, m, k, n, lt.bfloat16)
    assert tree.check() == (True, "legal") and "read the padded result in place" in tree.explain()
    assert_close(run(), reference, 1e-5)


def test_a_float32_product_on_k_tiles_of_64_with_a_tail_runs_right(rng):
    """256 x 200 x 64 on a 2-SM Hopper: 128 x 64 blocks, k tiles of 64 (200: three and a tail of 8)."""
    a, b = rng.standard_normal((256, 200)).astype(np.float32), rng.standard_normal((200, 64)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree, module = scheduled(c, GpuTarget("sm_90", 2))
    assert "128x64 a block" in tree.explain() and "cp.async k tiles of 64" in tree.explain()
    assert_close(run_tree(c, tree, module), a.astype(np.float64) @ b, 1e-5)


def test_a_convolution_reads_its_filters_coalesced(rng):
    sn, sc, sh, sw, so, soh, sow, skh, skw = lt.symbols("n c h w o oh ow kh kw")
    x, w = rng.standard_normal((2, 8, 9, 7)).astype(np.float32), rng.standard_normal((40, 8, 3, 3)).astype(np.float32)
    windows = lt.Tensor(x).to(sn, sc, sh, sw).window(sh, soh, skh, 3, padding=1).window(sw, sow, skw, 3, padding=1)
    conv = (windows * lt.Tensor(w).to(so, sc, skh, skw)).sum(sc, skh, skw)
    tree, module = scheduled(conv)
    assert "copied ahead with o last" in tree.explain() and "in1.t0: f32[8, 3, 3, 40] temp" in str(tree)
    assert len(module.launches) == 2 and module.launches[1].block[0] * module.launches[1].block[1] >= 128
    conv_kernel = module.ptx.split(".entry looptool_k1")[1]
    assert conv_kernel.count("st.global") == 2      # the result stays in a register over c (both copies)
    assert_close(run_tree(conv, tree, module), conv.numpy(), 1e-5)


def test_a_convolution_thread_takes_a_register_tile_of_outputs(rng):
    """Each thread keeps 4 outputs along o (a vector) x 4 along ow in registers, so a filter vector read
    serves 4 output columns and an input element 4 filters; computed by the GPU module on this CPU."""
    sn, sc, sh, sw, so, soh, sow, skh, skw = lt.symbols("n c h w o oh ow kh kw")
    x, w = rng.standard_normal((2, 8, 5, 28)).astype(np.float32), rng.standard_normal((64, 8, 3, 3)).astype(np.float32)
    windows = lt.Tensor(x).to(sn, sc, sh, sw).window(sh, soh, skh, 3, padding=1).window(sw, sow, skw, 3, padding=1)
    conv = (windows * lt.Tensor(w).to(so, sc, skh, skw)).sum(sc, skh, skw)
    tree, module = scheduled(conv)
    assert "a thread 4 outputs (a vector) x 4 along ow (registers" in tree.explain()
    conv_kernel = module.ptx.split(".entry looptool_k1")[1]
    assert ".local" not in conv_kernel and conv_kernel.count("fma.rn.f32") >= 4 * 4 * 9
    padded = np.pad(x.astype(np.float64), ((0, 0), (0, 0), (1, 1), (1, 1)))
    ref = np.zeros((2, 5, 28, 64))
    for kh in range(3):
        for kw in range(3):
            ref += np.einsum("nchw,oc->nhwo", padded[:, :, kh:kh + 5, kw:kw + 28], w[:, :, kh, kw])
    assert_close(run_tree(conv, tree, module), ref, 1e-5)


@pytest.mark.parametrize("l2_mib, turn", [(50, None), (1, 9)])
def test_long_rows_are_taken_in_turn_where_the_resident_blocks_rows_overflow_the_l2_share(rng, l2_mib, turn):
    """Rows of 40001 floats (160 KB; 1024 threads, 2 blocks an SM) re-read by the max, sum and division: 33 rows
    fit in 70 % of 50 MiB (`TURN_L2_SHARE`); with 1 MiB of L2 four rows do, so the 33 rows go to 4 blocks of 9
    rows taken in turn, each thread's walk unrolled `IN_TURN_UNROLL` times."""
    sm, ref = row_softmax(rng.standard_normal((33, 40001)).astype(np.float32))
    tree, module = scheduled(sm, dataclasses.replace(H100, l2_bytes=l2_mib << 20))
    assert ("rows each in turn" in tree.explain()) == (turn is not None)
    assert module.launches[0].grid == ((4 if turn else 33), 1, 1)
    assert (f"{gpu_rules.IN_TURN_UNROLL} loads in flight a thread" in tree.explain()) == (turn is not None)
    if turn:
        assert f"its blocks take {turn} rows each in turn (m.1)" in tree.explain()
        assert_close(lt.Kernel(tree, 1)(ir.lower(sm.node)[1]), ref, 1e-5)   # the tree's loops on this CPU


@pytest.mark.parametrize("m, k, n", [(131, 45, 67), (130, 64, 130), (256, 33, 64)])
def test_float32_products_of_rows_that_are_not_whole_vectors_run_on_zero_padded_operands(rng, m, k, n):
    """A row of 67 floats starts unaligned, so its tiles would be loaded word by word, without cp.async,
    and edge tiles run guarded: the operands are padded with zeros to whole block tiles (A's pad done in
    its transposed copy ahead), the contraction runs guard-free on cp.async tiles, and a copy writes the
    result (H100, session 21: 997 x 1001 x 1003 0.47 -> 0.87x torch, 4095^3 0.68 -> 1.02x)."""
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    tree, module = scheduled(c)
    assert re.search(r"padded with zeros to multiples of \((64|128), (64|128), 32\) \(m, n, k\)", tree.explain())
    contraction = next(kernel for kernel in module.ptx.split(".entry")[1:] if "cp.async" in kernel)
    assert not re.search(r"ld\.global(\.nc)?\.b32", contraction) and "cp.async.cg.shared.global" in contraction
    assert_close(run_tree(c, tree, module), a.astype(np.float64) @ b, 1e-5)


@pytest.mark.parametrize("a_shape, b_shape, dims, described", [
    ((100, 333), (333, 77), ("m k", "k n"), "by atomic adds"),            # 100 x 77: smaller than a block tile
    ((100, 10000), (10000, 100), ("m k", "k n"), "64x64 a block"),      # parts on the one block it holds
    ((8, 333, 64), (8, 333, 64), ("h s d", "h t d"), "register tiles"),   # a batch
    ((1000, 1500), (1500, 777), ("m k", "k n"), "split-k's 5 parts of 300 on register tiles")])
def test_float32_products_that_padding_does_not_pay_for_are_not_padded(rng, a_shape, b_shape, dims, described):
    """Padding costs two kernels: products smaller than one block tile ran 2x slower padded (100 x 333 x
    77, whose reduction rules beat torch), and split-k's parts lost (1000 x 1500 x 777 0.82 -> 0.76x)."""
    a, b = np.zeros(a_shape, np.float32), np.zeros(b_shape, np.float32)
    summed = set(dims[0].split()) & set(dims[1].split()) - {"h"}
    c = (lt.Tensor(a).to(*lt.symbols(dims[0])) * lt.Tensor(b).to(*lt.symbols(dims[1]))).sum(*lt.symbols(" ".join(summed)))
    program = ir.lower(c.node)[0]
    parts = templates.split_k_parts(program, H100.sms)
    tree = gpu_rules.gpu_tree(ir.split_k(program, parts) if parts > 1 else program, H100)
    assert "padded" not in tree.explain() and described in tree.explain()


@pytest.mark.parametrize("m, k, n, in_runs", [(1000, 1500, 777, True), (1024, 512, 1024, True), (257, 511, 129, False)])
def test_a_register_tile_reads_a_run_of_k_from_a_row_stored_k_last_as_one_vector(m, k, n, in_runs):
    """A split product's A (and a short k's) is copied into shared memory as stored, k last: its register tile
    takes a row's k steps in runs of STORED_K_RUN (one 16-byte load; H100, session 29: 1000x1500x777 in 5
    parts 0.097 -> 0.091 ms, 1024x512x1024 0.041 -> 0.036) where k's run is whole runs of it (511 / 7 = 73
    is not: a word a k step, 8 rows x 32 steps)."""
    a, b = np.zeros((m, k), np.float32), np.zeros((k, n), np.float32)
    sm, sk, sn = lt.symbols("m k n")
    program = ir.lower((lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk).node)[0]
    parts = templates.split_k_parts(program, H100.sms)
    module = codegen_gpu.generate(gpu_rules.gpu_tree(ir.split_k(program, parts) if parts > 1 else program, H100), "sm_90")
    product = max(module.ptx.split(".entry")[1:], key=lambda kernel: kernel.count("fma.rn.f32"))
    words = len(re.findall(r"ld\.shared\.(f32|b32)", product))
    assert (words, product.count("ld.shared.v4") >= 96) == (0, True) if in_runs else words >= 8 * 32
