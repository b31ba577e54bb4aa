"""Shared pieces of the GPU tests (tests/*/test_gpu_*.py): a float32 matmul and row softmax with
their float64 references, the tiled and register-tiled GPU schedules, CuPy or a skip, and the check
that a schedule is refused in plain words."""
import re

import numpy as np
import pytest

import looptool as lt
from looptool.codegen import gpu as codegen_gpu
from tests.helpers import mentions, row_softmax
from looptool.autoschedule import gpu as templates


def matmul(rng, m=64, k=32, n=48, dtype=np.float32):
    """(a * b).sum(k) on inputs of `dtype` and its float64 reference (from the same inputs)."""
    a = rng.standard_normal((m, k)).astype(dtype)
    b = rng.standard_normal((k, n)).astype(dtype)
    sm, sk, sn = lt.symbols("m k n")
    return (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk), a.astype(np.float64) @ b.astype(np.float64)


def tiled(tree, stage=None):
    """A 16 x 32 block of (m, n) per GPU block, 4 rows per thread, for the matmul stage `stage`."""
    return (tree.split("m", 16, stage=stage).split("n", 32, stage=stage).split("m.1", 4, stage=stage)
            .reorder("m.0", "n.0", "m.1.0", "n.1", "k", "m.1.1", stage=stage)
            .bind("m.0", "block.y", stage=stage).bind("n.0", "block.x", stage=stage)
            .bind("m.1.0", "thread.y", stage=stage).bind("n.1", "thread.x", stage=stage)
            .unroll("m.1.1", stage=stage))


def k_across_blocks(tree, k_tile=8, lanes=4):
    """A matmul whose k runs in blocks of `k_tile` on block.z (added atomically), n in vectors of `lanes`."""
    return tree.split("k", k_tile).split("n", lanes).reorder("k.0", "m", "n.0", "k.1", "n.1").bind("k.0", "block.z") \
        .bind("m", "block.x").bind("n.0", "thread.x").vectorize("n.1")


def softmax_rows(rng, rows=6, cols=40, threads=16, dtype=np.float32):
    sm, ref = row_softmax(rng.standard_normal((rows, cols)).astype(dtype))
    tree = sm.loop_tree().bind("m", "block.x", stage="t2").place("t0", "t2", 1).place("t1", "t2", 1)
    for stage in ("t0", "t1", "t2"):
        tree = tree.split("n", threads, stage=stage).reorder("n.1", "n.0", stage=stage) \
            .bind("n.1", "thread.x", stage=stage)
    return sm, tree, ref


def register_tiles(c, **changes):
    """The tuner's GPU matmul template: 8 x 8 outputs per thread in registers, 128-bit vectors,
    both inputs staged in shared memory."""
    params = dict(x_threads=8, x_groups=2, vector=4, y_threads=8, y_tile=4, k_tile=8, unroll_k=True,
                  shared=("in0", "in1"))
    return templates.register_tiled(c.loop_tree(), "t0", **{**params, **changes})


def cupy_or_skip():
    cp = pytest.importorskip("cupy", reason="GPU execution needs CuPy (pip install 'looptool[gpu]')")
    try:
        if cp.cuda.runtime.getDeviceCount() == 0:
            pytest.skip("no NVIDIA GPU present")
    except cp.cuda.runtime.CUDARuntimeError as err:
        pytest.skip(f"no usable NVIDIA GPU: {err}")
    return cp


def hopper_or_skip(what: str):
    """CuPy, where the GPU is a Hopper (sm_90: wgmma, TMA); else a skip saying `what` needs one."""
    from looptool.runtime import gpu as runtime_gpu
    cp = cupy_or_skip()
    if runtime_gpu.device_arch() not in codegen_gpu.WGMMA_ARCHS:
        pytest.skip(f"{what} needs a Hopper GPU (sm_90); this one is {runtime_gpu.device_arch()}")
    return cp


def assert_refused(t, *words):
    """The legality check and the GPU code generator both refuse `t`, with a reason naming `words`."""
    legal, reason = t.check()
    assert not legal
    assert re.search(mentions(*words), reason), reason
    with pytest.raises(lt.IllegalScheduleError, match=mentions(*words)):
        codegen_gpu.generate(t, "sm_90")
