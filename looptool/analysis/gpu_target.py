"""The GPU as the automatic scheduler sees it: streaming multiprocessors, threads, registers, shared
memory and which tensor-core instructions it runs.

The runtime reads these from the device (CUDA device attributes, through CuPy) and passes them
down; without a GPU (schedules made on the CPU, tests, export for another GPU) `assumed_gpu(arch)`
gives the figures of that architecture's reference part. `GpuTarget` is a plain dataclass, so
tests build their own.
"""
from __future__ import annotations

from dataclasses import dataclass

WARP_LANES = 32
STATIC_SHARED = 48 * 1024        # shared memory a block may use without opting in (every arch)


def capability(arch: str) -> int:
    """The compute capability of a PTX target as a number, e.g. 90 for sm_90 (and sm_90a)."""
    return int("".join(ch for ch in arch.removeprefix("sm_") if ch.isdigit()))


@dataclass(frozen=True)
class GpuTarget:
    """An NVIDIA GPU: its PTX target, SM count and per-SM limits (threads, registers, shared bytes),
    the shared memory one block may opt in to, and its L2 cache."""

    arch: str
    sms: int
    threads_per_sm: int = 2048
    registers_per_sm: int = 65536
    shared_per_sm: int = 228 * 1024
    shared_per_block: int = 227 * 1024
    name: str = ""
    l2_bytes: int = 50 * 1024 * 1024

    @property
    def capability(self) -> int:
        """The compute capability as a number (`capability`)."""
        return capability(self.arch)

    @property
    def tensor_cores(self) -> str | None:
        """'wgmma' on Hopper, 'mma' (mma.sync m16n8k16) on sm_80 and later, None before."""
        if self.capability == 90:
            return "wgmma"
        return "mma" if self.capability >= 80 else None

    @property
    def resident_threads(self) -> int:
        """Threads the whole GPU keeps in flight at full occupancy."""
        return self.sms * self.threads_per_sm

    def describe(self) -> str:
        """One line naming the facts the scheduler used."""
        return (f"GPU {self.name or self.arch} ({self.arch}): {self.sms} SMs, {self.threads_per_sm} threads and "
                f"{self.registers_per_sm} registers an SM, {self.shared_per_block // 1024} KiB of shared memory a "
                f"block, tensor cores: {self.tensor_cores or 'none'}")


# Reference parts of each architecture, for schedules made where no GPU can be asked
MIB = 1024 * 1024
ASSUMED = {80: GpuTarget("sm_80", 108, 2048, 65536, 164 * 1024, 163 * 1024, "A100 (assumed)", 40 * MIB),
           86: GpuTarget("sm_86", 84, 1536, 65536, 100 * 1024, 99 * 1024, "RTX 3090 (assumed)", 6 * MIB),
           89: GpuTarget("sm_89", 128, 1536, 65536, 100 * 1024, 99 * 1024, "RTX 4090 (assumed)", 72 * MIB),
           90: GpuTarget("sm_90", 132, 2048, 65536, 228 * 1024, 227 * 1024, "H100 SXM (assumed)", 50 * MIB)}


def assumed_gpu(arch: str) -> GpuTarget:
    """The reference part of `arch` (the nearest older architecture listed; an sm_75-like part before)."""
    known = [cc for cc in ASSUMED if cc <= capability(arch)]
    if not known:
        return GpuTarget(arch, 40, 1024, 65536, 64 * 1024, STATIC_SHARED, f"{arch} (assumed)", 4 * MIB)
    base = ASSUMED[max(known)]
    return GpuTarget(arch, base.sms, base.threads_per_sm, base.registers_per_sm, base.shared_per_sm,
                     base.shared_per_block, base.name, base.l2_bytes)
