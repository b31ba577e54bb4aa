"""CPU code generation: the LLVM IR and native assembly a compiled kernel exposes, vector
types for a vectorized loop and packed FMAs for a vectorized matmul, and buffers placed at a
parallel loop allocated once per thread."""

import re

import llvmlite.binding as llvm
import numpy as np
import pytest

from looptool import ir
from tests.helpers import assert_loop_tree_text, check, f64, random_matmul
from tests.schedule_helpers import (apply_steps, colsum_exp, matmul, matmul_bias_relu, pointwise, rowsum_exp,
                                    run_guarded)


# ------------------------------------------------------------------ LLVM IR and assembly

@pytest.mark.parametrize("dtype, ir_type", [(np.float32, "float"), (np.float64, "double")])
def test_compile_exposes_llvm_ir_and_assembly(rng, dtype, ir_type):
    t, a, b = random_matmul(rng, 13, 11, 9, dtype)
    kernel = t.compile()
    ir = kernel.llvm_ir
    asm = kernel.assembly
    assert isinstance(ir, str) and "define" in ir
    assert re.search(rf"(?<!\w){ir_type}(?!\w)", ir), f"no {ir_type} type in IR"
    assert isinstance(asm, str) and len(asm) > 0
    assert re.search(r"(?<!\w)ret\w*", asm), "assembly has no return instruction"
    assert "define" not in asm  # native assembly, not LLVM IR
    assert_loop_tree_text(str(kernel.loop_tree), {"m": 13, "k": 11, "n": 9})
    check(t, f64(a) @ f64(b), dtype)


# ------------------------------------------------------------------ vector code

def _host_has(*features):
    flags = llvm.get_host_cpu_features()
    return all(flags.get(f, False) for f in features)


@pytest.mark.skipif(not re.match(r"x86_64|amd64", llvm.get_process_triple()), reason="x86 assembly check")
def test_vectorized_matmul_uses_packed_fma(rng):
    if not _host_has("fma", "avx2"):
        pytest.skip("host CPU has no FMA/AVX2")
    case = matmul(rng, 32, 64, 64)
    t = case.make()
    tree = t.loop_tree().split("n", 16).vectorize("n.1")
    kernel = t.compile(tree)
    asm = kernel.assembly
    assert re.search(r"vfmadd\w*ps\s+[^\n]*%[yz]mm", asm), \
        "no packed single-precision FMA on ymm/zmm registers in:\n" + \
        "\n".join(ln for ln in asm.splitlines() if "fma" in ln or "mul" in ln)[:4000]
    case.check(kernel(ir.lower(t.node)[1]))


def test_vectorized_loop_in_llvm_ir_is_vector_code(rng):
    case = pointwise(rng, m=4, n=64)
    t = case.make()
    kernel = t.compile(t.loop_tree().split("n", 16).vectorize("n.1"))
    assert re.search(r"<\d+ x float>", kernel.optimized_ir), "no vector type in the optimized IR"
    case.check(t.numpy(kernel.loop_tree))


