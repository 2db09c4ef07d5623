"""The policy registry: every contract policy has rules, the rules keep the budget and limits, declare
exactly the inputs they read, and answer what the underlying rule answers when called directly."""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_proto import PREDICTOR_POLICIES, Policy
from trace_service.allocation import (
    Sharing,
    allocate_roots,
    allocate_roots_exact,
    dapo_keep,
    expand_prefixes,
    greso_keep,
    knapsack_weight,
    pcl_roots,
    random_branching,
    spread_evenly,
    uniform_roots,
)
from trace_service.allocation.policy_rules import (
    POLICIES,
    PREDICTOR_NEEDS,
    Need,
    PrefixInputs,
    PrefixRule,
    RootInputs,
    RootRule,
)

ROOT_RULES = sorted({rules.roots for rules in POLICIES.values()}, key=lambda rule: rule.name)
PREFIX_RULES = sorted({rules.prefixes for rules in POLICIES.values()}, key=lambda rule: rule.name)

#: The RootInputs / PrefixInputs fields behind each need.
ROOT_FIELDS = {
    Need.ROOT_PREDICTIONS: ("predicted",),
    Need.FRESHNESS: ("freshness",),
    Need.ZERO_VARIANCE_STREAKS: ("zero_variance_streak",),
    Need.RNG: ("rng",),
}
PREFIX_FIELDS = {
    Need.PREFIX_PREDICTIONS: ("predicted",),
    Need.BARE_OUTCOMES: ("bare_successes", "bare_trials"),
    Need.RNG: ("rng",),
}


@st.composite
def root_inputs(draw: st.DrawFn, rule: RootRule) -> RootInputs:
    """A pool with only the inputs ``rule`` declares; small enough for Knapsack's exact DP."""
    n = draw(st.integers(1, 12))
    lo = draw(st.integers(2, 4))
    hi = lo + draw(st.integers(0, 6))
    supplied: dict[str, Any] = {
        "predicted": np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))),
        "freshness": draw(st.floats(0.0, 1.0)),
        "zero_variance_streak": np.array(draw(st.lists(st.integers(0, 4), min_size=n, max_size=n))),
        "rng": np.random.default_rng(draw(st.integers(0, 2**32 - 1))),
    }
    declared = {name for need in rule.needs for name in ROOT_FIELDS[need]}
    return RootInputs(
        n_prompts=n,
        budget=draw(st.integers(0, 80)),
        min_rollouts=lo,
        max_rollouts=hi,
        max_prompts=draw(st.one_of(st.none(), st.integers(1, 12))),
        expansion=draw(st.sampled_from([0.0, 1.0, 2.5])),
        **{name: value for name, value in supplied.items() if name in declared},
    )


@st.composite
def prefix_inputs(draw: st.DrawFn, rule: PrefixRule) -> PrefixInputs:
    """One tree's round with only the inputs ``rule`` declares."""
    n = draw(st.integers(0, 10))
    trials = draw(st.integers(1, 8))
    supplied: dict[str, Any] = {
        "predicted": np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))),
        "bare_successes": draw(st.integers(0, trials)),
        "bare_trials": trials,
        "rng": np.random.default_rng(draw(st.integers(0, 2**32 - 1))),
    }
    declared = {name for need in rule.needs for name in PREFIX_FIELDS[need]}
    return PrefixInputs(
        budget=draw(st.integers(0, 40)),
        outcome=np.array(draw(st.lists(st.sampled_from([0.0, 1.0]), min_size=n, max_size=n))),
        blocked=np.array(draw(st.lists(st.booleans(), min_size=n, max_size=n)), dtype=bool),
        fallback=draw(st.booleans()),
        **{name: value for name, value in supplied.items() if name in declared},
    )


def test_every_contract_policy_is_registered() -> None:
    assert set(POLICIES) == set(Policy)


def test_the_predictor_is_read_by_exactly_the_contracts_predictor_policies() -> None:
    """The contract's set is the one definition; the rules' needs are held to it."""
    assert {
        policy for policy, rules in POLICIES.items() if rules.needs & PREDICTOR_NEEDS
    } == PREDICTOR_POLICIES
    assert [policy for policy, rules in POLICIES.items() if rules.keeps_only_mixed_groups] == [Policy.DAPO]


