"""GPU code generation: PTX structure (launches, guards, shared memory, barriers, vector loads) on
any machine, and loops bound to GPU axes run as plain loops on the CPU."""
import re

import numpy as np
import pytest

import looptool as lt
from looptool.codegen import gpu
from tests.gpu_helpers import k_across_blocks, matmul, register_tiles, softmax_rows, tiled
from tests.gpu_host import run_tree
from tests.helpers import assert_close


def test_ptx_has_one_entry_per_root_nest_with_guards_and_global_memory(rng):
    c, _ = matmul(rng, 50, 32, 70)
    module = gpu.generate(tiled(c.loop_tree()), "sm_90")
    assert module.launches[0].grid == (3, 4, 1) and module.launches[0].block == (32, 4, 1)
    ptx = module.ptx
    assert ".target sm_90" in ptx and ".visible .entry looptool_k0(" in ptx and ".maxntid 32, 4, 1" in ptx
    for register in ("%ctaid.x", "%ctaid.y", "%tid.x", "%tid.y"):
        assert register in ptx
    assert re.search(r"ld\.global(\.nc)?\.b32", ptx) and re.search(r"st\.global\.b32", ptx)
    assert re.search(r"fma\.rn\.f32", ptx)
    assert "setp" in ptx  # tails of 50 and 70 are guarded


def test_root_stages_are_separate_launches_and_softmax_ptx_is_arch_specific(rng):
    x = lt.Tensor(rng.standard_normal((40, 24)).astype(np.float32)).to(*lt.symbols("m n"))
    m, n = lt.symbols("m n")
    e = (x - x.max(n)).exp()
    sm = e / e.sum(n)
    tree = sm.loop_tree().split("m", 8, stage="t2").bind("m.0", "block.x", stage="t2").bind("m.1", "thread.x", stage="t2")
    module = gpu.generate(tree, "sm_80")
    assert [k.name for k in module.launches] == ["looptool_k0", "looptool_k1", "looptool_k2"]
    assert ".target sm_80" in module.ptx
    assert module.launches[2].grid == (5, 1, 1) and module.launches[2].block == (8, 1, 1)


@pytest.mark.parametrize("arch, programmatic", [("sm_90", True), ("sm_80", False)])
def test_on_hopper_the_kernel_after_a_fill_is_launched_programmatically_and_waits_for_it(rng, arch, programmatic):
    """Split-k's parts added into a zeroed result: on sm_90 the fill lets the product start as soon as all its
    blocks have (launch_dependents), and the product, launched programmatically, waits for it first; on sm_80
    neither. Kernels after other kernels (a softmax's three) are launched plainly."""
    c, _ = matmul(rng, 20, 64, 16)
    module = gpu.generate(k_across_blocks(c.loop_tree()), arch)
    assert len(module.launches) == 2 and [launch.programmatic for launch in module.launches] == [False, programmatic]
    fill, product = (re.findall(r"griddepcontrol\.\w+", kernel) for kernel in module.ptx.split(".entry ")[1:])
    assert (fill, product) == ((["griddepcontrol.launch_dependents"], ["griddepcontrol.wait"]) if programmatic
                               else ([], []))
    x = lt.Tensor(rng.standard_normal((40, 24)).astype(np.float32)).to(*lt.symbols("m n"))
    m, n = lt.symbols("m n")
    e = (x - x.max(n)).exp()
    tree = (e / e.sum(n)).loop_tree().split("m", 8, stage="t2").bind("m.0", "block.x", stage="t2") \
        .bind("m.1", "thread.x", stage="t2")
    softmax = gpu.generate(tree, arch)
    assert len(softmax.launches) == 3 and not any(launch.programmatic for launch in softmax.launches)
    assert "griddepcontrol" not in softmax.ptx


def test_bound_loops_run_as_plain_loops_on_the_cpu(rng):
    c, ref = matmul(rng, 37, 29, 41)
    tree = tiled(c.loop_tree())
    assert tree.check() == (True, "legal")
    assert_close(c.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(c, tree), ref, 1e-5)
    assert "[thread.x]" in str(tree) and "[block.y]" in str(tree)


def test_reductions_bound_to_threads_are_combined_through_shared_memory(rng):
    sm, tree, ref = softmax_rows(rng)
    assert tree.check() == (True, "legal")
    assert_close(sm.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(sm, tree), ref, 1e-5)
    ptx = gpu.generate(tree, "sm_90").ptx
    assert ".shared" in ptx and "bar.sync" in ptx


def test_unknown_axis_and_oversized_blocks_are_refused(rng):
    c, _ = matmul(rng)
    with pytest.raises(ValueError, match="unknown GPU axis 'warp.x'"):
        c.loop_tree().bind("m", "warp.x")
    big = c.loop_tree().reorder("m", "n", "k").bind("m", "thread.y").bind("n", "thread.x")
    with pytest.raises(ValueError, match="1024-thread limit"):
        gpu.generate(big, "sm_90")


