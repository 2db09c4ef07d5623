"""The split of an allocation between the policy and uniform, from the job's evidence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation.gain import BRANCH_DEEP, BRANCH_FIRST, CONTROL, POLICY, ArmSums
from trace_service.allocation.split import decide_shape, decide_split, draw_deep, evidence_steps, step_weights


def _arm(trees: int, mixed: int, turns: int = 6) -> ArmSums:
    rows = [ArmSums.of_tree(mixed=i < mixed, bare=2, turns=turns) for i in range(trees)]
    return sum(rows, ArmSums())


def _totals(*steps: tuple[ArmSums, ArmSums]) -> dict[int, dict[str, int]]:
    return {s: policy.figures(POLICY) | control.figures(CONTROL) for s, (policy, control) in enumerate(steps)}


def test_without_evidence_the_policy_gets_most_of_the_budget_within_the_floors() -> None:
    split = decide_split({}, 0, 0.1, 4.0)
    assert split.policy_share == pytest.approx(0.789, abs=1e-3) and split.policy_better == 0.5
    assert split.gain is None
    assert decide_split({}, 0, 0.25, 4.0).policy_share == pytest.approx(0.75)
    # A floor of one half or more pins the share (no adaptation).
    assert decide_split({}, 0, 0.7, 4.0).policy_share == pytest.approx(0.3)


def test_a_losing_policy_gets_the_floor_and_a_winning_one_all_but_it() -> None:
    losing = _totals((_arm(60, 10), _arm(60, 40)))
    winning = _totals((_arm(60, 40), _arm(60, 10)))
    assert decide_split(losing, 1, 0.1, 4.0).policy_share == pytest.approx(0.1)
    assert decide_split(winning, 1, 0.1, 4.0).policy_share == pytest.approx(0.9)
    assert decide_split(winning, 1, 0.0, 4.0).policy_share > 0.999


def test_the_allocations_own_step_and_later_ones_are_not_evidence() -> None:
    winning = _totals((_arm(60, 40), _arm(60, 10)))
    assert decide_split(winning, 0, 0.1, 4.0).gain is None
    assert step_weights({0: 0, 1: 0, 2: 0, 3: 0}, 2, 2.0) == pytest.approx({0: 0.5, 1: 2**-0.5})
    with pytest.raises(ValueError, match="half-life"):
        step_weights({}, 1, 0.0)
    with pytest.raises(ValueError, match="floor"):
        decide_split({}, 1, 1.5, 4.0)


def test_recent_steps_outweigh_old_ones() -> None:
    """A policy that lost early on and wins now (its predictor learned) gets most of the budget."""
    old = [(_arm(60, 5), _arm(60, 30))] * 3
    new = [(_arm(60, 40), _arm(60, 15))] * 3
    assert decide_split(_totals(*old, *new), 6, 0.1, 2.0).policy_share > 0.8
    assert decide_split(_totals(*new, *old), 6, 0.1, 2.0).policy_share < 0.2


@settings(max_examples=100, deadline=None)
@given(st.integers(0, 60), st.integers(1, 60), st.integers(0, 59))
def test_more_mixed_policy_trees_never_lower_the_policy_share(
    mixed: int, control_mixed: int, more: int
) -> None:
    def share(policy_mixed: int) -> float:
        totals = _totals((_arm(60, policy_mixed), _arm(60, control_mixed)))
        return decide_split(totals, 1, 0.05, 4.0).policy_share

    assert share(min(mixed + more, 60)) >= share(mixed) - 1e-12


@pytest.mark.parametrize(("policy_rate", "control_rate"), [(0.45, 0.3), (0.2, 0.35)])
def test_the_loop_plays_the_better_arm_all_but_its_floor(policy_rate: float, control_rate: float) -> None:
    """Simulated job, 60 trees a step of six turns each, arms mixed at fixed rates: after a few steps
    the worse arm gets little more than the floor, and the mixed groups lost against always playing the
    better arm stay within the module's bound (the floor's share plus a constant)."""
    rng = np.random.default_rng(3)
    floor, trees, steps = 0.1, 60, 30
    totals: dict[int, dict[str, int]] = {}
    worse_shares, lost = [], 0.0
    policy_wins = policy_rate > control_rate
    for step in range(steps):
        share = decide_split(totals, step, floor, 4.0).policy_share
        n_policy = round(share * trees)
        policy = _arm(n_policy, int(rng.binomial(n_policy, policy_rate)))
        control = _arm(trees - n_policy, int(rng.binomial(trees - n_policy, control_rate)))
        totals[step] = policy.figures(POLICY) | control.figures(CONTROL)
        worse = 1 - share if policy_wins else share
        worse_shares.append(worse)
        lost += worse * trees * abs(policy_rate - control_rate)
    assert np.mean(worse_shares[5:]) < floor + 0.1
    gap = abs(policy_rate - control_rate) * trees
    assert lost < floor * gap * steps + 6 * gap


def test_a_policy_whose_interval_lies_below_one_keeps_at_most_a_fifth() -> None:
    """The tolerance's promise, at the edge: an interval whose top just touches 1."""
    for trees in (30, 120, 480):
        for policy_mixed in range(1, trees):
            split = decide_split(_totals((_arm(trees, policy_mixed), _arm(trees, trees // 2))), 1, 0.05, 4.0)
            assert split.gain is not None
            if split.gain.high < 1:
                assert split.policy_share <= 0.2 + 1e-9


def test_the_split_reads_a_bounded_window_of_steps() -> None:
    """Evidence older than ten half-lives weighs under a thousandth and is not read at all."""
    assert evidence_steps(100, 4.0) == range(60, 100)
    assert evidence_steps(3, 4.0) == range(0, 3)
    losing_long_ago = _totals(*[(_arm(60, 5), _arm(60, 40))] * 10)
    assert decide_split(losing_long_ago, 60, 0.1, 4.0).gain is None
    assert decide_split(losing_long_ago, 20, 0.1, 4.0).policy_share == pytest.approx(0.1)


def _shapes(deep: ArmSums, first: ArmSums) -> dict[int, dict[str, int]]:
    return {0: deep.figures(BRANCH_DEEP) | first.figures(BRANCH_FIRST)}


def test_the_shape_follows_the_same_rule_on_its_own_arms() -> None:
    """Deep trees against first-turn trees, read from the same totals as the split but from their own
    figures: the policy/control figures do not move the shape, nor the shape's the split."""
    assert decide_shape({}, 0, 0.1, 4.0).deep_share == pytest.approx(0.789, abs=1e-3)
    deep_wins = _shapes(_arm(60, 40), _arm(60, 10))
    first_wins = _shapes(_arm(60, 10), _arm(60, 40))
    assert decide_shape(deep_wins, 1, 0.1, 4.0).deep_share == pytest.approx(0.9)
    assert decide_shape(first_wins, 1, 0.1, 4.0).deep_share == pytest.approx(0.1)
    assert decide_split(first_wins, 1, 0.1, 4.0).gain is None
    assert decide_shape(_totals((_arm(60, 10), _arm(60, 40))), 1, 0.1, 4.0).gain is None
    # Its probability and gain are those of the split's rule on the same sums.
    as_split = decide_split(_totals((_arm(60, 10), _arm(60, 40))), 1, 0.1, 4.0)
    shape = decide_shape(first_wins, 1, 0.1, 4.0)
    assert (shape.deep_share, shape.deep_better, shape.gain) == (
        as_split.policy_share,
        as_split.policy_better,
        as_split.gain,
    )


@settings(max_examples=200, deadline=None)
@given(st.lists(st.booleans(), max_size=60), st.floats(0.0, 1.0), st.integers(0, 2**32 - 1))
def test_the_deep_draw_marks_only_eligible_trees_and_keeps_the_share(
    eligible: list[bool], share: float, seed: int
) -> None:
    mask = np.array(eligible, dtype=bool)
    deep = draw_deep(mask, share, np.random.default_rng(seed))
    assert not np.any(deep & ~mask)
    n = int(mask.sum())
    assert np.floor(share * n) <= deep.sum() <= np.ceil(share * n)


def test_the_deep_draw_is_exact_on_average_and_refuses_a_bad_share() -> None:
    rng = np.random.default_rng(0)
    mask = np.ones(3, dtype=bool)
    assert np.mean([draw_deep(mask, 0.5, rng).sum() for _ in range(4000)]) == pytest.approx(1.5, abs=0.05)
    with pytest.raises(ValueError, match="deep share"):
        draw_deep(mask, 1.5, rng)
