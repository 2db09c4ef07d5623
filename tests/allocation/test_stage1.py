"""Stage 1: the production solver against the exact DP, caps, budget and bad input."""

from __future__ import annotations

from unittest.mock import patch

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation import allocate_roots, allocate_roots_exact, root_value, stage1

probability = st.one_of(
    st.floats(0.0, 1.0, allow_nan=False),
    st.sampled_from([0.0, 0.1, 0.25, 0.5, 0.75, 0.9, 1.0]),  # ties and degenerate prompts
)


@st.composite
def instances(draw: st.DrawFn) -> dict[str, object]:
    v = draw(st.lists(probability, min_size=0, max_size=7))
    lo = draw(st.integers(1, 4))
    return {
        "v": np.array(v, dtype=np.float64),
        "budget": draw(st.integers(0, 40)),
        "min_rollouts": lo,
        "max_rollouts": draw(st.integers(lo, 12)),
        "max_prompts": draw(st.one_of(st.none(), st.integers(0, len(v)))),
    }


def test_root_value_formula() -> None:
    assert root_value(0.5, 0) == 0.0
    assert root_value(0.3, 1) == pytest.approx(0.0)
    assert root_value(0.3, 2) == pytest.approx(2 * 0.3 * 0.7)
    assert root_value(0.3, 5) == pytest.approx(1 - 0.3**5 - 0.7**5)


@settings(max_examples=400, deadline=None)
@given(instances())
def test_fast_solver_reaches_the_exact_optimum(case: dict[str, object]) -> None:
    fast = allocate_roots(**case)  # type: ignore[arg-type]
    exact = allocate_roots_exact(**case)  # type: ignore[arg-type]
    assert fast.expected_mixed == pytest.approx(exact.expected_mixed, rel=1e-9, abs=1e-12)


@settings(max_examples=150, deadline=None)
@given(instances(), st.integers(20, 60))
def test_exact_when_the_extras_view_must_grow(case: dict[str, object], max_rollouts: int) -> None:
    # The solver materialises extras columns lazily; start it from one column so it has to grow.
    case = {**case, "max_rollouts": max(max_rollouts, int(case["min_rollouts"]))}  # type: ignore[call-overload]
    with patch.object(stage1, "_FIRST_COLUMNS", 1):
        fast = allocate_roots(**case)  # type: ignore[arg-type]
    exact = allocate_roots_exact(**case)  # type: ignore[arg-type]
    assert fast.expected_mixed == pytest.approx(exact.expected_mixed, rel=1e-9, abs=1e-12)


@settings(max_examples=300, deadline=None)
@given(instances())
def test_allocation_respects_budget_and_caps(case: dict[str, object]) -> None:
    result = allocate_roots(**case)  # type: ignore[arg-type]
    counts = result.counts
    lo, hi, cap = case["min_rollouts"], case["max_rollouts"], case["max_prompts"]
    assert counts.sum() + result.unspent == case["budget"]
    assert result.unspent >= 0
    active = counts > 0
    assert np.all(counts[active] >= lo) and np.all(counts[active] <= hi)
    if cap is not None:
        assert active.sum() <= cap
    v = case["v"]
    assert isinstance(v, np.ndarray)
    assert result.expected_mixed == pytest.approx(float(root_value(v, counts).sum()), abs=1e-12)
    # Prompts certain to succeed or fail can never be mixed: they are never given rollouts.
    assert not np.any(active & ((v == 0.0) | (v == 1.0)))


@settings(max_examples=200, deadline=None)
@given(instances())
def test_budget_is_left_unspent_only_when_it_buys_nothing(case: dict[str, object]) -> None:
    result = allocate_roots(**case)  # type: ignore[arg-type]
    if result.unspent:
        spent = int(result.counts.sum())
        without_leftover = allocate_roots_exact(**{**case, "budget": spent})  # type: ignore[arg-type]
        assert result.expected_mixed == pytest.approx(without_leftover.expected_mixed, rel=1e-9, abs=1e-12)
        assert allocate_roots_exact(**case).expected_mixed == pytest.approx(  # type: ignore[arg-type]
            result.expected_mixed, rel=1e-9, abs=1e-12
        )


