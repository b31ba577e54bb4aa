"""Dynamic dims on the GPU (issue 28): kernels that take each dynamic dim's size as a 64-bit parameter
and a grid sized at launch. On any machine: the schedule, the PTX's size parameters, the launcher's grid
read from the size, the PTX cache's record of it. On a GPU (`-m gpu`): `.cuda()` and `lt.function` on
device arrays at many sizes of one kernel, against float64, and bad sizes refused in words."""
import ctypes
import functools
import json
import re

import numpy as np
import pytest

import looptool as lt
from looptool import ir
from looptool.autoschedule import gpu_rules
from looptool.codegen import gpu as codegen_gpu
from looptool.codegen import gpu_launch
from looptool.runtime import gpu as runtime_gpu
from looptool.runtime import ptx_cache
from looptool.runtime.cpu import lower_on_host
from tests.helpers import assert_close
from tests.runtime.test_gpu_launcher import block_of, recording_launch

b = lt.symbols("b", dynamic=True)[0]
m, k, n = lt.symbols("m k n")


def layer(rows, rng):
    x = rng.standard_normal((rows, 24)).astype(np.float32)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    return lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k)), np.maximum(x.astype(np.float64) @ w, 0)


def wide_layer(rows, rng, dtype="float32"):
    """relu(x @ w) with matrices that hold the register-tile template's block tiles (n = 200: a tail), the
    case that found register tiles cut at a dynamic size wrong on an H100."""
    x = rng.standard_normal((rows, 96)).astype(dtype)
    w = rng.standard_normal((96, 200)).astype(dtype)
    ref = np.maximum(x.astype(np.float64) @ w.astype(np.float64), 0)
    return lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k)), ref


def batched(batch, rng):
    """q . k over a dynamic batch of heads (k last in q: the template's transposed copy, batch first)."""
    q = rng.standard_normal((batch, 130, 64)).astype(np.float32)
    keys = rng.standard_normal((batch, 64, 128)).astype(np.float32)
    return (lt.Tensor(q).to(b, m, k) * lt.Tensor(keys).to(b, k, n)).sum(k), q.astype(np.float64) @ keys


def softmax(rows, rng, cols=33):
    x = rng.standard_normal((rows, cols)).astype(np.float32)
    t = lt.Tensor(x).to(b, k)
    e = (t - t.max(k)).exp()
    ref = np.exp(x.astype(np.float64) - x.max(1, keepdims=True))
    return e / e.sum(k), ref / ref.sum(1, keepdims=True)


@pytest.mark.parametrize("rows", [1, 255, 256, 1000])
def test_the_arrays_cuda_runs_on_keep_every_row_of_a_dynamic_dim(rng, rows):
    """`lowered_for` views each input as its buffer lays it out; a dynamic dim's planned extent (256) is no
    view's size: 1000 rows were viewed as their first 256 (found on an H100: the result was made for 1000
    rows on memory for 256)."""
    c, _ = layer(rows, rng)
    program, arrays = runtime_gpu.lowered_for(c.node)
    assert [a.shape for a in arrays] == [(rows, 24), (24, 40)]
    assert runtime_gpu.DynamicSizes.of_program(program, ["x", "w"]).of(arrays) == [rows]


