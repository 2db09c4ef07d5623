"""Baseline policies and batch statistics."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation import (
    dapo_keep,
    effective_ratio,
    greso_keep,
    knapsack_weight,
    pcl_roots,
    random_branching,
    uniform_roots,
)


@settings(max_examples=200, deadline=None)
@given(
    n=st.integers(0, 50),
    budget=st.integers(0, 500),
    lo=st.integers(1, 4),
    extra=st.integers(0, 20),
    cap=st.one_of(st.none(), st.integers(0, 50)),
)
def test_uniform_is_even_and_within_budget(n: int, budget: int, lo: int, extra: int, cap: int | None) -> None:
    counts = uniform_roots(n, budget, min_rollouts=lo, max_rollouts=lo + extra, max_prompts=cap)
    assert counts.sum() <= budget
    active = counts[counts > 0]
    assert np.all(active >= lo) and np.all(active <= lo + extra)
    if active.size:
        assert active.max() - active.min() <= 1
    if cap is not None:
        assert active.size <= cap


def test_uniform_is_grpo_with_a_fixed_group_size() -> None:
    assert uniform_roots(4, 32, max_rollouts=64).tolist() == [8, 8, 8, 8]
    assert uniform_roots(4, 32, keep=[True, False, True, False]).tolist() == [16, 0, 16, 0]


def test_dapo_keeps_only_mixed_groups() -> None:
    assert dapo_keep([0, 3, 8], [8, 8, 8]).tolist() == [False, True, False]


def test_greso_skips_zero_variance_prompts_with_exploration() -> None:
    rng = np.random.default_rng(0)
    keep = np.mean([greso_keep([0, 1, 2], rng, keep_probability=0.5) for _ in range(4000)], axis=0)
    assert keep == pytest.approx([1.0, 0.5, 0.25], abs=0.03)


def test_pcl_keeps_prompts_nearest_the_target() -> None:
    counts = pcl_roots([0.05, 0.45, 0.9, 0.6], 16, rollouts_per_prompt=8)
    assert counts.tolist() == [0, 8, 0, 8]


def test_knapsack_weight() -> None:
    assert knapsack_weight([0.0, 0.5, 1.0]).tolist() == pytest.approx([0.0, 0.125, 0.0])


def test_random_branching_spends_the_budget_uniformly() -> None:
    rng = np.random.default_rng(1)
    counts = np.sum([random_branching(4, 10, rng) for _ in range(2000)], axis=0)
    assert counts.sum() == 20_000
    assert counts / 5000 == pytest.approx([1.0, 1.0, 1.0, 1.0], abs=0.05)
    assert random_branching(0, 10, rng).tolist() == []


def test_effective_ratio_states_its_denominator() -> None:
    stats = effective_ratio([0, 2, 4, 1], [4, 4, 4, 4], skipped=4)
    assert (stats.active, stats.mixed, stats.skipped) == (4, 2, 4)
    assert stats.ratio == 0.5 and stats.pool_ratio == 0.25
    with pytest.raises(ValueError, match="between 0 and visits"):
        effective_ratio([5], [4])