def test_uniform_predictions_give_a_uniform_allocation() -> None:
    result = allocate_roots(np.full(10, 0.5), 80, max_rollouts=64)
    assert sorted(set(result.counts.tolist())) == [8]


def test_fixing_the_number_of_active_prompts_guards_against_tiny_groups() -> None:
    v = np.full(100, 0.5)
    loose = allocate_roots(v, 200)
    assert loose.counts.max() <= 3  # Σ P(mixed) prefers many groups of two or three ...
    capped = allocate_roots(v, 200, max_prompts=25)
    assert (capped.counts > 0).sum() == 25 and set(capped.counts[capped.counts > 0].tolist()) == {8}
    raised = allocate_roots(v, 200, min_rollouts=8)
    assert set(raised.counts[raised.counts > 0].tolist()) == {8}


def test_prompts_near_one_half_are_preferred() -> None:
    result = allocate_roots(np.array([0.02, 0.5, 0.98, 0.4]), 4)
    assert result.counts.tolist() == [0, 2, 0, 2]


def test_equal_value_goes_to_more_prompts() -> None:
    # V(3) = 3·V(2)/2: three groups of two and two groups of three expect the same mixed groups.
    result = allocate_roots(np.full(4, 0.5), 6)
    assert result.counts.tolist() == [2, 2, 2, 0]
    assert allocate_roots(np.full(4, 0.5), 8).counts.tolist() == [2, 2, 2, 2]


def test_deterministic_tie_breaking_favours_earlier_prompts() -> None:
    result = allocate_roots(np.full(5, 0.3), 6)
    assert result.counts.tolist() == [2, 2, 2, 0, 0]
    assert np.array_equal(result.counts, allocate_roots(np.full(5, 0.3), 6).counts)


