"""Schedule features for the tuner's cost model (looptool/analysis/features.py)."""
from __future__ import annotations

import numpy as np

from looptool.analysis import features
from tests.tuner_helpers import matmul_case, softmax_case


def _tiled(tree, tile: int):
    return tree.split("n", tile).split("k", 16).reorder("n.0", "k.0", "m", "k.1", "n.1").vectorize("n.1")


def test_features_have_a_fixed_length_for_any_program():
    for case in (matmul_case(24, 20, 28), softmax_case(8, 16)):
        vector = features.schedule_features(case.tensor.loop_tree())
        assert vector.shape == (features.feature_length(),)
        assert np.isfinite(vector).all()


def test_features_change_when_tile_sizes_change():
    tree = matmul_case(64, 64, 64).tensor.loop_tree()
    by_tile = {tile: features.schedule_features(_tiled(tree, tile)) for tile in (8, 16, 32)}
    assert not np.array_equal(by_tile[8], by_tile[16])
    assert not np.array_equal(by_tile[16], by_tile[32])
    # The innermost loop's extent (level 0 of the heaviest statement) is the tile: log2(1 + tile).
    assert by_tile[16][0] == np.log2(17) and by_tile[32][0] == np.log2(33)
    # And the vector width follows it.
    width = features.statement_width(3)
    vector_column = 4 * features.LEVELS + 2
    assert by_tile[32][vector_column] == np.log2(33) and width > vector_column


def test_features_see_contiguity_and_cache_traffic():
    """Vectorizing along n (contiguous in b and c) against along m (strided): the contiguous
    fraction of the innermost loop's accesses and the bytes moved differ."""
    tree = matmul_case(64, 64, 64).tensor.loop_tree().reorder("m", "k", "n")
    along_n = features.schedule_features(tree.reorder("k", "m", "n"))
    along_m = features.schedule_features(tree.reorder("k", "n", "m"))
    contiguous = 4 * features.LEVELS + 6          # fraction with stride 1 along the innermost loop
    assert along_n[contiguous] > along_m[contiguous]
    assert features.schedule_features(tree).shape == along_n.shape
