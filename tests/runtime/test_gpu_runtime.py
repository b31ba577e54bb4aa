"""The GPU runtime: the default GPU schedule on any machine; launching kernels where a GPU is
present (marked `gpu`, deselected by default: run with -m gpu)."""
import dataclasses
import threading
import types

import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.autoschedule import gpu_rules
from looptool.codegen import gpu as codegen_gpu
from looptool.runtime import gpu
from tests.gpu_helpers import cupy_or_skip, k_across_blocks, matmul, register_tiles, softmax_rows, tiled
from tests.helpers import assert_close, row_softmax, scaled_layer_norm


def test_the_default_gpu_schedule_gives_every_stage_blocks_and_threads(rng):
    sm, _, ref = softmax_rows(rng, rows=12, cols=300)
    program = sm.loop_tree().program
    tree = gpu_rules.default_gpu_tree(program)
    assert tree.check() == (True, "legal")
    assert str(tree).count("[thread.x]") == 3 and str(tree).count("[block.x]") == 3
    assert_close(lt.interpret(sm, tree), ref, 1e-5)


def test_an_untuned_float32_contraction_gets_register_tiles_with_a_transposed_ahead(rng):
    """A is transposed ahead (a kernel of its own) where a block walks 1024 of k or more; a shorter k is copied
    as stored, one kernel."""
    c, ref = matmul(rng, 148, 72, 200)        # 12 blocks of 64 x 64 on 108 SMs: tails in every dim, whole vectors
    tree = gpu.automatic_tree(c.loop_tree().program, "sm_80")
    assert len(tree.root) == 1 and "in0.t0.acc[m, k] = in0[m, k]" in str(tree) and "[pipeline.2.0]" in str(tree)
    assert "t0.acc: f32[64, 64] local" in str(tree) and tree.check() == (True, "legal")
    assert_close(lt.interpret(c, tree), ref, 1e-5)
    long, _ = matmul(rng, 148, 1024, 200)
    tree = gpu.automatic_tree(long.loop_tree().program, "sm_80")
    assert len(tree.root) == 2 and "in0.t0[k, m] = in0[m, k]" in str(tree) and tree.check() == (True, "legal")


@pytest.mark.parametrize("arch, instruction", [("sm_90", "wgmma.m64n"), ("sm_80", "mma.m16n8k16.")])
def test_an_untuned_half_precision_contraction_runs_on_tensor_cores(rng, arch, instruction):
    c, _ = matmul(rng, 256, 128, 256, dtype=lt.bfloat16)
    tree = gpu.automatic_tree(c.loop_tree().program, arch)
    assert f"[{instruction}" in str(tree) and tree.check() == (True, "legal")


def test_programs_no_template_fits_get_the_rules_of_the_gpu_scheduler(rng):
    small, small_ref = matmul(rng, 64, 16, 48)            # smaller than one float32 block tile
    sm, _, sm_ref = softmax_rows(rng, rows=12, cols=300)
    for tensor, ref in ((small, small_ref), (sm, sm_ref)):
        tree = gpu.automatic_tree(tensor.loop_tree().program, "sm_90")
        assert "[thread.x]" in str(tree) and "H100" in tree.explain() and tree.check() == (True, "legal")
        assert_close(tensor.numpy(tree), ref, 1e-5)


@pytest.mark.gpu
def test_an_untuned_matmul_runs_its_template_on_the_gpu(rng):
    cp = cupy_or_skip()
    c, ref = matmul(rng, 300, 200, 260)
    assert_close(cp.asnumpy(c.cuda()), ref, 1e-5)
    assert len(gpu.kernel_for(gpu.automatic_tree(c.loop_tree().program)).module.launches) == 1     # (A copied as stored)


@pytest.mark.gpu
def test_matmul_runs_on_the_gpu_and_writes_every_element(rng):
    cp = cupy_or_skip()
    c, ref = matmul(rng, 50, 33, 70)
    got = c.cuda(tiled(c.loop_tree()))
    assert isinstance(got, cp.ndarray)
    assert_close(cp.asnumpy(got), ref, 1e-5)


