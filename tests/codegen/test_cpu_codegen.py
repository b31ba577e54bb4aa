"""CPU code generation: the LLVM IR and native assembly a compiled kernel exposes, vector
types for a vectorized loop and packed FMAs for a vectorized matmul."""

import re

import llvmlite.binding as llvm
import numpy as np
import pytest

from looptool import ir
from tests.helpers import assert_close, assert_loop_tree_text, check, f64, random_matmul
from tests.schedule_helpers import matmul, pointwise


# ------------------------------------------------------------------ LLVM IR and assembly

@pytest.mark.parametrize("dtype, ir_type", [(np.float32, "float"), (np.float64, "double")])
def test_compile_exposes_llvm_ir_and_assembly(rng, dtype, ir_type):
    t, a, b = random_matmul(rng, 13, 11, 9, dtype)
    kernel = t.compile()
    ir = kernel.llvm_ir
    asm = kernel.assembly
    assert isinstance(ir, str) and "define" in ir
    assert re.search(rf"(?<!\w){ir_type}(?!\w)", ir), f"no {ir_type} type in IR"
    assert isinstance(asm, str) and len(asm) > 0
    assert re.search(r"(?<!\w)ret\w*", asm), "assembly has no return instruction"
    assert "define" not in asm  # native assembly, not LLVM IR
    assert_loop_tree_text(str(kernel.loop_tree), {"m": 13, "k": 11, "n": 9})
    check(t, f64(a) @ f64(b), dtype)


# ------------------------------------------------------------------ vector code

def _host_has(*features):
    flags = llvm.get_host_cpu_features()
    return all(flags.get(f, False) for f in features)


@pytest.mark.skipif(not re.match(r"x86_64|amd64", llvm.get_process_triple()), reason="x86 assembly check")
def test_vectorized_matmul_uses_packed_fma(rng):
    if not _host_has("fma", "avx2"):
        pytest.skip("host CPU has no FMA/AVX2")
    case = matmul(rng, 32, 64, 64)
    t = case.make()
    tree = t.loop_tree().split("n", 16).vectorize("n.1")
    kernel = t.compile(tree)
    asm = kernel.assembly
    assert re.search(r"vfmadd\w*ps\s+[^\n]*%[yz]mm", asm), \
        "no packed single-precision FMA on ymm/zmm registers in:\n" + \
        "\n".join(ln for ln in asm.splitlines() if "fma" in ln or "mul" in ln)[:4000]
    case.check(kernel(ir.lower(t.node)[1]))


def test_vectorized_loop_in_llvm_ir_is_vector_code(rng):
    case = pointwise(rng, m=4, n=64)
    t = case.make()
    kernel = t.compile(t.loop_tree().split("n", 16).vectorize("n.1"))
    assert re.search(r"<\d+ x float>", kernel.optimized_ir), "no vector type in the optimized IR"
    case.check(t.numpy(kernel.loop_tree))


# ------------------------------------------------------------------ threads

def test_a_buffer_placed_at_a_parallel_loop_is_private_to_each_thread(rng):
    """A panel packed per iteration of a parallel loop: each thread fills and reads its own copy
    (a copy shared by the threads gave wrong sums here)."""
    import looptool as lt
    t, a, b = random_matmul(rng, 200, 300, 500, np.float32)
    tree = (t.loop_tree().split("k", 100).split("n", 24).split("n.1", 8).split("m", 4)
            .reorder("k.0", "n.0", "m.0", "k.1", "m.1", "n.1.0", "n.1.1")
            .unroll("m.1").unroll("n.1.0").vectorize("n.1.1")
            .cache("in1").place("in1.t0", "t0", 2).parallel("n.0"))
    threads = lt.get_num_threads()
    lt.set_num_threads(2)
    try:
        got = t.numpy(tree)
    finally:
        lt.set_num_threads(threads)
    assert_close(got, f64(a) @ f64(b), 1e-5)
