"""Hopper's wgmma: `tensorize(..., "wgmma.m64n256k16")` runs a 64 x N tile on a warpgroup (4 warps of
consecutive thread.y) with both operands read from shared memory through descriptors. PTX structure,
shared-memory layouts and refusals are checked on any machine; the same schedules run as plain loops
on the CPU against NumPy float64, and on a Hopper GPU where there is one."""
import re
from collections import Counter

import numpy as np
import pytest

import looptool as lt
from looptool.analysis.tensorize import SharedOperand
from looptool.codegen import gpu, gpu_copies
from looptool.schedule import LoopTree
from tests.gpu_helpers import assert_refused, hopper_or_skip
from tests.helpers import assert_close, mentions
from looptool.autoschedule import gpu as templates


def contraction(rng, dtype=lt.bfloat16, m=256, k=256, n=256):
    """(a * b).sum(k) over A (m x k) and B (k x n), and its float64 reference."""
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    return (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk), a.astype(np.float64) @ b.astype(np.float64)


def wgmma_instructions(ptx: str) -> Counter:
    return Counter(re.findall(r"(wgmma\.[\w.]+|fence\.proxy\.async[\w:.]*|bar\.sync|cp\.async\.wait_group)", ptx))


def test_warpgroup_tiles_issue_one_batch_per_k_tile_and_overlap_it_with_the_next(rng):
    """Blocks of 128 x 256, two warpgroups of 64 x 256, k tiles of 64 in 4 stages: 4 wgmma of
    m64n256k16 per k tile in one committed batch; the loop keeps one batch in flight
    (wait_group 1) and drains it after the loop (wait_group 0); every barrier is preceded by the
    proxy fence that shows the copies to the tensor cores; no local memory. One of the 4 buffers is
    the batch's in flight: copies run 2 k tiles ahead, waiting leaves 1 group in flight."""
    c, ref = contraction(rng, k=512)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4)
    assert t.check() == (True, "legal")
    module = gpu.generate(t, "sm_90")
    assert ".target sm_90a" in module.ptx and ".local" not in module.ptx
    assert module.launches[0].block == (32, 8, 1) and module.launches[0].grid == (1, 2, 1)
    assert module.launches[0].dynamic_shared == (128 + 256) * 64 * 2 * 4
    counts = wgmma_instructions(module.ptx)
    assert counts["wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16"] == 4
    assert counts["wgmma.fence.sync.aligned"] == 1 and counts["wgmma.commit_group.sync.aligned"] == 1
    assert re.search(r"wgmma\.commit_group\.sync\.aligned;\s*// end inline asm\s*// begin inline asm\s*"
                     r"wgmma\.wait_group\.sync\.aligned 1;", module.ptx)
    assert "wgmma.wait_group.sync.aligned 0;" in module.ptx
    assert counts["cp.async.wait_group"] == 2 and re.search(r"cp\.async\.wait_group\s+1;", module.ptx)
    assert counts["fence.proxy.async.shared::cta"] == counts["bar.sync"]
    operands = re.findall(r"m64n256k16\.f32\.bf16\.bf16 \{[^}]*\}, %rd\d+, %rd\d+, p, 1, 1, (\d), (\d);", module.ptx)
    assert operands == [("0", "1")] * 4        # A k-major, B mn-major (transposed)
    for got in (c.numpy(t), lt.interpret(c, t)):
        assert_close(got, ref, 1e-5)


