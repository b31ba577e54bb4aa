"""The target model: the facts about this CPU that the automatic scheduler derives its choices from.

Everything is read from LLVM and the operating system, never from a table of CPU names:
the vector width and the number of vector registers from LLVM's host features (AVX-512:
32 registers of 512 bits; AVX/AVX2: 16 of 256; SSE2: 16 of 128; AArch64 NEON: 32 of 128),
cache sizes and L1's and L2's associativity from sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/{level,
type,size,ways_of_associativity,coherency_line_size}`, then `os.sysconf`, then the defaults below), and the cores this
process may run on from
`os.sched_getaffinity`.  `Target` is a plain dataclass, so tests build fake ones.

`LOOPTOOL_CPU` names another CPU to generate code and plan schedules for (an LLVM CPU name, then
optionally `:` and an LLVM feature string: `znver2`, `haswell:-fma`). Its vector registers and FMA
are then what LLVM generates for that CPU (`probed_features`: a probe function compiled for it), its
caches those of `LOOPTOOL_CPU_CACHES` (`32K,512K,16M`: L1 data, L2, L3), else the defaults below,
never this host's. The code still runs here, so this host must have its instructions
(`check_runs_here`).
"""
from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

from ..errors import TargetError

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

# Used only where neither sysfs nor sysconf says: sizes common to current x86 and Arm server cores.
DEFAULT_L1 = 32 * 1024
DEFAULT_L2 = 512 * 1024
DEFAULT_L3 = 8 * 1024 * 1024

SYSCONF_NAMES = {1: "SC_LEVEL1_DCACHE_SIZE", 2: "SC_LEVEL2_CACHE_SIZE", 3: "SC_LEVEL3_CACHE_SIZE"}
DEFAULTS = {1: DEFAULT_L1, 2: DEFAULT_L2, 3: DEFAULT_L3}
DEFAULT_L1_WAYS = 8
DEFAULT_L2_WAYS = 8
DEFAULT_LINE = 64

CPU_VARIABLE = "LOOPTOOL_CPU"
CACHES_VARIABLE = "LOOPTOOL_CPU_CACHES"

# What `probed_features` compiles for a named CPU: a 16-lane float add, which LLVM keeps in one
# register where the vectors are that wide (zmm: AVX-512; ymm: AVX; xmm: SSE), and a scalar fused
# multiply-add, an instruction where the CPU has FMA and a call of `fmaf` where it has not.
PROBE = """
define void @probe_width(ptr noalias %a, ptr noalias %b) #0 {
  %x = load <16 x float>, ptr %a
  %y = load <16 x float>, ptr %b
  %z = fadd <16 x float> %x, %y
  store <16 x float> %z, ptr %b
  ret void
}
define float @probe_fused(float %a, float %b, float %c) {
  %r = call float @llvm.fma.f32(float %a, float %b, float %c)
  ret float %r
}
declare float @llvm.fma.f32(float, float, float)
attributes #0 = { "min-legal-vector-width"="512" }
"""


