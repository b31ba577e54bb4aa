"""The cost-model sampler (tuner/costmodel.py): the model ranks a held-out set of schedules by a
synthetic cost, the sampler finds cheap schedules of that cost with few trials, transfer reads
earlier studies from the storage, and drawing without Optuna follows the search space.

No kernel is compiled: a synthetic cost computed from the loop tree stands in for the timings."""
from __future__ import annotations

import json
import math
import statistics

import numpy as np
import optuna
import pytest
from scipy.stats import spearmanr

from looptool.schedule import accesses
from tuner import costmodel, space
from tuner.study import draw_schedule

from tests.tuner_helpers import matmul_case

pytestmark = pytest.mark.filterwarnings("ignore::optuna.exceptions.ExperimentalWarning")


def synthetic_seconds(tree) -> float:
    """Iterations of every statement, divided by its SIMD width, doubled for each access that
    strides along its innermost loop."""
    total = 0.0
    for stmt, path in tree.statements():
        iterations = math.prod(node.loop.extent for node in path)
        inner = path[-1] if path else None
        width = inner.loop.extent if inner is not None and inner.loop.annotation == "vectorize" else 1
        strided = 0
        for access in accesses(stmt):
            plan = tree.buffers[access.buffer]
            offset = plan.linear_offset(tuple(ix.substitute(stmt.index) for ix in access.index))
            strided += inner is not None and abs(offset.coeffs().get(inner.loop.name, 0)) > 1
        total += iterations / width * 2 ** strided
    return total * 1e-9


def _candidates(tree, count: int, seed: int):
    rng = np.random.default_rng(seed)
    out = []
    while len(out) < count:
        draft = costmodel.ParamDraw(rng)
        try:
            drawn = space.sample(draft, tree, 1)
        except space.InvalidDraw:
            continue
        out.append((draft.params, drawn))
    return out


def test_the_model_ranks_held_out_schedules_by_a_synthetic_cost():
    tree = matmul_case(64, 48, 96).tensor.loop_tree()
    drawn = _candidates(tree, 160, seed=0)
    rows = [costmodel.describe(t, 1) for _, t in drawn]
    seconds = [synthetic_seconds(t) for _, t in drawn]
    train = costmodel.TrainingSet(rows[:120], [math.log(min(seconds[:120]) / s) for s in seconds[:120]])
    model = costmodel.CostModel(seed=0).fit(train)
    predicted = model.predict(rows[120:])
    rho = spearmanr(predicted, [-s for s in seconds[120:]]).statistic
    assert rho >= 0.8, rho


def test_no_model_before_enough_measurements():
    model = costmodel.CostModel().fit(costmodel.TrainingSet([[1.0], [2.0]], [0.0, -1.0]))
    assert model.predict([[1.0]]) is None


def _synthetic_study(storage, name, case, trials, sampler, target="cpu:test", cost=synthetic_seconds):
    """A study of `case` whose trials cost `cost` (`synthetic_seconds`), with the attributes tune() sets."""
    tree = case.tensor.loop_tree()
    program = tree.program
    study = optuna.create_study(study_name=name, storage=storage, sampler=sampler)
    study.set_user_attr("target", target)
    study.set_user_attr("structure", costmodel.structure_key(program))
    study.set_user_attr("sizes", dict(program.sizes))

    study.optimize(_measured(tree, lambda drawn, params: cost(drawn)), n_trials=trials)
    return study


def _measured(tree, cost):
    """An objective that draws a schedule of `tree`, keeps its features as tune() does and returns
    cost(schedule, params); a draw the space refuses is pruned."""
    def objective(trial):
        try:
            drawn = draw_schedule(trial, tree, 1, "cpu")
        except space.InvalidDraw as err:
            raise optuna.TrialPruned(str(err)) from None
        trial.set_user_attr("features", costmodel.describe(drawn, 1))
        return cost(drawn, trial.params)
    return objective