@pytest.mark.parametrize("stored, flags", [("a", ("1", "1")), ("b", ("0", "0"))])
def test_operands_stored_the_other_way_round_switch_the_transpose_flags(rng, stored, flags):
    """A stored [k][m] is read m-major (its transpose flag 1); B stored [n][k] k-major (flag 0). Not yet
    run on a GPU: bench/gpu_tensor_check.py has both cases for the next one."""
    sm, sk, sn = lt.symbols("m k n")
    a = rng.standard_normal((128, 64)).astype(lt.bfloat16)
    b = rng.standard_normal((64, 128)).astype(lt.bfloat16)
    ta = lt.Tensor(np.ascontiguousarray(a.T)).to(sk, sm) if stored == "a" else lt.Tensor(a).to(sm, sk)
    tb = lt.Tensor(np.ascontiguousarray(b.T)).to(sn, sk) if stored == "b" else lt.Tensor(b).to(sk, sn)
    c = (ta * tb).sum(sk)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 128), (2, 1), 64, 3)
    ptx = gpu.generate(t, "sm_90").ptx
    assert set(re.findall(r"m64n128k16\.f32\.bf16\.bf16 \{[^}]*\}, %rd\d+, %rd\d+, p, 1, 1, (\d), (\d);", ptx)) == {flags}
    assert_close(c.numpy(t), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


def test_descriptors_carry_the_layouts_strides_and_the_128_byte_swizzle(rng):
    """A's rows of 128 bytes: atoms of 8 rows 1024 bytes apart; B's 64-column blocks of 64 rows are
    64 * 128 bytes apart (the leading offset). Both descriptors say 128-byte swizzle (bit 62)."""
    c, _ = contraction(rng)
    ptx = gpu.generate(templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 0), "sm_90").ptx
    high = ((1024 >> 4) | 1 << 30) << 32
    constants = {c for c in re.findall(r"or\.b64\s+%rd\d+, %rd\d+, (\d+);", ptx) if int(c) >> 62}
    assert constants == {str(high | 1 << 16), str(high | (64 * 128 >> 4) << 16)}    # A (16: unused), B


def test_shared_layouts_keep_16_byte_chunks_whole_and_are_permutations():
    """The mn-major layout stores a 64 x 256 tile as four 64 x 64 blocks, then XORs each 128-byte
    line's chunks with the line's index mod 8; the k-major one only swizzles. Both are permutations
    of the tile that move 8-element chunks whole."""
    mn = gpu.WgmmaLayout(SharedOperand("mn", 256, 64))
    assert mn(1 * 256 + 65) == (64 * 64 + 1 * 64 + 1) ^ (1 << 3)
    k_major = gpu.WgmmaLayout(SharedOperand("k", 64, 128))
    assert k_major(3 * 64 + 8) == 3 * 64 + 8 ^ (3 << 3)
    for layout, size in ((mn, 64 * 256), (k_major, 128 * 64)):
        places = [layout(offset) for offset in range(size)]
        assert sorted(places) == list(range(size))
        assert all(places[offset + 1] == places[offset] + 1 for offset in range(size) if offset % 8 != 7)


def test_warpgroup_rules_are_refused_in_plain_words(rng):
    c, _ = contraction(rng)
    t = templates.mma_tiled(c.loop_tree(), "t0", (128, 128), (2, 2), 32, 0)
    direct = c.loop_tree().split("m", 64).split("n", 64).split("k", 16).reorder("m.0", "n.0", "k.0", "m.1", "n.1", "k.1")
    assert_refused(direct.tensorize(("m.1", "n.1", "k.1"), "wgmma.m64n64k16"), "wgmma.m64n64k16", "shared memory",
             "in0", "t.cache")
    narrow = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 32, 0)
    assert_refused(narrow, "128-byte rows", "in0.t0.acc", "64 elements")
    assert t.check() == (True, "legal")
    with pytest.raises(ValueError, match=mentions("wgmma.m64n256k16", "Hopper", "sm_80")):
        gpu.generate(templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 0), "sm_80")
    with pytest.raises(ValueError, match=mentions("100", "multiple of 8")):
        templates.wgmma_tiled(c.loop_tree(), "t0", (128, 100), (2, 1), 64, 0)


def test_half_precision_wgmma_schedules_run_on_the_cpu_with_tails_of_whole_tiles(rng):
    c, ref = contraction(rng, lt.float16, m=192, k=128, n=384)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 128), (2, 1), 64, 3)
    assert t.check() == (True, "legal")
    assert_close(c.numpy(t), ref, 1e-5)


