"""Stage 2: exact optimality against brute force, budget accounting, fallback, bad input."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation import expand_prefixes, prefix_value, repeat_probability, round_budgets


def brute_force_best(q: np.ndarray, blocked: np.ndarray, budget: int) -> float:
    best = 0.0
    for split in itertools.product(range(budget + 1), repeat=q.size):
        if sum(split) == budget:
            k = np.array(split)
            best = max(best, float(prefix_value(q[~blocked], k[~blocked]).sum()))
    return best


@st.composite
def candidates(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    n = draw(st.integers(1, 4))
    p = np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n)))
    outcome = np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n)))
    blocked = np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)))
    return p, outcome, blocked, draw(st.integers(0, 6))


def test_repeat_probability() -> None:
    assert repeat_probability([0.8, 0.8], [1.0, 0.0]).tolist() == pytest.approx([0.8, 0.2])


@settings(max_examples=300, deadline=None)
@given(candidates())
def test_greedy_is_exactly_optimal(case: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> None:
    p, outcome, blocked, budget = case
    result = expand_prefixes(p, outcome, budget, blocked=blocked, fallback=False, min_gain=0.0)
    q = repeat_probability(p, outcome)
    assert result.expected_flips == pytest.approx(brute_force_best(q, blocked, budget), abs=1e-12)
    assert not np.any(result.counts[blocked])


@settings(max_examples=300, deadline=None)
@given(candidates())
def test_spends_exactly_the_budget_when_it_can(case: tuple[np.ndarray, np.ndarray, np.ndarray, int]) -> None:
    p, outcome, blocked, budget = case
    result = expand_prefixes(p, outcome, budget, blocked=blocked)
    assert result.counts.sum() + result.unspent == budget
    assert np.all(result.counts >= 0)
    if np.any(~blocked):
        assert result.unspent == 0
    else:
        assert result.unspent == budget
    assert not np.any(result.counts[blocked])


def test_branches_where_a_flip_is_likely() -> None:
    # A success through a node the predictor thought hopeless is the best place to look for a failure.
    result = expand_prefixes([0.1, 0.9, 0.5], [1.0, 1.0, 0.0], 4)
    assert result.counts[0] > result.counts[1]
    assert result.counts.sum() == 4 and result.fallback_units == 0


def test_fallback_spreads_useless_budget_evenly_and_reports_it() -> None:
    # q = 1 everywhere: the predictor is certain every continuation repeats the outcome.
    result = expand_prefixes([1.0, 1.0, 0.0], [1.0, 1.0, 0.0], 7)
    assert result.counts.tolist() == [3, 2, 2]
    assert result.fallback_units == 7 and result.unspent == 0
    kept = expand_prefixes([1.0, 1.0], [1.0, 1.0], 7, fallback=False)
    assert kept.counts.tolist() == [0, 0] and kept.unspent == 7


def test_large_budgets_stay_cheap_and_exact() -> None:
    rng = np.random.default_rng(0)
    p = rng.random(3000)
    result = expand_prefixes(p, rng.integers(0, 2, 3000).astype(float), 4096)
    assert result.counts.sum() == 4096


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([0.5], [1.0], -1), {}, "budget"),
        (([0.5, 0.2], [1.0], 3), {}, "same shape"),
        (([float("nan")], [1.0], 3), {}, "NaN"),
        (([0.5], [2.0], 3), {}, r"\[0, 1\]"),
        (([0.5], [1.0], 3), {"blocked": [True, False]}, "blocked"),
        (([0.5], [1.0], 3), {"min_gain": -1.0}, "min_gain"),
    ],
)
def test_bad_input_raises_a_clear_error(
    args: tuple[object, ...], kwargs: dict[str, object], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        expand_prefixes(*args, **kwargs)  # type: ignore[arg-type]


def test_round_budgets_split_evenly_earlier_first() -> None:
    assert round_budgets(10, 3) == [4, 3, 3]
    assert round_budgets(2, 4) == [1, 1, 0, 0]
    with pytest.raises(ValueError, match="rounds"):
        round_budgets(5, 0)
