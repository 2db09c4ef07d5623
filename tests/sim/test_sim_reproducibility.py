"""Seeds reproduce workloads and runs; continuations share their prefix exactly and nothing after it."""

import dataclasses

import numpy as np
import pytest

from trace_lab.sim import RolloutState, SimConfig, SimWorkload, VocabularyConfig

CONFIG = SimConfig(prompts=64, feature_dim=4)


def run_once(workload: SimWorkload, seed: int) -> list[tuple[RolloutState, ...]]:
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts[:16] for _ in range(4)]
    return workload.run(starts, np.random.default_rng(seed))


def test_same_seed_same_prompts() -> None:
    first, second = SimWorkload(CONFIG, seed=4), SimWorkload(CONFIG, seed=4)
    assert first.prompts == second.prompts
    ids = [prompt.prompt_id for prompt in first.prompts]
    np.testing.assert_array_equal(first.true_success_many(ids), second.true_success_many(ids))


def test_different_seed_different_prompts() -> None:
    first, second = SimWorkload(CONFIG, seed=4), SimWorkload(CONFIG, seed=5)
    assert [prompt.text for prompt in first.prompts] != [prompt.text for prompt in second.prompts]
    # Prompt ids name the seed, so histories of two workloads are never confused.
    assert not {prompt.prompt_id for prompt in first.prompts} & {
        prompt.prompt_id for prompt in second.prompts
    }


def test_same_generator_seed_same_run() -> None:
    workload = SimWorkload(CONFIG, seed=4)
    assert run_once(workload, seed=9) == run_once(workload, seed=9)
    assert run_once(workload, seed=9) != run_once(workload, seed=10)


def test_continuation_shares_the_prefix_and_draws_fresh_turns() -> None:
    workload = SimWorkload(CONFIG, seed=4)
    rng = np.random.default_rng(3)
    (trajectory,) = workload.run([workload.start(workload.prompts[0].prompt_id)], rng)
    while len(trajectory) < 4:
        (trajectory,) = workload.run([workload.start(workload.prompts[0].prompt_id)], rng)
    prefix = trajectory[1]
    branches = workload.run([prefix] * 20, rng)
    for branch in branches:
        assert branch[0].history[: prefix.turns] == prefix.history
        assert all(mine is theirs for mine, theirs in zip(branch[0].history, prefix.history, strict=False))
    # Fresh randomness after the prefix: the next turns differ between branches and from the original.
    next_turns = {branch[0].history[prefix.turns].text for branch in branches}
    next_turns.add(trajectory[2].history[prefix.turns].text)
    assert len(next_turns) == len(branches) + 1
    # The prefix itself is a value: continuing it changed nothing.
    assert prefix == trajectory[1]


def test_vocabulary_seed_decides_the_words() -> None:
    base = SimWorkload(CONFIG, seed=4)
    same = SimWorkload(CONFIG, seed=8)
    other = SimWorkload(dataclasses.replace(CONFIG, vocabulary=VocabularyConfig(seed=1)), seed=4)
    assert base.vocabulary.words == same.vocabulary.words
    assert base.vocabulary.words != other.vocabulary.words
    # Spelled independently, two vocabularies can share a word only by chance: a tiny share.
    shared = set(base.vocabulary.words) & set(other.vocabulary.words)
    assert len(shared) <= 0.01 * len(base.vocabulary.words)


def test_unknown_prompt_is_a_clear_error() -> None:
    workload = SimWorkload(CONFIG, seed=4)
    with pytest.raises(ValueError, match="unknown prompt_id"):
        workload.start("no-such-prompt")


@pytest.mark.parametrize("p", [-0.1, 1.2, float("nan")])
def test_a_state_needs_a_probability(p: float) -> None:
    with pytest.raises(ValueError, match="probability"):
        RolloutState("any", p)
