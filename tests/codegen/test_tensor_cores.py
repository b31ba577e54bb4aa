"""Tensor cores: `tensorize(..., "mma.m16n8k16")` gives one mma.sync per tile and k step, with its
operands loaded by ldmatrix from shared memory (or element by element from global memory), and
the legality check refuses in plain words what the instruction cannot do. PTX structure is
checked here on any machine (no GPU runs these tests); the same schedules run as plain loops
on the CPU and in the interpreter, checked against NumPy float64."""
import re
from collections import Counter

import numpy as np
import pytest

import looptool as lt
from looptool.codegen import gpu
from looptool.schedule import LoopTree, Schedule
from tests.gpu_helpers import assert_refused
from tests.helpers import assert_close, mentions
from looptool.autoschedule import gpu as templates

MMA = "mma.m16n8k16"


def operands(rng, dtype=lt.bfloat16, m=64, k=64, n=32):
    """Named tensors A (m x k) and B (k x n), and the k symbol."""
    sm, sk, sn = lt.symbols("m k n")
    a = lt.Tensor(rng.standard_normal((m, k)).astype(dtype)).to(sm, sk)
    return a, lt.Tensor(rng.standard_normal((k, n)).astype(dtype)).to(sk, sn), sk


def contraction(rng, dtype=lt.bfloat16, m=64, k=64, n=32):
    """(a * b).sum(k) and its float64 reference."""
    a, b, sk = operands(rng, dtype, m, k, n)
    ref = a.node.array.astype(np.float64) @ b.node.array.astype(np.float64)
    return (a * b).sum(sk), ref


def warp_tiles(c, warps=1):
    """Blocks of (16 * warps) x 8 outputs, one warp per 16 x 8 tile (warps on thread.y), k in steps of 16."""
    t = c.loop_tree().split("m", 16 * warps).split("m.1", 16).split("n", 8).split("k", 16)
    t = t.reorder("m.0", "n.0", "k.0", "m.1.0", "m.1.1", "n.1", "k.1")
    t = t.bind("m.0", "block.y").bind("n.0", "block.x").bind("m.1.0", "thread.y")
    return t.tensorize(("m.1.1", "n.1", "k.1"), MMA)


def staged(t, a_order, b_order):
    """Both operands copied per k step into shared memory, laid out in the given orders, by all threads."""
    t = t.cache("in0", order=a_order).place("in0.t0", "t0", 3).cache("in1", order=b_order).place("in1.t0", "t0", 3)
    return t.bind("m.1.0", "thread.y", stage="in0.t0").bind("k.1", "thread.x", stage="in0.t0") \
        .bind("k.1", "thread.x", stage="in1.t0")


def instructions(ptx: str) -> Counter:
    return Counter(re.findall(r"^\s+((?:ld|st|mma|ldmatrix|bar)\.[\w.]+)", ptx, re.M))


def test_a_tile_is_one_mma_per_k_step_with_the_accumulators_in_registers(rng):
    c, ref = contraction(rng, k=256)
    t = warp_tiles(c)
    assert "for k.1 in 0..16  [mma.m16n8k16.k]" in str(t) and t.check() == (True, "legal")
    module = gpu.generate(t, "sm_90")
    assert module.launches[0].block == (32, 1, 1) and module.launches[0].grid == (4, 4, 1)
    counts = instructions(module.ptx)
    assert counts["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"] == 1     # inside the k loop
    assert counts["ld.global.nc.b16"] == 12              # a lane's 8 elements of A and 4 of B, from global memory
    assert counts["ld.global.b32"] == 4 and counts["st.global.b32"] == 8     # 4 accumulators: zeroed, read once, stored
    for got in (c.numpy(t), lt.interpret(c, t)):         # the same schedule as plain loops
        assert_close(got, ref, 1e-5)


