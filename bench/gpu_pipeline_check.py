"""Run pipelined GPU matmuls once at a small size (for compute-sanitizer): each schedule checked
against a float64 reference on NaN-poisoned outputs.  Exit status 1 on a wrong result."""
import sys

import numpy as np

import looptool as lt
from looptool.runtime import gpu as runtime_gpu
from tuner import space


def main() -> int:
    """Check 2-, 3- and 4-stage pipelines on a matmul with tails in every dim."""
    cp = runtime_gpu.cupy()
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((150, 70)).astype(np.float32), rng.standard_normal((70, 200)).astype(np.float32)
    m, k, n = lt.symbols("m k n")
    c = (lt.Tensor(cp.asarray(a)).to(m, k) * lt.Tensor(cp.asarray(b)).to(k, n)).sum(k)
    ref = a.astype(np.float64) @ b
    failures = 0
    for stages in (2, 3, 4):
        tree = space.register_tiled(c.loop_tree(), "t0", 8, 2, 4, 8, 4, 8, True, ("in0", "in1"))
        out = c.cuda(tree.pipeline("k.0", stages, stage="t0.acc"))
        err = float(np.abs(cp.asnumpy(out) - ref).max() / np.abs(ref).max())
        ok = err < 1e-5
        failures += not ok
        print(f"{stages} stages: rel. error {err:.1e} {'ok' if ok else 'WRONG'}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
