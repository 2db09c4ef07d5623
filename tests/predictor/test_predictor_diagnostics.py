"""Diagnostics: each measure against a direct reference, plus the predictor's report."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from predictor_synthetic import SyntheticTask, tiny_config

from trace_service.predictor import SuccessPredictor
from trace_service.predictor.diagnostics import (
    average_ranks,
    brier_by_group,
    brier_score,
    expected_calibration_error,
    spearman,
    spearman_by_group,
)

probabilities = st.floats(min_value=0.0, max_value=1.0)
weights = st.floats(min_value=0.0, max_value=10.0)


def rows(size: int) -> st.SearchStrategy[list[tuple[float, float, float]]]:
    return st.lists(st.tuples(probabilities, probabilities, weights), min_size=size, max_size=40)


def reference_ranks(values: list[float]) -> list[float]:
    """Rank = 1 + number of smaller values + (number of equal others) / 2."""
    return [
        1 + sum(other < value for other in values) + (sum(other == value for other in values) - 1) / 2
        for value in values
    ]


def reference_pearson(x: list[float], y: list[float]) -> float | None:
    mean_x, mean_y = sum(x) / len(x), sum(y) / len(y)
    covariance = sum((a - mean_x) * (b - mean_y) for a, b in zip(x, y, strict=True))
    spread = math.sqrt(sum((a - mean_x) ** 2 for a in x) * sum((b - mean_y) ** 2 for b in y))
    return None if spread == 0 else covariance / spread


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(min_value=-5, max_value=5), min_size=1, max_size=30))
def test_average_ranks_match_reference(values: list[int]) -> None:
    np.testing.assert_allclose(average_ranks(values), reference_ranks([float(v) for v in values]))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(-4, 4), st.floats(-10, 10)), min_size=2, max_size=30))
def test_spearman_matches_pearson_of_reference_ranks(pairs: list[tuple[int, float]]) -> None:
    x = [float(a) for a, _ in pairs]
    y = [b for _, b in pairs]
    expected = reference_pearson(reference_ranks(x), reference_ranks(y))
    actual = spearman(x, y)
    if expected is None:
        assert actual is None
    else:
        assert actual == pytest.approx(expected, abs=1e-9)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-1000, 1000), min_size=2, max_size=30, unique=True))
def test_spearman_is_one_for_monotone_maps_and_minus_one_for_reversals(x: list[int]) -> None:
    assert spearman(x, [value**3 + 5 * value for value in x]) == pytest.approx(1.0)
    assert spearman(x, [-value for value in x]) == pytest.approx(-1.0)


def test_spearman_is_undefined_for_constant_or_tiny_inputs() -> None:
    assert spearman([1.0], [2.0]) is None
    assert spearman([1.0, 1.0, 1.0], [1.0, 2.0, 3.0]) is None


@settings(max_examples=200, deadline=None)
@given(rows(1))
def test_brier_matches_weighted_reference(data: list[tuple[float, float, float]]) -> None:
    p, t, w = (list(column) for column in zip(*data, strict=True))
    total = sum(w)
    actual = brier_score(p, t, w)
    if total == 0:
        assert actual is None
    else:
        expected = sum(wi * (pi - ti) ** 2 for pi, ti, wi in zip(p, t, w, strict=True)) / total
        assert actual == pytest.approx(expected, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(rows(1), st.integers(min_value=1, max_value=12))
def test_ece_matches_loop_reference_and_is_bounded(data: list[tuple[float, float, float]], bins: int) -> None:
    p, t, w = (list(column) for column in zip(*data, strict=True))
    total = sum(w)
    actual = expected_calibration_error(p, t, w, num_bins=bins)
    if total == 0:
        assert actual is None
        return
    expected = 0.0
    for b in range(bins):
        members = [i for i, pi in enumerate(p) if min(int(pi * bins), bins - 1) == b]
        bin_weight = sum(w[i] for i in members)
        if bin_weight > 0:
            mean_p = sum(w[i] * p[i] for i in members) / bin_weight
            mean_t = sum(w[i] * t[i] for i in members) / bin_weight
            expected += bin_weight / total * abs(mean_p - mean_t)
    assert actual == pytest.approx(expected, abs=1e-9)
    # Calibration error never exceeds the mean absolute error (triangle inequality within each bin).
    mean_absolute = sum(wi * abs(pi - ti) for pi, ti, wi in zip(p, t, w, strict=True)) / total
    assert actual <= mean_absolute + 1e-9


def test_ece_is_zero_for_perfect_calibration_in_every_bin() -> None:
    predicted = [0.05, 0.05, 0.95, 0.95]
    observed = [0.0, 0.1, 1.0, 0.9]
    assert expected_calibration_error(predicted, observed) == pytest.approx(0.0, abs=1e-12)


def test_grouped_measures_split_by_group() -> None:
    predicted = [0.1, 0.2, 0.3, 0.9, 0.8, 0.7]
    target = [0.0, 0.5, 1.0, 0.0, 0.5, 1.0]
    groups = [0, 0, 0, 3, 3, 3]
    assert spearman_by_group(predicted, target, groups) == {0: pytest.approx(1.0), 3: pytest.approx(-1.0)}
    by_group = brier_by_group(predicted, target, groups)
    assert by_group[0] == pytest.approx(brier_score(predicted[:3], target[:3]))
    assert by_group[3] == pytest.approx(brier_score(predicted[3:], target[3:]))


@pytest.mark.parametrize(
    ("predicted", "target", "weights", "message"),
    [
        ([0.5, 0.5], [0.5], None, "one length"),
        ([0.5, float("nan")], [0.5, 0.5], None, "finite"),
        ([0.5, 1.5], [0.5, 0.5], None, r"\[0, 1\]"),
        ([0.5, 0.5], [0.5, 0.5], [1.0, -1.0], "non-negative"),
    ],
)
def test_bad_inputs_are_rejected(
    predicted: list[float], target: list[float], weights: list[float] | None, message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        brier_score(predicted, target, weights)
    with pytest.raises(ValueError, match=message):
        expected_calibration_error(predicted, target, weights)


def test_spearman_rejects_bad_inputs() -> None:
    with pytest.raises(ValueError, match="one length"):
        spearman([1.0, 2.0], [1.0])
    with pytest.raises(ValueError, match="finite"):
        spearman([1.0, float("inf")], [1.0, 2.0])
    with pytest.raises(ValueError, match="num_bins"):
        expected_calibration_error([0.5], [0.5], num_bins=0)


def test_predictor_report_scores_the_holdout(synthetic_task: SyntheticTask) -> None:
    predictor = SuccessPredictor(tiny_config(holdout_every=4))
    empty = predictor.diagnostics()
    assert (empty.version, empty.holdout_examples, empty.brier, empty.ece, empty.spearman) == (
        0,
        0,
        None,
        None,
        None,
    )

    rng = np.random.default_rng(3)
    held_out = []
    for index in range(40):
        nodes = synthetic_task.tree(predictor.featurizer, rng, f"p{index}")
        if predictor.add_examples(synthetic_task.examples(nodes)) == "holdout":
            held_out.extend(nodes)
    predictor.train_round(max_steps=20)
    report = predictor.diagnostics()

    predicted = predictor.predict([node.query for node in held_out])
    target = np.array([node.target for node in held_out])
    weight = np.array([node.weight for node in held_out])
    depth = np.array([node.query.history.depth for node in held_out])
    assert report.version == 1
    assert report.examples_seen == 30 * 9
    assert report.holdout_examples == len(held_out) == 10 * 9
    assert report.brier == pytest.approx(brier_score(predicted, target, weight))
    assert report.ece == pytest.approx(expected_calibration_error(predicted, target, weight))
    assert report.spearman == pytest.approx(spearman(predicted, target))
    assert set(report.spearman_by_depth) == set(report.brier_by_depth) == {0, 1, 2}
    assert report.brier_by_depth[1] == pytest.approx(
        brier_score(predicted[depth == 1], target[depth == 1], weight[depth == 1])
    )
