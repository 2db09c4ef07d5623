"""The family registry, seeds, the epoch pool and the families' different difficulty mixes."""

import itertools
from collections import Counter

import numpy as np
import pytest
from family_support import ALL_FAMILIES, POLICY_FAMILIES, VARIANTS, policy_workload, root_success
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_lab.sim import (
    FAMILIES,
    MathConfig,
    PolicyWorkload,
    RolloutState,
    SimConfig,
    SimWorkload,
    Workload,
    make_workload,
    root_summary,
)
from trace_lab.sim.__main__ import main


def test_the_registry_names_every_family() -> None:
    assert set(FAMILIES) == {*ALL_FAMILIES, *VARIANTS}
    for family in (*ALL_FAMILIES, *VARIANTS):
        workload = make_workload(family, seed=1, prompts=32)
        assert isinstance(workload, Workload)
        assert workload.name == family
        assert len(workload.prompts) == 32
        assert isinstance(workload, PolicyWorkload) == (family != "react")
    with pytest.raises(ValueError, match="unknown workload family"):
        make_workload("chess", seed=1)


def test_factories_take_config_overrides() -> None:
    workload = FAMILIES["math"](2, 16, topic_noise=0.0, max_steps=6)
    assert isinstance(workload, PolicyWorkload)
    assert workload.max_turns == 7
    react = FAMILIES["react"](2, 16, max_turns=5)
    assert isinstance(react, SimWorkload)
    assert react.max_turns == react.config.max_turns == 5
    with pytest.raises(ValueError, match="answer_prob"):
        FAMILIES["math"](2, 16, answer_prob=1.5)
    assert len(make_workload("multihop", seed=0).prompts) == 2048


def test_react_is_a_workload_with_the_config_formula() -> None:
    workload = SimWorkload(SimConfig(prompts=8), seed=0)
    state = workload.start(workload.prompts[0].prompt_id)
    while state.turns < 3:
        state = workload.step(state, np.random.default_rng(state.turns))[1]
    assert workload.expected_remaining_turns(state) == workload.config.expected_remaining_turns(3)
    assert state.latent == ()
    assert state.history[0].action is None


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_same_seed_same_tasks_and_runs(family: str) -> None:
    first, second = make_workload(family, 4, 64), make_workload(family, 4, 64)
    assert first.prompts == second.prompts
    np.testing.assert_array_equal(root_success(first), root_success(second))
    starts = [first.start(prompt.prompt_id) for prompt in first.prompts[:16] for _ in range(4)]
    assert first.run(starts, np.random.default_rng(9)) == second.run(starts, np.random.default_rng(9))


@pytest.mark.parametrize("family", ALL_FAMILIES)
def test_different_seed_different_tasks(family: str) -> None:
    first, second = make_workload(family, 4, 64), make_workload(family, 5, 64)
    assert [prompt.text for prompt in first.prompts] != [prompt.text for prompt in second.prompts]
    assert not np.array_equal(root_success(first), root_success(second))
    assert not {prompt.prompt_id for prompt in first.prompts} & {
        prompt.prompt_id for prompt in second.prompts
    }


def test_prompt_ids_never_collide_between_families() -> None:
    ids = [{prompt.prompt_id for prompt in make_workload(family, 0, 64).prompts} for family in ALL_FAMILIES]
    assert all(not a & b for a, b in itertools.combinations(ids, 2))


@pytest.mark.parametrize("family", POLICY_FAMILIES)
def test_held_out_tasks_share_the_vocabulary_and_the_contexts(family: str) -> None:
    """Another seed gives other tasks of the same family: same words, same contexts and actions; only the
    vocabulary seed changes the words."""
    train, held_out = policy_workload(family, 0, 64), policy_workload(family, 1, 64)
    assert train.lexicon.words == held_out.lexicon.words
    assert (train.contexts, train.actions) == (held_out.contexts, held_out.actions)
    np.testing.assert_array_equal(train.right_actions(), held_out.right_actions())
    respelled = FAMILIES[family](0, 64, vocabulary_seed=1)
    assert isinstance(respelled, type(train))
    assert len(set(respelled.lexicon.words) & set(train.lexicon.words)) <= 0.02 * len(train.lexicon.words)


