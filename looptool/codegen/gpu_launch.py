"""Host code that launches a GPU module's kernels: one native function calls `cuLaunchKernel` for
each kernel in order, with the kernel handles, grids, blocks and shared memory built in, so a call
from Python is one foreign call with one argument, whatever the number of kernels (a `cuLaunchKernel`
through ctypes costs some microseconds in argument conversion alone).

The function takes the address of a block of 64-bit words: the stream, then one value a kernel
parameter, then a pointer to each of those values (the `kernelParams` array of `cuLaunchKernel`).
It returns 0, or the number of the first kernel the driver refused, plus one.

A kernel marked `programmatic` goes through `cuLaunchKernelEx` with programmatic stream serialization
(sm_90): the driver starts it once every block of the kernel before it has started (and let it:
`griddepcontrol.launch_dependents`), instead of once that kernel has finished, and its threads wait for
that kernel's results (`griddepcontrol.wait`), so its launch and set-up overlap the other's end.
"""
from __future__ import annotations

from dataclasses import dataclass

from .. import ir

ENTRY = "looptool_launch"
# CUlaunchConfig: grid x, y, z, block x, y, z, shared bytes, stream, attributes, their count
LAUNCH_CONFIG = "{ i32, i32, i32, i32, i32, i32, i32, ptr, ptr, i32 }"
PROGRAMMATIC_SERIALIZATION = 6        # CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION
# CUlaunchAttribute: its id, padding, a 64-byte value (here the flag 1)
PROGRAMMATIC_ATTRIBUTE = (f"@programmatic = private constant {{ i32, i32, [8 x i64] }} "
                          f"{{ i32 {PROGRAMMATIC_SERIALIZATION}, i32 0, [8 x i64] [i64 1, i64 0, i64 0, i64 0, i64 0, "
                          f"i64 0, i64 0, i64 0] }}")


@dataclass(frozen=True)
class KernelLaunch:
    """One kernel to launch: its loaded `CUfunction` handle and its launch shape (a grid extent that is
    an `ir.Size` is ceil(n / divisor) of the size n the block holds for its dim, `size_slots`)."""

    function: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared: int
    programmatic: bool = False       # through cuLaunchKernelEx, started while the kernel before it ends


def launch_block_words(param_count: int) -> int:
    """Words in the argument block of a module with `param_count` kernel parameters."""
    return 1 + 2 * param_count


def launcher_ir(launch_kernel: int, kernels: list[KernelLaunch], param_count: int, name: str = ENTRY,
                size_slots: dict[str, int] | None = None, launch_kernel_ex: int = 0) -> str:
    """LLVM IR of `i32 name(ptr block)`, which launches `kernels` in order on the block's stream
    through `cuLaunchKernel` (found at address `launch_kernel`; a `programmatic` kernel through
    `cuLaunchKernelEx`, at `launch_kernel_ex`) with the block's parameters; a dynamic dim's size is the
    value of parameter `size_slots[dim]`."""
    lines = [f"define i32 @{name}(ptr %block) {{", "entry:",
             "  %stream = load ptr, ptr %block",
             f"  %params = getelementptr i64, ptr %block, i64 {1 + param_count}",
             f"  %launch = inttoptr i64 {launch_kernel} to ptr",
             f"  %launch_ex = inttoptr i64 {launch_kernel_ex} to ptr"]
    for number, kernel in enumerate(kernels):
        grid = [_extent(lines, extent, f"g{number}.{axis}", size_slots or {})
                for axis, extent in enumerate(kernel.grid)]
        dims = [*grid, *kernel.block, kernel.shared]
        lines.append(f"  %f{number} = inttoptr i64 {kernel.function} to ptr")
        if kernel.programmatic:
            lines += _config(number, dims)
            lines.append(f"  %r{number} = call i32 %launch_ex(ptr %c{number}, ptr %f{number}, ptr %params, ptr null)")
        else:
            operands = ", ".join(f"i32 {d}" for d in dims)
            lines.append(f"  %r{number} = call i32 %launch(ptr %f{number}, {operands}, ptr %stream, ptr %params, "
                         f"ptr null)")
        lines += [f"  %bad{number} = icmp ne i32 %r{number}, 0",
                  f"  br i1 %bad{number}, label %refused{number}, label %next{number}",
                  f"refused{number}:", f"  ret i32 {number + 1}", f"next{number}:"]
    lines += ["  ret i32 0", "}", PROGRAMMATIC_ATTRIBUTE, ""]
    return "\n".join(lines)


def _config(number: int, dims: list) -> list[str]:
    """Instructions filling launch `number`'s CUlaunchConfig (%c<number>) with its dims, the stream and the
    programmatic serialization attribute."""
    fields = [f"i32 {d}" for d in dims] + ["ptr %stream", "ptr @programmatic", "i32 1"]
    lines = [f"  %c{number} = alloca {LAUNCH_CONFIG}"]
    for index, field in enumerate(fields):
        lines += [f"  %c{number}.{index} = getelementptr {LAUNCH_CONFIG}, ptr %c{number}, i32 0, i32 {index}",
                  f"  store {field}, ptr %c{number}.{index}"]
    return lines


def _extent(lines: list[str], extent, name: str, size_slots: dict[str, int]) -> str:
    """A grid extent as an i32 operand: the number, or (an `ir.Size`) ceil(n / divisor) of its dim's size
    read from the block, computed by instructions added to `lines`."""
    if not isinstance(extent, ir.Size):
        return str(extent)
    dim = extent.dim
    lines += [f"  %{name}.at = getelementptr i64, ptr %block, i64 {1 + size_slots[dim]}",
              f"  %{name}.n = load i64, ptr %{name}.at",
              f"  %{name}.up = add i64 %{name}.n, {extent.divisor - 1}",
              f"  %{name}.q = udiv i64 %{name}.up, {extent.divisor}",
              f"  %{name} = trunc i64 %{name}.q to i32"]
    return f"%{name}"