@pytest.mark.parametrize("rows", [37, 300])
def test_the_automatic_gpu_schedule_binds_dynamic_loops_to_blocks_and_says_why(rng, rows):
    """Over 256 rows too: a clamped read past the row's tail once clamped the row index to the dim's
    planned 256 rows, not its size (wrong results from row 256 on, found on an H100)."""
    c, ref = softmax(rows, rng, cols=3001)
    program, arrays = lower_on_host(c.node)
    tree = runtime_gpu.automatic_tree(program, "sm_90")       # the rows rule: a block a row, B blocks
    assert tree.check() == (True, "legal")
    assert "for b in 0..B  [block.x]" in str(tree) and "t2: one kernel: t0, t1.e, t1 placed in its rows" in tree.explain()
    assert "dynamic dims ['b']: their outer loops over blocks (their counts set at launch)" in tree.explain()
    assert_close(lt.Kernel(tree, 1)(arrays), ref, 1e-5)          # the tree's loops on this CPU
    clamps = re.findall(r"icmp slt i64 %\S+, (\d+)\n", codegen_gpu.generate(tree, "sm_90").llvm_ir)
    assert "255" not in clamps        # a clamped row index goes to B - 1, not to the planned 256 rows' last
    product, _ = layer(37, rng)
    tree = runtime_gpu.automatic_tree(lower_on_host(product.node)[0], "sm_90")
    assert tree.check() == (True, "legal") and "for b.0.0 in 0..ceil(B/16)  [block.x]" in str(tree)
    assert "t0: reduction along k (rows of 24, shorter than 128): a thread an output x 4 along b" in tree.explain()
    with pytest.raises(ValueError, match="runs B iterations, a number known only at run time"):
        c.loop_tree().bind("b", "thread.x", stage="t2")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_product_over_dynamic_rows_takes_the_contraction_templates_with_tails_at_the_size(rng, dtype):
    """Register tiles (float32; A transposed ahead into a temp that keeps its dynamic rows in blocks of the
    block tile's 128, so its strides stay fixed, and whose k tiles are copied whole: the last block's rows
    past B lie in the temp's memory) and wgmma tiles fed by TMA (bfloat16; the tensor maps encoded at each call's sizes) cut the dynamic rows into
    tiles of 128, the last one cut by a tail at B that every guard tests against the size the kernel takes.
    An edge tile's guards once tested the dim's planned 256 rows instead: on an H100 rows 936-959 of 1000
    were never written (the threads whose second group of rows lay past B took the edge tile, whose
    guards held nowhere)."""
    if dtype == "bfloat16":
        dtype = pytest.importorskip("ml_dtypes").bfloat16
    c, ref = wide_layer(300, rng, dtype)
    program, arrays = lower_on_host(c.node)
    tree = runtime_gpu.automatic_tree(program, "sm_90")
    assert tree.check() == (True, "legal") and "for b.0 in 0..ceil(B/128)  [block.y]" in str(tree)
    assert "< B  [unroll]" in str(tree) or "< B  [wgmma" in str(tree)
    described = "wgmma tensor-core tiles" if dtype != "float32" else "register tiles on CUDA cores"
    assert f"t0: a contraction: {described}" in tree.explain()
    assert "t1: fused into the contraction's write-back" in tree.explain()
    module = codegen_gpu.generate(tree, "sm_90")
    assert bool(module.tensor_maps) == (dtype != "float32") and ("in0.t0" in module.params) == (dtype == "float32")
    if dtype == "float32":
        assert "in0.t0: f32[96, B] temp, b in blocks of 128" in str(tree)
        assert "in0.t0.t0.acc[k, b] = in0.t0[k, b]" in str(tree) and "< B  [vectorize]" not in str(tree)
    bounds = {int(v) for v in re.findall(r"icmp slt i64 %\S+, (\d+)\n", module.llvm_ir)}
    assert not bounds & set(range(ir.REPRESENTATIVE_SIZE - 8, ir.REPRESENTATIVE_SIZE + 1))   # 256 - k: a planned bound
    assert_close(lt.Kernel(tree, 1)(arrays), ref, 1e-5)          # the tree's loops on this CPU


def test_size_classes_step_by_four_from_the_representative_size():
    assert [ir.size_class(n) for n in (1, 255, 256, 1023, 1024, 4095, 8192, 16384)] == \
        [256, 256, 256, 256, 1024, 1024, 4096, 16384]


def test_a_dynamic_dim_is_planned_on_the_gpu_at_its_size_class(rng):
    """A float32 layer of 8192 rows planned at 256 took blocks of 128x64 (32 blocks fill 132 SMs at 256
    rows) and ran at 0.87x the static kernel's 128x128 on an H200: planned at its class (4096) it takes
    the static kernel's tiles, and the kernel still runs any size (here 5 rows, on this CPU)."""
    w = rng.standard_normal((1024, 1024)).astype(np.float32)

    def planned(rows):
        x = np.ones((rows, 1024), np.float32)
        c = lt.relu((lt.Tensor(x).to(b, k) * lt.Tensor(w).to(k, n)).sum(k))
        program, _ = runtime_gpu.lowered_for(c.node)
        return dict(program.sizes)["b"].representative, runtime_gpu.automatic_tree(program, "sm_90")
    assert planned(1000)[0] == 256 and "128x64 a block" in planned(1000)[1].explain()
    representative, tree = planned(8192)
    assert representative == 4096 and "128x128 a block" in tree.explain()
    assert "for b.0 in 0..ceil(B/128)  [block.y]" in str(tree) and tree.check() == (True, "legal")
    x = rng.standard_normal((5, 1024)).astype(np.float32)
    assert_close(lt.Kernel(tree, 1)([x, w]), np.maximum(x.astype(np.float64) @ w, 0), 1e-5)
    assert runtime_gpu.planned_sizes(None, tree) == {"b": 4096}      # a given tree: the sizes it was planned at