@dataclass(frozen=True)
class Target:
    """A CPU as the scheduler sees it: SIMD registers, FMA, data cache sizes (bytes) and cores."""

    arch: str
    vector_bits: int
    vector_registers: int
    fma: bool
    l1: int
    l2: int
    l3: int
    cores: int
    l1_ways: int = DEFAULT_L1_WAYS
    l2_ways: int = DEFAULT_L2_WAYS
    line: int = DEFAULT_LINE

    @property
    def cache_bytes(self) -> tuple[int, int, int]:
        """The data cache sizes, smallest first."""
        return self.l1, self.l2, self.l3

    def lanes(self, dtype: str) -> int:
        """Elements of `dtype` in one vector register."""
        return max(1, self.vector_bits // (8 * np.dtype(dtype).itemsize))

    def with_cores(self, cores: int) -> "Target":
        """The same CPU with `cores` threads to use (the runtime's thread count)."""
        return replace(self, cores=max(1, cores))

    def describe(self) -> str:
        """One line: the figures the scheduler uses."""
        return (f"{self.arch}: {self.vector_registers} vector registers of {self.vector_bits} bits"
                f"{', FMA' if self.fma else ''}; L1 {self.l1 // 1024} KiB, L2 {self.l2 // 1024} KiB, "
                f"L3 {self.l3 // 1024} KiB; {self.cores} core{'s' if self.cores != 1 else ''}")


def vector_file(triple: str, features: dict[str, bool]) -> tuple[int, int]:
    """(vector bits, vector registers) from an LLVM triple and host feature map."""
    if triple.startswith(("aarch64", "arm64")):
        return 128, 32
    if features.get("avx512f"):
        return 512, 32
    if features.get("avx") or features.get("avx2"):
        return 256, 16
    if features.get("sse2"):
        return 128, 16
    return 64, 8


def cache_sizes(root: Path = SYSFS_CACHE) -> dict[int, int]:
    """Data cache bytes per level (1, 2, 3): sysfs first, then os.sysconf, then the defaults."""
    sizes = _sysfs_cache_sizes(root)
    for level in (1, 2, 3):
        if level not in sizes:
            sizes[level] = _sysconf_cache_size(level) or DEFAULTS[level]
    return sizes


def _sysfs_cache_sizes(root: Path) -> dict[int, int]:
    sizes: dict[int, int] = {}
    for index in sorted(root.glob("index*")):
        try:
            level = int((index / "level").read_text())
            kind = (index / "type").read_text().strip()
            size = parse_size((index / "size").read_text())
        except (OSError, ValueError):
            continue
        if kind in ("Data", "Unified") and size:
            sizes.setdefault(level, size)
    return sizes


def l1_ways(root: Path = SYSFS_CACHE) -> int:
    """The L1 data cache's associativity: sysfs first, then os.sysconf, then DEFAULT_L1_WAYS."""
    return _cache_ways(root, 1) or _sysconf("SC_LEVEL1_DCACHE_ASSOC") or DEFAULT_L1_WAYS


def l2_ways(root: Path = SYSFS_CACHE) -> int:
    """The L2 cache's associativity: sysfs first, then os.sysconf, then DEFAULT_L2_WAYS."""
    return _cache_ways(root, 2) or _sysconf("SC_LEVEL2_CACHE_ASSOC") or DEFAULT_L2_WAYS


def line_size(root: Path = SYSFS_CACHE) -> int:
    """The L2 cache's line in bytes: sysfs first, then os.sysconf, then DEFAULT_LINE."""
    return _cache_figure(root, 2, "coherency_line_size") or _sysconf("SC_LEVEL2_CACHE_LINESIZE") or DEFAULT_LINE


def _cache_ways(root: Path, level: int) -> int:
    """The sysfs `ways_of_associativity` of the data (or unified) cache of `level`, or 0."""
    return _cache_figure(root, level, "ways_of_associativity")


def _cache_figure(root: Path, level: int, name: str) -> int:
    """The sysfs figure `name` of the data (or unified) cache of `level`, or 0."""
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) == level and \
                    (index / "type").read_text().strip() in ("Data", "Unified"):
                return max(0, int((index / name).read_text()))
        except (OSError, ValueError):
            continue
    return 0


def _sysconf(name: str) -> int:
    try:
        return max(0, os.sysconf(name))
    except (ValueError, OSError):
        return 0


def _sysconf_cache_size(level: int) -> int:
    return _sysconf(SYSCONF_NAMES[level])

def parse_size(text: str) -> int:
    """'32K', '512K', '32768K', '1M' or '4096' as bytes."""
    text = text.strip().upper()
    scale = {"K": 1024, "M": 1024 ** 2, "G": 1024 ** 3}.get(text[-1:], 1)
    return int(text.rstrip("KMG")) * scale


def _cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


@dataclass(frozen=True)
class LlvmCpu:
    """The CPU LLVM generates code for: this host's (`setting` None), or the one `LOOPTOOL_CPU` names
    (`setting` is that variable's value). `features` is an LLVM feature string: the host's whole list,
    or what the variable gave after the name (often empty: the name implies its features)."""

    triple: str
    name: str
    features: str
    setting: str | None = None


def named_cpu(setting: str | None) -> LlvmCpu:
    """The CPU of a `LOOPTOOL_CPU` value (None or blank: this host), checked by LLVM: an unknown
    CPU name or feature, or a feature without its + or -, raises TargetError naming the variable."""
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    triple = llvm.get_process_triple()
    if setting is None or not setting.strip():
        return LlvmCpu(triple, llvm.get_host_cpu_name(), llvm.get_host_cpu_features().flatten())
    name, _, features = (part.strip() for part in setting.strip().partition(":"))
    where = f"{CPU_VARIABLE}={setting!r}"
    if not name:
        raise TargetError(f"{where}: no CPU name before the ':' (write e.g. znver2 or haswell:-fma)")
    flags = [flag.strip() for flag in features.split(",") if flag.strip()]
    unsigned = [flag for flag in flags if flag[0] not in "+-" or len(flag) < 2]
    if unsigned:
        raise TargetError(f"{where}: the feature string after ':' is LLVM's, each feature with + or - "
                          f"(+avx2,-fma); not {', '.join(unsigned)}")
    cpu = LlvmCpu(triple, name, ",".join(flags), setting)
    complaints = _llvm_complaints(lambda: new_machine(cpu))     # LLVM warns (and carries on) on stderr
    if complaints:
        hint = " (`llc -mcpu=help` lists the CPU names LLVM knows)" if any("processor" in c for c in complaints) else ""
        raise TargetError(f"{where}: {'; '.join(complaints)}{hint}")
    return cpu


def new_machine(cpu: LlvmCpu, **options) -> llvm.TargetMachine:
    """An O3 LLVM target machine for `cpu` (`options`: create_target_machine's others)."""
    return llvm.Target.from_triple(cpu.triple).create_target_machine(cpu=cpu.name, features=cpu.features,
                                                                     opt=3, **options)


