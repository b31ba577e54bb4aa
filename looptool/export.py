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
"""
from __future__ import annotations

import ctypes
import datetime
import hashlib
import json
import shutil
import subprocess
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from . import ir, runtime
from .analysis import legality
from .codegen import cpu as codegen_cpu
from .codegen import threadpool as codegen_threadpool
from .errors import ArtifactError
from .runtime import threadpool
from .version import __version__

FORMAT_VERSION = 2   # 2: the thread pool in pool.o, not kernel.o; manifest.json carries its own SHA-256
ENTRY = "looptool_kernel"
# C has no standard half-precision type: float16 and bfloat16 elements travel as their 16 raw bits.
C_TYPES = {"float16": "uint16_t", "bfloat16": "uint16_t", "float32": "float", "float64": "double"}
BITS_NOTE = {"float16": ", IEEE binary16 bits", "bfloat16": ", bfloat16 bits (the upper half of a float32)"}


def export(tensor, path, schedule=None, *, input_names=None, tuning: dict | None = None) -> Path:
    """Write the compiled kernel of `tensor` under `schedule` (default: the tuned one, else the
    automatic one) as an artifact directory at `path`; return the path.

    `input_names` names the inputs (in the order they first appear in the computation)
    for calling the loaded kernel by keyword; `tuning` is stored as the tuning result."""
    program, _ = runtime.lower_on_host(tensor.node)
    target = codegen_cpu.HostTarget.get()
    if schedule is None:
        schedule = runtime.chosen_schedule(program)
    tree = runtime.loop_tree_of(tensor.node, schedule)
    if tree.schedule.steps:
        legality.assert_legal(tree)
    names = list(input_names or [b.name for b in program.inputs])
    if len(names) != len(program.inputs):
        raise ArtifactError(f"export: {len(program.inputs)} inputs but {len(names)} input_names {names}")
    source = codegen_cpu.generate(tree, target.triple, runtime.get_num_threads(), ENTRY)
    ir_text = str(source.module)
    machine = llvm.Target.from_triple(target.triple).create_target_machine(
        cpu=target.cpu, features=target.features, opt=3, reloc="pic", codemodel="default")
    module = target.optimize(ir_text, machine)
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)
    pool = target.optimize(str(codegen_threadpool.pool_module(target.triple)), machine)
    files = {"kernel.ll": ir_text.encode(), "kernel.o": machine.emit_object(module),
             "pool.o": machine.emit_object(pool)}
    files["kernel.h"] = _header(program, names).encode()
    for name, data in files.items():
        (out / name).write_bytes(data)
    built = _build_shared_library(out)
    manifest = {
        "format_version": FORMAT_VERSION, "looptool_version": __version__, "entry": ENTRY,
        "created": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "inputs": [{"name": n, "dims": list(b.dims), "shape": list(b.shape), "dtype": b.dtype,
                    "strides": list(b.strides)} for n, b in zip(names, program.inputs)],
        "output": {"dims": list(program.output.dims), "shape": list(tree.buffers[program.output.name].shape),
                   "dtype": program.output.dtype},
        "target": {"triple": target.triple, "cpu": target.cpu, "features": target.features},
        "threads": runtime.get_num_threads(),
        "schedule": json.loads(tree.schedule.to_json()), "loop_tree": str(tree), "tuning": tuning,
        "shared_library": "libkernel.so" if built else None,
        "files": {name: _sha256(out / name) for name in sorted(files) + (["libkernel.so"] if built else [])},
    }
    manifest["manifest_sha256"] = _manifest_digest(manifest)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return out


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
    lines = ["/* Generated by looptool. ABI: every array is passed as a pointer to its element [0, 0, ...];",
             " * strides are fixed at export time (in elements, listed below). The output must be a",
             " * C-contiguous array the caller allocates, overlapping no input. Returns 0; 1 if scratch",
             " * memory ran out; 2 if a pointer is NULL; 3 if a pointer is not aligned to its element size.",
             " * Sizes are fixed: the arrays must have the shapes listed below (the library cannot see them).",
             " * The function is thread-safe; parallel loops start their own POSIX threads. */",
             "#pragma once", "#include <stdint.h>", "#ifdef __cplusplus", 'extern "C" {', "#endif", ""]
    for n, b in zip(names, program.inputs):
        lines.append(f"/* {n}: dims ({', '.join(b.dims)}), shape {list(b.shape)}, strides {list(b.strides)}"
                     f"{BITS_NOTE.get(b.dtype, '')} */")
    lines.append(f"/* out: dims ({', '.join(out.dims)}), shape {[program.size(d) for d in out.dims]}, "
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


class LoadedKernel:
    """An exported kernel loaded back: call it with arrays by position or by input name."""

    def __init__(self, path: Path, manifest: dict, engine, address: int):
        self.path, self.manifest, self._engine = path, manifest, engine
        self.inputs, self.output = manifest["inputs"], manifest["output"]
        self._fn = ctypes.CFUNCTYPE(ctypes.c_int, *[ctypes.c_void_p] * (len(self.inputs) + 1))(address)

    @property
    def input_names(self) -> list[str]:
        return [spec["name"] for spec in self.inputs]

    def __call__(self, *arrays, **named) -> np.ndarray:
        """Run on the inputs (positional, or keywords by input name); returns a new output array."""
        given = self._bind(arrays, named)
        prepared = [_prepare(spec, array) for spec, array in zip(self.inputs, given)]
        out = np.empty(self.output["shape"], dtype=self.output["dtype"])
        status = self._fn(*[a.ctypes.data for a in prepared], out.ctypes.data)
        if status == 1:
            raise MemoryError("the kernel could not allocate its scratch buffers")
        if status != 0:
            raise ArtifactError(f"the kernel refused its arrays (status {status}: 2 is a NULL pointer, 3 one not "
                                f"aligned to its element size)")
        return out

    def _bind(self, arrays, named) -> list[np.ndarray]:
        names = self.input_names
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


def _prepare(spec: dict, array) -> np.ndarray:
    """Check an input against the signature; copy it into the kernel's layout when its strides
    differ, it is not aligned to its element size, or its strides are not whole elements."""
    array = np.asarray(array)
    name, dims, shape = spec["name"], spec["dims"], tuple(spec["shape"])
    if array.ndim != len(shape):
        raise ArtifactError(f"input {name} has dims ({', '.join(dims)}) = {len(shape)} dimensions, "
                            f"got an array with {array.ndim}: shape {array.shape}")
    for dim, want, got in zip(dims, shape, array.shape):
        if want != got:
            raise ArtifactError(f"input {name}: dimension '{dim}' has size {got}, the kernel was built for {want} "
                                f"(shape {list(shape)})")
    if array.dtype.name != spec["dtype"]:
        raise ArtifactError(f"input {name}: dtype {array.dtype} but the kernel was built for {spec['dtype']}")
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


def load(path, rebuild: bool = False) -> LoadedKernel:
    """Load an exported kernel. A kernel built for CPU features this host lacks is refused,
    or recompiled from its LLVM IR for this host when `rebuild` is true."""
    path = Path(path)
    manifest = _read_manifest(path)
    target = codegen_cpu.HostTarget.get()
    missing = _missing_features(manifest["target"]["features"], target.features)
    if missing and not rebuild:
        raise ArtifactError(f"{path} was built for CPU {manifest['target']['cpu']} with features this host "
                            f"({target.cpu}) lacks: {', '.join(missing)}; load it with rebuild=True to recompile "
                            f"its LLVM IR for this CPU")
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
    unhashed = [name for name in ("kernel.ll", "kernel.o") if name not in manifest["files"]]
    if unhashed:  # never hand unchecked object code to the JIT
        raise ArtifactError(f"{manifest_path} is corrupted: no SHA-256 listed for {', '.join(unhashed)}")
    for name, digest in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise ArtifactError(f"{path}: {name} is missing")
        if _sha256(file) != digest:
            raise ArtifactError(f"{path}: {name} is corrupted (its SHA-256 does not match the manifest)")
    return manifest


def _missing_features(built: str, host: str) -> list[str]:
    have = {f[1:] for f in host.split(",") if f.startswith("+")}
    return sorted(f[1:] for f in built.split(",") if f.startswith("+") and f[1:] not in have)
