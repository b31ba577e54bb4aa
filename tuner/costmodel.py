"""The cost-model sampler: rank many drawn schedules with a learned model, measure the best few.

As in TVM's Ansor, each round draws many candidate schedules from the search space (random
draws, plus mutations of the best schedules measured so far), describes each by its loop-tree
features (`looptool.analysis.features`, no compiling), ranks them with gradient-boosted trees
(LightGBM) trained on the trials measured so far, and hands the top few, legal ones, to Optuna
one trial at a time.  Plugged in as an Optuna sampler, it leaves storages, several jobs,
resumption and optuna-dashboard as they are: each trial's parameters are ordinary Optuna
parameters, and every measured trial stores its feature vector (`features` user attribute),
so trials of earlier studies in the same storage and for the same target train the model
before a new study measures anything (transfer), and a new shape of a tuned workload starts
from the best schedules of its nearest tuned shape.

The model's target is a trial's log throughput relative to the best trial of its own study,
log(best seconds / seconds), so studies of different workloads share one scale.  Transferred
trials count only as far as their own model ranks the new study's measured trials right
(`Prior.trust`), and never for more than PRIOR_WEIGHT of the study's own trials.

A cold sampler is not blind: given the parameters of the automatic schedule (`centre`: the
analytical model's choices, `looptool.autoschedule`, from the target's facts), it draws mutations
of it as it does of measured schedules, and ranks candidates the model cannot tell apart (no
model yet, or predictions within TIE of each other) by how many parameters they share with it.
As measured trials arrive the model's predictions separate and decide more of the ranking.
"""
from __future__ import annotations

import functools
import hashlib
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Callable

import numpy as np
import optuna

from looptool import ir
from looptool.analysis import features
from looptool.memo import BoundedMemo
from looptool.schedule import LoopTree

from . import space

BATCH = 8                   # trials per round: the model is retrained between rounds
RANDOM_CANDIDATES = 96      # fresh random draws per round
MUTANTS_PER_PARENT = 16     # mutations of each of the best measured schedules per round
PARENTS = 4
MIN_TRAINING = 4            # measured trials (own or transferred) before the model ranks anything
PRIOR_WEIGHT = 2 * BATCH    # own trials' worth of weight that all transferred trials together carry
NEAREST_SEEDS = 4           # best schedules of the nearest tuned shape tried first
TIE = 0.01                  # predicted log speeds closer than this (1 %) count as equal
COMPLETE = optuna.trial.TrialState.COMPLETE
log = logging.getLogger("looptool.tuner")


DESCRIBED_LIMIT = 512       # feature vectors remembered per process: three rounds of candidates (about 164 each)
_DESCRIBED = BoundedMemo(DESCRIBED_LIMIT)


def describe(tree: LoopTree, threads: int) -> list[float]:
    """A schedule's feature vector for this host, as stored with each measured trial (remembered by
    program and per-stage loops, so the trial does not recompute what its sampler computed)."""
    return _DESCRIBED.get((tree.program, tree.schedule.stages, threads),
                          lambda: features.schedule_features(tree, threads=threads).tolist())


def structure_key(program: ir.Program) -> str:
    """A hash of a program's structure without its sizes: the same for every shape of a workload."""
    inputs = tuple(replace(b, shape=(), strides=()) for b in program.inputs)
    bare = replace(program, inputs=inputs, sizes=tuple((d, 0) for d, _ in program.sizes))
    return hashlib.sha256(repr(bare).encode()).hexdigest()[:32]


# Drawing candidates without Optuna ---------------------------------------------------------------

class ParamDraw:
    """Stands in for an `optuna.Trial` in `space.sample`: answers each suggestion from `base` where
    that value is allowed, redrawing it at random with probability `mutation` (or when it is not),
    and records what it answered."""

    def __init__(self, rng: np.random.Generator, base: dict | None = None, mutation: float = 0.0):
        self.rng, self.base, self.mutation = rng, base or {}, mutation
        self.params: dict = {}

    def _keep(self, name: str, allowed) -> bool:
        return name in self.base and allowed(self.base[name]) and self.rng.random() >= self.mutation

    def suggest_categorical(self, name: str, choices):
        """One of `choices`."""
        choices = list(choices)
        value = self.base[name] if self._keep(name, choices.__contains__) else \
            choices[int(self.rng.integers(len(choices)))]
        self.params[name] = value
        return value

    def suggest_int(self, name: str, low: int, high: int) -> int:
        """An integer in [low, high]."""
        value = self.base[name] if self._keep(name, lambda v: low <= v <= high) else \
            int(self.rng.integers(low, high + 1))
        self.params[name] = value
        return value