@settings(max_examples=40, deadline=None)
@given(
    family=st.sampled_from(ALL_FAMILIES),
    population=st.integers(1, 60),
    share=st.floats(0.0, 1.0),
    epochs=st.integers(1, 4),
    seed=st.integers(0, 1000),
)
def test_epoch_pool_draws_every_prompt_once_per_epoch(
    family: str, population: int, share: float, epochs: int, seed: int
) -> None:
    """Pools hold distinct prompts; consecutive pools laid end to end visit each prompt exactly once per
    epoch (population draws); a pool depends on (seed, step) only."""
    workload = make_workload(family, seed, population)
    size = max(1, round(share * population))
    steps = -(-epochs * population // size)
    pools = [workload.epoch_pool(step, size) for step in range(steps)]
    assert all(len({prompt.prompt_id for prompt in pool}) == size for pool in pools)
    stream = [prompt.prompt_id for pool in pools for prompt in pool]
    for epoch in range(epochs):
        assert Counter(stream[epoch * population : (epoch + 1) * population]) == Counter(
            prompt.prompt_id for prompt in workload.prompts
        )
    fresh = make_workload(family, seed, population)
    last = steps - 1
    assert fresh.epoch_pool(last, size) == pools[last]  # no history needed


def test_epoch_pool_order_depends_on_the_seed_and_the_epoch() -> None:
    workload = make_workload("toolcall", 0, 256)
    first = [prompt.prompt_id for prompt in workload.epoch_pool(0, 64)]
    assert first != [prompt.prompt_id for prompt in workload.epoch_pool(4, 64)]  # reshuffled next epoch
    assert first != [prompt.prompt_id for prompt in workload.prompts[:64]]
    other = make_workload("toolcall", 1, 256)
    assert [prompt.prompt_id[prompt.prompt_id.index("-") :] for prompt in other.epoch_pool(0, 64)] != [
        prompt_id[prompt_id.index("-") :] for prompt_id in first
    ]
    with pytest.raises(ValueError, match="pool size"):
        workload.epoch_pool(0, 257)
    with pytest.raises(ValueError, match="step"):
        workload.epoch_pool(-1, 8)
    assert workload.epoch_pool(3, 0) == []


def test_families_have_different_difficulty_mixes() -> None:
    """Shares of tasks below 0.05 / above 0.95, intraclass correlations and turn counts differ between
    every two families at their defaults."""
    summaries = {family: root_summary(make_workload(family, 0)) for family in ALL_FAMILIES}
    for a, b in itertools.combinations(summaries.values(), 2):
        assert (
            max(abs(a.below_5_percent - b.below_5_percent), abs(a.above_95_percent - b.above_95_percent))
            >= 0.04
        )
        assert abs(a.intraclass_correlation - b.intraclass_correlation) >= 0.03
        assert abs(a.mean_turns - b.mean_turns) >= 0.3
    for summary in summaries.values():
        # RLVR-like: many tasks near certain failure or success, and many in between.
        assert 0.2 <= summary.below_5_percent + summary.above_95_percent <= 0.8


def test_the_summary_is_printed_per_family(capsys: pytest.CaptureFixture[str]) -> None:
    main(["1"])
    lines = capsys.readouterr().out.splitlines()
    assert [line.split()[0] for line in lines[1:]] == [*ALL_FAMILIES, *VARIANTS]


@pytest.mark.parametrize(
    "override",
    [{"min_steps": 0}, {"min_steps": 3, "max_steps": 2}, {"topic_noise": -0.1}, {"verdict_flip": 0.6}],
)
def test_family_configs_are_validated(override: dict[str, float]) -> None:
    with pytest.raises(ValueError):  # noqa: PT011 - each override breaks a different rule
        MathConfig(**override)  # type: ignore[arg-type]


def test_a_state_must_carry_a_probability() -> None:
    with pytest.raises(ValueError, match="probability"):
        RolloutState("any", 1.5, latent=(0,))
