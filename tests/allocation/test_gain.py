"""The gain estimate: its sums against the trees they came from, and the coverage of its interval."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation.gain import ArmSums, gain_ratio

trees = st.lists(st.tuples(st.booleans(), st.integers(1, 8), st.integers(1, 40)), min_size=2, max_size=40)


def _sums(rows: list[tuple[bool, int, int]]) -> ArmSums:
    return sum((ArmSums.of_tree(mixed=m, bare=b, turns=t) for m, b, t in rows), ArmSums())


@settings(max_examples=200, deadline=None)
@given(trees, trees)
def test_the_ratio_is_the_rates_quotient_and_its_interval_holds_it(
    policy: list[tuple[bool, int, int]], control: list[tuple[bool, int, int]]
) -> None:
    mine, theirs = _sums(policy), _sums(control)
    for unit, cost in (("bare", 1), ("turns", 2)):
        estimate = gain_ratio(mine, theirs, unit)  # type: ignore[arg-type]
        x_p = sum(m for m, *_ in policy) / sum(row[cost] for row in policy)
        x_c = sum(m for m, *_ in control) / sum(row[cost] for row in control)
        if x_p == 0 or x_c == 0:
            assert estimate is None
            continue
        assert estimate is not None
        ratio, low, high = estimate
        assert ratio == pytest.approx(x_p / x_c)
        assert low <= ratio <= high


def test_the_sums_round_trip_through_a_steps_figures() -> None:
    sums = _sums([(True, 2, 7), (False, 3, 9)])
    assert ArmSums.from_figures(sums.figures("control"), "control") == sums
    assert ArmSums.from_figures({}, "policy") == ArmSums()


def test_the_90_percent_interval_covers_the_true_ratio() -> None:
    """Two arms of Bernoulli trees with known rates: the interval holds the true ratio about 90% of
    the time."""
    rng = np.random.default_rng(0)
    covered = 0
    runs = 400
    for _ in range(runs):
        policy = [(bool(rng.random() < 0.5), 2, int(rng.integers(4, 9))) for _ in range(300)]
        control = [(bool(rng.random() < 0.3), 2, int(rng.integers(4, 9))) for _ in range(40)]
        estimate = gain_ratio(_sums(policy), _sums(control), "bare")
        assert estimate is not None
        covered += estimate[1] <= 0.5 / 0.3 <= estimate[2]
    assert 0.85 <= covered / runs <= 0.95
