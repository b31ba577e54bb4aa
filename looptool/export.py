"""Exported kernels: one versioned directory you can load back, or call from C, without tuning.

An artifact is a directory (not an archive: the shared library and header must be
plain files a C build can use, and every file stays inspectable) holding
  manifest.json   format version, looptool version, signature (dims, shapes, strides,
                  dtypes), target (triple, CPU name, features), schedule, tuning
                  result, and a SHA-256 of every other file;
  kernel.ll       the LLVM IR (rebuilds the kernel for another CPU of the family);
  kernel.o        native object code (position independent), which `load` runs;
  libkernel.so, kernel.h   a C shared library and its header (when a C compiler exists).
Loading needs only numpy and llvmlite: no islpy, no optuna, no re-tuning.
A GPU artifact (`device="gpu"`) holds instead the PTX of its kernels (kernel.ptx; kernel.unaligned.ptx
where the kernels assume 16-byte aligned inputs, for inputs that are not), their LLVM IR, and in the
manifest the launches, parameters, temps and TMA copies that `load` needs to run them through CuPy.
"""
from __future__ import annotations

import ctypes
import dataclasses
import datetime
import hashlib
import json
import re
import shutil
import subprocess
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from . import ir, runtime
from .analysis import legality
from .analysis import target as target_model
from .analysis.gpu_target import capability
from .analysis.tma import BulkCopy
from .codegen import cpu as codegen_cpu
from .codegen import gpu as codegen_gpu
from .codegen import threadpool as codegen_threadpool
from .errors import ArtifactError
from .runtime import gpu as runtime_gpu
from .runtime import ptx_cache
from .runtime import threadpool
from .version import __version__

FORMAT_VERSION = 3   # 2: the thread pool in pool.o, not kernel.o; manifest.json carries its own SHA-256;
#                      3: dynamic dims (their sizes are arguments); written only for artifacts that have them
ENTRY = "looptool_kernel"
# C has no standard half-precision type: float16 and bfloat16 elements travel as their 16 raw bits.
C_TYPES = {"float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double"}
BITS_NOTE = {"float16": ", IEEE binary16 bits", "bfloat16": ", bfloat16 bits (the upper half of a float32)"}
DEVICES = ("cpu", "gpu")
REQUIRED_FILES = {"cpu": ("kernel.ll", "kernel.o"), "gpu": ("kernel.ll", "kernel.ptx")}


def export(tensor, path, schedule=None, *, input_names=None, tuning: dict | None = None, device: str = "cpu",
           arch: str | None = None, example=None) -> Path:
    """Write the compiled kernel of `tensor` under `schedule` (default: the tuned one, else the
    automatic one) as an artifact directory at `path`; return the path.

    `tensor` may also be an `lt.function`, traced on the arrays `example` (a tuple, one per parameter;
    its inputs are then named after its parameters). `input_names` names the inputs (in the order they
    first appear in the computation) for calling the loaded kernel by keyword; `tuning` is stored as the
    tuning result. A kernel with dynamic dims takes their sizes as arguments (docs/export.md).
    `device="gpu"` writes the GPU kernels' PTX for `arch` (default: the current GPU's; the default
    schedule is the one tuned for it, else the GPU default), which needs no GPU to write."""
    if device not in DEVICES:
        raise ArtifactError(f"export: device must be one of {DEVICES}, got {device!r}")
    if isinstance(tensor, runtime.Function):
        tensor, input_names = _traced(tensor, example, input_names)
    program, _ = runtime.lower_on_host(tensor.node)
    names = list(input_names or [b.name for b in program.inputs])
    clashing = [dim for dim, _ in program.dynamic if dim in names or dim == "out"]
    if clashing:
        raise ArtifactError(f"export: dynamic dim '{clashing[0]}' would name the C entry's size argument, but an "
                            f"array has that name (inputs {names}, out): rename the input with input_names")
    if len(names) != len(program.inputs):
        raise ArtifactError(f"export: {len(program.inputs)} inputs but {len(names)} input_names {names}")
    if device == "gpu":
        arch = arch or runtime_gpu.device_arch()
        schedule = runtime_gpu.chosen_schedule(program, arch) if schedule is None else schedule
    elif schedule is None:
        schedule = runtime.chosen_schedule(program)
    tree = runtime.loop_tree_of(tensor.node, schedule)
    if tree.schedule.steps:
        legality.assert_legal(tree)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    if device == "gpu":
        files, fields = _gpu_files(tree, arch, out)
    else:
        files, fields = _cpu_files(tree, program, names, out)
    manifest = {
        "format_version": FORMAT_VERSION if program.dynamic else 2, "looptool_version": __version__,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "inputs": [{"name": n, "dims": list(b.dims), "shape": _shape_field(b.shape), "dtype": b.dtype,
                    "strides": list(b.strides)} for n, b in zip(names, program.inputs)],
        "output": {"dims": list(program.output.dims), "shape": _shape_field(tree.buffers[program.output.name].shape),
                   "dtype": program.output.dtype},
        "dynamic": [{"dim": dim, "min": minimum} for dim, minimum in program.dynamic],
        **fields,
        "schedule": json.loads(tree.schedule.to_json()), "loop_tree": str(tree), "tuning": tuning,
        "files": {name: _sha256(out / name) for name in sorted(files)},
    }
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