@pytest.mark.parametrize("rule", ROOT_RULES, ids=lambda rule: rule.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_root_rules_keep_the_budget_and_limits(rule: RootRule, data: st.DataObject) -> None:
    inputs = data.draw(root_inputs(rule))
    counts = rule.counts(inputs)
    assert counts.shape == (inputs.n_prompts,) and counts.dtype == np.int64
    assert counts.sum() <= inputs.budget
    active = counts[counts > 0]
    assert np.all((active >= inputs.min_rollouts) & (active <= inputs.max_rollouts))
    if inputs.max_prompts is not None:
        assert active.size <= inputs.max_prompts
    if rule.equal_groups and active.size:
        assert active.max() - active.min() <= 1


@pytest.mark.parametrize("rule", PREFIX_RULES, ids=lambda rule: rule.name)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_prefix_rules_keep_the_share(rule: PrefixRule, data: st.DataObject) -> None:
    inputs = data.draw(prefix_inputs(rule))
    placement = rule.place(inputs)
    assert placement.counts.shape == (inputs.n_candidates,) and np.all(placement.counts >= 0)
    assert placement.counts.sum() <= inputs.budget
    assert 0 <= placement.fallback_units <= placement.counts.sum()


@pytest.mark.parametrize("rule", ROOT_RULES, ids=lambda rule: rule.name)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_a_root_rule_fails_without_each_input_it_declares(rule: RootRule, data: st.DataObject) -> None:
    inputs = data.draw(root_inputs(rule))
    for need in rule.needs:
        missing: dict[str, Any] = dict.fromkeys(ROOT_FIELDS[need])
        with pytest.raises(ValueError, match=need.value):
            rule.counts(dataclasses.replace(inputs, **missing))


@pytest.mark.parametrize("rule", PREFIX_RULES, ids=lambda rule: rule.name)
@settings(max_examples=10, deadline=None)
@given(data=st.data())
def test_a_prefix_rule_fails_without_each_input_it_declares(rule: PrefixRule, data: st.DataObject) -> None:
    inputs = data.draw(prefix_inputs(rule))
    for need in rule.needs:
        missing: dict[str, Any] = dict.fromkeys(PREFIX_FIELDS[need])
        with pytest.raises(ValueError, match=need.value):
            rule.place(dataclasses.replace(inputs, **missing))


@settings(max_examples=40, deadline=None)
@given(
    v=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=10),
    budget=st.integers(0, 60),
    cap=st.one_of(st.none(), st.integers(1, 10)),
    freshness=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_stage1_of_each_policy_is_its_rule_called_directly(
    v: list[float], budget: int, cap: int | None, freshness: float, seed: int
) -> None:
    n = len(v)
    streak = np.arange(n) % 3
    inputs = RootInputs(
        n_prompts=n,
        budget=budget,
        max_rollouts=8,
        max_prompts=cap,
        expansion=2.0,
        predicted=np.array(v),
        freshness=freshness,
        zero_variance_streak=streak,
        rng=np.random.default_rng(seed),
    )
    limits: dict[str, Any] = {"min_rollouts": 2, "max_rollouts": 8, "max_prompts": cap}
    joint = allocate_roots(v, budget, expansion=2.0, freshness=freshness, **limits).counts
    paper = allocate_roots(v, budget, **limits).counts
    uniform = uniform_roots(n, budget, **limits)
    keep = greso_keep(streak, np.random.default_rng(seed), keep_probability=0.1)
    per_prompt = int(np.clip(budget // min(n, cap or n), 2, 8))
    expected = {
        Policy.TRACE: paper,
        Policy.TRACE_ROOT: paper,
        Policy.TRACE_PAPER: paper,
        Policy.TRACE_JOINT: joint,
        Policy.TRACE_SHARED: joint,
        Policy.TRACE_PREFIX: uniform,
        Policy.UNIFORM: uniform,
        Policy.DAPO: uniform,
        Policy.TREEPO: uniform,
        Policy.GRESO: uniform_roots(n, budget, keep=keep, **limits),
        Policy.PCL: pcl_roots(v, budget, rollouts_per_prompt=per_prompt, max_prompts=cap),
        Policy.KNAPSACK: allocate_roots_exact(v, budget, weight=knapsack_weight(v), **limits).counts,
    }
    for policy, counts in expected.items():
        seeded = dataclasses.replace(inputs, rng=np.random.default_rng(seed))
        assert POLICIES[policy].roots.counts(seeded).tolist() == counts.tolist(), policy


def test_knapsack_above_the_exact_limit_uses_the_production_solver(monkeypatch: pytest.MonkeyPatch) -> None:
    v = np.linspace(0.05, 0.95, 7)
    inputs = RootInputs(n_prompts=7, budget=30, max_rollouts=8, predicted=v)
    monkeypatch.setattr("trace_service.allocation.policy_rules.KNAPSACK_EXACT_CELLS", 7 * 30 * 8 - 1)
    greedy = allocate_roots(v, 30, max_rollouts=8, weight=knapsack_weight(v)).counts
    assert POLICIES[Policy.KNAPSACK].roots.counts(inputs).tolist() == greedy.tolist()


@settings(max_examples=40, deadline=None)
@given(
    p=st.lists(st.floats(0.0, 1.0), min_size=1, max_size=8),
    budget=st.integers(0, 30),
    successes=st.integers(0, 4),
    fallback=st.booleans(),
    seed=st.integers(0, 2**32 - 1),
)
def test_stage2_of_each_policy_is_its_rule_called_directly(
    p: list[float], budget: int, successes: int, fallback: bool, seed: int
) -> None:
    n = len(p)
    outcome = (np.arange(n) % 2).astype(np.float64)
    blocked = np.arange(n) % 3 == 0
    inputs = PrefixInputs(
        budget=budget,
        outcome=outcome,
        blocked=blocked,
        fallback=fallback,
        predicted=np.array(p),
        bare_successes=successes,
        bare_trials=4,
    )
    greedy = expand_prefixes(p, outcome, budget, blocked=blocked, fallback=fallback)
    even = spread_evenly(np.ones(n, dtype=bool), budget)
    random = random_branching(n, budget, np.random.default_rng(seed))
    expected = {
        Policy.TRACE: (greedy.counts, greedy.fallback_units),
        Policy.TRACE_PAPER: (greedy.counts, greedy.fallback_units),
        Policy.TRACE_JOINT: (greedy.counts, greedy.fallback_units),
        Policy.TRACE_SHARED: (greedy.counts, greedy.fallback_units),
        Policy.TRACE_PREFIX: (greedy.counts, greedy.fallback_units),
        Policy.TRACE_ROOT: (random, 0),
        Policy.TREEPO: (random, 0),
        Policy.UNIFORM: (even, 0),
        Policy.GRESO: (even, 0),
        Policy.PCL: (even, 0),
        Policy.KNAPSACK: (even, 0),
        Policy.DAPO: (even if dapo_keep(successes, 4) else np.zeros(n, dtype=np.int64), 0),
    }
    for policy, (counts, fallback_units) in expected.items():
        placement = POLICIES[policy].prefixes.place(
            dataclasses.replace(inputs, rng=np.random.default_rng(seed))
        )
        assert placement.counts.tolist() == counts.tolist(), policy
        assert placement.fallback_units == fallback_units, policy


def test_dapo_places_nothing_for_a_group_whose_rewards_all_agree() -> None:
    inputs = PrefixInputs(budget=6, outcome=np.ones(3), blocked=np.zeros(3, dtype=bool), bare_trials=4)
    dapo = POLICIES[Policy.DAPO].prefixes
    assert dapo.place(dataclasses.replace(inputs, bare_successes=4)).counts.tolist() == [0, 0, 0]
    assert dapo.place(dataclasses.replace(inputs, bare_successes=2)).counts.tolist() == [2, 2, 2]


def test_inputs_of_the_wrong_shape_are_refused() -> None:
    with pytest.raises(ValueError, match="predicted must have shape"):
        RootInputs(n_prompts=3, budget=8, predicted=np.zeros(2))
    with pytest.raises(ValueError, match="blocked must have the outcome's shape"):
        PrefixInputs(budget=2, outcome=np.zeros(3), blocked=np.zeros(2, dtype=bool))


def test_trace_joint_keeps_half_and_trace_shared_pools_everything() -> None:
    sharing = {policy: rules.sharing for policy, rules in POLICIES.items() if rules.sharing is not None}
    assert sharing == {
        Policy.TRACE_JOINT: Sharing(kept=0.5, agreeing_depth=1),
        Policy.TRACE_SHARED: Sharing(kept=0.0, agreeing_depth=None),
    }