@dataclass
class Candidate:
    """A drawn schedule: its Optuna parameters, loop tree and features; `seeded` when it comes from
    the nearest tuned shape (tried first)."""

    params: dict
    tree: LoopTree
    features: list[float]
    seeded: bool = False


def param_key(params: dict) -> tuple:
    """A hashable identity of a parameter set."""
    return tuple(sorted((k, str(v)) for k, v in params.items()))


# The model ---------------------------------------------------------------------------------------

@dataclass
class TrainingSet:
    """Feature vectors, their targets (log throughput relative to their study's best) and weights."""

    rows: list = field(default_factory=list)
    targets: list = field(default_factory=list)
    weights: list = field(default_factory=list)

    def __post_init__(self):
        self.weights = self.weights or [1.0] * len(self.rows)

    def add_study(self, trials: list[optuna.trial.FrozenTrial]):
        """Add the measured trials of one study that carry features of this layout (weight 1 each)."""
        usable = [t for t in trials if t.state == COMPLETE and t.value and
                  len(t.user_attrs.get("features") or ()) == features.feature_length()]
        if not usable:
            return
        best = min(t.value for t in usable)
        for t in usable:
            self.rows.append(t.user_attrs["features"])
            self.targets.append(math.log(best / t.value))
            self.weights.append(1.0)

    def joined(self, other: "TrainingSet", total_weight: float) -> "TrainingSet":
        """These rows and `other`'s, whose weights are scaled to sum to `total_weight`."""
        scale = total_weight / max(sum(other.weights), 1e-12)
        return TrainingSet(self.rows + other.rows, self.targets + other.targets,
                           self.weights + [w * scale for w in other.weights])

    def __len__(self):
        return len(self.rows)


class CostModel:
    """Gradient-boosted trees (LightGBM) from features to relative log throughput."""

    def __init__(self, seed: int = 0):
        self.seed = seed
        self.booster = None

    def fit(self, data: TrainingSet) -> "CostModel":
        """Train on `data` (fewer than MIN_TRAINING rows, or all targets equal: no model)."""
        import lightgbm
        self.booster = None
        if len(data) < MIN_TRAINING or len(set(data.targets)) < 2:
            return self
        params = {"objective": "regression", "learning_rate": 0.08, "num_leaves": 15, "min_data_in_leaf": 2,
                  "min_data_in_bin": 1, "bagging_fraction": 0.9, "bagging_freq": 1, "feature_fraction": 0.8,
                  "seed": self.seed, "num_threads": 1, "verbose": -1}
        dataset = lightgbm.Dataset(np.asarray(data.rows), np.asarray(data.targets), weight=np.asarray(data.weights),
                                   params={"verbose": -1})
        self.booster = lightgbm.train(params, dataset, num_boost_round=120)
        return self

    def predict(self, rows: list) -> np.ndarray | None:
        """Predicted score of each row (higher is faster), or None without a model."""
        if self.booster is None or not rows:
            return None
        return self.booster.predict(np.asarray(rows))


# Transfer ----------------------------------------------------------------------------------------

@dataclass
class Prior:
    """What earlier studies in the storage give a new one: training data and schedules to try first."""

    data: TrainingSet = field(default_factory=TrainingSet)
    seeds: list = field(default_factory=list)

    @functools.cached_property
    def model(self) -> CostModel:
        """The model of the transferred trials alone (trained once)."""
        return CostModel().fit(self.data)

    def trust(self, own: TrainingSet) -> float:
        """How well the transferred trials' model ranks the study's own measured trials: Spearman's
        correlation of its predictions with their measured speed, at least 0 (0 when it predicts them
        all alike); 1 while there are fewer than MIN_TRAINING own trials or their times are all equal
        (no evidence against it yet)."""
        from scipy.stats import spearmanr
        if len(own) < MIN_TRAINING or len(set(own.targets)) < 2:
            return 1.0
        predicted = self.model.predict(own.rows)
        if predicted is None:
            return 1.0
        if len(set(predicted)) < 2:
            return 0.0                   # it cannot tell the study's schedules apart
        return max(0.0, float(spearmanr(predicted, own.targets).statistic))