def _traced(function, example, input_names) -> tuple:
    """(the tensor of an `lt.function` traced on `example`, its inputs' names: the given ones, else the
    parameter each input is, or `const<i>` for an array the function captured)."""
    if example is None:
        raise ArtifactError(f"export of the function {function.__name__}: give example=(arrays...), one per "
                            f"parameter, to trace it (dynamic dims take any size later)")
    arrays = [np.asarray(a).view() for a in example]          # distinct objects: each input found among them
    tensor = function.tensor(*arrays)
    if input_names is None:
        _, inputs = runtime.lower_on_host(tensor.node)
        params = [name for name, _ in function.params]
        input_names = [next((p for p, a in zip(params, arrays) if a is array), f"const{i}")
                       for i, array in enumerate(inputs)]
    return tensor, input_names


def _shape_field(shape) -> list:
    """A shape for the manifest: a dynamic axis is the name of its dim, whose size each call gives (with
    `/divisor` for an extent of ceil(size / divisor): the blocks of a temp kept in blocks)."""
    return [(n.dim if n.divisor == 1 else f"{n.dim}/{n.divisor}") if isinstance(n, ir.Size) else int(n) for n in shape]


def _cpu_files(tree, program: ir.Program, names: list[str], out: Path) -> tuple[list[str], dict]:
    """Write the host kernel's files (IR, object code, thread pool, header, shared library); return
    their names and the manifest's CPU fields."""
    target = codegen_cpu.HostTarget.get()
    source = codegen_cpu.generate(tree, target.triple, runtime.get_num_threads(), ENTRY)
    ir_text = str(source.module)
    machine = target_model.new_machine(target.llvm_cpu, reloc="pic", codemodel="default")
    module = target.optimize(ir_text, machine)
    pool = target.optimize(str(codegen_threadpool.pool_module(target.triple)), machine)
    files = {"kernel.ll": ir_text.encode(), "kernel.o": machine.emit_object(module),
             "pool.o": machine.emit_object(pool)}
    files["kernel.h"] = _header(program, names).encode()
    for name, data in files.items():
        (out / name).write_bytes(data)
    built = _build_shared_library(out)
    fields = {"entry": ENTRY, "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
              "threads": runtime.get_num_threads(), "shared_library": "libkernel.so" if built else None}
    return sorted(files) + (["libkernel.so"] if built else []), fields


