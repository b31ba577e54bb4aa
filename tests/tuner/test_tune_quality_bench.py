"""bench.tune_quality's ranking quality: the held-out schedules are ranked against their re-measured
times (one side-by-side measurement), not against each trial's own, noisier time."""
from __future__ import annotations

import json

import optuna

from bench.tune_quality import ranking_quality
from looptool.analysis import features


def _study(rows: list[tuple[float, float]], tag: str) -> optuna.Study:
    """A study whose trials have one informative feature (the first) and the given times."""
    study = optuna.create_study()
    for k, (feature, seconds) in enumerate(rows):
        vector = [feature] + [0.0] * (features.feature_length() - 1)
        study.add_trial(optuna.trial.create_trial(value=seconds, user_attrs={
            "features": vector, "schedule": json.dumps([tag, k])}))
    return study


def test_ranking_quality_compares_predictions_with_the_remeasured_times():
    def seconds(feature):
        return 1e-3 * (1.0 + feature)
    train = _study([(x / 4, seconds(x / 4)) for x in range(40)], "train")
    xs = [x / 4 + 0.1 for x in range(0, 40, 3)]
    # the held-out trials' own times are reversed (a loaded machine); re-measured, they follow the feature
    held = _study([(x, seconds(xs[-1 - i])) for i, x in enumerate(xs)], "held")
    runs = {("matmul", "random", 0): held, ("matmul", "tpe", 0): train}
    remeasured = {json.dumps(["held", k]): seconds(x) for k, x in enumerate(xs)}
    assert ranking_quality(runs, "matmul", False, remeasured) > 0.9
    reversed_times = {key: seconds(xs[-1 - k]) for k, key in enumerate(remeasured)}
    assert ranking_quality(runs, "matmul", False, reversed_times) < -0.9
