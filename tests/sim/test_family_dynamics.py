"""The policy families' stated probabilities are exact: at roots, at deep prefixes, turn by turn."""

import math
import time

import numpy as np
import pytest
from family_support import (
    POLICY_FAMILIES,
    Z_SCORE,
    binomial_tolerance,
    policy_workload,
    prompt_near,
    success_frequency,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_lab.sim import FAMILIES, RolloutState, TabularWorkload


@pytest.fixture(scope="module", params=POLICY_FAMILIES)
def workload(request: pytest.FixtureRequest) -> TabularWorkload:
    return policy_workload(request.param, seed=3, prompts=512)


@pytest.mark.parametrize("target", [0.2, 0.5, 0.8])
def test_root_success_frequency_matches_p(workload: TabularWorkload, target: float) -> None:
    state = workload.start(prompt_near(workload, target))
    samples = 4000
    frequency = success_frequency(workload, state, samples, seed=11)
    assert abs(frequency - state.p) <= binomial_tolerance(state.p, samples)


def unfinished_prefixes(workload: TabularWorkload, prompt_id: str, rollouts: int) -> list[RolloutState]:
    trajectories = workload.run([workload.start(prompt_id)] * rollouts, np.random.default_rng(5))
    return [state for trajectory in trajectories for state in trajectory[:-1]]


@pytest.mark.parametrize("pick", ["moved", "deepest"])
def test_deep_prefix_success_frequency_matches_its_p(workload: TabularWorkload, pick: str) -> None:
    """Many continuations resumed from one deep prefix succeed at the rate it states."""
    prompt_id = prompt_near(workload, 0.5)
    p0 = workload.true_success(prompt_id)
    prefixes = [state for state in unfinished_prefixes(workload, prompt_id, 1000) if 0.05 < state.p < 0.95]
    if pick == "moved":  # at least two turns in, as far from the root's rate as any
        prefix = max((state for state in prefixes if state.turns >= 2), key=lambda state: abs(state.p - p0))
    else:  # as deep as rollouts go unfinished
        prefix = max(prefixes, key=lambda state: (state.turns, abs(state.p - p0)))
    samples = 6000
    frequency = success_frequency(workload, prefix, samples, seed=13)
    assert abs(frequency - prefix.p) <= binomial_tolerance(prefix.p, samples)
    if pick == "moved":
        # The test has power: the root's rate would have been rejected at this prefix.
        assert abs(frequency - p0) > binomial_tolerance(p0, samples)


def test_continuations_share_the_prefix_exactly_and_draw_fresh_turns(workload: TabularWorkload) -> None:
    prompt_id = prompt_near(workload, 0.5)
    # Two turns in at least, two left at least, and the outcome still open.
    prefixes = [
        state
        for state in unfinished_prefixes(workload, prompt_id, 200)
        if 2 <= state.turns <= workload.max_turns - 3 and 0.1 < state.p < 0.9
    ]
    prefix = max(prefixes, key=lambda state: state.turns)
    snapshot = (prefix.p, prefix.latent, prefix.history)
    branches = workload.run([prefix] * 40, np.random.default_rng(17))
    for branch in branches:
        first = branch[0]
        assert all(mine is theirs for mine, theirs in zip(first.history, prefix.history, strict=False))
        assert first.turns == prefix.turns + 1
        assert all(later.history[: prefix.turns] == prefix.history for later in branch)
    # Fresh randomness after the prefix, and the prefix itself is a value that continuing left alone.
    assert len({tuple(state.history[-1].text for state in branch) for branch in branches}) > 30
    assert (prefix.p, prefix.latent, prefix.history) == snapshot


def test_expected_remaining_turns_matches_the_mean_length(workload: TabularWorkload) -> None:
    prompt_id = prompt_near(workload, 0.5)
    for state in [workload.start(prompt_id), unfinished_prefixes(workload, prompt_id, 10)[1]]:
        samples = 4000
        lengths = np.array(
            [len(trajectory) for trajectory in workload.run([state] * samples, np.random.default_rng(7))]
        )
        tolerance = Z_SCORE * lengths.std() / math.sqrt(samples) + 1e-12
        assert abs(lengths.mean() - workload.expected_remaining_turns(state)) <= tolerance


@settings(max_examples=30, deadline=None)
@given(family=st.sampled_from(POLICY_FAMILIES), seed=st.integers(0, 2**32 - 1), scale=st.floats(0.0, 3.0))
def test_values_are_an_exact_martingale(family: str, seed: int, scale: float) -> None:
    """Under any θ, at every state along sampled rollouts: E[p' | s] = Σ_a π(a | c) Σ_k P(k | s, a) · p'
    equals p(s) (to round-off), the pair probabilities sum to 1, and a stepped state's p is the value of
    the (action, outcome) pair it drew."""
    workload = FAMILIES[family](seed % 97, 16)
    assert isinstance(workload, TabularWorkload)
    rng = np.random.default_rng(seed)
    workload.policy = workload.policy + scale * rng.standard_normal(workload.policy.shape)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts]
    for start, trajectory in zip(starts, workload.run(starts, rng), strict=True):
        for before, after in zip((start, *trajectory[:-1]), trajectory, strict=True):
            probability, latent, value = workload.successors(before)
            assert probability.sum() == pytest.approx(1.0, abs=1e-12)
            assert float((probability * value).sum()) == pytest.approx(before.p, abs=1e-12)
            action = after.history[-1].action
            assert action is not None
            drawn = (latent[action] == after.latent[0]) & (probability[action] > 0)
            assert drawn.any()
            assert after.p in value[action][drawn].tolist()


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from(POLICY_FAMILIES),
    low=st.integers(1, 3),
    extra=st.integers(0, 2),
    turns=st.integers(0, 4),
    seed=st.integers(0, 2**32 - 1),
)
def test_every_rollout_is_well_formed(family: str, low: int, extra: int, turns: int, seed: int) -> None:
    """For any valid shape of task: at most max_turns turns, p in [0, 1], the reward only on the last
    turn and equal to the final p, each state extending its predecessor, a recorded action in range
    and a context in range before every turn."""
    shape = {
        "math": {"min_steps": low, "max_steps": low + extra},
        "multihop": {
            "min_hops": low,
            "max_hops": low + extra,
            "max_turns": low + extra + turns + 1,
            "answer_prior": (0.0,) * (low + extra + 1),
        },
        "toolcall": {"min_calls": low, "max_calls": low + extra, "max_turns": low + extra + turns},
        "maze": {"min_junctions": low, "max_junctions": low + extra, "max_turns": low + extra + turns},
    }[family]
    workload = FAMILIES[family](seed % 1000, 8, **shape)
    assert isinstance(workload, TabularWorkload)
    rng = np.random.default_rng(seed)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts]
    for start, trajectory in zip(starts, workload.run(starts, rng), strict=True):
        assert 1 <= len(trajectory) <= workload.max_turns
        previous = start
        for state in trajectory:
            assert 0 <= workload.context_of(previous) < workload.contexts
            assert 0.0 <= state.p <= 1.0
            assert state.history[:-1] == previous.history
            turn = state.history[-1]
            assert turn.action is not None and 0 <= turn.action < workload.actions
            previous = state
        *middle, last = trajectory
        assert all(not state.done and state.reward is None for state in middle)
        assert last.done and last.reward in (0.0, 1.0) and last.p == last.reward
        assert last.latent[0] == (workload.success_state if last.reward else workload.failure_state)