def _gpu_files(tree, arch: str, out: Path) -> tuple[list[str], dict]:
    """Write the GPU kernels' files (PTX, LLVM IR); return their names and the manifest's GPU fields:
    what a launch needs besides the PTX."""
    module = codegen_gpu.generate(tree, arch)
    files = {"kernel.ptx": module.ptx, "kernel.ll": module.llvm_ir}
    if module.aligned:
        files["kernel.unaligned.ptx"] = codegen_gpu.generate(tree, arch, aligned_params=False).ptx
    for name, text in files.items():
        (out / name).write_text(text)
    compiled_for = re.search(r"^\.target (\w+)", module.ptx, re.M).group(1)    # sm_90a where wgmma or TMA
    fields = {"entry": [launch.name for launch in module.launches], "target": {"device": "gpu", "arch": compiled_for},
              "gpu": {"launches": [ptx_cache.launch_fields(launch) for launch in module.launches],
                      "params": module.params, "aligned": list(module.aligned),
                      "tensor_maps": [dataclasses.asdict(copy) for copy in module.tensor_maps],
                      "buffers": [b.name for b in tree.program.inputs],
                      "scratch": [{**dataclasses.asdict(spec), "shape": _shape_field(spec.shape)}
                                  for spec in runtime_gpu.scratch_specs(tree)],
                      "output_buffer": tree.program.output.name}}
    return sorted(files), fields


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def _manifest_digest(manifest: dict) -> str:
    """SHA-256 of the manifest's content (keys sorted) without its own digest: an edited or
    damaged signature could otherwise make the kernel write past the arrays it is given."""
    content = {key: value for key, value in manifest.items() if key != "manifest_sha256"}
    return hashlib.sha256(json.dumps(content, sort_keys=True).encode()).hexdigest()