def _costmodel_sampler(case, seed, prior=None):
    tree = case.tensor.loop_tree()
    return costmodel.CostModelSampler(lambda trial: draw_schedule(trial, tree, 1, "cpu"), 1, seed, prior)


def test_the_sampler_finds_cheaper_schedules_than_random_search_with_as_many_trials():
    """The space is centred on the automatic schedule, so random draws find the cheapest one too; the
    model's trials are cheaper as a whole (a lower median for every seed), and its best is as cheap in most
    seeds. (One seed alone is fragile: once a packed panel of the whole reduction was copied by vectors,
    issue #27, the model's 24 trials of seed 0 missed the cheapest schedule, which seeds 1 and 2 find.)"""
    case = matmul_case(64, 48, 96)
    as_cheap = 0
    for seed in range(3):
        storage = optuna.storages.InMemoryStorage()
        ranked = _synthetic_study(storage, "ranked", case, 24, _costmodel_sampler(case, seed))
        drawn = _synthetic_study(storage, "random", case, 24, optuna.samplers.RandomSampler(seed=seed))
        assert all(t.state == optuna.trial.TrialState.COMPLETE for t in ranked.trials)   # only legal ones
        assert statistics.median(t.value for t in ranked.trials) < statistics.median(t.value for t in drawn.trials)
        as_cheap += ranked.best_value <= drawn.best_value
    assert as_cheap >= 2


def test_a_cold_sampler_measures_better_schedules_first_than_random_draws():
    """Before any measurement the sampler ranks by closeness to the automatic schedule (the analytical
    model's choices). On a synthetic cost whose optimum is a neighbour of the automatic schedule (as
    measured: the best known matmul 512^3 schedule is one of them) its first round is never worse than
    random search's first trials, and cheaper over five seeds together (which neighbours a round holds
    is drawn, so one seed of random search may tie it: it did on an AVX-512 CPU, whose space differs)."""
    case = matmul_case(64, 48, 96)
    tree = case.tensor.loop_tree()
    centre = space.automatic_params(tree.program, 1)
    moved = sorted(centre)[0]

    def cost(drawn, params: dict) -> float:
        return 1.0 + sum(params.get(k) != v for k, v in centre.items() if k != moved) + (params.get(moved) == centre[moved])

    objective = _measured(tree, cost)
    first = costmodel.MIN_TRAINING
    cold_best, drawn_best, cold_median, drawn_median = [], [], [], []
    for seed in range(5):
        sampler = costmodel.CostModelSampler(lambda trial: draw_schedule(trial, tree, 1, "cpu"), 1, seed,
                                             centre=centre)
        cold = optuna.create_study(sampler=sampler)
        cold.optimize(objective, n_trials=first)
        drawn = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=seed))
        drawn.optimize(objective, n_trials=first)
        assert cold.trials[0].params == centre
        assert cold.best_value <= drawn.best_value
        cold_best.append(cold.best_value)
        drawn_best.append(drawn.best_value)
        cold_median.append(statistics.median(t.value for t in cold.trials))
        drawn_median.append(statistics.median(t.value for t in drawn.trials))
    assert sum(cold_best) < sum(drawn_best) and sum(cold_median) < sum(drawn_median), \
        (cold_best, drawn_best, cold_median, drawn_median)


def test_closeness_counts_the_centres_parameters_a_schedule_shares():
    sampler = costmodel.CostModelSampler(lambda trial: None, centre={"a": 1, "b": "x"})
    assert sampler.closeness({"a": 1, "b": "y", "c": 3}) == 0.5
    assert costmodel.CostModelSampler(lambda trial: None).closeness({"a": 1}) == 0.0