@pytest.mark.gpu
def test_softmax_with_combined_reductions_runs_on_the_gpu(rng):
    cp = cupy_or_skip()
    sm, tree, ref = softmax_rows(rng, rows=37, cols=1000, threads=128)
    assert_close(cp.asnumpy(sm.cuda(tree)), ref, 1e-5)


@pytest.mark.gpu
def test_long_rows_taken_in_turn_by_their_blocks_run_on_the_gpu(rng):
    """34 rows of 40001 with an L2 of 1 MiB (70 % of it holds 4 rows): 4 blocks of 9 rows, the last block's 7 under
    a tail."""
    cp = cupy_or_skip()
    sm, ref = row_softmax(rng.standard_normal((34, 40001)).astype(np.float32))
    small_l2 = dataclasses.replace(gpu.gpu_target(), l2_bytes=1 << 20)
    tree = gpu_rules.gpu_tree(ir.lower(sm.node)[0], small_l2)
    assert "its blocks take 9 rows each in turn" in tree.explain()
    assert_close(cp.asnumpy(sm.cuda(tree)), ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols, block", [(1001, 48, (16, 16, 1)), (3, 33, (16, 3, 1)), (20_001, 100, (32, 8, 1)),
                                               (777, 127, (32, 8, 1)), (5, 64, (16, 5, 1)), (1001, 300, (32, 8, 1))])
