"""The policy families follow their policy θ and, in learning mode, their groups' contrast."""

import numpy as np
import pytest
from family_support import (
    POLICY_FAMILIES,
    binomial_tolerance,
    policy_workload,
    root_success,
    success_frequency,
)

from trace_lab.sim import RolloutState, TabularWorkload


@pytest.fixture(params=POLICY_FAMILIES)
def workload(request: pytest.FixtureRequest) -> TabularWorkload:
    return policy_workload(request.param, seed=5, prompts=512)


def test_the_expert_policy_raises_success_and_its_opposite_lowers_it(workload: TabularWorkload) -> None:
    """θ + 4·onehot(right action per context) beats the default θ on the whole population, and
    θ − 4·onehot falls below it; the task-by-task rates move the same way for most tasks."""
    base = root_success(workload)
    expert = np.eye(workload.actions)[workload.right_actions()]
    default = workload.policy
    workload.policy = default + 4 * expert
    better = root_success(workload)
    workload.policy = default - 4 * expert
    worse = root_success(workload)
    assert better.mean() > base.mean() + 0.03
    assert worse.mean() < base.mean() - 0.01
    in_between = (base > 0.05) & (base < 0.95)
    assert np.mean(better[in_between] > base[in_between]) > 0.8


def test_success_under_a_new_policy_is_exact(workload: TabularWorkload) -> None:
    rng = np.random.default_rng(3)
    workload.policy = workload.policy + 2 * rng.standard_normal(workload.policy.shape)
    rates = root_success(workload)
    prompt_id = workload.prompts[int(np.argmin(np.abs(rates - 0.5)))].prompt_id
    state = workload.start(prompt_id)
    samples = 4000
    assert abs(success_frequency(workload, state, samples, seed=4) - state.p) <= binomial_tolerance(
        state.p, samples
    )


def test_states_keep_the_probability_they_were_made_with(workload: TabularWorkload) -> None:
    prompt_id = workload.prompts[0].prompt_id
    in_flight = workload.start(prompt_id)
    p_made = in_flight.p
    workload.policy = workload.policy + 3 * np.eye(workload.actions)[workload.right_actions()]
    assert workload.start(prompt_id).p != in_flight.p
    assert workload.value(in_flight) == workload.start(prompt_id).p
    assert in_flight.p == p_made


def test_the_policy_is_validated_and_copied(workload: TabularWorkload) -> None:
    theta = workload.policy
    theta += 1.0
    assert not np.array_equal(theta, workload.policy)
    np.testing.assert_allclose(workload.action_probabilities().sum(axis=1), 1.0)
    with pytest.raises(ValueError, match="shape"):
        workload.policy = np.zeros((workload.contexts + 1, workload.actions))
    bad = workload.policy
    bad[0, 0] = np.inf
    with pytest.raises(ValueError, match="finite"):
        workload.policy = bad


def test_learning_moves_only_mixed_groups_up(workload: TabularWorkload) -> None:
    prompt_ids = [prompt.prompt_id for prompt in workload.prompts[:64]]
    before = workload.true_success_many(prompt_ids)
    mixed = np.arange(64) % 2 == 0
    for prompt_id, was_mixed in zip(prompt_ids, mixed.tolist(), strict=True):
        workload.learn(prompt_id, mixed=was_mixed)
    after = workload.true_success_many(prompt_ids)
    assert (after[mixed] >= before[mixed]).all()
    movable = mixed & (before > 1e-6) & (before < 1 - 1e-6)
    assert (after[movable] > before[movable]).all()
    np.testing.assert_array_equal(after[~mixed], before[~mixed])
    untouched = [prompt.prompt_id for prompt in workload.prompts[64:]]
    assert workload.true_success_many(untouched).tolist() == root_success(workload)[64:].tolist()


def test_learning_keeps_the_values_exact(workload: TabularWorkload) -> None:
    rates = root_success(workload)
    prompt_id = workload.prompts[int(np.argmin(np.abs(rates - 0.3)))].prompt_id
    for _ in range(4):
        workload.learn(prompt_id, mixed=True)
    state = workload.start(prompt_id)
    assert state.p > 0.3
    samples = 4000
    assert abs(success_frequency(workload, state, samples, seed=6) - state.p) <= binomial_tolerance(
        state.p, samples
    )


def test_contexts_follow_what_the_agent_can_see(workload: TabularWorkload) -> None:
    """Tasks of the same visible type share the root context; a finished rollout has none."""
    roots = np.array([workload.context_of(workload.start(prompt.prompt_id)) for prompt in workload.prompts])
    assert 1 < len(np.unique(roots)) < len(roots)
    (trajectory,) = workload.run([workload.start(workload.prompts[0].prompt_id)], np.random.default_rng(0))
    with pytest.raises(ValueError, match="finished"):
        workload.context_of(trajectory[-1])
    with pytest.raises(ValueError, match="finished"):
        workload.successors(trajectory[-1])


def test_a_state_from_another_family_is_rejected(workload: TabularWorkload) -> None:
    other = policy_workload(next(f for f in POLICY_FAMILIES if f != workload.name), seed=5, prompts=8)
    with pytest.raises(ValueError, match="unknown prompt_id"):
        workload.context_of(other.start(other.prompts[0].prompt_id))
    with pytest.raises(ValueError, match="latent"):
        workload.step_many([RolloutState(workload.prompts[0].prompt_id, 0.5)], np.random.default_rng(0))