def test_transfer_reads_other_studies_and_seeds_from_the_nearest_shape():
    storage = optuna.storages.InMemoryStorage()
    near, far = matmul_case(64, 48, 96), matmul_case(16, 16, 16)
    _synthetic_study(storage, "near", near, 6, optuna.samplers.RandomSampler(seed=0))
    _synthetic_study(storage, "far", far, 6, optuna.samplers.RandomSampler(seed=1))
    _synthetic_study(storage, "other-target", near, 6, optuna.samplers.RandomSampler(seed=2), target="cpu:other")
    new = matmul_case(64, 48, 80)
    program = new.tensor.loop_tree().program
    prior = costmodel.prior_from_storage(storage, "new", "cpu:test", program)
    assert len(prior.data) == 12                      # both studies for this target, not the other
    near_study = optuna.load_study(study_name="near", storage=storage)
    best = sorted(near_study.trials, key=lambda t: t.value)[:costmodel.NEAREST_SEEDS]
    assert prior.seeds == [t.params for t in best]
    # The new study's first trials are the nearest shape's best schedules, where they fit its sizes.
    study = _synthetic_study(storage, "new", new, 2, _costmodel_sampler(new, 0, prior))
    first = study.trials[0]
    fitting = {k: v for k, v in prior.seeds[0].items() if k in first.distributions
               and v in first.distributions[k].choices}
    assert fitting and all(first.params[k] == v for k, v in fitting.items())


def test_the_prior_is_read_again_only_when_the_storage_changed():
    storage = optuna.storages.InMemoryStorage()
    near = matmul_case(64, 48, 96)
    _synthetic_study(storage, "near", near, 4, optuna.samplers.RandomSampler(seed=0))
    program = matmul_case(64, 48, 80).tensor.loop_tree().program
    first = costmodel.prior_from_storage(storage, "new", "cpu:test", program)
    assert costmodel.prior_from_storage(storage, "new", "cpu:test", program) is first
    optuna.load_study(study_name="near", storage=storage).optimize(lambda trial: 1.0, n_trials=1)
    again = costmodel.prior_from_storage(storage, "new", "cpu:test", program)
    assert again is not first and len(again.data) == len(first.data)   # the new trial has no features


def _ranking(model, drawn) -> float:
    """Spearman's correlation of a model's scores with the synthetic speed of drawn schedules."""
    predicted = model.predict([costmodel.describe(t, 1) for _, t in drawn])
    return spearmanr(predicted, [-synthetic_seconds(t) for _, t in drawn]).statistic


def _own_trials(drawn) -> costmodel.TrainingSet:
    seconds = [synthetic_seconds(t) for _, t in drawn]
    return costmodel.TrainingSet([costmodel.describe(t, 1) for _, t in drawn],
                                 [math.log(min(seconds) / s) for s in seconds])


def test_a_model_warm_started_from_another_shape_ranks_the_new_one():
    storage = optuna.storages.InMemoryStorage()
    _synthetic_study(storage, "old", matmul_case(64, 48, 96), 60, optuna.samplers.RandomSampler(seed=0))
    new = matmul_case(48, 64, 80)
    prior = costmodel.prior_from_storage(storage, "new", "cpu:test", new.tensor.loop_tree().program)
    assert _ranking(prior.model, _candidates(new.tensor.loop_tree(), 40, seed=1)) >= 0.7


def test_transferred_trials_that_rank_the_study_wrongly_are_left_out():
    """An earlier study of the same workload whose cost is the inverse of the new one's (no feature
    tells them apart): once the new study has its own trials, its model ranks by them. (32 own trials:
    the schedule space is centred on this CPU's automatic schedule, and on an Intel Xeon with AMX 16
    trials taught a model no better than Spearman 0.45, on a Zen 4 more than 0.7.)"""
    storage = optuna.storages.InMemoryStorage()
    new = matmul_case(64, 48, 96)
    _synthetic_study(storage, "inverse", new, 60, optuna.samplers.RandomSampler(seed=0),
                     cost=lambda tree: 1e-12 / synthetic_seconds(tree))
    tree = new.tensor.loop_tree()
    prior = costmodel.prior_from_storage(storage, "new", "cpu:test", tree.program)
    sampler = _costmodel_sampler(new, 0, prior)
    drawn = _candidates(tree, 72, seed=1)
    own, held_out = _own_trials(drawn[:32]), drawn[32:]
    assert prior.trust(costmodel.TrainingSet()) == 1.0 and prior.trust(own) == 0.0
    assert _ranking(costmodel.CostModel().fit(sampler.training_set(own)), held_out) >= 0.7
    blind = own.joined(prior.data, len(prior.data))      # every transferred trial as much as an own one
    assert _ranking(costmodel.CostModel().fit(blind), held_out) < 0.5