def _llvm_complaints(action) -> list[str]:
    """The distinct lines LLVM wrote to the process's stderr (file descriptor 2) while `action()` ran:
    it reports an unknown CPU or feature there and then ignores it."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as sink:
        os.dup2(sink.fileno(), 2)
        try:
            action()
        finally:
            os.dup2(saved, 2)
            os.close(saved)
        sink.seek(0)
        lines = sink.read().decode(errors="replace").splitlines()
    return list(dict.fromkeys(line.strip() for line in lines if line.strip()))


def probed_features(cpu: LlvmCpu) -> dict[str, bool]:
    """The features `vector_file` and the FMA flag read, as LLVM compiles `PROBE` for `cpu`: which
    registers hold a 16-lane float add, and whether a fused multiply-add is an instruction."""
    module = llvm.parse_assembly(PROBE)
    module.triple = cpu.triple
    assembly = new_machine(cpu).emit_assembly(module)
    return {"avx512f": "zmm" in assembly, "avx": "ymm" in assembly or "zmm" in assembly,
            "sse2": "xmm" in assembly, "fma": "fmaf" not in assembly}


def check_runs_here(cpu: LlvmCpu, probed: dict[str, bool], here: dict[str, bool]):
    """Refuse (TargetError) a CPU named by LOOPTOOL_CPU whose code this host (features `here`) could
    not run: wider vectors, FMA, or a feature its string turns on (+name) that this host lacks. A CPU
    name implying other extensions this host lacks (AMX, say) is not caught: name one it can run."""
    lacking = []
    bits, host_bits = vector_file(cpu.triple, probed)[0], vector_file(cpu.triple, here)[0]
    if bits > host_bits:
        lacking.append(f"{bits}-bit vectors (this host has {host_bits}-bit ones)")
    if probed.get("fma") and not here.get("fma") and not cpu.triple.startswith(("aarch64", "arm64")):
        lacking.append("FMA")
    lacking += [f[1:] for f in cpu.features.split(",") if f.strip().startswith("+") and
                not here.get(f.strip()[1:])]
    if lacking:
        raise TargetError(f"{CPU_VARIABLE}={cpu.setting!r}: code for {cpu.name} uses {', '.join(lacking)}, which "
                          f"this host ({llvm.get_host_cpu_name()}) lacks; it runs here, so name a CPU this host "
                          "can run")


def named_caches(setting: str) -> dict[int, int]:
    """The cache sizes of a `LOOPTOOL_CPU_CACHES` value: L1 data, L2 and L3, comma-separated, each as
    sysfs writes them (`32K,512K,16M`); anything else raises TargetError naming the variable."""
    parts = [p.strip() for p in setting.split(",")]
    try:
        sizes = [parse_size(p) for p in parts]
    except ValueError:
        sizes = []
    if len(sizes) != 3 or not 0 < sizes[0] <= sizes[1] <= sizes[2]:
        raise TargetError(f"{CACHES_VARIABLE}={setting!r}: give the L1 data, L2 and L3 sizes, smallest first, "
                          "as in 32K,512K,16M")
    return dict(zip((1, 2, 3), sizes))


def target_of(cpu: LlvmCpu, caches: str | None = None) -> Target:
    """The target model of `cpu`: this host's features, caches (sysfs), L1 and L2 ways and line, or for a named CPU
    the features LLVM generates for it and the caches of `caches` (a LOOPTOOL_CPU_CACHES value, else the
    defaults); the cores are always those this process may use."""
    here = dict(llvm.get_host_cpu_features().items())
    if cpu.setting is None:
        features, sizes, ways = here, cache_sizes(), (l1_ways(), l2_ways(), line_size())
    else:
        features = probed_features(cpu)
        check_runs_here(cpu, features, here)
        sizes, ways = dict(DEFAULTS), (DEFAULT_L1_WAYS, DEFAULT_L2_WAYS, DEFAULT_LINE)
    if caches is not None and caches.strip():
        sizes = named_caches(caches)
    bits, registers = vector_file(cpu.triple, features)
    fma = bool(features.get("fma") or features.get("neon") or cpu.triple.startswith(("aarch64", "arm64")))
    return Target(cpu.triple.split("-")[0], bits, registers, fma, sizes[1], sizes[2], sizes[3], _cores(), *ways)


@lru_cache(maxsize=1)
def llvm_cpu() -> LlvmCpu:
    """The CPU this process generates code for: this host's, or `LOOPTOOL_CPU`'s (read once)."""
    return named_cpu(os.environ.get(CPU_VARIABLE))


@lru_cache(maxsize=1)
def host() -> Target:
    """The CPU the scheduler plans for, read once per process: this machine, or the one `LOOPTOOL_CPU`
    names (with `LOOPTOOL_CPU_CACHES`'s caches)."""
    return target_of(llvm_cpu(), os.environ.get(CACHES_VARIABLE))