def branches_inside_batches(ptx: str) -> int:
    """Branches between two wgmma instructions of one batch (no fence or commit between them)."""
    marks = re.findall(r"(wgmma\.mma_async|wgmma\.fence|wgmma\.commit_group|^\s*(?:@%p\d+\s+)?bra)", ptx, re.M)
    found, pending = 0, None
    for mark in marks:
        if mark == "wgmma.mma_async":
            found, pending = found + (pending or 0), 0
        elif mark.strip().endswith("bra"):
            pending = None if pending is None else pending + 1
        else:
            pending = None
    return found


@pytest.mark.parametrize("copier", ["tma", "cp.async"])
def test_k_steps_past_the_end_of_k_are_cut_whole_with_no_branch_inside_a_batch(rng, copier):
    """k = 208 ends one 16-deep step into its last 64-deep tile. Its tail tests whole steps (`_inner_free`:
    k.1.0 + 4*k.0 < 13), so neither copier issues the three steps past k (cp.async leaves what the buffer
    held there) and no branch separates the wgmma of a batch (ptxas serializes wgmma that branches separate)."""
    c, ref = contraction(rng, k=208)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, copier)
    assert t.check() == (True, "legal")
    assert re.search(r"for k\.1\.0 in 0\.\.4 while (k\.1\.0 \+ 4\*k\.0|4\*k\.0 \+ k\.1\.0) < 13", str(t)), str(t)
    assert branches_inside_batches(gpu.generate(t, "sm_90").ptx) == 0
    assert_close(c.numpy(t), ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [lt.bfloat16, lt.float16], ids=["bf16", "f16"])
@pytest.mark.parametrize("block, groups, stages, copier, k", [
    ((128, 128), (2, 1), 0, "cp.async", 192), ((128, 256), (1, 2), 4, "cp.async", 192),
    ((128, 128), (2, 1), 2, "tma", 320), ((128, 256), (2, 1), 4, "tma", 320), ((128, 256), (2, 1), 4, "tma", 208),
    ((128, 256), (2, 1), 4, "cp.async", 208)])
def test_warpgroup_tiles_run_on_hopper(rng, dtype, block, groups, stages, copier, k):
    """Products of half-precision inputs are exact in float32: only float32 accumulation error is left.
    m ends in a partial block (TMA fills what lies outside the inputs with zeros)."""
    cp = hopper_or_skip("wgmma")
    c, ref = contraction(rng, dtype, m=192, k=k, n=512)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", block, groups, 64, stages, copier)
    assert_close(cp.asnumpy(c.cuda(t)), ref, 1e-5)


@pytest.mark.parametrize("blocks, grid", [(4, 4), (100, 12)])
def test_a_persistent_wgmma_kernel_launches_at_most_its_blocks_and_issues_copies_across_tiles(rng, blocks, grid):
    """12 tiles (3 x 2, a batch of 2) run by `blocks` blocks, at most one a tile; the pipeline's loop is one
    rolled loop inside the loop over a block's tiles."""
    sb, sm, sk, sn = lt.symbols("b m k n")
    a, b = rng.standard_normal((2, 300, 208)).astype(lt.bfloat16), rng.standard_normal((2, 208, 512)).astype(lt.bfloat16)
    c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, "tma", persistent=blocks)
    assert t.check() == (True, "legal")
    assert [launch.grid for launch in gpu.generate(t, "sm_90").launches] == [(grid, 1, 1)]
    assert_close(c.numpy(t), np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64)), 1e-5)


def test_persistent_pipelines_are_refused_in_plain_words(rng):
    """Persistence needs TMA copies, and block-bound loops that are the kernel's outermost."""
    c, _ = contraction(rng)
    with pytest.raises(ValueError, match="persistent must be a number of blocks >= 1 with copier='tma'"):
        templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, "cp.async", persistent=4)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, "tma", persistent=4)
    assert_refused(LoopTree(t.program, t.schedule.annotate("t0", "m.0", "")), "persistently", "outermost loops")


@pytest.mark.gpu
@pytest.mark.parametrize("blocks", [1, 5, 64])
@pytest.mark.parametrize("stages, batch, m, k, n", [(4, 2, 300, 208, 512), (3, 3, 257, 144, 600), (4, 1, 640, 1024, 520),
                                                     (4, 1, 1300, 128, 520), (3, 2, 1100, 144, 304)])