def _header(program: ir.Program, names: list[str]) -> str:
    out = program.output
    params = [f"const {C_TYPES[b.dtype]} *{n}" for n, b in zip(names, program.inputs)]
    params.append(f"{C_TYPES[out.dtype]} *out")
    params += [f"int64_t {dim}" for dim, _ in program.dynamic]
    if program.dynamic:
        sizes = [" * Dynamic dims: their sizes are the int64_t arguments after out, named after the dims;",
                 " * each must be at least its minimum (" + ", ".join(f"{d} >= {m}" for d, m in program.dynamic) +
                 "), else the function", " * returns 4 and writes nothing. A dynamic dim is the first axis of "
                 "every array that has it.", " * The other sizes are fixed: the arrays must have the shapes listed "
                 "below (the library", " * cannot see them)."]
    else:
        sizes = [" * Sizes are fixed: the arrays must have the shapes listed below (the library cannot see them)."]
    lines = ["/* Generated by looptool. ABI: every array is passed as a pointer to its element [0, 0, ...];",
             " * strides are fixed at export time (in elements, listed below). The output must be a",
             " * C-contiguous array the caller allocates, overlapping no input. Returns 0; 1 if scratch",
             " * memory ran out; 2 if a pointer is NULL; 3 if a pointer is not aligned to its element size.",
             *sizes,
             " * The function is thread-safe; parallel loops start their own POSIX threads. */",
             "#pragma once", "#include <stdint.h>", "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    for n, b in zip(names, program.inputs):
        lines.append(f"/* {n}: dims ({', '.join(b.dims)}), shape [{', '.join(map(str, _shape_field(b.shape)))}], "
                     f"strides {list(b.strides)}{BITS_NOTE.get(b.dtype, '')} */")
    shape = _shape_field(tuple(program.size(d) for d in out.dims))
    lines.append(f"/* out: dims ({', '.join(out.dims)}), shape [{', '.join(map(str, shape))}], "
                 f"C-contiguous{BITS_NOTE.get(out.dtype, '')} */")
    lines += [f"int {ENTRY}({', '.join(params)});", "", "#ifdef __cplusplus", "}", "#endif", ""]
    return "\n".join(lines)


def _build_shared_library(out: Path) -> bool:
    """libkernel.so from kernel.o and pool.o (the thread pool) with the system's C compiler; False when
    there is none.  `-z nodelete`: the pool's sleeping workers run its code, so it is never unloaded."""
    cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        return False
    objects = [str(out / "kernel.o"), str(out / "pool.o")]
    result = subprocess.run([cc, "-shared", "-o", str(out / "libkernel.so"), *objects, "-Wl,-z,nodelete",
                             "-lpthread", "-lm"], capture_output=True, text=True)
    if result.returncode != 0:
        raise ArtifactError(f"building libkernel.so with {cc} failed:\n{result.stderr}")
    return True


def _dynamic_sizes(manifest: dict) -> runtime.DynamicSizes:
    """Where a loaded kernel's calls read the sizes of its dynamic dims: the inputs' first axes named
    by a dim in the manifest (errors are `ArtifactError`s naming the inputs)."""
    inputs = manifest["inputs"]
    return runtime.DynamicSizes(
        [(spec["dim"], spec["min"]) for spec in manifest.get("dynamic", [])],
        [spec["shape"][0] if spec["shape"] and isinstance(spec["shape"][0], str) else None for spec in inputs],
        [f"input {spec['name']}" for spec in inputs], error=ArtifactError)


class LoadedKernel:
    """An exported kernel loaded back: call it with arrays by position or by input name."""

    def __init__(self, path: Path, manifest: dict, engine, address: int):
        self.path, self.manifest, self._engine = path, manifest, engine
        self.inputs, self.output = manifest["inputs"], manifest["output"]
        self.dynamic = _dynamic_sizes(manifest)
        self._output_shape = self.dynamic.template(self.output["shape"])
        argtypes = [ctypes.c_void_p] * (len(self.inputs) + 1) + [ctypes.c_int64] * len(self.dynamic.dims)
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int, *argtypes)(address)

    @property
    def input_names(self) -> list[str]:
        return [spec["name"] for spec in self.inputs]

    def __call__(self, *arrays, **named) -> np.ndarray:
        """Run on the inputs (positional, or keywords by input name); returns a new output array. The
        sizes of dynamic dims are read from the inputs: inputs that share one must agree, and each must
        be at least the dim's minimum."""
        given = [np.asarray(array) for array in self._bind(arrays, named)]
        for spec, array in zip(self.inputs, given):
            _check_signature(spec, array.shape, array.dtype.name)
        sizes = self.dynamic.of(given)
        prepared = [_prepare(spec, array, self.dynamic.at(self.dynamic.template(spec["shape"]), sizes))
                    for spec, array in zip(self.inputs, given)]
        out = np.empty(self.dynamic.at(self._output_shape, sizes), dtype=self.output["dtype"])
        status = self._fn(*[a.ctypes.data for a in prepared], out.ctypes.data, *sizes)
        if status == 1:
            raise MemoryError("the kernel could not allocate its scratch buffers")
        if status != 0:
            raise ArtifactError(f"the kernel refused its arrays (status {status}: 2 is a NULL pointer, 3 one not "
                                f"aligned to its element size, 4 a dynamic size below its minimum)")
        return out

    def _bind(self, arrays, named) -> list:
        return _bind(self.input_names, arrays, named)


def _bind(names: list[str], arrays, named) -> list:
    """The inputs in order, given by position or by name."""
    if arrays and named:
        raise ArtifactError("pass the inputs either by position or by name, not both")
    if named:
        unknown = sorted(set(named) - set(names))
        missing = [n for n in names if n not in named]
        if unknown or missing:
            raise ArtifactError(f"kernel inputs are {names}; unknown {unknown}, missing {missing}")
        return [named[n] for n in names]
    if len(arrays) != len(names):
        raise ArtifactError(f"kernel takes {len(names)} inputs {names}, got {len(arrays)}")
    return list(arrays)


