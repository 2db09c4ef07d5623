"""The control share: uniform's group size on a uniform draw of the pool, the policy's rule on the rest,
and the budget never over-spent."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_proto import Policy
from trace_service.allocation import POLICIES, RootInputs, uniform_roots
from trace_service.allocation.control_share import draw_controls, plan_roots
from trace_service.allocation.policies import uniform_group_size


@st.composite
def pools(draw: st.DrawFn) -> RootInputs:
    n = draw(st.integers(1, 40))
    lo = draw(st.integers(2, 4))
    return RootInputs(
        n_prompts=n,
        budget=draw(st.integers(0, 200)),
        min_rollouts=lo,
        max_rollouts=draw(st.integers(lo, 16)),
        max_prompts=draw(st.one_of(st.none(), st.integers(1, n))),
        predicted=np.array(draw(st.lists(st.floats(0.0, 1.0), min_size=n, max_size=n))),
    )


@settings(max_examples=300, deadline=None)
@given(pools())
def test_the_group_size_is_uniforms(inputs: RootInputs) -> None:
    """Uniform's rule deals the budget evenly (±1): its largest group is the size, or one more when
    the budget does not divide."""
    size = uniform_group_size(
        inputs.n_prompts,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
    )
    counts = uniform_roots(
        inputs.n_prompts,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
    )
    active = counts[counts > 0]
    if active.size == 0:
        assert size == 0
    else:
        assert active.min() == size


@settings(max_examples=300, deadline=None)
@given(pools(), st.floats(0.0, 1.0), st.sampled_from(list(Policy)), st.integers(0, 2**32 - 1))
def test_a_plan_never_overspends_and_controls_are_uniform_sized(
    inputs: RootInputs, share: float, policy: Policy, seed: int
) -> None:
    rules = POLICIES[policy]
    inputs = replace(
        inputs,
        freshness=0.5,
        zero_variance_streak=np.zeros(inputs.n_prompts, np.int64),
        rng=np.random.default_rng(seed),
    )
    plan = plan_roots(rules.roots, inputs, share, np.random.default_rng(seed))
    assert plan.counts.sum() <= inputs.budget
    active = np.count_nonzero(plan.counts)
    assert active <= (inputs.max_prompts or inputs.n_prompts)
    assert np.all((plan.counts == 0) | (plan.counts >= inputs.min_rollouts))
    assert np.all(plan.counts <= inputs.max_rollouts)
    size = uniform_group_size(
        inputs.n_prompts,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
    )
    assert np.all(plan.counts[plan.control] == size)
    if share == 0.0:
        assert not plan.control.any()


def test_the_share_is_exact_on_average_and_the_draw_uniform() -> None:
    """E[K·n] = ε·M with stochastic rounding, and every prompt, skipped by the policy or not, is drawn
    as often."""
    inputs = RootInputs(n_prompts=50, budget=100, max_rollouts=64)  # uniform's groups of 2
    rng = np.random.default_rng(0)
    draws = np.array([draw_controls(inputs, 0.13, rng) for _ in range(4000)])
    assert draws.sum(axis=1).mean() == pytest.approx(0.13 * 100, rel=0.03)
    per_prompt = (draws > 0).mean(axis=0)
    assert per_prompt.std() < 0.02 and per_prompt.mean() == pytest.approx(0.13 * 100 / 2 / 50, rel=0.05)


def test_the_policy_allocates_the_rest_over_the_rest() -> None:
    """A prompt the policy would never pick (predicted certain) is still drawn as a control; the policy's
    rule then spends what is left on the other prompts."""
    v = np.array([1.0] * 10 + [0.5] * 10)
    inputs = RootInputs(n_prompts=20, budget=40, predicted=v)
    rng = np.random.default_rng(3)
    seen_certain = False
    for _ in range(200):
        plan = plan_roots(POLICIES[Policy.TRACE].roots, inputs, 0.2, rng)
        assert plan.counts.sum() <= 40
        seen_certain |= bool(plan.control[:10].any())
        policy_trees = (plan.counts > 0) & ~plan.control
        assert not policy_trees[:10].any()  # the policy skips the certain prompts
        assert plan.counts[policy_trees].sum() == 40 - plan.counts[plan.control].sum()
    assert seen_certain


@pytest.mark.parametrize("share", [-0.1, 1.5, math.nan])
def test_a_share_outside_0_1_is_refused(share: float) -> None:
    with pytest.raises(ValueError, match="control share"):
        draw_controls(RootInputs(n_prompts=4, budget=8), share, np.random.default_rng(0))