@pytest.mark.parametrize("dtype, a_order, b_order, a_load, b_load", [
    (lt.bfloat16, ("m", "k"), ("k", "n"), "x4", "x2.trans"),
    (lt.float16, ("k", "m"), ("n", "k"), "x4.trans", "x2"),
], ids=["bf16-row-major", "f16-transposed"])
def test_operands_in_shared_memory_load_with_ldmatrix(rng, dtype, a_order, b_order, a_load, b_load):
    c, ref = contraction(rng, dtype)
    t = staged(warp_tiles(c, warps=2), a_order, b_order)
    assert t.check() == (True, "legal")
    module = gpu.generate(t, "sm_90")
    assert module.launches[0].block == (32, 2, 1)
    counts = instructions(module.ptx)
    kind = {lt.bfloat16: "bf16", lt.float16: "f16"}[dtype]
    assert counts[f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32"] == 1
    assert counts[f"ldmatrix.sync.aligned.m8n8.{a_load}.shared.b16"] == 1
    assert counts[f"ldmatrix.sync.aligned.m8n8.{b_load}.shared.b16"] == 1
    assert counts["ld.shared.b16"] == 0 and counts["st.shared.b16"] > 0 and counts["bar.sync"] > 0
    assert_close(c.numpy(t), ref, 1e-5)
    assert_close(lt.interpret(c, t), ref, 1e-5)


def test_tensorize_survives_json(rng):
    c, _ = contraction(rng)
    t = warp_tiles(c)
    again = Schedule.from_json(t.schedule.to_json(), t.program)
    assert again.steps == t.schedule.steps and ("tensorize", "t0", "m.1.1", "n.1", "k.1", MMA) in again.steps


def test_wrong_tile_sizes_and_tails_areassert_refused(rng):
    c, _ = contraction(rng)
    t = c.loop_tree().split("m", 16).split("n", 16).split("k", 16).reorder("m.0", "n.0", "k.0", "m.1", "n.1", "k.1")
    assert_refused(t.tensorize(("m.1", "n.1", "k.1"), MMA), MMA, "16 x 8 x 16", "n.1", "runs 16", "split 'n' by 8")
    c40, _ = contraction(rng, m=40)
    t = c40.loop_tree().split("m", 16).split("n", 8).split("k", 16).reorder("m.0", "n.0", "k.0", "m.1", "n.1", "k.1")
    assert_refused(t.tensorize(("m.1", "n.1", "k.1"), MMA), "m.1", "tail", "whole tiles")


def test_operand_and_accumulator_dtypes_areassert_refused(rng):
    c32, _ = contraction(rng, np.float32)
    assert_refused(warp_tiles(c32), MMA, "two bfloat16 or two float16", "float32 in0", "float32 in1", "astype")
    a, b, sk = operands(rng)
    assert_refused(warp_tiles((a * b).sum(sk, dtype=lt.float64)), MMA, "accumulates in float32", "float64")


def test_what_is_not_a_product_of_two_matrices_isassert_refused(rng):
    a, b, sk = operands(rng)
    assert_refused(warp_tiles((a * b * 2.0).sum(sk)), MMA, "product of two tensors", "sums")
    assert_refused(warp_tiles((a * b).max(sk)), "not a sum", "contractions")


def test_the_warp_rules_are_refused_in_plain_words(rng):
    c, _ = contraction(rng)
    t = c.loop_tree().split("m", 16).split("n", 16).split("n.1", 8).split("k", 16)
    t = t.reorder("m.0", "n.0", "n.1.0", "k.0", "m.1", "n.1.1", "k.1").bind("n.1.0", "thread.x")
    assert_refused(t.tensorize(("m.1", "n.1.1", "k.1"), MMA), "warp", "32 lanes", "thread.x", "n.1.0", "thread.y")
    t = warp_tiles(c).cache("in0", order=("m", "k")).place("in0.t0", "t0", 2)
    t = t.bind("k", "thread.x", stage="in0.t0")
    assert_refused(t, "thread.x", "64 iterations", "split it by 32")
    t = c.loop_tree().split("m", 16).split("n", 8).split("k", 16).split("k.0", 2)
    t = t.reorder("m.0", "n.0", "k.0.1", "k.0.0", "m.1", "n.1", "k.1").bind("k.0.1", "thread.y")
    assert_refused(t.tensorize(("m.1", "n.1", "k.1"), MMA), "k.0.1", "summed dimension", "thread.y")
    t = c.loop_tree().split("m", 16).split("n", 8).split("k", 16).reorder("m.0", "n.0", "k.0", "m.1", "n.1", "k.1")
    t = t.tensorize(("m.1", "n.1", "k.1"), MMA).cache("in0", order=("m", "k")).place("in0.t0", "t0", 3)
    t = t.split("m.1", 8, stage="in0.t0").bind("m.1.0", "thread.y", stage="in0.t0")   # 2 warps copy, 1 tile
    assert_refused(t, "several warps", "m.1.0", "thread.y", "same", "one tile per warp")


def test_misplaced_loops_areassert_refused(rng):
    c, _ = contraction(rng)
    t = c.loop_tree().split("m", 16).split("n", 8).split("k", 16).split("k.0", 2)
    t = t.reorder("m.0", "n.0", "k.0.0", "m.1", "n.1", "k.1", "k.0.1")
    assert_refused(t.tensorize(("m.1", "n.1", "k.1"), MMA), "three innermost", "k.0.1")
    t = c.loop_tree().split("m", 16).split("n", 16).split("k", 8).reorder("m.0", "n.0", "k.0", "m.1", "n.1", "k.1")
    assert_refused(t.tensorize(("m.1", "k.1", "n.1"), MMA), "n loop", "k.1", "dimension of the result", "'k' is not")


def test_unknown_instructions_and_loop_lists_are_refused_at_once(rng):
    c, _ = contraction(rng)
    with pytest.raises(ValueError, match=mentions("unknown instruction", "wmma.m8n8k4", MMA)):
        c.loop_tree().tensorize(("m", "n", "k"), "wmma.m8n8k4")
    with pytest.raises(ValueError, match=mentions("three names", "two")):
        c.loop_tree().tensorize(("m",), MMA)
    with pytest.raises(ValueError, match=mentions("different loops")):
        c.loop_tree().tensorize(("m", "m", "k"), MMA)


def warp_tiled(c, block=(128, 128), warps=(2, 2), stages=0):
    """`templates.mma_tiled`: 64 x 64 warp tiles of 4 x 8 mma tiles, k tiles of 32 staged in shared memory."""
    return templates.mma_tiled(c.loop_tree(), "t0", block, warps, 32, stages)


def test_warp_tiles_keep_their_accumulators_in_registers(rng):
    c, ref = contraction(rng, m=128, k=64, n=128)
    t = warp_tiled(c)
    assert t.check() == (True, "legal")
    module = gpu.generate(t, "sm_90")
    assert module.launches[0].block == (32, 2, 2)
    counts = instructions(module.ptx)
    assert counts["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"] == 64     # 4 x 8 tiles x 2 k steps
    assert counts["ldmatrix.sync.aligned.m8n8.x4.shared.b16"] == 8                 # A: one per m tile and k step
    assert counts["ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16"] == 8           # B: one per two n tiles and k step
    assert counts["ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16"] == 0
    assert "local" not in module.ptx                     # the 128 accumulators of a lane are registers
    assert counts["st.global.v2.b32"] == 64              # and are copied out once, through the fragment layout,
    assert counts["st.global.b32"] == 0                  # each pair of neighbouring columns as one vector
    assert re.search(r"xor\.b\d+", module.ptx)          # shared operands swizzled
    for got in (c.numpy(t), lt.interpret(c, t)):
        assert_close(got, ref, 1e-5)


def test_b_stored_by_rows_of_k_loads_two_n_tiles_per_ldmatrix(rng):
    """B laid out n x k (k contiguous): its fragments come by ldmatrix.x4 without .trans, two n tiles each."""
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((128, 64)).astype(lt.float16)
    bt = rng.standard_normal((128, 64)).astype(lt.float16)
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(bt).to(sn, sk)).sum(sk)
    t = warp_tiled(c)
    counts = instructions(gpu.generate(t, "sm_90").ptx)
    assert counts["ldmatrix.sync.aligned.m8n8.x4.shared.b16"] == 16        # A's 8 and B's 8
    assert counts["ldmatrix.sync.aligned.m8n8.x2.shared.b16"] == 0
    assert_close(c.numpy(t), a.astype(np.float64) @ bt.astype(np.float64).T, 1e-5)


