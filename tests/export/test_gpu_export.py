"""GPU artifacts (export(..., device="gpu")): the PTX of every kernel and what launching it needs,
written on any machine; loaded back and run where a GPU is present."""
import json

import numpy as np
import pytest

import looptool as lt
from looptool import runtime
from looptool.runtime import gpu as runtime_gpu
from looptool.errors import ArtifactError
from tests.codegen.test_gpu_pipeline import transposed_ahead_tiles
from tests.codegen.test_wgmma import contraction
from tests.gpu_helpers import cupy_or_skip, hopper_or_skip, matmul
from tests.helpers import assert_close
from looptool.autoschedule import gpu as templates


def test_a_two_kernel_gpu_schedule_exports_its_ptx_launches_and_temps(rng, tmp_path):
    c, _ = matmul(rng, 64, 64, 64)
    path = lt.export(c, tmp_path / "mm", transposed_ahead_tiles(c), input_names=["a", "b"], device="gpu",
                     arch="sm_80")
    manifest = json.loads((path / "manifest.json").read_text())
    assert sorted(manifest["files"]) == ["kernel.ll", "kernel.ptx", "kernel.unaligned.ptx"]
    assert manifest["target"] == {"device": "gpu", "arch": "sm_80"}
    gpu = manifest["gpu"]
    assert manifest["entry"] == [launch["name"] for launch in gpu["launches"]] and len(gpu["launches"]) == 2
    assert [launch["block"] for launch in gpu["launches"]] == [[32, 8, 1], [8, 8, 1]]
    assert gpu["buffers"] == ["in0", "in1"] and gpu["output_buffer"] == "t0" and gpu["tensor_maps"] == []
    assert {spec["name"]: spec["shape"] for spec in gpu["scratch"]} == {"in0.t0": [64, 64], "t0": [64, 64]}
    ptx = (path / "kernel.ptx").read_text()
    assert ".target sm_80" in ptx and all(f".entry {name}(" in ptx for name in manifest["entry"])
    assert "ld.global.nc.v4" in ptx and "ld.global.nc.v4" not in (path / "kernel.unaligned.ptx").read_text()


def test_a_tma_schedule_exports_its_tensor_maps_for_hopper_only(rng, tmp_path):
    c, _ = contraction(rng)
    tree = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 3, "tma")
    manifest = json.loads((lt.export(c, tmp_path / "bf16", tree, device="gpu", arch="sm_90") /
                           "manifest.json").read_text())
    assert manifest["target"] == {"device": "gpu", "arch": "sm_90a"}      # wgmma and TMA: Hopper's own PTX
    assert [(copy["source"], copy["rows"], copy["columns"]) for copy in manifest["gpu"]["tensor_maps"]] == \
        [("in0", 128, 64), ("in1", 64, 64)]
    with pytest.raises(ValueError, match="runs only on Hopper GPUs"):
        lt.export(c, tmp_path / "bf16_ampere", tree, device="gpu", arch="sm_80")


def test_a_gpu_artifact_is_checked_before_it_is_run(rng, tmp_path):
    c, _ = matmul(rng, 64, 64, 64)
    path = lt.export(c, tmp_path / "mm", transposed_ahead_tiles(c), device="gpu", arch="sm_80")
    (path / "kernel.ptx").write_text((path / "kernel.ptx").read_text().replace("fma.rn.f32", "sub.rn.f32"))
    with pytest.raises(ArtifactError, match="kernel.ptx is corrupted"):
        lt.load(path)
    with pytest.raises(ArtifactError, match=r"export: device must be one of \('cpu', 'gpu'\), got 'tpu'"):
        lt.export(c, tmp_path / "x", device="tpu")


@pytest.mark.gpu
def test_exported_gpu_kernels_load_back_and_match_numpy(rng, tmp_path):
    cp = cupy_or_skip()
    c, ref = matmul(rng, 150, 70, 200)                  # tails in every dim, two kernels
    kernel = lt.load(lt.export(c, tmp_path / "mm", transposed_ahead_tiles(c), input_names=["a", "b"],
                               device="gpu"))
    a, b = (cp.asarray(array) for array in runtime.lower_on_host(c.node)[1])
    assert_close(cp.asnumpy(kernel(a=a, b=b)), ref, 1e-5)
    with pytest.raises(ArtifactError, match=r"input b: dimension 'n' has size 199, the kernel was built for 200"):
        kernel(a, b[:, :199])


@pytest.mark.gpu
def test_an_exported_tma_kernel_loads_back_on_hopper(rng, tmp_path):
    hopper_or_skip("a TMA kernel")
    c, ref = contraction(rng, k=512)
    tree = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 3, "tma")
    kernel = lt.load(lt.export(c, tmp_path / "bf16", tree, device="gpu"))
    out = kernel(*runtime.lower_on_host(c.node)[1])
    assert_close(np.asarray(out.get(), dtype=np.float64), ref, 1e-5)


@pytest.mark.parametrize("here, refused", [("sm_80", True), ("sm_100", True), ("sm_90", False)])
def test_hopper_only_ptx_loads_only_on_hopper(rng, tmp_path, monkeypatch, here, refused):
    c, _ = contraction(rng)
    tree = templates.wgmma_tiled(c.loop_tree(), "t0", (128, 256), (2, 1), 64, 3, "tma")
    path = lt.export(c, tmp_path / "bf16", tree, device="gpu", arch="sm_90")
    monkeypatch.setattr(runtime_gpu, "device_arch", lambda: here)
    monkeypatch.setattr(runtime_gpu, "ModuleRunner", lambda *args: "loaded")
    if refused:
        with pytest.raises(ArtifactError, match=rf"was built for GPU sm_90a; this GPU is {here}, which cannot run it"):
            lt.load(path)
    else:
        assert lt.load(path).runner == "loaded"