def test_rows_a_warp_each_several_a_block_run_on_the_gpu(rng, rows, cols, block):
    """Softmax and layer norm over rows of 33-511: a warp a row (up to 64: half a warp, two rows a warp, each
    half's shuffles naming its own lanes), combined by shuffles with no barrier, the lanes' short walks predicated
    (rows of 100: lanes 0-3 four elements, the rest three); a tail of rows (1001 rows of 48: the last warp's
    second half has no row)."""
    cp = cupy_or_skip()
    taken = "a warp a row" if block[0] == 32 else "16 lanes a row (2 rows a warp)"
    for tensor, ref in (row_softmax(rng.standard_normal((rows, cols)).astype(np.float32)),
                        scaled_layer_norm(rng, rows, cols)):
        kernel = gpu.GpuKernel(gpu.automatic_tree(ir.lower(tensor.node)[0]))
        assert taken in kernel.tree.explain() and kernel.module.launches[0].block == block
        assert_close(cp.asnumpy(tensor.cuda()), ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rows, cols", [(100_001, 31), (1001, 17), (300, 7)])
def test_short_rows_staged_through_shared_memory_run_on_the_gpu(rng, rows, cols):
    """Rows with no whole vectors, 128 a block through shared memory; the last block's rows under a tail."""
    cp = cupy_or_skip()
    sm, ref = row_softmax(rng.standard_normal((rows, cols)).astype(np.float32))
    assert "walks n in shared memory" in gpu.automatic_tree(ir.lower(sm.node)[0]).explain()
    assert_close(cp.asnumpy(sm.cuda()), ref, 1e-5)


def test_a_module_loaded_in_the_background_is_waited_for_when_its_kernels_are_first_needed(rng, monkeypatch):
    """`load_in_background` (an attention head's weights while its weighted sum is generated): the driver's load
    runs in a thread of its own on the caller's device; `loaded` waits for it, and raises what the load raised."""
    devices, threads = [], []
    runtime = types.SimpleNamespace(getDevice=lambda: 3, setDevice=devices.append)
    monkeypatch.setattr(gpu, "cupy", lambda: types.SimpleNamespace(cuda=types.SimpleNamespace(runtime=runtime)))

    def load(module):
        threads.append(threading.current_thread().name)
        if not module.launches[0].block[0] % 2:
            raise RuntimeError("CUDA_ERROR_INVALID_PTX")
        return ("loaded", module.launches)
    monkeypatch.setattr(gpu, "load_module", load)
    i, = lt.symbols("i")
    t = lt.Tensor(rng.standard_normal(100).astype(np.float32)).to(i) * 2.0
    for threads_a_block, result in ((25, "loaded"), (32, RuntimeError)):
        tree = t.loop_tree().split("i", threads_a_block).bind("i.0", "block.x").bind("i.1", "thread.x")
        program, module = tree.program, codegen_gpu.generate(tree, "sm_90")
        runner = gpu.ModuleRunner(module, gpu.input_specs(program), gpu.scratch_specs(tree), program.output.name,
                                  lambda: module)
        runner.load_in_background()
        if result == "loaded":
            assert runner.loaded() == ("loaded", module.launches) and runner.loaded() is runner.loaded()
        else:
            with pytest.raises(RuntimeError, match="CUDA_ERROR_INVALID_PTX"):
                runner.loaded()
    assert devices == [3, 3] and all(name.startswith("looptool-gpu-load") for name in threads)


@pytest.mark.gpu
def test_gpu_inputs_stay_on_the_device(rng):
    cp = cupy_or_skip()
    x = cp.asarray(rng.standard_normal(1000).astype(np.float32))
    i, = lt.symbols("i")
    t = lt.Tensor(x).to(i)
    y = (t * t + 1.0).relu()
    tree = y.loop_tree().split("i", 128).bind("i.0", "block.x").bind("i.1", "thread.x")
    assert_close(cp.asnumpy(y.cuda(tree)), np.maximum(cp.asnumpy(x).astype(np.float64) ** 2 + 1, 0), 1e-5)
    assert_close(y.numpy(), np.maximum(cp.asnumpy(x).astype(np.float64) ** 2 + 1, 0), 1e-5)


@pytest.mark.gpu
def test_register_tiles_run_on_the_gpu_also_on_unaligned_inputs(rng):
    cp = cupy_or_skip()
    a = rng.standard_normal((100, 72)).astype(np.float32)
    b = rng.standard_normal((72, 136)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    base = cp.zeros(100 * 72 + 1, dtype=np.float32)
    base[1:] = cp.asarray(a).ravel()
    offset = base[1:].reshape(100, 72)                      # starts 4 bytes into its allocation
    assert offset.data.ptr % 16 == 4
    ref = a.astype(np.float64) @ b
    for a_dev in (cp.asarray(a), offset):
        c = (lt.Tensor(a_dev).to(sm, sk) * lt.Tensor(cp.asarray(b)).to(sk, sn)).sum(sk)
        out = c.cuda(register_tiles(c))
        assert_close(cp.asnumpy(out), ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [lt.float16, lt.bfloat16], ids=str)
def test_half_precision_matmul_runs_on_the_gpu_and_rounds_its_result(rng, dtype):
    cp = cupy_or_skip()
    c, ref = matmul(rng, 100, 72, 136, dtype)
    tree = register_tiles(c)
    got = c.cuda(tree)
    assert isinstance(got, cp.ndarray) and got.dtype == np.float32
    assert_close(cp.asnumpy(got), ref, 1e-5)
    rounded = c.astype(dtype)
    out = rounded.cuda(rounded.loop_tree(tree.schedule.to_json()))
    host = gpu.to_host(out)
    assert host.dtype == dtype
    assert_close(host.astype(np.float64), ref, 2.0 ** -7)


@pytest.mark.gpu
def test_bfloat16_arrays_come_in_and_go_out_through_pytorch(rng):
    cupy_or_skip()
    torch = pytest.importorskip("torch")
    a = rng.standard_normal((64, 32)).astype(lt.bfloat16)
    b = rng.standard_normal((32, 48)).astype(lt.bfloat16)
    ta = torch.from_numpy(a.view(np.int16)).view(torch.bfloat16).cuda()
    tb = torch.from_numpy(b.view(np.int16)).view(torch.bfloat16).cuda()
    sm, sk, sn = lt.symbols("m k n")
    x = lt.Tensor(ta).to(sm, sk)
    assert x.dtype == lt.bfloat16
    c = (x * lt.Tensor(tb).to(sk, sn)).sum(sk).astype(lt.bfloat16)
    tree = tiled(c.loop_tree(), stage="t0")          # t0: the float32 sum; t1 rounds it to bfloat16
    out = c.cuda(tree)
    assert isinstance(out, gpu.BFloat16Array) and out.shape == (64, 48)
    back = out.to_torch()
    assert back.dtype == torch.bfloat16 and back.is_cuda
    ref = torch.matmul(ta.float(), tb.float()).cpu().double().numpy()
    assert_close(back.float().cpu().double().numpy(), ref, 2.0 ** -7)
    assert np.array_equal(out.get(), c.numpy(tree))     # the CPU runs the same schedule


@pytest.mark.gpu
def test_float16_cupy_arrays_in_and_out(rng):
    cp = cupy_or_skip()
    x = cp.asarray(rng.standard_normal(1000).astype(np.float16))
    i, = lt.symbols("i")
    y = (lt.Tensor(x).to(i) * 2.0 + 1.0).astype(lt.float16)
    tree = y.loop_tree().split("i", 128).bind("i.0", "block.x").bind("i.1", "thread.x")
    got = y.cuda(tree)
    assert isinstance(got, cp.ndarray) and got.dtype == np.float16
    assert np.array_equal(cp.asnumpy(got), y.numpy())


@pytest.mark.gpu
def test_repeated_cuda_calls_see_host_arrays_changed_in_place_and_strided_views(rng):
    """A `.cuda()` call is prepared once per graph; host inputs are still copied at every call."""
    cp = cupy_or_skip()
    base = rng.standard_normal((6, 51)).astype(np.float32)
    x = base[:, :50]                                   # a strided view: its row stride stays 51
    m, n = lt.symbols("m n")
    total = lt.Tensor(x).to(m, n).sum(n)
    assert_close(cp.asnumpy(total.cuda()), x.astype(np.float64).sum(1), 1e-5)
    base *= 2
    assert_close(cp.asnumpy(total.cuda()), x.astype(np.float64).sum(1), 1e-5)
    on_device = cp.asarray(base)
    again = lt.Tensor(on_device).to(m, lt.symbols("k")[0]).sum(m)
    first = cp.asnumpy(again.cuda())
    on_device *= 3
    assert_close(cp.asnumpy(again.cuda()), 3 * first, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, shape, tolerance", [(np.float32, (300, 136, 264), 1e-5),
                                                    (lt.bfloat16, (256, 128, 512), 2.0 ** -7)])
def test_a_contraction_with_its_bias_relu_and_cast_fused_runs_as_one_kernel(rng, dtype, shape, tolerance):
    """Register tiles with tails in every dim; wgmma (or mma) tiles on a size they take whole."""
    cupy_or_skip()
    rows, depth, columns = shape
    x = rng.standard_normal((rows, depth)).astype(dtype)
    w = rng.standard_normal((depth, columns)).astype(dtype)
    bias = rng.standard_normal(columns).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    y = lt.relu((lt.Tensor(x).to(m, k) * lt.Tensor(w).to(k, n)).sum(k) * 0.5 + lt.Tensor(bias).to(n)).astype(dtype)
    tree = gpu.automatic_tree(y.loop_tree().program)
    assert "fused into the contraction's write-back" in tree.explain()
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64) * 0.5 + bias, 0)
    assert_close(gpu.to_host(y.cuda()).astype(np.float64), ref, tolerance)


