"""Compiled GPU modules kept on disk, so a new process does not compile a kernel again.

`generate` is `codegen.gpu.generate` through the cache. An entry is keyed, before any code is
generated, by a SHA-256 of everything its PTX follows from: the program (structure, shapes, strides,
dtypes), the schedule's steps, the GPU architecture, the code generator's flag (aligned parameters),
looptool's version and a digest of its source files (an edited code generator, released or not,
never reads an older one's entry), and llvmlite's and LLVM's versions. Keying before code
generation spares its whole cost on a hit, building the LLVM IR included.

An entry is one gzip-compressed JSON file holding the whole `GpuModule`: PTX, LLVM IR, the
kernels' launches (grid, block, dynamic shared memory), parameters, the parameters assumed
aligned and the TMA copies. It is written to a temporary file in the same folder and renamed over
the entry (`os.replace`), so a reader sees a whole entry or none; one that cannot be read or is not
a module (truncated, corrupt, from another format) is ignored, generated again and replaced.

`LOOPTOOL_CACHE_DIR` moves the cache (default `~/.cache/looptool`; entries in its `ptx/` folder);
an empty value turns it off.
"""
from __future__ import annotations

import dataclasses
import functools
import gzip
import hashlib
import json
import logging
import os
import tempfile
import zlib
from pathlib import Path

import llvmlite
import llvmlite.binding as llvm

from .. import ir
from ..analysis.tma import BulkCopy
from ..codegen import gpu as codegen_gpu
from ..schedule import LoopTree
from ..version import __version__

log = logging.getLogger("looptool")
FORMAT = 1                      # the entries' layout; a new one never reads an older one's files
PACKAGE = Path(__file__).resolve().parent.parent


def cache_dir() -> Path | None:
    """The folder of PTX entries (None when the disk cache is turned off)."""
    configured = os.environ.get("LOOPTOOL_CACHE_DIR")
    if configured == "":
        return None
    return Path(configured or Path.home() / ".cache" / "looptool") / "ptx"


def generate(tree: LoopTree, arch: str, aligned_params: bool = True) -> codegen_gpu.GpuModule:
    """`codegen.gpu.generate(tree, arch, aligned_params)`, read from the disk cache where an entry
    exists, else generated and stored."""
    folder = cache_dir()
    if folder is None:
        return codegen_gpu.generate(tree, arch, aligned_params)
    path = folder / f"{entry_key(tree, arch, aligned_params)}.json.gz"
    module = read(path)
    if module is None:
        module = codegen_gpu.generate(tree, arch, aligned_params)
        write(path, module)
    return module


def entry_key(tree: LoopTree, arch: str, aligned_params: bool) -> str:
    """The hex SHA-256 naming a tree's entry for `arch` and the flag."""
    parts = [f"format {FORMAT}", repr(tree.program), tree.schedule.to_json(), arch, f"aligned {aligned_params}",
             f"looptool {__version__} {source_digest()}", f"llvmlite {llvmlite.__version__} llvm {llvm_version()}"]
    return hashlib.sha256("\n".join(parts).encode()).hexdigest()


@functools.cache
def source_digest() -> str:
    """A SHA-256 of looptool's source files (paths and contents), worked out once per process."""
    digest = hashlib.sha256()
    for path in sorted(PACKAGE.rglob("*.py")):
        digest.update(str(path.relative_to(PACKAGE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def llvm_version() -> str:
    """The version of the LLVM llvmlite is built on, e.g. '15.0.7'."""
    return ".".join(map(str, llvm.llvm_version_info))


def read(path: Path) -> codegen_gpu.GpuModule | None:
    """The module stored at `path`; None where there is none or it cannot be read as one."""
    try:
        return module_of(json.loads(gzip.decompress(path.read_bytes())))
    except FileNotFoundError:
        return None
    except (OSError, EOFError, zlib.error, ValueError, KeyError, TypeError) as err:
        log.warning("ignoring the unreadable PTX cache entry %s (%s); compiling again", path, err)
        return None


def write(path: Path, module: codegen_gpu.GpuModule):
    """Store a module at `path` atomically: a temporary file in its folder, renamed over it. A cache
    that cannot be written (a read-only folder, a full disk) only costs the next process a compile."""
    data = gzip.compress(json.dumps(fields_of(module)).encode(), compresslevel=1)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path.parent, prefix=path.name, suffix=".tmp", delete=False) as file:
            file.write(data)
        os.replace(file.name, path)
    except OSError as err:
        log.warning("could not store the PTX cache entry %s (%s)", path, err)


def fields_of(module: codegen_gpu.GpuModule) -> dict:
    """A module as JSON-ready fields (a grid extent sized at launch as its dim, divisor and planned size)."""
    return {**dataclasses.asdict(module), "launches": [launch_fields(launch) for launch in module.launches],
            "aligned": list(module.aligned)}


def launch_fields(launch: codegen_gpu.Launch) -> dict:
    """A launch as JSON-ready fields: a grid extent sized at launch (`ir.Size`) as [dim, divisor, planned size]."""
    grid = [[g.dim, g.divisor, g.representative] if isinstance(g, ir.Size) else g for g in launch.grid]
    return {**dataclasses.asdict(launch), "grid": grid}


def launch_of(fields: dict) -> codegen_gpu.Launch:
    """The launch of `launch_fields`'s fields."""
    grid = tuple(ir.Size(*g) if isinstance(g, list) else g for g in fields["grid"])
    return codegen_gpu.Launch(**{**fields, "grid": grid, "block": tuple(fields["block"])})


def module_of(fields: dict) -> codegen_gpu.GpuModule:
    """The module of `fields_of`'s fields."""
    launches = [launch_of(launch) for launch in fields["launches"]]
    return codegen_gpu.GpuModule(fields["ptx"], fields["llvm_ir"], launches, list(fields["params"]), fields["arch"],
                                 tuple(fields["aligned"]), tuple(BulkCopy(**copy) for copy in fields["tensor_maps"]))
