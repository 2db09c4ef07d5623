"""The stated conditional success probabilities are the true ones, at roots and at deep prefixes."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_lab.sim import RolloutState, SimConfig, SimWorkload, TextConfig, VocabularyConfig

# Seeded runs are deterministic; five standard errors keep a correct simulator far from the threshold
# while a wrong p (off by a few points at these sample sizes) fails.
Z_SCORE = 5.0
SMALL_VOCABULARY = VocabularyConfig(distractor_words=50, levels=3, words_per_level=2, tools=2)


def binomial_tolerance(p: float, samples: int) -> float:
    return Z_SCORE * math.sqrt(p * (1 - p) / samples)


def success_frequency(workload: SimWorkload, state: RolloutState, samples: int, seed: int) -> float:
    trajectories = workload.run([state] * samples, np.random.default_rng(seed))
    return float(np.mean([trajectory[-1].reward for trajectory in trajectories]))


@pytest.fixture(scope="module")
def workload() -> SimWorkload:
    return SimWorkload(SimConfig(prompts=512), seed=3)


def prompt_near(workload: SimWorkload, target: float) -> str:
    rates = workload.true_success_many([prompt.prompt_id for prompt in workload.prompts])
    return workload.prompts[int(np.argmin(np.abs(rates - target)))].prompt_id


@pytest.mark.parametrize("target", [0.15, 0.5, 0.85])
def test_root_success_frequency_matches_prompt_rate(workload: SimWorkload, target: float) -> None:
    prompt_id = prompt_near(workload, target)
    p0 = workload.true_success(prompt_id)
    samples = 4000
    frequency = success_frequency(workload, workload.start(prompt_id), samples, seed=11)
    assert abs(frequency - p0) <= binomial_tolerance(p0, samples)


def deep_prefix(workload: SimWorkload, prompt_id: str, depth: int, shift: float) -> RolloutState:
    """An unfinished prefix at least `depth` turns deep whose p moved by `shift` (signed) or more from p0."""
    p0 = workload.true_success(prompt_id)
    for trajectory in workload.run([workload.start(prompt_id)] * 500, np.random.default_rng(5)):
        for state in trajectory[depth - 1 : -1]:
            if (state.p - p0) / shift >= 1.0:
                return state
    raise AssertionError("no deep prefix moved far enough; the dynamics barely move p")


@pytest.mark.parametrize("shift", [-0.25, 0.25])
def test_deep_prefix_success_frequency_matches_its_p(workload: SimWorkload, shift: float) -> None:
    prompt_id = prompt_near(workload, 0.5)
    p0 = workload.true_success(prompt_id)
    samples = 4000
    prefix = deep_prefix(workload, prompt_id, depth=4, shift=shift)
    assert prefix.turns >= 4
    frequency = success_frequency(workload, prefix, samples, seed=13)
    assert abs(frequency - prefix.p) <= binomial_tolerance(prefix.p, samples)
    # The test has power: the root's rate would have been rejected at this prefix.
    assert abs(frequency - p0) > binomial_tolerance(p0, samples)


def test_one_step_keeps_the_mean(workload: SimWorkload) -> None:
    """E[p_{t+1} | prefix] = p_t, checked on the first turn (which is never final by default)."""
    prompt_id = prompt_near(workload, 0.4)
    state = workload.start(prompt_id)
    samples = 20000
    stepped = workload.step_many([state] * samples, np.random.default_rng(23))
    p_next = np.array([after.p for after in stepped])
    assert not any(after.done for after in stepped)
    assert abs(p_next.mean() - state.p) <= Z_SCORE * p_next.std() / math.sqrt(samples)
    # The step really moves p: the martingale is not the trivial constant one.
    assert p_next.std() > 0.05


@pytest.mark.parametrize(
    ("min_turns", "max_turns", "stop_prob"),
    [(1, 1, 0.0), (2, 12, 0.2), (3, 8, 0.9), (6, 6, 0.5)],
)
def test_stopping_rule_keeps_root_rate(min_turns: int, max_turns: int, stop_prob: float) -> None:
    config = SimConfig(
        prompts=64, min_turns=min_turns, max_turns=max_turns, stop_prob=stop_prob, vocabulary=SMALL_VOCABULARY
    )
    workload = SimWorkload(config, seed=2)
    prompt_id = prompt_near(workload, 0.6)
    p0 = workload.true_success(prompt_id)
    samples = 3000
    trajectories = workload.run([workload.start(prompt_id)] * samples, np.random.default_rng(29))
    lengths = np.array([len(trajectory) for trajectory in trajectories])
    assert lengths.min() >= min_turns
    assert lengths.max() <= max_turns
    frequency = float(np.mean([trajectory[-1].reward for trajectory in trajectories]))
    assert abs(frequency - p0) <= binomial_tolerance(p0, samples)


def test_turn_counts_are_heterogeneous(workload: SimWorkload) -> None:
    trajectories = workload.run(
        [workload.start(workload.prompts[0].prompt_id)] * 2000, np.random.default_rng(1)
    )
    counts = np.bincount([len(trajectory) for trajectory in trajectories])
    config = workload.config
    assert counts[: config.min_turns].sum() == 0
    assert len(counts) == config.max_turns + 1
    # Every allowed length occurs.
    assert (counts[config.min_turns :] > 0).all()


def test_stepping_a_finished_rollout_is_an_error(workload: SimWorkload) -> None:
    (trajectory,) = workload.run([workload.start(workload.prompts[0].prompt_id)], np.random.default_rng(0))
    with pytest.raises(ValueError, match="finished rollout"):
        workload.step(trajectory[-1], np.random.default_rng(0))
    with pytest.raises(ValueError, match="finished rollout"):
        workload.run([trajectory[-1]], np.random.default_rng(0))


@settings(max_examples=40, deadline=None)
@given(
    min_turns=st.integers(1, 5),
    extra_turns=st.integers(0, 6),
    stop_prob=st.floats(0.0, 1.0),
    step_low=st.floats(0.0, 1.0),
    step_width=st.floats(0.0, 1.0),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_rollout_is_well_formed(
    min_turns: int, extra_turns: int, stop_prob: float, step_low: float, step_width: float, seed: int
) -> None:
    """For any valid config: turn counts in range, p in [0, 1], the reward only on the last turn and equal
    to the final p, and each state's history extends its predecessor's."""
    config = SimConfig(
        prompts=4,
        min_turns=min_turns,
        max_turns=min_turns + extra_turns,
        stop_prob=stop_prob,
        step_size=(step_low, min(1.0, step_low + step_width)),
        vocabulary=SMALL_VOCABULARY,
        text=TextConfig(prompt_words=(1, 3)),
    )
    workload = SimWorkload(config, seed=seed % 1000)
    rng = np.random.default_rng(seed)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts]
    for start, trajectory in zip(starts, workload.run(starts, rng), strict=True):
        assert config.min_turns <= len(trajectory) <= config.max_turns
        previous = start
        for state in trajectory:
            assert 0.0 <= state.p <= 1.0
            assert state.history[:-1] == previous.history
            assert state.turns == previous.turns + 1
            previous = state
        *middle, last = trajectory
        assert all(not state.done and state.reward is None for state in middle)
        assert last.done
        assert last.reward in (0.0, 1.0)
        assert last.p == last.reward


@pytest.mark.parametrize(
    ("min_turns", "max_turns", "stop_prob", "depth"),
    [(2, 12, 0.2, 0), (2, 12, 0.2, 1), (2, 12, 0.2, 7), (3, 8, 0.9, 0), (3, 8, 0.9, 5), (5, 5, 0.3, 2)],
)
def test_expected_remaining_turns_matches_the_mean_length(
    min_turns: int, max_turns: int, stop_prob: float, depth: int
) -> None:
    config = SimConfig(
        prompts=4, min_turns=min_turns, max_turns=max_turns, stop_prob=stop_prob, vocabulary=SMALL_VOCABULARY
    )
    workload = SimWorkload(config, seed=0)
    rng = np.random.default_rng(3)
    prefix = workload.start(workload.prompts[0].prompt_id)
    while prefix.turns < depth:
        prefix = workload.step(prefix, rng)[1]
        if prefix.done:
            prefix = workload.start(workload.prompts[0].prompt_id)
    samples = 4000
    lengths = np.array([len(trajectory) for trajectory in workload.run([prefix] * samples, rng)])
    tolerance = Z_SCORE * lengths.std() / math.sqrt(samples) + 1e-12
    assert abs(lengths.mean() - config.expected_remaining_turns(depth)) <= tolerance
    if depth == 0:
        assert config.expected_turns == config.expected_remaining_turns(0)


def test_expected_remaining_turns_rejects_impossible_depths() -> None:
    with pytest.raises(ValueError, match="depth"):
        SimConfig(max_turns=6).expected_remaining_turns(6)