class RecordingBuilder:
    """Stands in for the measurer: records what the sampler asks to compile; `done` are ready."""

    def __init__(self):
        self.prefetched, self.done = [], set()

    def prefetch(self, schedules):
        self.prefetched += [json.dumps(steps) for steps in schedules]

    def ready(self, steps) -> bool:
        return json.dumps(steps) in self.done


def test_the_sampler_hands_each_round_to_the_builder_and_takes_ready_kernels_first():
    case = matmul_case(64, 48, 96)
    tree = case.tensor.loop_tree()
    builder = RecordingBuilder()
    sampler = costmodel.CostModelSampler(lambda trial: draw_schedule(trial, tree, 1, "cpu"), 1, 0, None, builder)
    study = optuna.create_study(sampler=sampler)
    drawn = []

    def objective(trial):
        drawn.append(json.dumps(draw_schedule(trial, tree, 1, "cpu").schedule.steps))
        builder.done.add(builder.prefetched[-1])          # the round's last kernel is ready first
        return synthetic_seconds(draw_schedule(trial, tree, 1, "cpu"))
    study.optimize(objective, n_trials=costmodel.MIN_TRAINING)
    # The first round (no model yet) has MIN_TRAINING schedules, all prefetched; the ready one ran second.
    assert len(builder.prefetched) == costmodel.MIN_TRAINING
    assert sorted(drawn) == sorted(builder.prefetched)
    assert drawn[1] == builder.prefetched[-1]


def test_param_draw_keeps_its_base_without_mutation_and_redraws_values_that_do_not_fit():
    tree = matmul_case(64, 48, 96).tensor.loop_tree()
    (params, drawn), = _candidates(tree, 1, seed=3)
    again = costmodel.ParamDraw(np.random.default_rng(9), params, mutation=0.0)
    assert space.sample(again, tree, 1).schedule.to_json() == drawn.schedule.to_json()
    assert again.params == params
    small = matmul_case(8, 8, 8).tensor.loop_tree()
    fitted = costmodel.ParamDraw(np.random.default_rng(9), {"t0.k.block": 64})
    try:
        space.sample(fitted, small, 1)
    except space.InvalidDraw:
        pass
    assert fitted.params["t0.k.block"] <= 8


def test_workers_sharing_a_study_do_not_measure_a_schedule_another_worker_took():
    """Two samplers (two workers' processes) on one study rank alike: each skips the queued schedules a
    trial of the other took since its round was chosen, so every trial measures a schedule of its own."""
    case = matmul_case(64, 48, 96)
    storage = optuna.storages.InMemoryStorage()
    tree = case.tensor.loop_tree()
    objective = _measured(tree, lambda drawn, params: synthetic_seconds(drawn))
    optuna.create_study(study_name="shared", storage=storage)
    workers = [optuna.load_study(study_name="shared", storage=storage, sampler=_costmodel_sampler(case, 0))
               for _ in range(2)]
    for _ in range(12):                       # turns, each worker's round chosen before the other's trials
        for study in workers:
            study.optimize(objective, n_trials=1)
    keys = [costmodel.param_key(t.params) for t in workers[0].trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(keys) >= 20 and len(set(keys)) == len(keys)