def test_pipelined_warp_tiles_copy_with_cp_async_and_read_with_ldmatrix(rng):
    c, ref = contraction(rng, lt.float16, m=128, k=128, n=128)
    t = warp_tiled(c, stages=3)
    counts = instructions(gpu.generate(t, "sm_90").ptx)
    assert counts["mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"] >= 64
    assert counts["ldmatrix.sync.aligned.m8n8.x4.shared.b16"] >= 8 and counts["ld.shared.b16"] == 0
    assert len(re.findall(r"cp\.async\.cg\.shared\.global", gpu.generate(t, "sm_90").ptx)) >= 32
    assert_close(c.numpy(t), ref, 1e-5)


def test_tiles_may_skip_whole_tiles_at_the_edges(rng):
    """144 x 48 x 200 in 128 x 128 blocks and k tiles of 32: the last block and k tile hold fewer
    whole 16 x 8 x 16 tiles, which are skipped."""
    c, ref = contraction(rng, m=144, k=48, n=200)
    t = warp_tiled(c, stages=2)
    assert t.check() == (True, "legal")
    assert instructions(gpu.generate(t, "sm_90").ptx)["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"] > 0
    assert_close(lt.interpret(c, t), ref, 1e-5)


def test_batched_contractions_put_the_batch_on_blocks(rng):
    sb, sm, sk, sn = lt.symbols("b m k n")
    a = rng.standard_normal((3, 64, 32)).astype(lt.bfloat16)
    b = rng.standard_normal((3, 32, 48)).astype(lt.bfloat16)
    c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
    t = warp_tiled(c, block=(64, 64), stages=2)
    module = gpu.generate(t, "sm_90")
    assert module.launches[0].grid == (1, 1, 3) and "local" not in module.ptx
    assert instructions(module.ptx)["mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"] > 0
    assert_close(lt.interpret(c, t), np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64)), 1e-5)