def test_a_dynamic_batch_of_products_takes_register_tiles_on_block_z(rng):
    c, ref = batched(3, rng)
    program, arrays = lower_on_host(c.node)
    tree = runtime_gpu.automatic_tree(program, "sm_90")
    assert tree.check() == (True, "legal") and "for b in 0..B  [block.z]" in str(tree)
    assert "t0: a contraction: register tiles on CUDA cores" in tree.explain()
    assert not codegen_gpu.generate(tree, "sm_90").tensor_maps
    assert_close(lt.Kernel(tree, 1)(arrays), ref, 1e-5)


def test_the_ptx_takes_each_dynamic_size_and_the_grid_is_sized_at_launch(rng):
    c, _ = softmax(37, rng)
    program, _ = lower_on_host(c.node)
    module = codegen_gpu.generate(gpu_rules.default_gpu_tree(program), "sm_90")     # grids of ceil(B/128) too
    assert module.params[-1] == "#b" and [str(launch.grid) for launch in module.launches] == \
        ["(Size(ceil(B/128)), 1, 1)", "(Size(ceil(B/128)), 1, 1)", "(1, Size(B), 1)"]
    assert module.ptx.count(".param .u64 .ptr") == 3 * (len(module.params) - 1)     # buffers: pointers
    assert f".param .u64 looptool_k0_param_{len(module.params) - 1}\n" in module.ptx       # the size: a number
    assert runtime_gpu.size_slots(module) == {"b": len(module.params) - 1}
    assert ptx_cache.module_of(ptx_cache.fields_of(module)).launches == module.launches   # kept as sizes