def test_a_tree_from_loop_tree_runs_on_the_program_it_was_made_on(rng):
    """`c.loop_tree()` shows the CPU's lowering (attention's exp a stage of its own); a schedule made
    on it is run on that program, while the automatic one runs on the GPU's (the softmax inlined)."""
    q, k, v = (rng.standard_normal((40, 8)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d)
    e = (scores - scores.max(j)).exp()
    out = (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j)
    shown = out.loop_tree()
    program, arrays = gpu.lowered_for(out.node, shown)
    assert program == shown.program and len(arrays) == 3
    inlined, _ = gpu.lowered_for(out.node)
    assert len(inlined.stages) < len(shown.program.stages)
    assert gpu.lowered_for(out.node, gpu.automatic_tree(inlined, "sm_90"))[0] == inlined


@pytest.mark.gpu
def test_an_attention_head_runs_on_the_gpu_under_a_schedule_made_on_its_loop_tree(rng):
    cp = cupy_or_skip()
    q, k, v = (rng.standard_normal((40, 8)).astype(np.float32) for _ in range(3))
    i, j, d = lt.symbols("i j d")
    scores = (lt.Tensor(q).to(i, d) * lt.Tensor(k).to(j, d)).sum(d)
    e = (scores - scores.max(j)).exp()
    out = (e / e.sum(j) * lt.Tensor(v).to(j, d)).sum(j)
    tree = gpu_rules.default_gpu_tree(out.loop_tree().program)
    s = q.astype(np.float64) @ k.T.astype(np.float64)
    p = np.exp(s - s.max(1, keepdims=True))
    assert_close(cp.asnumpy(out.cuda(tree)), p / p.sum(1, keepdims=True) @ v, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("on_device", [False, True])
def test_a_flattened_pointwise_chain_returns_its_result_in_the_tensors_shape(rng, on_device):
    cp = cupy_or_skip()
    data = rng.standard_normal((3, 100, 301)).astype(np.float32)
    b, m, n = lt.symbols("b m n")
    x = lt.Tensor(cp.asarray(data) if on_device else data).to(b, m, n)
    got = (x * 2.0).exp().cuda()
    assert got.shape == (3, 100, 301) and got.flags.c_contiguous
    assert_close(cp.asnumpy(got), np.exp(2.0 * data.astype(np.float64)), 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("on_device", [False, True])
def test_means_over_an_arrays_innermost_dims_run_on_their_merged_rows(rng, on_device):
    """A global pool (h, w) and a batch norm's means (b, h, w) of an NCHW array: h and w merged into one reduced
    dim, the input viewed flat (`ir.merged_reduced_pair`), the result in the tensor's shape."""
    cp = cupy_or_skip()
    data = rng.standard_normal((4, 33, 17, 19)).astype(np.float32)
    b, c, h, w = lt.symbols("b c h w")
    x = lt.Tensor(cp.asarray(data) if on_device else data).to(b, c, h, w)
    for reduced, axes in (((h, w), (2, 3)), ((b, h, w), (0, 2, 3))):
        got = x.mean(*reduced).cuda()
        assert got.shape == data.mean(axes).shape
        assert_close(cp.asnumpy(got), data.astype(np.float64).mean(axes), 1e-5)
    centred = x - x.mean(h, w)                                  # an instance norm: rows of h * w, one kernel
    got = (centred / lt.sqrt((centred * centred).mean(h, w) + 1e-5)).cuda()
    d = data.astype(np.float64) - data.astype(np.float64).mean((2, 3), keepdims=True)
    assert got.shape == data.shape
    assert_close(cp.asnumpy(got), d / np.sqrt((d * d).mean((2, 3), keepdims=True) + 1e-5), 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, tolerance", [(np.float32, 1e-5), (lt.bfloat16, 1e-5)], ids=["float32", "bfloat16"])
@pytest.mark.parametrize("x_shape, channels, stride", [((2, 16, 14, 14), 64, 1), ((3, 5, 13, 11), 7, 2)])
def test_a_convolution_runs_as_a_gather_and_a_matrix_product(rng, dtype, tolerance, x_shape, channels, stride):
    cupy_or_skip()
    from tests.ir.test_im2col import conv
    y, ref = conv(rng, x_shape, channels, stride, dtype=dtype)
    trees = gpu.planned_trees(y.node)
    if channels == 64:          # a product 64 wide gets a matrix template in either dtype
        assert len(trees) == 2 and trees[0].program.output.dims == ("c", "kh", "kw", "n", "oh", "ow")
    got = gpu.to_host(y.cuda())
    assert got.shape == ref.shape
    assert_close(got, ref, tolerance)
    assert_close(gpu.to_host(y.cuda()), ref, tolerance)          # the prepared call again


@pytest.mark.parametrize("channels, programs", [(40, 1), (64, 2)])
def test_a_float32_convolution_too_narrow_for_the_wide_blocks_runs_as_its_own_program(rng, channels, programs):
    """40 output channels would put the gathered product on 128 x 32 blocks, slower than the convolution's own
    program (H200: 6x40x33x33 0.76x torch, 0.66-0.75x gathered); 64 keep the gather and the product. Planned for
    an H100 on any machine (`planned_trees(node, arch)`)."""
    from tests.ir.test_im2col import conv
    y, _ = conv(rng, (2, 16, 14, 14), channels)
    assert len(gpu.planned_trees(y.node, "sm_90")) == programs


def test_the_plans_of_another_architecture_need_no_gpu():
    """`planned_trees(node, arch)`: what `.cuda()` would run on that architecture's reference part, split-k's parts
    cut for its SMs; with no architecture named and no GPU, an error naming what is missing."""
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(np.ones((32, 4096), np.float32)).to(sm, sk) * lt.Tensor(np.ones((4096, 4096), np.float32)).to(sk, sn)).sum(sk)
    h100, a100 = gpu.planned_trees(c.node, "sm_90"), gpu.planned_trees(c.node, "sm_80")
    assert "split-k's 16 parts of 256 on register tiles, 32x128 a block" in h100[0].explain()
    assert "split-k's 16 parts" in a100[0].explain() and "A100" in a100[0].explain()
    try:
        gpu.device_arch()
    except (RuntimeError, ImportError):
        with pytest.raises(RuntimeError, match="CuPy|GPU"):
            gpu.planned_trees(c.node)


@pytest.mark.gpu
@pytest.mark.parametrize("a_transposed", [False, True])
def test_a_float32_matmul_too_small_to_fill_the_gpu_runs_split_along_k(rng, a_transposed):
    cp = cupy_or_skip()
    a, b = rng.standard_normal((1000, 1500)).astype(np.float32), rng.standard_normal((1500, 777)).astype(np.float32)
    a_device = cp.asarray(a.T.copy()).T if a_transposed else cp.asarray(a)     # a strided view, not a copy
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a_device).to(sm, sk) * lt.Tensor(cp.asarray(b)).to(sk, sn)).sum(sk)
    program, _ = gpu.lowered_for(c.node)
    if gpu.gpu_target().sms > 104:          # 104 blocks of 128 x 64 leave SMs idle: k cut into parts
        assert [st.name for st in program.stages] == ["t0.part", "t0"]
        assert "adding its tile into t0 by atomic adds" in gpu.planned_trees(c.node)[0].explain()
    for _ in range(2):                      # the result zeroed again at each call
        assert_close(cp.asnumpy(c.cuda()), a.astype(np.float64) @ b, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(32, 4096, 1024), (8, 1000, 300), (45, 777, 129)])