PRIORS_KEPT = 16
_PRIORS = BoundedMemo(PRIORS_KEPT)


def prior_from_storage(storage, study_name: str, target: str, program: ir.Program) -> Prior:
    """Measured trials of the other studies for `target` in `storage`, and the best parameters of
    the study of the same structure whose sizes are nearest to `program`'s.  Remembered per process
    until those studies change (each round of `tune_program` asks again); the oldest are forgotten
    past PRIORS_KEPT."""
    summaries = [s for s in optuna.get_all_study_summaries(storage, include_best_trial=False)
                 if s.study_name != study_name and s.user_attrs.get("target") == target]
    key = (getattr(storage, "url", id(storage)), study_name, target, program,
           tuple((s.study_name, s.n_trials) for s in summaries))
    return _PRIORS.get(key, lambda: _read_prior(storage, summaries, program))


def _read_prior(storage, summaries, program: ir.Program) -> Prior:
    prior = Prior()
    structure, sizes = structure_key(program), dict(program.sizes)
    nearest, distance = None, math.inf
    for summary in summaries:
        study = optuna.load_study(study_name=summary.study_name, storage=storage)
        trials = study.get_trials(deepcopy=False, states=(COMPLETE,))
        prior.data.add_study(trials)
        if summary.user_attrs.get("structure") == structure and trials:
            gap = _size_distance(sizes, summary.user_attrs.get("sizes", {}))
            if gap < distance:
                nearest, distance = trials, gap
    if nearest:
        prior.seeds = [t.params for t in sorted(nearest, key=lambda t: t.value)[:NEAREST_SEEDS]]
    return prior


def _size_distance(a: dict, b: dict) -> float:
    if set(a) != set(b):
        return math.inf
    return sum(abs(math.log(a[d]) - math.log(b[d])) for d in a)


# The sampler -------------------------------------------------------------------------------------