def test_parallel_annotation_is_refused_on_the_gpu(rng):
    c, _ = matmul(rng)
    with pytest.raises(ValueError, match="bind it to blocks or threads"):
        gpu.generate(c.loop_tree().parallel("m"), "sm_90")


def test_cache_write_keeps_a_register_tile_per_thread_across_the_k_loop(rng):
    c, ref = matmul(rng, 100, 72, 136)   # tails in both pure dims
    tree = register_tiles(c)
    assert tree.check() == (True, "legal")
    assert "t0.acc[m, n] += (in0.t0.acc[k, m] * in1.t0.acc[k, n])" in str(tree)
    slices = tree.thread_slices
    assert set(slices) == {"t0.acc"} and dict(slices["t0.acc"].coeffs) == {"thread.x": 4, "thread.y": 256}
    assert_close(c.numpy(tree), ref, 1e-5)
    assert_close(lt.interpret(c, tree), ref, 1e-5)
    ptx = gpu.generate(tree, "sm_90").ptx
    assert ".local" not in ptx                      # accumulators never leave registers
    assert re.search(r"ld\.global\.nc\.v4\.[bf]32", ptx) and re.search(r"st\.global\.v4\.[bf]32", ptx)
    assert re.search(r"ld\.shared\.v4\.[bf]32", ptx)
    assert gpu.generate(tree, "sm_90", aligned_params=False).aligned == ()
    assert set(gpu.generate(tree, "sm_90").aligned) == {"in0", "in1", "t0"}


def test_independent_block_level_nests_share_one_barrier(rng):
    c, _ = matmul(rng, 64, 16, 64)
    llvm_ir = gpu.generate(register_tiles(c, unroll_k=False), "sm_90").llvm_ir
    # inside the k loop: both copies, one barrier, the products, one barrier that ends the body
    # (none around the accumulators: each thread has its own)
    assert llvm_ir.count("call void @\"llvm.nvvm.barrier0\"()") == 2


def test_a_thread_tile_bound_differently_where_it_is_read_lives_in_shared_memory(rng):
    c, ref = matmul(rng, 32, 16, 32)
    tree = c.loop_tree().cache_write().split("m", 16).split("n", 16) \
        .reorder("m.0", "n.0", "m.1", "n.1").bind("m.0", "block.y").bind("n.0", "block.x") \
        .bind("m.1", "thread.x").bind("n.1", "thread.y").place("t0.acc", "t0", 2) \
        .bind("m.1", "thread.y", stage="t0.acc").bind("n.1", "thread.x", stage="t0.acc")
    assert tree.thread_slices == {} and tree.check() == (True, "legal")
    assert_close(c.numpy(tree), ref, 1e-5)
    assert ".shared" in gpu.generate(tree, "sm_90").ptx


@pytest.mark.parametrize("dtype", [lt.float16, lt.bfloat16], ids=str)
def test_half_precision_inputs_move_16_bits_and_compute_in_float32(rng, dtype):
    c, ref = matmul(rng, 64, 32, 48, dtype)
    tree = register_tiles(c)
    ptx = gpu.generate(tree, "sm_90").ptx
    assert re.search(r"ld\.global\.nc\.v4\.b16", ptx)                     # 4 half elements, 8 bytes
    assert re.search(r"st\.shared(\.v\d)?\.b16", ptx) and re.search(r"ld\.shared(\.v\d)?\.b16", ptx)
    assert re.search(r"fma\.rn\.f32", ptx) and re.search(r"st\.global\.v4\.b32", ptx)   # float32 out
    if dtype == lt.float16:
        assert "cvt.f32.f16" in ptx
    else:                                                        # bfloat16: its bits are a float32's upper half
        assert "cvt.f32.f16" not in ptx and re.search(r"shl\.b32\s+%r\d+, %r\d+, 16;", ptx)
    assert_close(c.numpy(tree), ref, 1e-5)                       # the same schedule, run on the CPU


@pytest.mark.parametrize("dtype", [lt.float16, lt.bfloat16], ids=str)
def test_half_precision_results_and_shared_memory_reductions_in_ptx(rng, dtype):
    sm, tree, ref = softmax_rows(rng, dtype=dtype)
    rounded = sm.astype(dtype)                      # the rounding joins the last stage: no new stage
    tree = rounded.loop_tree(tree.schedule.to_json())
    assert str(tree).startswith(f"in0: {dict(float16='f16', bfloat16='bf16')[dtype.name]}[6, 40] input")
    assert tree.check() == (True, "legal")
    ptx = gpu.generate(tree, "sm_90").ptx
    assert ".shared" in ptx and "bar.sync" in ptx
    assert re.search(r"st\.global\.b16", ptx)                   # the result stored as 16 bits
    assert_close(lt.interpret(rounded, tree).astype(np.float64), ref, 2.0 ** -7)


