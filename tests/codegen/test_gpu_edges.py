"""Register tiles cut by tails on the GPU (codegen/edges.py): tails that run whole, edge tiles tested
once per thread's tile, their structure (what kept a 1000 x 1500 x 777 float32 matmul 100 s in LLVM)
and their results, computed on this CPU by the GPU module's own LLVM IR (tests/gpu_host.py)."""
import pytest

from looptool import ir
from looptool.autoschedule import gpu as templates
from looptool.codegen import gpu
from looptool.runtime import gpu as runtime_gpu
from tests.gpu_helpers import matmul
from tests.gpu_host import run_tree
from tests.helpers import assert_close

SCHEDULES = {
    "template": lambda c: runtime_gpu.automatic_tree(ir.lower(c.node)[0], "sm_80"),   # the default float32 one
    "global": lambda c: register_tiles(c, ()),
    "b_shared": lambda c: register_tiles(c, ("in1",)),
    "as_stored": lambda c: register_tiles(c, ("in0", "in1"), ("in0",)),
    "a_in_registers": lambda c: a_in_registers(register_tiles(c, ())),
}


def register_tiles(c, shared: tuple[str, ...], as_stored: tuple[str, ...] = ()):
    """The tuner's register-tile template: 32 x 64 outputs a block (8 x 8 threads of 4 x 8) over k tiles of
    8, the inputs `shared` staged in shared memory (those `as_stored` in their own layout)."""
    return templates.register_tiled(c.loop_tree(), "t0", 8, 2, 4, 8, 4, 8, True, shared, as_stored)


def a_in_registers(tree):
    """Each thread's rows of A's k tile copied into registers: the k tail then cuts a register tile
    along a reduced dim, so an edge tile must keep its sums only where k is inside (selects)."""
    tree = tree.cache("in0", stage="t0.acc").place("in0.t0.acc", "t0.acc", 5)
    return tree.unroll("k.1", stage="in0.t0.acc").unroll("m.1.1", stage="in0.t0.acc")


def kernel(ptx: str, name: str) -> str:
    """The PTX of one kernel of a module."""
    return ptx[ptx.index(f".entry {name}("):]


def test_a_register_tile_cut_by_tails_in_m_and_n_compiles_like_a_whole_one(rng):
    """The default float32 schedule at 300 x 100 x 200 (tails in m, n and k) against 256 x 100 x 256
    (a tail in k only): the same matmul kernel but for the final stores; before, each tail doubled
    the tile (9.6 MB of LLVM IR, 2959 branches, 11880 FMAs and the accumulators in local memory)."""
    modules = {}
    for m, n in ((300, 200), (256, 256)):
        c, _ = matmul(rng, m, 100, n)
        modules[m] = gpu.generate(SCHEDULES["template"](c), "sm_90")
    odd, whole = modules[300], modules[256]
    assert len(odd.ptx) < 1.5 * len(whole.ptx)        # (their LLVM IR differs more: the k steps are one loop LLVM unrolls)
    assert odd.llvm_ir.count("br i1") < 300
    assert ".local" not in odd.ptx
    product = {m: kernel(module.ptx, module.launches[-1].name) for m, module in modules.items()}
    for instruction in ("fma.rn.f32", "ld.shared"):    # within k's tail: one rolled run of STORED_K_RUN of the
        whole_count = product[256].count(instruction)    # 32 steps of a k tile, which LLVM lays out apart at 300
        assert abs(product[300].count(instruction) - whole_count) <= whole_count * templates.STORED_K_RUN / 32


def test_an_edge_tile_keeps_its_registers_and_blends_its_results(rng):
    """Inputs read from global memory may leave their rows past a tail: an edge tile clamps those
    loads and keeps its results by selects, one copy of the tile besides the tail-free one."""
    c, _ = matmul(rng, 33, 7, 65)
    module = gpu.generate(SCHEDULES["global"](c), "sm_90")
    assert ".local" not in module.ptx and "selp" in module.ptx
    assert module.llvm_ir.count("br i1") < 100
    assert module.ptx.count("fma.rn.f32") <= 2 * 4 * 8 * 8      # two copies of the 4 x 8 tile over 8 k steps


@pytest.mark.parametrize("name,shape", [("template", (130, 33, 129)), ("global", (33, 7, 65)),
                                        ("b_shared", (33, 7, 65)), ("as_stored", (20, 10, 30)),
                                        ("a_in_registers", (33, 13, 65))])
def test_tails_compute_what_the_cpu_computes(rng, name, shape):
    c, ref = matmul(rng, *shape)
    tree = SCHEDULES[name](c)
    for aligned in (True, False):
        assert_close(run_tree(c, tree, gpu.generate(tree, "sm_90", aligned_params=aligned)), ref, 1e-5)
