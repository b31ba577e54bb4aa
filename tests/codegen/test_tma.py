"""Pipelines that copy wgmma operand tiles with the tensor memory accelerator
(`pipeline(..., copier='tma')`): one thread issues each tile's bulk tensor copies, which complete on
the buffer's mbarrier; buffers are handed back through a second mbarrier instead of a barrier per k
tile. PTX structure, tensor-map boxes and refusals are checked on any machine; the schedules run as
plain loops on the CPU against NumPy float64, and on a Hopper GPU where there is one (in test_wgmma.py)."""
import re
from collections import Counter

import numpy as np
import pytest

import looptool as lt
from looptool.analysis.tma import BulkCopy
from looptool.codegen import gpu
from tests.codegen.test_wgmma import contraction
from tests.gpu_helpers import assert_refused
from tests.helpers import assert_close, mentions
from looptool.autoschedule import gpu as templates


def tma_instructions(ptx: str) -> Counter:
    return Counter(re.findall(r"(cp\.async\.bulk\.tensor\.\dd|mbarrier\.[\w.]+|bar\.sync|cp\.async\.c[ag]"
                              r"|wgmma\.wait_group\.sync\.aligned \d)", ptx))


def k_loop(ptx: str) -> str:
    """The PTX of the pipelined k loop: from the first wait for a full buffer to the last wgmma."""
    start = ptx.index("mbarrier.try_wait.parity")
    return ptx[start:ptx.rindex("wgmma.mma_async")]


def test_tma_pipelines_copy_each_tile_with_bulk_copies_and_no_barrier_per_k_tile(rng):
    """128 x 256 blocks, k tiles of 64 in 4 stages: A's 128 x 64 tile is one box of 128-byte rows, B's
    64 x 256 tile four boxes of 64 columns (8 KB apart); 3 k tiles are copied before the loop and one
    in it, by the block's first thread (predicated, not branched). No bar.sync or cp.async in the loop."""
    c, ref = contraction(rng, k=512)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 4, "tma")
    assert "[pipeline.4.2.tma]" in str(t) and t.check() == (True, "legal")
    module = gpu.generate(t, "sm_90")
    assert module.params[-1] == gpu.TENSOR_MAPS and ".local" not in module.ptx
    assert module.tensor_maps == (BulkCopy("in0.t0.acc", "in0", 0, 128, 64, 1, 0),
                                  BulkCopy("in1.t0.acc", "in1", 0, 64, 64, 4, 1))
    assert [copy.box(2) for copy in module.tensor_maps] == [(128, 64), (64, 64)]
    assert sum(copy.bytes for copy in module.tensor_maps) == (128 + 256) * 64 * 2
    counts = tma_instructions(module.ptx)
    assert counts["cp.async.bulk.tensor.2d"] % 5 == 0 and counts["cp.async.bulk.tensor.2d"] >= 3 * 5   # LLVM may peel
    assert counts["mbarrier.init.shared"] == 8                      # full and empty, per stage
    assert counts["cp.async.cg"] == counts["cp.async.ca"] == 0
    loop = k_loop(module.ptx)      # the first wait to the last wgmma (LLVM may lay the loop's copies out apart)
    assert loop.count("cp.async.bulk.tensor.2d") % 5 == 0 and "bar.sync" not in loop
    assert "@leader mbarrier.arrive.shared::cta.b64" in module.ptx        # each warp's first lane hands a buffer back
    assert re.search(r"@leader cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.tile\.mbarrier::complete_tx"
                     r"::bytes \[%r\d+\], \[%rd\d+, \{%r\d+, %r\d+\}\], \[%r\d+\];", module.ptx)
    assert "wgmma.wait_group.sync.aligned 1;" in module.ptx
    for got in (c.numpy(t), lt.interpret(c, t)):
        assert_close(got, ref, 1e-5)


def test_batched_tiles_are_boxes_of_one_matrix_of_a_3d_tensor(rng):
    sb, sm, sk, sn = lt.symbols("b m k n")
    a = rng.standard_normal((3, 128, 128)).astype(lt.bfloat16)
    bb = rng.standard_normal((3, 128, 128)).astype(lt.bfloat16)
    c = (lt.Tensor(a).to(sb, sm, sk) * lt.Tensor(bb).to(sb, sk, sn)).sum(sk)
    t = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 128), (2, 1), 64, 2, "tma")
    module = gpu.generate(t, "sm_90")
    assert [copy.box(3) for copy in module.tensor_maps] == [(1, 128, 64), (1, 64, 64)]
    assert tma_instructions(module.ptx)["cp.async.bulk.tensor.3d"] > 0
    assert_close(c.numpy(t), np.einsum("bmk,bkn->bmn", a.astype(np.float64), bb.astype(np.float64)), 1e-5)


def test_tma_copies_what_wgmma_reads_and_nothing_else(rng):
    c, _ = contraction(rng)
    assert_refused(templates.mma_tiled(c.loop_tree(), "t0", (128, 128), (2, 2), 32, 2, "tma"),
                   "TMA", "no wgmma tile reads in0.t0.acc", "copier='cp.async'")
    with pytest.raises(ValueError, match=mentions("copier", "('cp.async', 'tma')", "'bulk'")):
        c.loop_tree().pipeline("k", 2, copier="bulk")

