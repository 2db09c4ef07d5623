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


# --- priced in turns -------------------------------------------------------------------------------


def knapsack_best(q: np.ndarray, blocked: np.ndarray, cost: np.ndarray, budget: int) -> float:
    """The exact optimum of Σ_c 1 − q_c^K_c subject to Σ_c cost_c·K_c ≤ budget (integer costs)."""
    best = np.zeros(budget + 1)  # best[b]: the most flips within b turns over the candidates so far
    for c in np.flatnonzero(~blocked).tolist():
        options = [(k * int(cost[c]), 1.0 - q[c] ** k) for k in range(budget // int(cost[c]) + 1)]
        best = np.array(
            [
                max(best[b - spent] + value for spent, value in options if spent <= b)
                for b in range(budget + 1)
            ]
        )
    return float(best[budget])


@st.composite
def priced_candidates(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
    p, outcome, blocked, _ = draw(candidates())
    cost = np.array(draw(st.lists(st.integers(1, 5), min_size=p.size, max_size=p.size)), dtype=float)
    return p, outcome, blocked, cost, draw(st.integers(0, 20))


@settings(max_examples=300, deadline=None)
@given(priced_candidates())
def test_per_turn_greedy_is_within_one_unit_of_the_knapsack_optimum(
    case: tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int],
) -> None:
    p, outcome, blocked, cost, budget = case
    result = expand_prefixes(p, outcome, budget, blocked=blocked, fallback=False, min_gain=0.0, cost=cost)
    q = repeat_probability(p, outcome)
    best = knapsack_best(q, blocked, cost, budget)
    one_unit = float(np.max(np.where(blocked, 0.0, 1.0 - q), initial=0.0))
    assert best - one_unit - 1e-12 <= result.expected_flips <= best + 1e-12
    assert float(cost @ result.counts) <= budget
    assert result.unspent == int(budget - cost @ result.counts)
    assert not np.any(result.counts[blocked])


@settings(max_examples=200, deadline=None)
@given(candidates(), st.floats(0.5, 8.0), st.booleans())
def test_equal_costs_price_exactly_as_the_unit_greedy(
    case: tuple[np.ndarray, np.ndarray, np.ndarray, int], cost: float, fallback: bool
) -> None:
    p, outcome, blocked, units = case
    turns = int(units * cost)
    priced = expand_prefixes(
        p, outcome, turns, blocked=blocked, fallback=fallback, cost=np.full(p.size, cost)
    )
    plain = expand_prefixes(p, outcome, int(turns // cost), blocked=blocked, fallback=fallback)
    assert priced.counts.tolist() == plain.counts.tolist()
    assert priced.fallback_units == plain.fallback_units


def test_a_cheap_deep_prefix_wins_per_turn_what_a_dear_one_wins_per_continuation() -> None:
    # The same chance to flip from both; the second costs a quarter of the turns.
    p, outcome = [0.3, 0.35], [1.0, 1.0]
    assert expand_prefixes(p, outcome, 1).counts.tolist() == [1, 0]
    per_turn = expand_prefixes(p, outcome, 8, cost=[8.0, 2.0], fallback=False)
    assert per_turn.counts.tolist() == [0, 4]
    assert per_turn.unspent == 0


def test_the_per_turn_fallback_deals_whole_continuations_that_fit() -> None:
    result = expand_prefixes([1.0, 1.0, 0.0], [1.0, 1.0, 0.0], 11, cost=[2.0, 3.0, 4.0])
    # Rounds of 2 + 3 + 4 = 9 turns: one round, then the 2 turns left buy one more from the first.
    assert result.counts.tolist() == [2, 1, 1]
    assert result.fallback_units == 4 and result.unspent == 0


@pytest.mark.parametrize(
    ("args", "kwargs", "message"),
    [
        (([0.5], [1.0], -1), {}, "budget"),
        (([0.5, 0.2], [1.0], 3), {}, "same shape"),
        (([float("nan")], [1.0], 3), {}, "NaN"),
        (([0.5], [2.0], 3), {}, r"\[0, 1\]"),
        (([0.5], [1.0], 3), {"blocked": [True, False]}, "blocked"),
        (([0.5], [1.0], 3), {"min_gain": -1.0}, "min_gain"),
        (([0.5], [1.0], 3), {"cost": [1.0, 2.0]}, "cost must have shape"),
        (([0.5], [1.0], 3), {"cost": [0.0]}, "cost must be finite and > 0"),
        (([0.5], [1.0], 3), {"cost": [float("inf")]}, "cost must be finite and > 0"),
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
