"""`KnowableRoots`, the Bayes posterior of what a workload lets one know at the roots: against an exact
reference on small pools, its limits (no text, no history; sharp evidence) and its wiring."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.estimators import KnowableRoots, Query, declared_text_noise, text_error
from trace_lab.sim import Prompt, RolloutState, Turn, make_workload


def _roots(successes: Sequence[float], outcomes: Sequence[tuple[int, int]]) -> list[Query]:
    return [
        Query(Prompt(f"p{i}", "text"), RolloutState(f"p{i}", p=p), s, n)
        for i, (p, (s, n)) in enumerate(zip(successes, outcomes, strict=True))
    ]


def _constant(queries: Sequence[Query]) -> np.ndarray:
    return np.full(len(queries), 0.5)


def _reference(queries: Sequence[Query], text_noise: float) -> list[float]:
    """The docstring's sum, one root and one other prompt at a time."""
    means = []
    for i, query in enumerate(queries):
        logit_i = math.log(query.state.p / (1 - query.state.p))
        reading = logit_i + text_noise * text_error(query.prompt.prompt_id)
        total = weighted = 0.0
        for j, other in enumerate(queries):
            if j == i:
                continue
            p = other.state.p
            weight = p**query.successes * (1 - p) ** (query.trials - query.successes)
            if math.isfinite(text_noise):
                weight *= math.exp(-(((reading - math.log(p / (1 - p))) / text_noise) ** 2) / 2)
            total += weight
            weighted += weight * p
        means.append(weighted / total)
    return means


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.floats(0.05, 0.95), min_size=2, max_size=7).flatmap(
        lambda p: st.tuples(
            st.just(p),
            st.lists(
                st.integers(0, 6).flatmap(lambda n: st.tuples(st.integers(0, n), st.just(n))),
                min_size=len(p),
                max_size=len(p),
            ),
        )
    ),
    st.sampled_from([0.5, 2.0, math.inf]),
)
def test_root_values_are_the_exact_posterior_means(
    pool: tuple[list[float], list[tuple[int, int]]], text_noise: float
) -> None:
    queries = _roots(*pool)
    values = KnowableRoots(_constant, text_noise=text_noise)(queries)
    assert values.tolist() == pytest.approx(_reference(queries, text_noise), rel=1e-9)


def test_without_text_or_history_each_root_gets_the_others_mean() -> None:
    successes = [0.1, 0.4, 0.7, 0.9]
    values = KnowableRoots(_constant, text_noise=math.inf)(_roots(successes, [(0, 0)] * 4))
    total = sum(successes)
    assert values.tolist() == pytest.approx([(total - p) / 3 for p in successes])


def test_sharp_evidence_finds_the_prompt_it_fits() -> None:
    """Forty successes in forty rollouts: only the near-certain others still fit."""
    successes = [0.02, 0.5, 0.99, 0.995]
    values = KnowableRoots(_constant, text_noise=math.inf)(_roots(successes, [(40, 40)] * 4))
    assert values[0] > 0.98 and values[1] > 0.98


def test_prefixes_and_a_lone_root_are_the_wrapped_estimators() -> None:
    estimator = KnowableRoots(_constant, text_noise=1.0)
    root = _roots([0.9], [(0, 0)])[0]
    turn = Turn("a step", done=False)
    prefix = Query(root.prompt, RolloutState("p0", p=0.3, history=(turn,)), 0, 0)
    assert estimator([root, prefix]).tolist() == [0.5, 0.5]
    assert estimator([prefix, *_roots([0.2, 0.8], [(0, 0)] * 2)])[0] == 0.5


def test_the_wrapped_answer_is_not_rewritten() -> None:
    """The wrapped estimator's own array (one it may keep) comes back as it was; prefixes keep it."""
    queries = _roots([0.2, 0.8], [(0, 0)] * 2)
    prefix = Query(queries[0].prompt, RolloutState("p0", p=0.3, history=(Turn("a step", done=False),)), 0, 0)
    kept = np.array([0.2, 0.8, 0.3])

    def keeping(_: Sequence[Query]) -> np.ndarray:
        return kept

    values = KnowableRoots(keeping, text_noise=math.inf)([*queries, prefix])
    assert values.tolist() == pytest.approx([0.8, 0.2, 0.3])
    assert kept.tolist() == [0.2, 0.8, 0.3]


def test_the_text_noise_is_the_familys_declared_offset() -> None:
    assert declared_text_noise(make_workload("math", 0, prompts=16)) == 4.0
    assert declared_text_noise(make_workload("react", 0, prompts=16)) == math.inf


@pytest.mark.parametrize("text_noise", [0.0, -1.0, math.nan])
def test_a_text_noise_that_is_not_positive_is_refused(text_noise: float) -> None:
    with pytest.raises(ValueError, match="text_noise"):
        KnowableRoots(_constant, text_noise=text_noise)
