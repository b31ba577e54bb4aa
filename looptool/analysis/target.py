"""The target model: the facts about this CPU that the automatic scheduler derives its choices from.

Everything is read from LLVM and the operating system, never from a table of CPU names:
the vector width and the number of vector registers from LLVM's host features (AVX-512:
32 registers of 512 bits; AVX/AVX2: 16 of 256; SSE2: 16 of 128; AArch64 NEON: 32 of 128),
cache sizes and L1's associativity from sysfs (`/sys/devices/system/cpu/cpu0/cache/index*/{level,
type,size,ways_of_associativity}`, then `os.sysconf`, then the defaults below), and the cores this
process may run on from
`os.sched_getaffinity`.  `Target` is a plain dataclass, so tests build fake ones.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path

import llvmlite.binding as llvm
import numpy as np

SYSFS_CACHE = Path("/sys/devices/system/cpu/cpu0/cache")

# Used only where neither sysfs nor sysconf says: sizes common to current x86 and Arm server cores.
DEFAULT_L1 = 32 * 1024
DEFAULT_L2 = 512 * 1024
DEFAULT_L3 = 8 * 1024 * 1024

SYSCONF_NAMES = {1: "SC_LEVEL1_DCACHE_SIZE", 2: "SC_LEVEL2_CACHE_SIZE", 3: "SC_LEVEL3_CACHE_SIZE"}
DEFAULTS = {1: DEFAULT_L1, 2: DEFAULT_L2, 3: DEFAULT_L3}
DEFAULT_L1_WAYS = 8


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
    return _l1_data(root, "ways_of_associativity") or _sysconf("SC_LEVEL1_DCACHE_ASSOC") or DEFAULT_L1_WAYS


def _l1_data(root: Path, field: str) -> int:
    """A positive number from the sysfs file `field` of the L1 data cache, or 0."""
    for index in sorted(root.glob("index*")):
        try:
            if int((index / "level").read_text()) == 1 and (index / "type").read_text().strip() == "Data":
                return max(0, int((index / field).read_text()))
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


@lru_cache(maxsize=1)
def host() -> Target:
    """This machine, read once per process."""
    triple = llvm.get_process_triple()
    features = dict(llvm.get_host_cpu_features().items())
    bits, registers = vector_file(triple, features)
    sizes = cache_sizes()
    fma = bool(features.get("fma") or features.get("neon") or triple.startswith(("aarch64", "arm64")))
    return Target(triple.split("-")[0], bits, registers, fma, sizes[1], sizes[2], sizes[3], _cores(), l1_ways())