def test_a_padded_value_broadcast_across_lanes_is_one_guarded_vector(rng):
    """A 1-D convolution vectorized along its output channels: the padded input is the same in every
    lane, so it is loaded once and its padding guard picks between vectors (no scalar float select,
    which x86 turns into a branch).  The padding reads a clamped neighbour, so an infinity at the
    edge must not leak into padded positions."""
    import looptool as lt
    x, w = rng.standard_normal((8, 20), dtype=np.float32), rng.standard_normal((16, 8, 3), dtype=np.float32)
    x[:, 0] = np.inf
    c, i, o, j, k = lt.symbols("c i o j k")
    xw = lt.Tensor(x).to(c, i).window(i, j, k, 3, padding=1)
    t = (xw * lt.Tensor(w).to(o, c, k)).sum(c, k)                          # dims (j, o)
    kernel = t.compile(t.loop_tree().split("o", 8).reorder("j", "o.0", "c", "k", "o.1").vectorize("o.1"))
    assert re.search(r"select\s+<8 x i1>", kernel.llvm_ir), "the guard is not a vector select"
    xp = np.pad(f64(x), ((0, 0), (1, 1)))
    with np.errstate(invalid="ignore"):
        ref = np.einsum("cjk,ock->jo", np.lib.stride_tricks.sliding_window_view(xp, 3, axis=1), f64(w))
    got = kernel(ir.lower(t.node)[1])
    assert np.isfinite(got[2:]).all() and np.allclose(got[2:], ref[2:], rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_an_edge_register_tile_keeps_its_accumulators_in_registers(rng, dtype):
    """A 4x16 register tile over 10x37x21: the last row tile has 2 rows and the last column tile 5
    columns (the unrolled vector loop stops after one copy, its vector after 5 lanes).  Its
    accumulators are loaded once before the k loop and stored once after, the short vector through
    masked loads and stores, and nothing outside the result is read or written."""
    case = matmul(rng, 10, 37, 21, dtype)
    t = case.make()
    tree = (t.loop_tree().split("m", 4).split("n", 16).split("n.1", 8)
            .reorder("m.0", "n.0", "k", "m.1", "n.1.0", "n.1.1")
            .unroll("m.1").unroll("n.1.0").vectorize("n.1.1"))
    kernel = t.compile(tree)
    assert "llvm.masked.store" in kernel.optimized_ir and "llvm.masked.load" in kernel.optimized_ir
    case.check(kernel(ir.lower(t.node)[1]))


@pytest.mark.parametrize("threads", [1, 2])
def test_an_edge_tile_keeps_its_accumulators_across_a_nest_of_reduction_loops(rng, threads):
    """k split into k.0 and k.1, both plain, around a 4x16 tile whose last column tile has 5 columns,
    the column tiles as the parallel loop (a 1x1 convolution's c, kh, kw around its tile, on threads):
    the accumulators are loaded before k.0 and stored after it, once a tile, not around each pass of k.1
    (where the edge tile's masked stores and reloads made a 1x1 convolution 4.5x slower on 2 threads, on
    the one copy of the outlined loop that cannot know which tile is the edge)."""
    case = matmul(rng, 12, 30, 21)
    t = case.make()
    tree = (t.loop_tree().split("m", 4).split("n", 16).split("n.1", 8).split("k", 6)
            .reorder("n.0", "m.0", "k.0", "k.1", "m.1", "n.1.0", "n.1.1")
            .unroll("m.1").unroll("n.1.0").vectorize("n.1.1"))
    if threads > 1:
        tree = tree.parallel("n.0")
    kernel = t.compile(tree)
    stores = re.findall(r'^([\w."]+):$|call void @"?llvm\.masked\.store', kernel.llvm_ir, flags=re.M)
    blocks, block = [], None
    for label in stores:
        if label:
            block = label.strip('"')
        else:
            blocks.append(block)
    assert blocks and all(b.startswith("k.0.done") for b in blocks), blocks
    for _ in range(3):
        case.check(kernel(ir.lower(t.node)[1]))


@pytest.mark.parametrize("threads", [1, 2])
def test_an_edge_tile_skips_its_vectors_past_the_edge(rng, threads):
    """A 4x24 tile of 3 vectors over 35 columns: the edge tile's 11 columns need 2 vectors, and its third,
    wholly past the edge, is neither multiplied nor added. The column tiles run on threads, so the
    outlined body serves every tile: the tile loop is emitted once per count of live vectors (a switch
    on it, not a branch per vector inside the reduction loop), with 4, 8 and 12 multiply-adds a step."""
    case = matmul(rng, 10, 37, 35)
    t = case.make()
    tree = (t.loop_tree().split("m", 4).split("n", 24).split("n.1", 8)
            .reorder("n.0", "m.0", "k", "m.1", "n.1.0", "n.1.1")
            .unroll("m.1").unroll("n.1.0").vectorize("n.1.1"))
    kernel = t.compile(tree.parallel("n.0") if threads > 1 else tree)
    labels = set(re.findall(r'^"?([\w.]+)"?:', kernel.llvm_ir, flags=re.M))
    assert {"k.edge1", "k.edge2", "k.edge3"} <= labels
    multiplies, block = {}, None
    for line in kernel.llvm_ir.splitlines():
        label = re.match(r'^"?([\w.]+)"?:', line)
        block = label.group(1) if label else block
        multiplies[block] = multiplies.get(block, 0) + bool(re.search(r"llvm\.fma\.v8f32|fmul <8 x float>", line))
    assert {4, 8, 12} <= set(multiplies.values())
    case.check(kernel(ir.lower(t.node)[1]))


def test_register_tile_updates_of_one_result_share_its_register(rng):
    """k split and its inner part unrolled inside the vectorized tile: two unrolled copies update the
    same results in turn, so they share one accumulator (the loop tree's order of additions)."""
    case = matmul(rng, 6, 12, 20)
    t = case.make()
    tree = (t.loop_tree().split("n", 8).split("k", 2).reorder("m", "n.0", "k.0", "k.1", "n.1")
            .unroll("k.1").vectorize("n.1"))
    kernel = t.compile(tree)
    assert "llvm.masked.store" in kernel.optimized_ir   # the edge tile kept in registers
    case.check(kernel(ir.lower(t.node)[1]))


# ------------------------------------------------------------------ parallel loops

def _functions(llvm_ir: str) -> dict[str, str]:
    """Each function of an LLVM module by name: its text up to the next definition."""
    parts = re.split(r"^define [^@]*@", llvm_ir, flags=re.M)[1:]
    return {part.split("(")[0].strip('"'): part for part in parts}


def test_buffer_placed_at_a_parallel_loop_is_private_to_each_thread(rng):
    """t0 = a @ b placed inside the parallel loop m of relu(t0 + bias): each thread needs its own
    tile of t0.  The brute-force oracle (tests/analysis/oracle.py) found that the tile was
    allocated once, outside the threads, so they overwrote each other's rows (5 wrong results
    in 20 runs at 64x300x64); it is now allocated in the outlined loop body (the automatic
    scheduler's packed panels hit the same bug with two threads)."""
    case = matmul_bias_relu(rng, 64, 300, 64, np.float64)
    t = case.make()
    tree = apply_steps(t.loop_tree(), [("place", "t0", "t1", 1), ("parallel", "m", {"stage": "t1"})])
    assert tree.check() == (True, "legal")
    kernel = t.compile(tree)
    functions = _functions(kernel.llvm_ir)
    holders = [name for name, text in functions.items() if re.search(r'%"t0" = alloca', text)]
    assert holders == [name for name in functions if name.endswith(".par1")], holders
    arrays = ir.lower(t.node)[1]
    for _ in range(5):
        case.check(kernel(arrays))


def test_a_tail_vector_reads_a_local_buffer_through_its_mask(rng):
    """Lanes past a tail in a packed local buffer hold stale or never-written words; read unmasked,
    the ones that happen to be subnormal floats cost an Intel core a microcode assist per FMA
    (2-thread 200x300x500 matmul calls took 3-5 ms instead of 0.4 ms on a Xeon). The tail's
    loads of the packed panel are masked, so those lanes are zeros."""
    t, a, b = random_matmul(rng, 3, 8, 20)
    tree = t.loop_tree().split("n", 16).reorder("n.0", "m", "k", "n.1").cache("in1") \
        .place("in1.t0", "t0", 1).vectorize("n.1")
    kernel = t.compile(tree)
    defined = dict(re.findall(r'^\s*(%"?[\w.]+"?) = (.*)$', kernel.llvm_ir, re.M))
    pointers = re.findall(r'@"?llvm\.masked\.load\.[\w.]+"?\([\w*]+ (%"?[\w.]+"?)', kernel.llvm_ir)
    assert any('%"in1.t0"' in defined.get(p, "") for p in pointers), "no masked load of the packed panel"
    check(t, f64(a) @ f64(b), np.float32)


# ------------------------------------------------------------------ generating the IR quickly

def test_constants_are_shared_and_keep_their_exact_value():
    from llvmlite import ir as llir

    from looptool.codegen.llvm import F32, I1, I64, constant
    assert constant(I64, 5) is constant(I64, 5)
    assert constant(I64, 5) is not constant(llir.IntType(32), 5)
    assert str(constant(F32, 0.0)) != str(constant(F32, -0.0))
    assert str(constant(I1, True)) == "i1 true" and str(constant(I1, 1)) == "i1 1"
    vector = llir.VectorType(F32, 4)
    assert constant(vector, [1.0] * 4) is constant(vector, [1.0] * 4)
    assert str(constant(vector, [1.0] * 4)) == str(llir.Constant(vector, [1.0] * 4))


@pytest.mark.parametrize("size, window, padding, tile, tested_at", [
    ((13, 40), 3, 1, 4, ["oz.0"]),
    ((9, 50), 5, 2, 6, ["ky"]),    # a 5-row window moves over 4 of 9 rows: tested per window row
    ((6, 30), 3, 1, 8, ["kz"]),    # a tile's window spans 10 of 30 columns: tested per window column
])
def test_padding_guards_are_tested_once_per_tile_and_hold_in_its_copy(rng, size, window, padding, tile, tested_at):
    """A 2-D convolution whose output columns are tiled: each tile's body is emitted twice, one copy
    free of the padding guards (and of the input's clamps) for the tiles whose whole window lies
    inside the input, chosen by one test per tile.  Tiles straddling an edge, tails and windows
    wider than the padding take the guarded copy, where a padded position that read its clamped
    neighbour would show as a wrong value."""
    import looptool as lt
    from looptool.codegen.llvm import hoisted_guard_checks
    from looptool.schedule import LoopNode
    h, w = size
    x, f = rng.standard_normal((3, h, w), dtype=np.float32), rng.standard_normal((8, 3, window, window), dtype=np.float32)
    c, y, z, o, oy, oz, ky, kz = lt.symbols("c y z o oy oz ky kz")
    xw = lt.Tensor(x).to(c, y, z).window(y, oy, ky, window, padding=padding).window(z, oz, kz, window, padding=padding)
    t = (xw * lt.Tensor(f).to(o, c, ky, kz)).sum(c, ky, kz)                    # dims (oy, oz, o)
    tree = (t.loop_tree().split("oz", tile).reorder("oy", "oz.0", "c", "ky", "kz", "oz.1", "o")
            .unroll("oz.1").vectorize("o"))
    hosts = {id(node): node.loop.name for node, _ in tree.walk() if isinstance(node, LoopNode)}
    assert [hosts[host] for host in hoisted_guard_checks(tree)] == tested_at
    xp = np.pad(f64(x), ((0, 0), (padding, padding), (padding, padding)))
    windows = np.lib.stride_tricks.sliding_window_view(xp, (window, window), axis=(1, 2))
    got = t.compile(tree)(ir.lower(t.node)[1])
    ref = np.einsum("cyzab,ocab->yzo", windows, f64(f))
    assert np.abs(got - ref).max() / np.abs(ref).max() < 1e-5


@pytest.mark.parametrize("make", [rowsum_exp, colsum_exp])
def test_a_vector_loop_with_two_tail_limits_tested_at_two_loops_runs_no_lane_past_either(rng, make):
    """Found by the slow schedule fuzzer: a vectorized loop whose two tail limits are tested once at two
    different loops above it counted as full in the copy where only the outer one held, so the sum over
    5 rows wrote past its 1-element result (rowsum) or added lanes past the rows (colsum, error 0.34)."""
    case = make(rng, 5, 1, np.float64)
    tensor = case.make()
    steps = [("split", "m", 4), ("split", "m.0", 1), ("split", "m.1", 3),
             ("reorder", "m.0.0", "m.1.0", "m.0.1", "n", "m.1.1"), ("vectorize", "m.1.1")]
    tree = apply_steps(tensor.loop_tree(), [(*step, {"stage": "t0"}) for step in steps])
    assert "while m.1.1 + 4*m.0.0 + 4*m.0.1 + 3*m.1.0 < 5 and m.1.1 + 3*m.1.0 < 4  [vectorize]" in str(tree)
    case.check(run_guarded(tensor, tree, rng).value)
