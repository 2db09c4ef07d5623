"""TRACE Stage 1 at a draw from the estimator's Beta belief (the harness's `RootBelief.thompson`): what
it reads, and that a certain belief is the point value."""

import functools
from collections.abc import Sequence

import numpy as np
import pytest

from bench.estimators import Query, oracle_estimator, posterior_estimator
from bench.forest import PromptRecord
from bench.harness import RootBelief, StepConfig, Strategy, _thompson_draw, run_step
from trace_lab.sim import FAMILIES, VocabularyConfig
from trace_proto import Policy

make_react = functools.partial(
    FAMILIES["react"], prompts=96, vocabulary=VocabularyConfig(distractor_words=200)
)
CONFIG = StepConfig(bare_rollouts=64, expansion=1.0, group_size=4)


class CertainOracle:
    """The true p with an infinite concentration: a belief with no doubt."""

    def __call__(self, queries: Sequence[Query]) -> np.ndarray:
        return oracle_estimator(queries)

    def predictive(self, queries: Sequence[Query]) -> tuple[np.ndarray, np.ndarray]:
        return oracle_estimator(queries), np.full(len(queries), np.inf)


def step(strategy: Strategy, *, seen: bool = False) -> list[int]:
    """One step's (rollouts, active, mixed); with ``seen`` every pool prompt had one earlier rollout."""
    workload = make_react(0)
    pool = workload.epoch_pool(0, 32)
    history = {prompt.prompt_id: PromptRecord(index % 2, 1) for index, prompt in enumerate(pool) if seen}
    result = run_step(workload, strategy, pool, history, CONFIG, np.random.default_rng(5), learn=False)
    return [result.rollouts, result.active, result.mixed]


def test_a_certain_belief_allocates_as_the_point_value() -> None:
    point = step(Strategy("trace", Policy.TRACE, CertainOracle()))
    thompson = Strategy("trace_thompson", Policy.TRACE, CertainOracle(), belief=RootBelief.thompson)
    assert step(thompson) == point


def test_a_belief_needs_an_estimator_that_states_its_concentration() -> None:
    with pytest.raises(ValueError, match="predictive"):
        step(Strategy("trace_thompson", Policy.TRACE, oracle_estimator, belief=RootBelief.thompson))


def test_thompson_draws_follow_the_beta_and_keep_certain_prompts() -> None:
    mean = np.array([0.0, 1.0, 0.3, 0.3])
    concentration = np.array([2.0, 2.0, np.inf, 4.0])
    rng = np.random.default_rng(1)
    draws = np.array([_thompson_draw(mean, concentration, rng) for _ in range(4000)])
    assert np.all(draws[:, :3] == mean[:3])
    # Beta(1.2, 2.8): mean 0.3, variance 0.21 / 5.
    assert draws[:, 3].mean() == pytest.approx(0.3, abs=0.01)
    assert draws[:, 3].var() == pytest.approx(0.21 / 5, rel=0.1)


def test_thompson_explores_only_prompts_without_earlier_rollouts() -> None:
    point = step(Strategy("trace", Policy.TRACE, posterior_estimator), seen=True)
    thompson = Strategy("trace_thompson", Policy.TRACE, posterior_estimator, belief=RootBelief.thompson)
    assert step(thompson, seen=True) == point
