"""The analysis layer: isl legality of loop trees, and features of a schedule for cost models.  Importing it installs the check behind
`LoopTree.check()` and `LoopTree.assert_legal()`."""
from ..schedule import LEGALITY
from . import features, legality

LEGALITY.install(legality)

__all__ = ["features", "legality"]
