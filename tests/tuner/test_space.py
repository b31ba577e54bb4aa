"""The CPU search space is centred on the automatic schedule: its centre's parameters rebuild the
automatic loop tree, random draws near it are legal, and its neighbourhoods follow the target."""
from __future__ import annotations

import numpy as np
import optuna
import pytest

import looptool as lt
from looptool.analysis.target import Target, host
from looptool.autoschedule import auto_tree
from looptool.runtime import lower_on_host
from tuner import space

from tests.autoschedule.test_generality import WORKLOADS
from tests.helpers import assert_close

AVX2 = Target("x86_64", 256, 16, True, 32 * 1024, 512 * 1024, 32 << 20, 2)
AVX512 = Target("x86_64", 512, 32, True, 48 * 1024, 1 << 20, 32 << 20, 2)
TARGETS = {"host": None, "avx2": AVX2, "avx512": AVX512}


def program_of(name):
    tensor, _ = WORKLOADS[name](np.random.default_rng(0))
    return tensor, lower_on_host(tensor.node)[0]


@pytest.mark.parametrize("target", ["host", "avx512"])
@pytest.mark.parametrize("name", sorted(WORKLOADS))
@pytest.mark.parametrize("threads", [1, 2])
def test_the_centre_of_the_space_is_the_automatic_schedule(name, target, threads):
    tensor, program = program_of(name)
    model = TARGETS[target] or host()
    params = space.automatic_params(program, threads, model)
    drawn = space.sample(optuna.trial.FixedTrial(params), tensor.loop_tree(), threads, model)
    automatic = auto_tree(program, model.with_cores(threads))
    assert drawn.schedule.to_json() == automatic.schedule.to_json()


@pytest.mark.parametrize("name", ["matmul", "matmul_b_transposed", "batched_matmul", "conv2d_nchw",
                                  "conv2d_nhwc", "softmax", "layernorm"])
def test_random_draws_are_legal(name):
    """40 draws with 2 threads: at least 90 % are built and pass the isl check."""
    tensor, program = program_of(name)
    study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=3))
    legal = 0
    for _ in range(40):
        trial = study.ask()
        try:
            legal += space.sample(trial, tensor.loop_tree(), 2).check()[0]
        except space.InvalidDraw:
            pass
        study.tell(trial, 1.0)
    assert legal >= 36, legal


def test_each_parameter_is_drawn_from_the_automatic_value_and_two_steps_around_it():
    _, program = program_of("matmul")                     # 70 x 90 by 90 x 100
    centre = space.centre_of(program, AVX2.with_cores(2))
    assert centre["t0.m.tile"].options == (2, 3, 4, 5, 6) and centre["t0.m.tile"].value == 4
    assert centre["t0.n.tile"].options == (8, 16, 24, 32, 40) and centre["t0.n.tile"].value == 24
    assert centre["t0.pack.in1"].options == (True, False)
    assert centre["t0.parallel"].options[0] == "none"
    order = centre["t0.order"]
    assert order.options[0] == order.value and len(order.options) > 1
    for other in order.options[1:]:                       # one swap away
        assert sum(a != b for a, b in zip(order.value.split(), other.split())) == 2


def vector_widths(tree):
    return {lp.extent for _, sched in tree.schedule.stages for lp in sched.loops if lp.annotation == "vectorize"}


def test_draws_on_an_avx512_target_differ():
    tensor, program = program_of("matmul")
    avx2, avx512 = space.centre_of(program, AVX2.with_cores(1)), space.centre_of(program, AVX512.with_cores(1))
    assert all(c % 8 == 0 for c in avx2["t0.n.tile"].options)
    assert all(c % 16 == 0 for c in avx512["t0.n.tile"].options)
    assert avx2["t0.n.tile"].options != avx512["t0.n.tile"].options
    for target, lanes in ((AVX2, 8), (AVX512, 16)):
        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=0))
        for _ in range(10):
            trial = study.ask()
            assert vector_widths(space.sample(trial, tensor.loop_tree(), 1, target)) == {lanes}
            study.tell(trial, 1.0)


def odd_matmul(rng):
    """A matmul of odd sizes (none a multiple of a vector or of a register tile's rows)."""
    a, b = rng.standard_normal((37, 29), dtype=np.float32), rng.standard_normal((29, 53), dtype=np.float32)
    s = lt.symbols("m k n")
    return (lt.Tensor(a).to(s.m, s.k) * lt.Tensor(b).to(s.k, s.n)).sum(s.k), a.astype(np.float64) @ b


MOVES = dict(WORKLOADS, odd_matmul=odd_matmul)


@pytest.mark.parametrize("target", ["avx2", "avx512"])
@pytest.mark.parametrize("name", ["matmul", "odd_matmul", "batched_matmul", "conv2d_nchw", "softmax", "layernorm"])
def test_every_move_from_the_centre_is_legal_and_correct(name, target):
    """Each parameter moved alone to each of its other values (up to two steps: a quarter or four times
    a block, two rows or two vectors more or less) on a fake AVX2 or AVX-512 target with 2 cores:
    the schedule is built, passes the isl check and matches NumPy in float64."""
    tensor, ref = MOVES[name](np.random.default_rng(0))
    program = lower_on_host(tensor.node)[0]
    model = TARGETS[target]
    centre, params = space.centre_of(program, model.with_cores(2)), space.automatic_params(program, 2, model)
    moves = [(n, option) for n, choice in centre.items() for option in choice.options if option != choice.value]
    for param, option in moves:
        tree = space.sample(optuna.trial.FixedTrial(dict(params, **{param: space.categorical(option)})),
                            tensor.loop_tree(), 2, model)
        assert tree.check() == (True, "legal"), (param, option)
        assert_close(tensor.numpy(tree), ref, 1e-5)