def test_a_vectorized_loop_inside_a_combined_reduction_adds_into_the_threads_partial(rng):
    """Found by the GPU random-program test: the vector path wrote each thread's lanes straight into
    the result, racing with the combine (relative error 0.45 on an H100)."""
    x = rng.standard_normal((37, 12)).astype(np.float32)
    d1, d0 = lt.symbols("d1 d0")
    total = lt.Tensor(x).to(d1, d0).min(d1, d0)
    tree = total.loop_tree().split("d0", 4).vectorize("d0.1").bind("d1", "thread.x")
    module = gpu.generate(tree, "sm_90")
    stores = [line for line in module.ptx.splitlines() if "st.global" in line]
    assert len(stores) == 2, stores         # the init and thread 0's fold of the total, no store per vector
    assert_close(total.numpy(tree), x.min(), 1e-6)


@pytest.mark.parametrize("n, vector", [(48, True), (47, False)])
def test_a_sum_across_blocks_is_zeroed_by_its_own_kernel_then_added_atomically(rng, n, vector):
    """Rows of 48 floats keep 16-byte vectors: red.global.add.v4.f32 (PTX 8.1 on sm_90); rows of 47 add lane
    by lane; on sm_80 every lane alone. The result is zeroed as one flat array (`whole_fill`: a 16-byte store a
    thread, the last thread the 20 * 47 % 4 elements past them, one by one). The same tree runs on the CPU
    (bound loops as plain loops)."""
    c, ref = matmul(rng, 20, 32, n)
    tree = k_across_blocks(c.loop_tree())
    assert tree.check() == (True, "legal")
    module = gpu.generate(tree, "sm_90")
    zero, product = module.ptx.split(".entry")[1:]
    assert [(launch.grid, launch.block[0]) for launch in module.launches][0] == ((1, 1, 1), gpu.FILL_THREADS)
    assert module.launches[1].grid == (20, 1, 4)
    assert "red.global.add" not in zero and "atom" not in zero
    assert (zero.count("st.global.v4.b32"), len(re.findall(r"st\.global\.(f32|b32)", zero))) == (1, 20 * n % 4)
    unaligned = gpu.generate(tree, "sm_90", aligned_params=False)          # an element a thread, no vector
    assert "st.global.v4" not in unaligned.ptx.split(".entry")[1] and "t0" not in unaligned.aligned
    assert unaligned.launches[0].grid == (-(-20 * n // gpu.FILL_THREADS), 1, 1)
    assert ("red.global.add.v4.f32" in product) == vector and (".version 8.1" in module.ptx) == vector
    assert vector or re.search(r"(atom|red)\.global\.add\.f32", product)
    assert "st.global" not in product
    assert re.search(r"(atom|red)\.global\.add\.f32", gpu.generate(tree, "sm_80").ptx)
    assert_close(c.numpy(tree), ref, 1e-5)


def test_a_zeroing_fill_stores_the_elements_past_its_whole_vectors_once(rng):
    """21 x 47 results: 987 floats, 246 16-byte vectors and 3 elements past them, which the one thread at the
    vectors' end stores (threads past it store nothing). Run on this CPU (`tests.gpu_host`) on a result that
    starts as NaN, the atomic adds then give the product."""
    c, ref = matmul(rng, 21, 32, 47)
    tree = k_across_blocks(c.loop_tree())
    module = gpu.generate(tree, "sm_90")
    zero = module.ptx.split(".entry")[1]
    assert (zero.count("st.global.v4.b32"), len(re.findall(r"st\.global\.(f32|b32)", zero))) == (1, 3)
    assert re.search(r"setp\.(eq|ne)\.[bsu]64\s+%p\d+, %rd\d+, 984;", zero)        # the thread at element 984
    assert_close(run_tree(c, tree, module), ref, 1e-5)


@pytest.mark.parametrize("arch, hardware", [("sm_90", True), ("sm_80", True), ("sm_75", False)])
def test_bfloat16_results_are_rounded_by_the_hardware_from_sm_80(rng, arch, hardware):
    """`cvt.rn.bf16x2.f32` (two lanes an instruction) or `cvt.rn.bf16.f32` from sm_80, the integer rounding
    (9 instructions a value) before; either way ties go to even, as ml_dtypes rounds (run on this CPU by
    tests.gpu_host, which does the hardware's rounding in integers)."""
    x = rng.standard_normal((16, 64)).astype(np.float32)
    x[0, :5] = [1.00390625, 1.01171875, -3.3895314e38, 1e-40, np.inf]   # ties to even either way, the largest,
    t = lt.Tensor(x).to(*lt.symbols("m n"))                                # a subnormal, infinity
    y = t.astype(lt.bfloat16)
    tree = y.loop_tree().split("n", 4).vectorize("n.1").bind("m", "block.x").bind("n.0", "thread.x")
    module = gpu.generate(tree, arch)
    assert ("cvt.rn.bf16x2.f32" in module.ptx) == hardware and ("32767" in module.llvm_ir) != hardware
    expected = x.astype(lt.bfloat16)
    assert np.array_equal(run_tree(y, tree, module).view(np.uint16), expected.view(np.uint16))