class CostModelSampler(optuna.samplers.BaseSampler):
    """An Optuna sampler that gives each trial the parameters of the next schedule a learned cost
    model ranks best (see the module docstring).  `draw(trial)` is the search space: it draws a
    loop tree through the trial's suggestions; kernels run on `threads` cores.  `builder`, when given
    (a `tuner.worker.Measurer`), gets each round's schedules (lists of steps) as soon as they are chosen,
    to compile them ahead (`builder.prefetch`), and each trial takes the first schedule of the round
    whose kernel is ready (`builder.ready`). `centre`, when given, is the automatic schedule's
    parameters: the prior that ranks what the model cannot (module docstring)."""

    def __init__(self, draw: Callable[[object], LoopTree], threads: int = 1, seed: int | None = None,
                 prior: Prior | None = None, builder=None, centre: dict | None = None):
        self.draw, self.threads, self.builder, self.centre = draw, threads, builder, centre or {}
        self.rng = np.random.default_rng(seed)
        self.prior = prior or Prior()
        self.model = CostModel(seed or 0)
        self.fallback = optuna.samplers.RandomSampler(seed=seed)
        self.queue: list[tuple[dict, list]] = []       # (parameters, steps) of the round's schedules
        self.chosen: dict[int, dict] = {}

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        """The chosen schedule's value for this parameter (chosen on the trial's first parameter)."""
        if trial.number not in self.chosen:
            self.queue = self.untaken(study, trial.number)
            if not self.queue:
                self.queue = self.next_round(study)
            self.chosen[trial.number] = self.queue.pop(self._first_ready())[0] if self.queue else {}
        value = self.chosen[trial.number].get(param_name)
        if value is not None and _allowed(value, param_distribution):
            return value
        return self.fallback.sample_independent(study, trial, param_name, param_distribution)

    def untaken(self, study: optuna.Study, number: int) -> list[tuple[dict, list]]:
        """The queued schedules no trial of the study has taken since the round was chosen: workers sharing
        a study rank alike, so without this they measure the same schedules (4 GPUs' best kernel fell to
        0.89x the one-GPU study's)."""
        if not self.queue:
            return self.queue
        taken = {param_key(t.params) for t in study.get_trials(deepcopy=False) if t.number != number}
        return [entry for entry in self.queue if param_key(entry[0]) not in taken]

    def _first_ready(self) -> int:
        if self.builder is not None:
            return next((i for i, (_, steps) in enumerate(self.queue) if self.builder.ready(steps)), 0)
        return 0

    def after_trial(self, study, trial, state, values):
        self.chosen.pop(trial.number, None)

    def next_round(self, study: optuna.Study) -> list[tuple[dict, list]]:
        """Retrain on every measured trial, draw candidates, return the parameters and steps of the
        next BATCH (MIN_TRAINING while there is no model or the study has fewer own measured trials,
        so that the model soon learns from them): the best legal ones by the model, and one legal
        random one to keep exploring. Candidates the model scores alike (or all, without a model)
        are ranked by their closeness to the centre."""
        trials = study.get_trials(deepcopy=False)
        own = TrainingSet()
        own.add_study(trials)
        self.model.fit(self.training_set(own))
        taken = {param_key(t.params) for t in trials}
        candidates = self.candidates(trials, taken)
        scores = self.model.predict([c.features for c in candidates])
        tied = np.zeros(len(candidates)) if scores is None else np.round(scores / TIE)
        order = sorted(range(len(candidates)), key=lambda i: (-tied[i], -self.closeness(candidates[i].params)))
        seeded = [i for i, c in enumerate(candidates) if c.seeded]
        ranked = seeded + [i for i in order if i not in seeded]
        size = BATCH if scores is not None and len(own) >= MIN_TRAINING else MIN_TRAINING   # retrain sooner
        picked = _first_legal(candidates, ranked, size - 1)
        explore = [i for i in self.rng.permutation(len(candidates)) if i not in picked]
        picked += _first_legal(candidates, explore, 1)
        chosen = [(candidates[i].params, candidates[i].tree.schedule.steps) for i in picked]
        if self.builder is not None:
            self.builder.prefetch([steps for _, steps in chosen])
        return chosen

    def training_set(self, own: TrainingSet) -> TrainingSet:
        """The study's own measured trials, and the transferred ones weighted by how well their model
        ranks the own ones (`Prior.trust`): together as much as PRIOR_WEIGHT own trials when trusted
        fully, left out when their model ranks the study no better than chance."""
        if not len(self.prior.data):
            return own
        trust = self.prior.trust(own)
        log.debug("transferred trials trusted %.2f after %d own trials", trust, len(own))
        return own.joined(self.prior.data, trust * PRIOR_WEIGHT) if trust > 0 else own

    def candidates(self, trials, taken: set) -> list[Candidate]:
        """Random draws, the centre and mutations of it and of the best measured schedules (the centre
        counts as a parent while fewer than PARENTS are measured) and (first) the prior's seeds, each
        once and none already tried."""
        measured = sorted((t for t in trials if t.state == COMPLETE and t.value), key=lambda t: t.value)
        drafts = []
        if not measured:
            drafts += [(ParamDraw(self.rng, seed), True) for seed in self.prior.seeds]
        parents = [t.params for t in measured[:PARENTS]]
        if self.centre:
            drafts.append((ParamDraw(self.rng, self.centre), False))
            parents += [self.centre] if len(parents) < PARENTS else []
        for parent in parents:
            mutation = 1.0 / max(1, len(parent))
            drafts += [(ParamDraw(self.rng, parent, max(mutation, 0.1)), False)
                       for _ in range(MUTANTS_PER_PARENT)]
        drafts += [(ParamDraw(self.rng), False) for _ in range(RANDOM_CANDIDATES)]
        out = []
        for draft, seeded in drafts:
            try:
                tree = self.draw(draft)
            except space.InvalidDraw:
                continue
            key = param_key(draft.params)
            if key in taken:
                continue
            taken.add(key)
            out.append(Candidate(draft.params, tree, describe(tree, self.threads), seeded))
        return out

    def closeness(self, params: dict) -> float:
        """The share of the centre's parameters that `params` has the same value of (0 without one)."""
        if not self.centre:
            return 0.0
        return sum(params.get(name) == value for name, value in self.centre.items()) / len(self.centre)


def _first_legal(candidates: list[Candidate], order, count: int) -> list[int]:
    picked = []
    for i in order:
        if len(picked) == count:
            break
        if candidates[i].tree.check()[0]:
            picked.append(i)
    return picked


def _allowed(value, distribution) -> bool:
    if isinstance(distribution, optuna.distributions.CategoricalDistribution):
        return value in distribution.choices
    if isinstance(distribution, optuna.distributions.IntDistribution):
        return distribution.low <= value <= distribution.high
    return False
