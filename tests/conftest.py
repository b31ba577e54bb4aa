import zlib

import numpy as np
import pytest

# tests/ is a package (one subpackage per layer: frontend, ir, schedule, analysis, codegen, runtime,
# export, notebook, tuner), so the shared helpers are imported as `tests.helpers`,
# `tests.schedule_helpers`, `tests.gpu_helpers`, `tests.tuner_helpers` and
# `tests.random_program_helpers`.  tests/ itself is not put on sys.path: its folder tuner/ would
# shadow the tuner package.


@pytest.fixture
def rng(request):
    """A numpy Generator seeded deterministically from the test's node id."""
    return np.random.default_rng(zlib.crc32(request.node.nodeid.encode()))


@pytest.fixture(autouse=True, scope="session")
def isolated_kernel_cache(tmp_path_factory):
    """Compiled GPU modules go to a folder of this session's (LOOPTOOL_CACHE_DIR), never ~/.cache."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOOPTOOL_CACHE_DIR", str(tmp_path_factory.mktemp("kernel-cache")))
        yield
