"""The default pool looks like a real RLVR pool under uniform GRPO; learning mode rewards contrast only."""

import numpy as np
import pytest

from trace_lab.sim import BetaComponent, SimConfig, SimWorkload

ROLLOUTS_PER_PROMPT = 8


def uniform_group_rewards(workload: SimWorkload, prompt_ids: list[str], seed: int) -> np.ndarray:
    starts = [workload.start(prompt_id) for prompt_id in prompt_ids for _ in range(ROLLOUTS_PER_PROMPT)]
    trajectories = workload.run(starts, np.random.default_rng(seed))
    rewards = np.array([trajectory[-1].reward for trajectory in trajectories])
    return rewards.reshape(len(prompt_ids), ROLLOUTS_PER_PROMPT)


def mixed(rewards: np.ndarray) -> np.ndarray:
    return np.asarray((rewards.min(axis=1) == 0) & (rewards.max(axis=1) == 1))


def test_default_pool_gives_a_paper_like_uniform_effective_ratio() -> None:
    workload = SimWorkload(SimConfig(), seed=0)
    pool = [prompt.prompt_id for prompt in workload.sample_pool(1024, np.random.default_rng(1))]
    observed = mixed(uniform_group_rewards(workload, pool, seed=2)).mean()
    assert 0.25 <= observed <= 0.40
    p0 = workload.true_success_many(pool)
    expected = np.mean(1 - p0**ROLLOUTS_PER_PROMPT - (1 - p0) ** ROLLOUTS_PER_PROMPT)
    # 1,024 groups: the observed share is within a few standard errors of its expectation.
    assert abs(observed - expected) <= 5 * np.sqrt(expected * (1 - expected) / len(pool))
    # U-shaped: most prompts are nearly always failed or nearly always solved.
    assert np.mean((p0 < 0.1) | (p0 > 0.9)) > 0.5


def test_difficulty_mixture_is_configurable() -> None:
    easy = SimConfig(prompts=2000, difficulty=(BetaComponent(weight=1.0, alpha=9.0, beta=1.0),))
    workload = SimWorkload(easy, seed=0)
    p0 = workload.true_success_many([prompt.prompt_id for prompt in workload.prompts])
    assert abs(p0.mean() - 0.9) <= 5 * np.sqrt(0.9 * 0.1 / 11 / len(p0))


def test_sample_pool_draws_distinct_prompts() -> None:
    workload = SimWorkload(SimConfig(prompts=100), seed=0)
    pool = workload.sample_pool(100, np.random.default_rng(0))
    assert len({prompt.prompt_id for prompt in pool}) == 100
    with pytest.raises(ValueError, match="pool size"):
        workload.sample_pool(101, np.random.default_rng(0))
    with pytest.raises(ValueError, match="pool size"):
        workload.sample_pool(-1, np.random.default_rng(0))


def test_learning_moves_only_mixed_groups_up() -> None:
    workload = SimWorkload(SimConfig(prompts=512), seed=6)
    prompt_ids = [prompt.prompt_id for prompt in workload.prompts]
    before = workload.true_success_many(prompt_ids)
    groups_mixed = mixed(uniform_group_rewards(workload, prompt_ids, seed=3))
    assert 0 < groups_mixed.sum() < len(prompt_ids)
    for prompt_id, was_mixed in zip(prompt_ids, groups_mixed.tolist(), strict=True):
        workload.learn(prompt_id, mixed=was_mixed)
    after = workload.true_success_many(prompt_ids)
    assert (after[groups_mixed] > before[groups_mixed]).all()
    np.testing.assert_array_equal(after[~groups_mixed], before[~groups_mixed])
    # The step is the configured one on the logit scale.
    logit = np.log(after / (1 - after)) - np.log(before / (1 - before))
    np.testing.assert_allclose(logit[groups_mixed], workload.config.learning_rate, rtol=1e-6)


def test_learning_changes_new_rollouts_but_not_states_in_flight() -> None:
    workload = SimWorkload(SimConfig(prompts=8), seed=6)
    prompt_id = workload.prompts[0].prompt_id
    in_flight = workload.start(prompt_id)
    workload.learn(prompt_id, mixed=True)
    assert workload.start(prompt_id).p > in_flight.p


def test_learning_an_unknown_prompt_is_an_error() -> None:
    workload = SimWorkload(SimConfig(prompts=8), seed=6)
    with pytest.raises(ValueError, match="unknown prompt_id"):
        workload.learn("s6-p99999", mixed=True)