def test_an_accumulator_in_fragments_is_read_only_by_copy_tiles(rng):
    c, _ = contraction(rng, m=128, k=64, n=128)
    t = warp_tiled(c)
    plain = LoopTree(t.program, t.schedule.annotate("t0", "m.1.1.1", "").annotate("t0", "n.1.1.1", ""))
    assert_refused(plain, "t0 reads t0.acc", "fragments", "tensorize t0's (m, n) tile loops", "copy tile")
    wrong = LoopTree(t.program, t.schedule.tensorize("t0", "n.1.1.1", "m.1.1.1", None, MMA))
    assert_refused(wrong, MMA, "n loop 'm.1.1.1'", "must run 8 iterations, it runs 16")


def test_swizzles_spread_rows_over_the_banks():
    """Rows of 32 and 128 bfloat16 (4 and 16 chunks of 16 bytes): the swizzle permutes each row's
    chunks, and 8 consecutive rows at one chunk (an ldmatrix phase, or 8 lanes' 16-byte copies)
    land in 8 different groups of 4 banks."""
    for row in (32, 64, 128):
        swizzle = gpu.Swizzle.of((row, 1), 2)
        for first in range(0, 64, 8):
            for chunk in range(row // 8):
                groups = {swizzle((first + r) * row + chunk * 8) * 2 // 16 % 8 for r in range(8)}
                assert len(groups) == 8, (row, first, chunk)
        offsets = sorted(swizzle(r * row + e) for r in range(16) for e in range(row))
        assert offsets == list(range(16 * row))
    assert gpu.Swizzle.of((8, 1), 2) is None and gpu.Swizzle.of((48, 1), 2) is None


@pytest.mark.parametrize("item_bytes, rows", [(4, (32, 64)), (2, (32,))])
def test_an_element_swizzle_spreads_a_tiles_columns_and_rows_over_the_banks(item_bytes, rows):
    """A transpose's shared tile (rows of 32 elements, or 64 of 4 bytes): 32 consecutive rows at one
    column fall in 32 different banks (or share a 4-byte word), and the swizzle permutes each row's
    elements (so a row's 32 consecutive elements stay in 32 banks)."""
    for row in rows:
        swizzle = gpu.Swizzle.of_elements((row, 1))
        for column in range(row):
            words = {swizzle(r * row + column) * item_bytes // 4 for r in range(32)}
            assert len({word % 32 for word in words}) == len(words), (row, column)
        for r in range(64):
            assert sorted(swizzle(r * row + e) for e in range(row)) == list(range(r * row, (r + 1) * row))
    assert gpu.Swizzle.of_elements((48, 1)) is None and gpu.Swizzle.of_elements((16, 1)) is None


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, a_order, b_order", [
    (lt.bfloat16, None, None), (lt.float16, None, None),
    (lt.bfloat16, ("m", "k"), ("k", "n")), (lt.float16, ("k", "m"), ("n", "k")),
], ids=["bf16-global", "f16-global", "bf16-ldmatrix", "f16-ldmatrix-transposed"])
def test_tensor_core_tiles_run_on_the_gpu(rng, dtype, a_order, b_order):
    """Products of half-precision inputs are exact in float32, so against float64 on the same
    (rounded) inputs only float32 accumulation error remains: 1e-5."""
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    c, ref = contraction(rng, dtype, m=96, k=160, n=48)
    t = warp_tiles(c, warps=2)
    if a_order:
        t = staged(t, a_order, b_order)
    assert_close(cp.asnumpy(c.cuda(t)), ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [lt.bfloat16, lt.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("stages", [0, 2])
def test_warp_tiles_run_on_the_gpu(rng, dtype, stages):
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    c, ref = contraction(rng, dtype, m=144, k=48, n=200)
    assert_close(cp.asnumpy(c.cuda(warp_tiled(c, stages=stages))), ref, 1e-5)


def test_shared_memory_beyond_48_kb_is_dynamic(rng):
    """128 x 128 blocks, k tiles of 64 in 4 stages: 128 KB of operand tiles, which only dynamic shared
    memory holds; the launch carries the size, ldmatrix and cp.async still address shared memory."""
    c, ref = contraction(rng, m=128, k=256, n=128)
    module = gpu.generate(templates.mma_tiled(c.loop_tree(), "t0", (128, 128), (2, 2), 64, 4), "sm_90")
    assert module.launches[0].dynamic_shared == (128 + 128) * 64 * 2 * 4
    assert f".extern .shared .align {gpu.WGMMA_ALIGN} .b8 looptool_k0_dynamic_shared[];" in module.ptx
    assert not re.search(r"^\s*\.shared", module.ptx, re.M)           # no static shared arrays
    counts = instructions(module.ptx)
    assert counts["ldmatrix.sync.aligned.m8n8.x4.shared.b16"] > 0 and "cp.async.cg.shared.global" in module.ptx
    # pipelined copies are built for dynamic shared memory at once, even where they take less than 48 KB
    pipelined = gpu.generate(warp_tiled(c, stages=2), "sm_90")
    assert pipelined.launches[0].dynamic_shared == (128 + 128) * 32 * 2 * 2 and ".extern .shared" in pipelined.ptx
    small = gpu.generate(templates.shared_tiled(c.loop_tree(), 32, 16, 4, 8), "sm_90")     # no pipeline: static
    assert small.launches[0].dynamic_shared == 0 and ".extern" not in small.ptx
    assert_close(c.numpy(templates.mma_tiled(c.loop_tree(), "t0", (128, 128), (2, 2), 64, 4)), ref, 1e-5)


def test_dynamic_shared_memory_keeps_accumulators_in_registers(rng):
    """A float32 kernel staging 16 x 16 tiles in shared memory, forced to dynamic shared memory: its
    k loop reads only shared memory, the accumulators stay in registers as with static arrays (an
    extern array from the start made LLVM reload and store them every k step)."""
    sm, sk, sn = lt.symbols("m k n")
    a, b = (rng.standard_normal((64, 64)).astype(np.float32) for _ in range(2))
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    t = templates.shared_tiled(c.loop_tree(), 32, 16, 4, 8)
    static, dynamic = (gpu.generate(t, "sm_90", dynamic_shared=d).ptx for d in (False, True))
    assert ".extern .shared" in dynamic and ".extern" not in static
    for ptx in (static, dynamic):
        loops = re.split(r"^\$L__BB\d+_\d+:", ptx, flags=re.M)
        k_loop = next(body for body in loops if "fma.rn.f32" in body)
        assert "ld.shared" in k_loop and "ld.global" not in k_loop and "st.global" not in k_loop
    assert_close(c.numpy(t), a.astype(np.float64) @ b.astype(np.float64), 1e-5)
