import os
import sys
import zlib

import numpy as np
import pytest

# Make tests/helpers.py importable whatever pytest's import mode is.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)


@pytest.fixture
def rng(request):
    """A numpy Generator seeded deterministically from the test's node id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))