def test_weighted_objective_stays_close_to_the_exact_dp() -> None:
    rng = np.random.default_rng(3)
    for _ in range(50):
        v = rng.random(6)
        weight = v * (1 - v) ** 2
        fast = allocate_roots(v, 20, max_rollouts=8, weight=weight)
        exact = allocate_roots_exact(v, 20, max_rollouts=8, weight=weight)
        assert fast.counts.sum() <= 20
        assert fast.expected_mixed >= 0.97 * exact.expected_mixed


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"v": [0.5, float("nan")], "budget": 4}, "NaN"),
        ({"v": [0.5, 1.2], "budget": 4}, r"\[0, 1\]"),
        ({"v": [-0.1], "budget": 4}, r"\[0, 1\]"),
        ({"v": [[0.5]], "budget": 4}, "1-D"),
        ({"v": [0.5], "budget": -1}, "budget"),
        ({"v": [0.5], "budget": 2.5}, "integer"),
        ({"v": [0.5], "budget": 4, "min_rollouts": 5, "max_rollouts": 4}, "max_rollouts"),
        ({"v": [0.5], "budget": 4, "min_rollouts": 0}, "min_rollouts"),
        ({"v": [0.5], "budget": 4, "max_prompts": -1}, "max_prompts"),
        ({"v": [0.5], "budget": 4, "weight": [1.0, 2.0]}, "weight"),
        ({"v": [0.5], "budget": 4, "weight": [-1.0]}, "weight"),
    ],
)
@pytest.mark.parametrize("solver", [allocate_roots, allocate_roots_exact])
def test_bad_input_raises_a_clear_error(solver: object, kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        solver(**kwargs)  # type: ignore[operator]


def test_empty_pool_spends_nothing() -> None:
    result = allocate_roots(np.array([]), 10)
    assert result.counts.size == 0 and result.unspent == 10


# --- The joint objective: bare rollouts and the continuations Stage 2 will branch from them -----------


def test_joint_value_with_fresh_continuations_is_that_many_more_bare_rollouts() -> None:
    # ρ = 1: a continuation behaves like a fresh rollout, so m bare + m·N continuations are m(N + 1) draws.
    v = np.array([0.0, 0.05, 0.3, 0.5, 0.9, 1.0])
    for m, n in [(1, 1), (2, 1), (2, 3), (5, 2)]:
        joint = root_value(v, m, expansion=float(n), freshness=1.0)
        assert joint == pytest.approx(root_value(v, m * (n + 1)), abs=1e-12)


def test_joint_value_reduces_to_the_paper_without_flips() -> None:
    v = np.linspace(0, 1, 11)
    for m in range(6):
        assert np.array_equal(root_value(v, m, expansion=2.0, freshness=0.0), root_value(v, m))
        assert np.array_equal(root_value(v, m, expansion=0.0, freshness=0.7), root_value(v, m))


@settings(max_examples=200, deadline=None)
@given(probability, st.floats(0.0, 4.0), st.floats(0.0, 1.0))
def test_joint_value_has_the_shape_the_solver_needs(v: float, expansion: float, freshness: float) -> None:
    values = root_value(v, np.arange(0, 12), expansion=expansion, freshness=freshness)
    gains = np.diff(values)
    assert np.all(gains >= -1e-12)
    # Concave from one rollout on, and a block of two is worth at least twice the next gain.
    assert np.all(np.diff(gains[1:]) <= 1e-12)
    assert values[2] / 2 >= gains[2] - 1e-12
    # Counting Stage 2's contrast never makes a group worth less than its bare rollouts.
    assert np.all(values >= root_value(v, np.arange(0, 12)) - 1e-12)


@settings(max_examples=300, deadline=None)
@given(instances(), st.floats(0.0, 3.0), st.floats(0.0, 1.0))
def test_joint_solver_stays_within_one_block_of_the_exact_optimum(
    case: dict[str, object], expansion: float, freshness: float
) -> None:
    knobs = {**case, "expansion": expansion, "freshness": freshness}
    fast = allocate_roots(**knobs)  # type: ignore[arg-type]
    exact = allocate_roots_exact(**knobs)  # type: ignore[arg-type]
    v = case["v"]
    lo = int(case["min_rollouts"])  # type: ignore[call-overload]
    assert int(fast.counts.sum()) <= int(case["budget"])  # type: ignore[call-overload]
    assert np.all((fast.counts == 0) | ((fast.counts >= lo) & (fast.counts <= case["max_rollouts"])))  # type: ignore[operator]
    block = float(root_value(v, lo, expansion=expansion, freshness=freshness).max(initial=0.0))
    bound = (lo - 1) / lo * block if lo > 1 else 0.0
    assert fast.expected_mixed <= exact.expected_mixed + 1e-9
    assert fast.expected_mixed >= exact.expected_mixed - bound - 1e-9
    assert fast.expected_mixed == pytest.approx(
        float(root_value(v, fast.counts, expansion=expansion, freshness=freshness).sum()), abs=1e-12
    )


def test_joint_solver_usually_reaches_the_optimum() -> None:
    rng = np.random.default_rng(11)
    exact_hits = 0
    for _ in range(200):
        v = rng.beta(0.4, 0.4, size=8)
        knobs = {"budget": int(rng.integers(4, 30)), "max_rollouts": 8, "expansion": 1.0, "freshness": 0.6}
        fast = allocate_roots(v, **knobs)  # type: ignore[arg-type]
        exact = allocate_roots_exact(v, **knobs)  # type: ignore[arg-type]
        exact_hits += fast.expected_mixed >= exact.expected_mixed - 1e-9
    assert exact_hits >= 190


def test_joint_objective_prefers_breadth_to_a_third_rollout() -> None:
    # Two bare rollouts on each of four prompts at 0.85 against the paper, which stacks the budget on
    # the two most uncertain prompts: the continuations give the extra prompts their contrast.
    v = np.array([0.5, 0.5, 0.85, 0.85])
    paper = allocate_roots(v, 8, max_rollouts=8)
    joint = allocate_roots(v, 8, max_rollouts=8, expansion=1.0, freshness=0.8)
    assert int(np.count_nonzero(joint.counts)) > int(np.count_nonzero(paper.counts))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"expansion": -1.0}, "expansion"),
        ({"expansion": float("inf")}, "expansion"),
        ({"freshness": 1.5}, "freshness"),
    ],
)
def test_joint_objective_rejects_bad_knobs(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        allocate_roots([0.5, 0.4], 4, **kwargs)  # type: ignore[arg-type]