@pytest.mark.parametrize("rows", [1, 128, 129, 70000])
def test_the_launcher_works_the_grid_out_from_the_size_parameter(rows):
    calls = []
    stub = recording_launch(calls)
    kernels = [gpu_launch.KernelLaunch(0x1000, (ir.Size("b", 128), 1, 1), (128, 1, 1), 0),
               gpu_launch.KernelLaunch(0x2000, (2, ir.Size("b"), 1), (64, 1, 1), 0)]
    launcher = runtime_gpu.native_launcher(kernels, 3, ctypes.cast(stub, ctypes.c_void_p).value, {"b": 2})
    block = block_of(0xAB, [11, 22, rows])
    assert launcher(ctypes.c_void_p(ctypes.addressof(block))) == 0
    assert [call[1] for call in calls] == [(-(-rows // 128), 1, 1), (2, rows, 1)]
    assert calls[0][5] == [11, 22, rows]


class FakeCupy:
    """What `ModuleRunner` asks of CuPy, without a GPU: allocations (recorded, at made-up addresses),
    the current stream, and arrays as records of their shape, dtype and memory."""

    def __init__(self):
        self.allocations = []
        self.cuda = self

    def alloc(self, nbytes):
        memory = type("Memory", (), {"ptr": 0x10000 * (1 + len(self.allocations)), "nbytes": nbytes})()
        self.allocations.append(memory)
        return memory

    def get_current_stream(self):
        return type("Stream", (), {"ptr": 0x5})()

    def ndarray(self, shape, dtype, memory=None):
        """An array record; with no memory given, allocated here, as CuPy allocates from its pool."""
        memory = memory or self.alloc(int(np.prod(shape)) * np.dtype(dtype).itemsize)
        return type("Array", (), {"shape": shape, "dtype": dtype, "data": memory})()


def test_a_module_runner_sizes_the_grid_temps_and_output_at_each_call(rng, monkeypatch):
    """The runner of a dynamic module (with the driver and CuPy stood in for): each call's sizes are read
    from the inputs, passed to the kernels after the buffers' addresses, and size the grid (worked out by
    the native launcher), the temps and the output."""
    calls, fake = [], FakeCupy()
    stub = recording_launch(calls, count=5)

    def loaded(module):
        kernels = [gpu_launch.KernelLaunch(0x1000 + i, launch.grid, launch.block, 0)
                   for i, launch in enumerate(module.launches)]
        launcher = runtime_gpu.native_launcher(kernels, len(module.params), ctypes.cast(stub, ctypes.c_void_p).value,
                                               runtime_gpu.size_slots(module))
        return runtime_gpu.LoadedModule(module, None, [], launcher)
    monkeypatch.setattr(runtime_gpu, "load_module", loaded)
    c, _ = softmax(37, rng)
    program, _ = lower_on_host(c.node)
    tree = gpu_rules.default_gpu_tree(program)         # three kernels with temps of B floats between them
    module = codegen_gpu.generate(tree, "sm_90")
    monkeypatch.setattr(runtime_gpu, "cupy", lambda: fake)
    runner = runtime_gpu.ModuleRunner(module, runtime_gpu.input_specs(program), runtime_gpu.scratch_specs(tree),
                                      program.output.name, lambda: module,
                                      runtime_gpu.DynamicSizes.of_program(program, ["x"]))
    run = runner.entry(True)
    for rows in (1, 300):
        calls.clear()
        assert runner.sizes([np.zeros((rows, 33), np.float32)]) == [rows]
        result = run([0xA00], None, [rows])
        assert (result.shape, result.dtype, result.data.nbytes) == ((rows, 33), np.dtype(np.float32), rows * 33 * 4)
        temps = [memory.nbytes for memory in fake.allocations[-2:]]    # made after the output
        assert temps == [rows * 4, rows * 4]                          # the row maxima and sums, B floats each
        assert [call[1] for call in calls] == [(-(-rows // 128), 1, 1)] * 2 + [(1, rows, 1)]
        output, *temps = fake.allocations[-3:]
        assert calls[0][5] == [0xA00, temps[0].ptr, temps[1].ptr, output.ptr, rows]     # buffers, then the size
    with pytest.raises(ValueError, match="GPU kernel input in0 expects 2 dimensions; got shape \\(33,\\)"):
        runner.sizes([np.zeros(33, np.float32)])
    with pytest.raises(ValueError, match="dynamic dim 'b' has size 70000: kernel looptool_k2 would launch 70000 "
                                         "blocks along block.y, over the GPU's 65535"):
        run([0xA00], None, [70000])


def test_a_gpu_artifact_takes_the_sizes_as_kernel_parameters(rng, tmp_path):
    """`lt.export(..., device="gpu")` of a program with a dynamic dim: the manifest names the size
    parameter after the buffers, keeps each grid extent sized at launch as [dim, divisor, planned size],
    and the shapes of the buffers a call makes by the dim's name."""
    import json
    c, _ = softmax(37, rng)
    lt.export(c, tmp_path / "softmax", device="gpu", arch="sm_90")
    manifest = json.loads((tmp_path / "softmax" / "manifest.json").read_text())
    gpu = manifest["gpu"]
    assert manifest["format_version"] == 3 and manifest["dynamic"] == [{"dim": "b", "min": 1}]
    assert gpu["params"] == ["in0", "t2", "#b"] and [launch["grid"] for launch in gpu["launches"]] == \
        [[["b", 16, 256], 1, 1]]                     # the rows rule: one kernel, half a warp a row, 16 rows a block
    assert [spec["shape"] for spec in gpu["scratch"]] == [["b", 33]]
    assert manifest["inputs"][0]["shape"] == ["b", 33]
    assert ".param .u64 looptool_k0_param_2\n" in (tmp_path / "softmax" / "kernel.ptx").read_text()


def test_a_gpu_artifact_allocates_a_temp_kept_in_blocks_by_its_blocks(rng, tmp_path):
    """The float32 layer's A transposed ahead is kept in blocks of 128 rows: the manifest gives its shape
    as ceil(B/128) blocks ('b/128'), and a loaded runner allocates that many at a call's size (not B
    blocks of 96 x 128)."""
    import json
    c, _ = wide_layer(300, rng)
    lt.export(c, tmp_path / "layer", device="gpu", arch="sm_90")
    manifest = json.loads((tmp_path / "layer" / "manifest.json").read_text())
    shapes = {spec["name"]: spec["shape"] for spec in manifest["gpu"]["scratch"]}
    assert shapes["in0.t0"] == ["b/128", 96, 128] and shapes["t1"] == ["b", 200]
    dynamic = runtime_gpu.DynamicSizes([("b", 1)], ["b", None], ["x", "w"])
    assert dynamic.at(dynamic.template(shapes["in0.t0"]), [300]) == (3, 96, 128)


@pytest.mark.gpu
def test_cuda_runs_one_kernel_at_every_size(rng):
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    for make in (layer, softmax, functools.partial(softmax, cols=3001), wide_layer,
                 functools.partial(wide_layer, dtype=bf16), batched):
        before = runtime_gpu.CACHE.misses
        for rows in (1, 5, 128, 129, 1000):
            c, ref = make(rows, rng)
            got = c.cuda()
            assert got.shape == ref.shape
            assert_close(cp.asnumpy(got), ref, 1e-5)
        assert runtime_gpu.CACHE.misses - before <= 1


@pytest.mark.gpu
def test_a_function_on_device_arrays_traces_once_for_every_size_of_a_class(rng):
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    traces = []

    @lt.function
    def blend(x: lt.In[b, k], y: lt.In[b, k], w: lt.In[k, n]):
        traces.append(x.shape)
        return ((x + y) * w).sum(k)
    w = rng.standard_normal((24, 40)).astype(np.float32)
    for rows in (3, 64, 300, 2):
        x, y = rng.standard_normal((2, rows, 24)).astype(np.float32)
        got = blend(cp.asarray(x), cp.asarray(y), cp.asarray(w))
        assert isinstance(got, cp.ndarray) and got.shape == (rows, 40)
        assert_close(cp.asnumpy(got), (x.astype(np.float64) + y) @ w, 1e-5)
        out = cp.full((rows, 40), cp.nan, dtype=cp.float32)
        assert blend(cp.asarray(x), cp.asarray(y), cp.asarray(w), out=out) is out
        assert_close(cp.asnumpy(out), (x.astype(np.float64) + y) @ w, 1e-5)
    assert len(traces) == 1
    for rows in (1500, 1024, 1025):     # size class 1024: one more kernel, planned at 1024 rows
        u, v = rng.standard_normal((2, rows, 24)).astype(np.float32)
        assert_close(cp.asnumpy(blend(cp.asarray(u), cp.asarray(v), cp.asarray(w))), (u.astype(np.float64) + v) @ w,
                     1e-5)
    assert len(traces) == 2
    with pytest.raises(ValueError, match=r"dim 'b' has size 2 in argument x .* but 1 in argument y"):
        blend(cp.asarray(x), cp.asarray(y[:1]), cp.asarray(w))
    with pytest.raises(ValueError, match=r"out must be a C-contiguous device array of shape \(2, 40\)"):
        blend(cp.asarray(x), cp.asarray(y), cp.asarray(w), out=cp.empty((3, 40), cp.float32))


@pytest.mark.gpu
def test_a_size_over_the_grid_limit_is_refused_in_words(rng):
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    x = cp.arange(140000, dtype=cp.float32).reshape(70000, 2)
    doubled = lt.Tensor(x).to(b, k) * 2.0
    program, _ = lower_on_host(doubled.node)
    rows_on_y = runtime_gpu.GpuKernel(gpu_rules.default_gpu_tree(program))       # a block a row, along y
    with pytest.raises(ValueError, match=r"dynamic dim 'b' has size 70000: kernel looptool_k0 would launch 70000 "
                                         r"blocks along block.y, over the GPU's 65535"):
        rows_on_y([x])
    assert_close(cp.asnumpy(doubled.cuda()), cp.asnumpy(x) * 2.0, 1e-6)        # automatic: 128 rows a block, on x


@pytest.mark.gpu
def test_a_loaded_gpu_artifact_runs_every_size(rng, tmp_path):
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    c, _ = layer(37, rng)
    lt.export(c, tmp_path / "layer", device="gpu")
    loaded = lt.load(tmp_path / "layer")
    _, weights = lower_on_host(c.node)[1]                      # the traced weights
    for rows in (1, 2, 37, 129, 1024):
        x = rng.standard_normal((rows, 24)).astype(np.float32)
        got = loaded(x, weights)
        assert isinstance(got, cp.ndarray) and got.shape == (rows, 40)
        assert_close(cp.asnumpy(got), np.maximum(x.astype(np.float64) @ weights, 0), 1e-5)
    with pytest.raises(lt.ArtifactError, match="dynamic dim 'b' has size 0 in input in0 .* from 1 up"):
        loaded(np.zeros((0, 24), np.float32), weights)


@pytest.mark.gpu
def test_a_loaded_bfloat16_gpu_artifact_encodes_its_tensor_maps_at_each_size(rng, tmp_path):
    from tests.gpu_helpers import cupy_or_skip
    cp = cupy_or_skip()
    bf16 = pytest.importorskip("ml_dtypes").bfloat16
    c, _ = wide_layer(300, rng, bf16)
    lt.export(c, tmp_path / "layer", device="gpu")
    loaded = lt.load(tmp_path / "layer")
    assert json.loads((tmp_path / "layer" / "manifest.json").read_text())["gpu"]["tensor_maps"]     # wgmma by TMA
    _, weights = lower_on_host(c.node)[1]
    for rows in (1, 129, 300, 1000):
        x = rng.standard_normal((rows, 96)).astype(bf16)
        got = loaded(x, weights)
        assert got.shape == (rows, 200)
        assert_close(cp.asnumpy(got), np.maximum(x.astype(np.float64) @ weights.astype(np.float64), 0), 1e-5)
