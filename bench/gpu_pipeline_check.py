"""Run pipelined GPU matmuls once at a small size (for compute-sanitizer): each schedule checked
against a float64 reference on NaN-poisoned outputs.  Exit status 1 on a wrong result."""
import sys

import numpy as np

import looptool as lt
from looptool.runtime import gpu as runtime_gpu
from looptool.autoschedule import gpu as templates


def main() -> int:
    """Check 2-, 3- and 4-stage pipelines (and the float32 schedules of bench.gpu: A as stored in k
    tiles of 32, or transposed ahead by its own kernel, with 2 and 3 stages) on a matmul with tails in
    every dim."""
    cp = runtime_gpu.cupy()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((150, 70)).astype(np.float32), rng.standard_normal((70, 200)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(cp.asarray(a)).to(m, k) * lt.Tensor(cp.asarray(b)).to(k, n)).sum(k)
    ref = a.astype(np.float64) @ b
    failures = 0
    small = templates.register_tiled(c.loop_tree(), "t0", 8, 2, 4, 8, 4, 8, True, ("in0", "in1"))
    as_stored = templates.register_tiled(c.loop_tree(), "t0", 16, 2, 4, 16, 8, 32, True, ("in0", "in1"), ("in0",))
    ahead = templates.register_tiled(templates.transposed_ahead(c.loop_tree(), "t0", "in0"), "t0", 16, 2, 4, 16, 8, 32, True,
                                 ("in0.t0", "in1"), ("in0.t0", "in1"), y_groups=2)
    for label, tree, stages in [("64x64 tiles, k 8", small, s) for s in (2, 3, 4)] + \
            [("128x128 tiles, k 32, A as stored", as_stored, s) for s in (2, 3)] + \
            [("128x128 tiles, k 32, A transposed ahead", ahead, s) for s in (2, 3)]:
        out = c.cuda(tree.pipeline("k.0", stages, stage="t0.acc"))
        err = float(np.abs(cp.asnumpy(out) - ref).max() / np.abs(ref).max())
        ok = err < 1e-5
        failures += not ok
        print(f"{label}, {stages} stages: rel. error {err:.1e} {'ok' if ok else 'WRONG'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
