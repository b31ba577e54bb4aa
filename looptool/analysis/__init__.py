"""The analysis layer: isl legality of loop trees.  Importing it installs the check behind
`LoopTree.check()` and `LoopTree.assert_legal()`."""
from ..schedule import LEGALITY
from . import legality

LEGALITY.install(legality)

__all__ = ["legality"]