class LoadedGpuKernel:
    """An exported GPU kernel loaded on the current GPU: call it with arrays (CuPy, PyTorch, NumPy)
    by position or by input name; returns a CuPy array (a `BFloat16Array` for bfloat16)."""

    def __init__(self, path: Path, manifest: dict):
        self.path, self.manifest = path, manifest
        self.inputs, self.output = manifest["inputs"], manifest["output"]
        built, here = manifest["target"]["arch"], runtime_gpu.device_arch()
        if not _runs_on(built, here):
            raise ArtifactError(f"{path} was built for GPU {built}; this GPU is {here}, which cannot run it: "
                                f"export it again on (or for) this GPU")
        gpu = manifest["gpu"]
        module = self._module(path / "kernel.ptx", gpu, gpu["aligned"])
        unaligned = path / "kernel.unaligned.ptx"
        specs = [runtime_gpu.BufferSpec(buffer, tuple(spec["shape"]), spec["dtype"], tuple(spec["strides"]))
                 for buffer, spec in zip(gpu["buffers"], self.inputs)]
        scratch = [runtime_gpu.BufferSpec(spec["name"], tuple(spec["shape"]), spec["dtype"], tuple(spec["strides"]))
                   for spec in gpu["scratch"]]
        self.runner = runtime_gpu.ModuleRunner(module, specs, scratch, gpu["output_buffer"],
                                               lambda: self._module(unaligned, gpu, ()), _dynamic_sizes(manifest))

    def _module(self, ptx: Path, gpu: dict, aligned) -> codegen_gpu.GpuModule:
        launches = [ptx_cache.launch_of(launch) for launch in gpu["launches"]]
        return codegen_gpu.GpuModule(ptx.read_text(), (self.path / "kernel.ll").read_text(), launches, gpu["params"],
                                     self.manifest["target"]["arch"], tuple(aligned),
                                     tuple(BulkCopy(**copy) for copy in gpu["tensor_maps"]))

    @property
    def input_names(self) -> list[str]:
        return [spec["name"] for spec in self.inputs]

    def __call__(self, *arrays, **named):
        """Run on the inputs (positional, or keywords by input name); returns a new device array."""
        given = _bind(self.input_names, arrays, named)
        for spec, array in zip(self.inputs, given):
            _check_device_input(spec, array)
        return self.runner(given)


def _runs_on(built: str, here: str) -> bool:
    """Whether PTX for GPU `built` runs on GPU `here`: PTX is compiled for newer GPUs too, but
    arch-specific code (sm_90a: wgmma, TMA) only for its own."""
    return capability(built) == capability(here) if built.endswith("a") else capability(built) <= capability(here)


def _check_device_input(spec: dict, array):
    """A device input's dims and dtype against the signature (its strides the runner checks)."""
    _check_signature(spec, tuple(array.shape), str(array.dtype).removeprefix("torch."))


def _check_signature(spec: dict, shape: tuple[int, ...], dtype: str):
    """An input's shape and dtype against the signature, named by its input and dims (a dynamic axis
    takes any size: `runtime.DynamicSizes` checks those)."""
    name, dims, want_shape = spec["name"], spec["dims"], tuple(spec["shape"])
    if len(shape) != len(want_shape):
        raise ArtifactError(f"input {name} has dims ({', '.join(dims)}) = {len(want_shape)} dimensions, "
                            f"got an array with {len(shape)}: shape {shape}")
    for dim, want, got in zip(dims, want_shape, shape):
        if want != got and not isinstance(want, str):
            raise ArtifactError(f"input {name}: dimension '{dim}' has size {got}, the kernel was built for {want} "
                                f"(shape {list(want_shape)})")
    if dtype != spec["dtype"]:
        raise ArtifactError(f"input {name}: dtype {dtype} but the kernel was built for {spec['dtype']}")


