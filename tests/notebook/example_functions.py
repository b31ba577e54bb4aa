"""An lt.function at module level, for the terminal editor's `module:function` workload."""
import looptool as lt

m, k, n = lt.symbols("m k n")


@lt.function
def matmul(a: lt.In[m, k], b: lt.In[k, n]):
    return (a * b).sum(k)
