"""The gain estimate: its sums against the trees they came from, its bias correction and the coverage
of its interval."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation.gain import ArmSums, arm_rate, gain_ratio, unweighted

Tree = tuple[bool, int, int]
trees = st.lists(st.tuples(st.booleans(), st.integers(1, 8), st.integers(1, 40)), min_size=2, max_size=40)


def _sums(rows: list[Tree]) -> ArmSums:
    return sum((ArmSums.of_tree(mixed=m, bare=b, turns=t) for m, b, t in rows), ArmSums())


def _exact_rate(steps: list[tuple[float, list[Tree]]], cost: int) -> tuple[float, float] | None:
    """The module's rate and relative variance computed tree by tree: the reference the per-step sums
    must reproduce."""
    rows = [(w, float(tree[0]), float(tree[cost])) for w, step in steps for tree in step]
    mixed = sum(w * x for w, x, _ in rows)
    spent = sum(w * c for w, _, c in rows)
    if mixed <= 0:
        return None
    r = mixed / spent
    n = sum(w for w, *_ in rows) ** 2 / sum(w * w for w, *_ in rows)
    spread = sum(w * w * (x - r * c) ** 2 for w, x, c in rows)
    return r, n / (n - 1) * spread / (r * spent) ** 2


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.floats(0.05, 1.0), trees), min_size=1, max_size=5))
def test_the_rate_from_step_sums_equals_the_tree_by_tree_formula(
    steps: list[tuple[float, list[Tree]]],
) -> None:
    for unit, cost in (("bare", 1), ("turns", 2)):
        rate = arm_rate([(w, _sums(step)) for w, step in steps], unit)  # type: ignore[arg-type]
        exact = _exact_rate(steps, cost)
        if exact is None:
            assert rate is None
            continue
        assert rate is not None
        assert rate.rate == pytest.approx(exact[0])
        assert rate.relative_variance == pytest.approx(exact[1], rel=1e-9, abs=1e-12)


@settings(max_examples=200, deadline=None)
@given(trees, trees)
def test_the_interval_is_centred_near_the_rates_quotient(policy: list[Tree], control: list[Tree]) -> None:
    mine, theirs = unweighted(_sums(policy)), unweighted(_sums(control))
    for unit, cost in (("bare", 1), ("turns", 2)):
        estimate = gain_ratio(mine, theirs, unit)  # type: ignore[arg-type]
        x_p = sum(m for m, *_ in policy) / sum(row[cost] for row in policy)
        x_c = sum(m for m, *_ in control) / sum(row[cost] for row in control)
        if x_p == 0 or x_c == 0:
            assert estimate is None
            continue
        assert estimate is not None
        assert estimate.low <= estimate.high
        assert estimate.log_error >= 0
        assert math.sqrt(estimate.low * estimate.high) == pytest.approx(math.exp(estimate.log_ratio))
        # The correction is of second order: small against the raw quotient once each arm has evidence.
        if len(policy) >= 20 and len(control) >= 20 and estimate.log_error < 0.3:
            assert estimate.ratio == pytest.approx(x_p / x_c, rel=0.15)


def test_the_sums_round_trip_through_a_steps_figures() -> None:
    sums = _sums([(True, 2, 7), (False, 3, 9)])
    assert ArmSums.from_figures(sums.figures("control"), "control") == sums
    assert ArmSums.from_figures({}, "policy") == ArmSums()


def _simulated(rng: np.random.Generator, trees: int, mixed: float) -> ArmSums:
    rows = []
    for _ in range(trees):
        turns = int(rng.integers(2, 13))
        rows.append((bool(rng.random() < mixed * turns / 7), 2, turns))  # mixed trees run longer
    return _sums(rows)


def test_the_bias_correction_brings_the_ratio_closer_to_the_truth() -> None:
    """Small control arms: the raw quotient overshoots the true ratio on average, the corrected one less."""
    rng = np.random.default_rng(1)
    truth_p, truth_c = 0.5 / 7, 0.3 / 7  # mixed per turn: the mixing chance per turn is constant
    raw, corrected = [], []
    for _ in range(3000):
        policy, control = _simulated(rng, 200, 0.5), _simulated(rng, 15, 0.3)
        estimate = gain_ratio(unweighted(policy), unweighted(control), "turns")
        if estimate is None:
            continue
        raw.append(policy.mixed / policy.turns / (control.mixed / control.turns))
        corrected.append(estimate.ratio)
    truth = truth_p / truth_c
    assert abs(np.mean(corrected) - truth) < 0.5 * abs(np.mean(raw) - truth)


def test_the_90_percent_interval_covers_the_true_ratio() -> None:
    """Two arms of Bernoulli trees with known rates: the interval holds the true ratio about 90% of
    the time."""
    rng = np.random.default_rng(0)
    covered = 0
    runs = 400
    for _ in range(runs):
        policy = [(bool(rng.random() < 0.5), 2, int(rng.integers(4, 9))) for _ in range(300)]
        control = [(bool(rng.random() < 0.3), 2, int(rng.integers(4, 9))) for _ in range(40)]
        estimate = gain_ratio(unweighted(_sums(policy)), unweighted(_sums(control)), "bare")
        assert estimate is not None
        covered += estimate.low <= 0.5 / 0.3 <= estimate.high
    assert 0.85 <= covered / runs <= 0.95


def test_weights_discount_old_steps() -> None:
    old = _sums([(True, 2, 4)] * 10 + [(False, 2, 4)] * 10)
    new = _sums([(False, 2, 4)] * 19 + [(True, 2, 4)])
    even = arm_rate([(1.0, old), (1.0, new)], "bare")
    recent = arm_rate([(0.01, old), (1.0, new)], "bare")
    assert even is not None and recent is not None and recent.rate < even.rate
    assert arm_rate([(0.0, old)], "bare") is None