def test_a_float32_product_of_few_rows_runs_on_short_register_tiles_in_parts(rng, m, k, n):
    """8 to 63 rows (a linear layer on a few tokens): short blocks, k cut for several blocks an SM, tails of
    m, n and k included."""
    cp = cupy_or_skip()
    a, b = rng.standard_normal((m, k)).astype(np.float32), rng.standard_normal((k, n)).astype(np.float32)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(cp.asarray(a)).to(sm, sk) * lt.Tensor(cp.asarray(b)).to(sk, sn)).sum(sk)
    assert "rows short" in "\n".join(tree.explain() for tree in gpu.planned_trees(c.node))
    for _ in range(2):                      # the result zeroed again at each call
        assert_close(cp.asnumpy(c.cuda()), a.astype(np.float64) @ b, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("m, k, n", [(24, 4096, 1024), (8, 1024, 300), (48, 2048, 136)])
def test_a_bfloat16_product_of_few_rows_runs_in_parts_on_padded_tensor_core_tiles(rng, m, k, n):
    cp = cupy_or_skip()
    a, b = rng.standard_normal((m, k)).astype(lt.bfloat16), rng.standard_normal((k, n)).astype(lt.bfloat16)
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(a).to(sm, sk) * lt.Tensor(b).to(sk, sn)).sum(sk)
    for _ in range(2):
        assert_close(cp.asnumpy(c.cuda()), a.astype(np.float64) @ b.astype(np.float64), 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype, n", [(np.float32, 48), (np.float32, 47), (np.float64, 48)])
def test_a_sum_whose_k_runs_across_blocks_adds_into_a_result_zeroed_at_each_call(rng, dtype, n):
    """Vectors of 4 float32 lanes by red.global.add.v4.f32, rows of 47 lane by lane, float64 by atom.add.f64."""
    cp = cupy_or_skip()
    c, ref = matmul(rng, 20, 64, n, dtype)
    tree = k_across_blocks(c.loop_tree())
    for _ in range(2):
        assert_close(cp.asnumpy(c.cuda(tree)), ref, 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("rounded", [False, True])
def test_a_half_precision_product_too_small_to_fill_the_gpu_runs_split_along_k(rng, rounded):
    """Split, the cast back to bfloat16 (an epilogue) after the parts' sum; inputs as torch tensors, whose
    bfloat16 is viewed through its bits as the parts lay it out."""
    cupy_or_skip()
    torch = pytest.importorskip("torch")
    a, b = (rng.standard_normal(shape).astype(lt.bfloat16) for shape in ((384, 4096), (4096, 520)))
    on_gpu = [torch.from_numpy(x.view(np.uint16).astype(np.int16)).view(torch.bfloat16).cuda() for x in (a, b)]
    sm, sk, sn = lt.symbols("m k n")
    c = (lt.Tensor(on_gpu[0]).to(sm, sk) * lt.Tensor(on_gpu[1]).to(sk, sn)).sum(sk)
    c = c.astype(lt.bfloat16) if rounded else c
    program, _ = gpu.lowered_for(c.node)
    if gpu.gpu_target().sms > 15:           # 3 x 5 blocks of 128 x 128 (or fewer, wider) leave SMs idle
        assert [st.name for st in program.stages] == ["t0.part", "t0"] + (["t1"] if rounded else [])
    got = c.cuda()
    got = got.float().cpu().numpy() if isinstance(got, torch.Tensor) else gpu.to_host(got).astype(np.float32)
    assert_close(got, a.astype(np.float64) @ b.astype(np.float64), 1e-2 if rounded else 1e-5)


@pytest.mark.gpu
@pytest.mark.parametrize("columns", [8, 40, 200])
def test_half_precision_products_narrower_than_a_block_run_on_wgmma_tiles_as_wide(rng, columns):
    cupy_or_skip()
    a = rng.standard_normal((300, 128)).astype(lt.bfloat16)
    b = rng.standard_normal((columns, 128)).astype(lt.bfloat16)
    m, k, n = lt.symbols("m k n")
    got = gpu.to_host((lt.Tensor(a).to(m, k) * lt.Tensor(b).to(n, k)).sum(k).cuda())
    assert_close(got, a.astype(np.float64) @ b.astype(np.float64).T, 1e-5)