def _prepare(spec: dict, array: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """An input, checked against the signature, of `shape` (at this call's sizes), copied into the
    kernel's layout when its strides differ, it is not aligned to its element size, or its strides are
    not whole elements."""
    name, dims = spec["name"], spec["dims"]
    strides = [s // array.itemsize for s in array.strides]
    if strides != spec["strides"] or not ir.whole_aligned_elements(array):
        relaid = np.lib.stride_tricks.as_strided(
            np.empty(1 + sum((n - 1) * abs(s) for n, s in zip(shape, spec["strides"])), array.dtype),
            shape, [s * array.itemsize for s in spec["strides"]])
        if any(s < 0 for s in spec["strides"]):
            raise ArtifactError(f"input {name}: strides {strides}, the kernel was built for {spec['strides']}")
        relaid[...] = array
        if 0 in spec["strides"] and not np.array_equal(relaid, array, equal_nan=True):
            broadcast = [d for d, n, s in zip(dims, shape, spec["strides"]) if s == 0 and n > 1]
            raise ArtifactError(f"input {name}: the kernel was built for an input broadcast along "
                                f"({', '.join(broadcast)}) (stride 0), but this array varies along them")
        return relaid
    return array


def load(path, rebuild: bool = False) -> "LoadedKernel | LoadedGpuKernel":
    """Load an exported kernel. A kernel built for CPU features this host lacks is refused,
    or recompiled from its LLVM IR for this host when `rebuild` is true. A GPU kernel is loaded
    on the current GPU (CuPy), which must be at least the GPU it was built for."""
    path = Path(path)
    manifest = _read_manifest(path)
    if _device(manifest) == "gpu":
        return LoadedGpuKernel(path, manifest)
    target = codegen_cpu.HostTarget.get()
    # the object code runs on this machine, whatever CPU LOOPTOOL_CPU has kernels compiled for
    missing = _missing_features(manifest["target"]["features"], llvm.get_host_cpu_features().flatten())
    if missing and not rebuild:
        raise ArtifactError(f"{path} was built for CPU {manifest['target']['cpu']} with features this host "
                            f"({llvm.get_host_cpu_name()}) lacks: {', '.join(missing)}; load it with rebuild=True to "
                            f"recompile its LLVM IR for this CPU")
    machine = target.new_machine()
    threadpool.ensure_loaded()
    if missing or rebuild:
        module = target.optimize((path / "kernel.ll").read_text(), machine)
        engine = llvm.create_mcjit_compiler(module, machine)
    else:
        engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), machine)
        engine.add_object_file(llvm.ObjectFileRef.from_data((path / "kernel.o").read_bytes()))
    engine.finalize_object()
    address = engine.get_function_address(manifest["entry"])
    if not address:
        raise ArtifactError(f"{path}: entry point {manifest['entry']} not found in the object code")
    return LoadedKernel(path, manifest, engine, address)


def _read_manifest(path: Path) -> dict:
    manifest_path = path / "manifest.json"
    if not manifest_path.is_file():
        raise ArtifactError(f"{path} is not a looptool kernel: {manifest_path} is missing")
    try:
        manifest = json.loads(manifest_path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise ArtifactError(f"{manifest_path} is corrupted: {err}") from None
    if not isinstance(manifest, dict):
        raise ArtifactError(f"{manifest_path} is corrupted: not a JSON object")
    version = manifest.get("format_version")
    if isinstance(version, int) and version > FORMAT_VERSION:
        raise ArtifactError(f"{path} has artifact format version {version}; this looptool ({__version__}) reads "
                            f"versions up to {FORMAT_VERSION}: upgrade looptool")
    absent = [key for key in ("entry", "inputs", "output", "target", "files") if key not in manifest]
    if not isinstance(version, int) or version < 1 or absent:
        raise ArtifactError(f"{manifest_path} is corrupted: format_version {version!r}, missing keys {absent}")
    if version >= 2 and manifest.get("manifest_sha256") != _manifest_digest(manifest):
        raise ArtifactError(f"{manifest_path} is corrupted: its content does not match its manifest_sha256 "
                            f"(was it edited?)")
    unhashed = [name for name in REQUIRED_FILES[_device(manifest)] if name not in manifest["files"]]
    if unhashed:  # never hand unchecked object code to the JIT
        raise ArtifactError(f"{manifest_path} is corrupted: no SHA-256 listed for {', '.join(unhashed)}")
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise ArtifactError(f"{path}: {name} is missing")
        if _sha256(file) != digest:
            raise ArtifactError(f"{path}: {name} is corrupted (its SHA-256 does not match the manifest)")
    return manifest


def _device(manifest: dict) -> str:
    return manifest["target"].get("device", "cpu") if isinstance(manifest["target"], dict) else "cpu"


def _missing_features(built: str, host: str) -> list[str]:
    have = {f[1:] for f in host.split(",") if f.startswith("+")}
    return sorted(f[1:] for f in built.split(",") if f.startswith("+") and f[1:] not in have)