def test_math_answers_after_two_to_four_steps() -> None:
    workload = policy_workload("math", seed=1, prompts=64)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts for _ in range(20)]
    lengths = np.bincount([len(trajectory) for trajectory in workload.run(starts, np.random.default_rng(0))])
    config = workload.config
    assert lengths[: config.min_steps + 1].sum() == 0
    assert len(lengths) == config.max_steps + 2
    assert (lengths[config.min_steps + 1 :] > 0).all()


def test_a_toolcall_fatal_error_ends_the_chance_of_success() -> None:
    """A fatal error ends the rollout at once with reward 0; a recoverable one leaves a chance."""
    workload = policy_workload("toolcall", seed=2, prompts=128)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts for _ in range(8)]
    fatal = recoverable = still_possible = 0
    for start, trajectory in zip(starts, workload.run(starts, np.random.default_rng(1)), strict=True):
        for before, after in zip((start, *trajectory[:-1]), trajectory, strict=True):
            if '"status": "error"' not in after.history[-1].text:
                continue
            if after.done:
                fatal += 1
                assert after.reward == 0.0
            else:
                recoverable += 1
                assert after.latent[0] % 2 == 1  # the recoverable-error flag
                # Under the default (uniform) policy an error only costs a turn.
                assert after.p <= before.p + 1e-12
                still_possible += after.p > 0.0
    assert fatal > 50 and recoverable > 50 and still_possible > 25


def test_prefixes_tell_least_in_math_and_most_in_multihop() -> None:
    """The share of the outcome's variance that is resolved before the final turn,
    Σ (p_{T−1} − p_0)² / Σ p_0(1 − p_0) over rollouts of in-between tasks: a maths rollout is decided
    by its answer, a multi-hop one largely by the documents found on the way."""
    resolved = {}
    for family in ("math", "multihop", "toolcall"):
        workload = policy_workload(family, seed=4, prompts=1024)
        middle = [
            prompt.prompt_id
            for prompt in workload.prompts
            if 0.1 <= workload.true_success(prompt.prompt_id) <= 0.9
        ]
        starts = [workload.start(prompt_id) for prompt_id in middle for _ in range(8)]
        trajectories = workload.run(starts, np.random.default_rng(2))
        before_answer = [
            trajectory[-2].p if len(trajectory) > 1 else start.p
            for start, trajectory in zip(starts, trajectories, strict=True)
        ]
        resolved[family] = sum(
            (p - start.p) ** 2 for p, start in zip(before_answer, starts, strict=True)
        ) / sum(start.p * (1 - start.p) for start in starts)
    assert resolved["math"] < 0.1 < resolved["toolcall"] < resolved["multihop"]
    assert resolved["multihop"] > 0.3


@pytest.mark.parametrize("family", POLICY_FAMILIES)
def test_a_step_pool_runs_well_under_a_second(family: str) -> None:
    """512 tasks × 8 rollouts to the end (the best of two tries: the machine is shared)."""
    workload = policy_workload(family, seed=0, prompts=2048)
    starts = [workload.start(prompt.prompt_id) for prompt in workload.epoch_pool(0, 512) for _ in range(8)]
    durations = []
    for attempt in range(2):
        began = time.perf_counter()
        workload.run(starts, np.random.default_rng(attempt))
        durations.append(time.perf_counter() - began)
    assert min(durations) < 1.0


@pytest.mark.parametrize("family", POLICY_FAMILIES)
def test_setting_the_policy_is_cheap(family: str) -> None:
    """The learner sets θ every step: 2,000 tasks' values in well under 50 ms (median of five)."""
    workload = policy_workload(family, seed=0, prompts=2000)
    theta = workload.policy
    durations = []
    for shift in range(5):
        began = time.perf_counter()
        workload.policy = theta + 0.1 * shift
        durations.append(time.perf_counter() - began)
    assert float(np.median(durations)) < 0.05
