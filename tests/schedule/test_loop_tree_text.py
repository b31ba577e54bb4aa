"""Inspection: the default loop tree of a computation, printed, without running anything."""

import looptool as lt
from tests.helpers import assert_loop_tree_text, rand, random_matmul


# ---------------------------------------------------------------- loop tree text

def test_loop_tree_text_for_matmul(rng):
    t, _, _ = random_matmul(rng, 23, 29, 31)
    before = dict(lt.cache_info())
    text = str(t.loop_tree())
    assert_loop_tree_text(text, {"m": 23, "k": 29, "n": 31})
    assert lt.cache_info()["hits"] == before["hits"]  # inspection does not execute


def test_loop_tree_text_for_window_and_reduction(rng):
    h, oh, kh, c = lt.symbols("h oh kh c")
    x = lt.Tensor(rand(rng, (17, 5))).to(h, c)
    t = x.window(h, oh, kh, 3, stride=2).max(kh).sum(c)
    assert t.dims == (oh,) and t.shape == (8,)
    assert_loop_tree_text(str(t.loop_tree()), {"oh": 8, "kh": 3, "c": 5})
