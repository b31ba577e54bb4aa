"""Host code that launches a GPU module's kernels: one native function calls `cuLaunchKernel` for
each kernel in order, with the kernel handles, grids, blocks and shared memory built in, so a call
from Python is one foreign call with one argument, whatever the number of kernels (a `cuLaunchKernel`
through ctypes costs some microseconds in argument conversion alone).

The function takes the address of a block of 64-bit words: the stream, then one value a kernel
parameter, then a pointer to each of those values (the `kernelParams` array of `cuLaunchKernel`).
It returns 0, or the number of the first kernel the driver refused, plus one.
"""
from __future__ import annotations

from dataclasses import dataclass

ENTRY = "looptool_launch"


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel to launch: its loaded `CUfunction` handle and its launch shape."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int


def launch_block_words(param_count: int) -> int:
    """Words in the argument block of a module with `param_count` kernel parameters."""
    return 1 + 2 * param_count


def launcher_ir(launch_kernel: int, kernels: list[KernelLaunch], param_count: int, name: str = ENTRY) -> str:
    """LLVM IR of `i32 name(ptr block)`, which launches `kernels` in order on the block's stream
    through `cuLaunchKernel` (found at address `launch_kernel`) with the block's parameters."""
    lines = [f"define i32 @{name}(ptr %block) {{", "entry:",
             "  %stream = load ptr, ptr %block",
             f"  %params = getelementptr i64, ptr %block, i64 {1 + param_count}",
             f"  %launch = inttoptr i64 {launch_kernel} to ptr"]
    for number, kernel in enumerate(kernels):
        dims = ", ".join(f"i32 {d}" for d in (*kernel.grid, *kernel.block, kernel.shared))
        lines += [f"  %f{number} = inttoptr i64 {kernel.function} to ptr",
                  f"  %r{number} = call i32 %launch(ptr %f{number}, {dims}, ptr %stream, ptr %params, ptr null)",
                  f"  %bad{number} = icmp ne i32 %r{number}, 0",
                  f"  br i1 %bad{number}, label %refused{number}, label %next{number}",
                  f"refused{number}:", f"  ret i32 {number + 1}", f"next{number}:"]
    lines += ["  ret i32 0", "}", ""]
    return "\n".join(lines)