def test_persistent_wgmma_kernels_run_on_hopper(rng, blocks, stages, batch, m, k, n):
    """Blocks running several tiles each, their copies running on from one tile into the next (k of 4, 3
    and 16 k tiles against 3 or 4 stages: the buffers' phases wrap across tiles), edge tiles guarded; 11
    and 9 rows of tiles walked in groups of 8 rows and a last one of 3 or 1."""
    cp = hopper_or_skip("wgmma")
    sb, sm, sk, sn = lt.symbols("b m k n")
    a, b = rng.standard_normal((batch, m, k)).astype(lt.bfloat16), rng.standard_normal((batch, k, n)).astype(lt.bfloat16)
    c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(b).to(sb, sk, sn)).sum(sk)
    block = (128, 256) if stages == 4 else (128, 128)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", block, (2, 1), 64, stages, "tma", persistent=blocks)
    assert_close(cp.asnumpy(c.cuda(t)), np.einsum("bmk,bkn->bmn", a.astype(np.float64), b.astype(np.float64)), 1e-5)


@pytest.mark.parametrize("m, n, persistent, grouped", [(1408, 600, 0, True), (100, 600, 0, False), (1408, 600, 12, False)])
def test_the_blocks_of_a_tma_product_take_their_tiles_in_groups_of_rows(rng, m, n, persistent, grouped):
    """11 x 3 tiles of a TMA-pipelined product: its blocks take them in groups of TILE_GROUP_ROWS rows
    (`gpu_copies.grouped_grid`: the blocks running at once read few operand tiles, which stay in L2); one
    row of tiles has nothing to group; a persistent kernel groups its tiles itself."""
    a, b = rng.standard_normal((m, 128)).astype(lt.bfloat16), rng.standard_normal((128, n)).astype(lt.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, "tma", persistent=persistent)
    nodes = gpu.kernel_nodes(t.root)[0]
    assert (gpu_copies.grouped_grid(nodes, gpu.launch_dims(nodes)[0]) is not None) == grouped


@pytest.mark.gpu
def test_a_product_whose_blocks_take_their_tiles_in_groups_runs_on_hopper(rng):
    """11 rows of tiles in a group of 8 and a last one of 3, 3 columns, edge tiles in both: every tile
    is computed once (the output starts as NaN)."""
    cp = hopper_or_skip("wgmma")
    a, b = rng.standard_normal((1400, 192)).astype(lt.bfloat16), rng.standard_normal((192, 600)).astype(lt.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, "tma")
    nodes = gpu.kernel_nodes(t.root)[0]
    assert gpu_copies.grouped_grid(nodes, gpu.launch_dims(nodes)[0]) == (3, 11, 1)
    assert_close(cp.asnumpy(c.cuda(t)), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


@pytest.mark.parametrize("tile, groups, block, registers", [
    ((128, 256), (2, 1), (32, 12, 1), 232), ((128, 256), (1, 1), (32, 8, 1), 256),
    ((128, 256), (1, 2), (32, 4, 2), None), ((128, 256), (2, 2), (32, 8, 2), None), ((256, 128), (4, 1), (32, 16, 1), None)])
def test_a_persistent_block_alone_on_its_sm_takes_a_producer_warpgroup_where_its_warpgroups_lie_along_y(
        rng, tile, groups, block, registers):
    """One or two warpgroups along thread.y: one warpgroup more, which gives its registers to those computing
    (setmaxnreg, within what the block was launched with) and issues the copies; warpgroups side by side
    along n (thread.z) take none (a producer along y there crashed a tuner trial), nor do four (one hung)."""
    c, _ = contraction(rng, m=1024, k=320, n=2048)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", tile, groups, 64, 4 if tile == (128, 256) else 3, "tma", persistent=20)
    module = gpu.generate(t, "sm_90")
    assert module.launches[0].block == block
    assert ("setmaxnreg.dec.sync.aligned.u32 40;" in module.ptx) == (registers is not None)
    assert registers is None or f"setmaxnreg.inc.sync.aligned.u32 {registers};" in module.ptx
