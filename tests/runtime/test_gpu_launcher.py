"""The native launcher of GPU modules (`codegen.gpu_launch`), run on the CPU against a stand-in for
`cuLaunchKernel` that records what it is given."""
import ctypes

import pytest

from looptool.codegen import gpu_launch
from looptool.runtime import gpu as runtime_gpu

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p,
                          ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def recording_launch(calls: list, refuse: int | None = None, count: int = 3):
    """A stand-in for cuLaunchKernel: records (function, dims, stream, the first `count` parameter values,
    extra) and returns an error for the launch numbered `refuse`."""
    def launch(function, gx, gy, gz, bx, by, bz, shared, stream, params, extra):
        values = [ctypes.c_uint64.from_address(params[i]).value for i in range(count)]
        calls.append((function, (gx, gy, gz), (bx, by, bz), shared, stream, values, extra))
        return 700 if len(calls) - 1 == refuse else 0
    return LAUNCH(launch)


def block_of(stream: int, values: list[int]):
    block = (ctypes.c_uint64 * gpu_launch.launch_block_words(len(values)))()
    base = ctypes.addressof(block)
    block[0] = stream
    for i, value in enumerate(values):
        block[1 + i] = value
        block[1 + len(values) + i] = base + 8 * (1 + i)
    return block


KERNELS = [gpu_launch.KernelLaunch(0x1000, (3, 2, 1), (128, 1, 1), 0),
           gpu_launch.KernelLaunch(0x2000, (1, 1, 1), (32, 4, 2), 49152)]


def test_launches_every_kernel_in_order_with_the_block():
    calls = []
    stub = recording_launch(calls)
    launcher = runtime_gpu.native_launcher(KERNELS, 3, ctypes.cast(stub, ctypes.c_void_p).value)
    block = block_of(0xABC0, [11, 22, 33])
    assert launcher(ctypes.c_void_p(ctypes.addressof(block))) == 0
    assert calls == [(0x1000, (3, 2, 1), (128, 1, 1), 0, 0xABC0, [11, 22, 33], None),
                     (0x2000, (1, 1, 1), (32, 4, 2), 49152, 0xABC0, [11, 22, 33], None)]


@pytest.mark.parametrize("refused", [0, 1])
def test_a_refused_launch_stops_and_says_which(refused):
    calls = []
    stub = recording_launch(calls, refuse=refused)
    launcher = runtime_gpu.native_launcher(KERNELS, 3, ctypes.cast(stub, ctypes.c_void_p).value)
    block = block_of(0, [1, 2, 3])
    assert launcher(ctypes.c_void_p(ctypes.addressof(block))) == refused + 1
    assert len(calls) == refused + 1


class LaunchAttribute(ctypes.Structure):
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_uint32), ("value", ctypes.c_uint64 * 8)]


class LaunchConfig(ctypes.Structure):
    _fields_ = [("dims", ctypes.c_uint * 7), ("stream", ctypes.c_void_p),
                ("attributes", ctypes.POINTER(LaunchAttribute)), ("count", ctypes.c_uint)]


LAUNCH_EX = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(LaunchConfig), ctypes.c_void_p,
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p)


def test_a_programmatic_kernel_goes_through_launch_kernel_ex_with_programmatic_serialization():
    """The second kernel is started while the first ends: cuLaunchKernelEx gets its dims, the stream and one
    attribute, CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (6) set to 1; the first goes plainly."""
    plain, extended = [], []

    def launch_ex(config, function, params, extra):
        c = config.contents
        attribute = c.attributes[0]
        values = [ctypes.c_uint64.from_address(params[i]).value for i in range(3)]
        extended.append((function, tuple(c.dims), c.stream, c.count, attribute.id, attribute.value[0], values, extra))
        return 0
    stub, stub_ex = recording_launch(plain), LAUNCH_EX(launch_ex)
    kernels = [KERNELS[0], gpu_launch.KernelLaunch(0x2000, (1, 1, 1), (32, 4, 2), 49152, programmatic=True)]
    launcher = runtime_gpu.native_launcher(kernels, 3, ctypes.cast(stub, ctypes.c_void_p).value,
                                           launch_kernel_ex=ctypes.cast(stub_ex, ctypes.c_void_p).value)
    block = block_of(0xABC0, [11, 22, 33])
    assert launcher(ctypes.c_void_p(ctypes.addressof(block))) == 0
    assert plain == [(0x1000, (3, 2, 1), (128, 1, 1), 0, 0xABC0, [11, 22, 33], None)]
    assert extended == [(0x2000, (1, 1, 1, 32, 4, 2, 49152), 0xABC0, 1, 6, 1, [11, 22, 33], None)]
