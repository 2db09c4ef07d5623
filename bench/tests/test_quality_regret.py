"""The regret decomposition's pieces: on hand-made step results, and on steps the harness ran."""

from __future__ import annotations

import dataclasses
import itertools

import numpy as np
import pytest
from tiny_policy_workload import TinyPolicyWorkload

from bench.harness import FreshnessEstimate, StepConfig, StepResult, Strategy, default_strategies, run_step
from bench.quality import (
    extreme_calibration,
    extreme_share,
    flips_per_continuation,
    paired_ratio,
    per_continuation,
    reliability_bins,
    root_pairs,
    stage1_share,
)
from trace_service.allocation import root_value

STEP = StepResult(
    pool=8, active=8, mixed=4, kept=8, mixed_forks=0, rollouts=32, continuations=0, turns=64,
    fallback_units=0, stage1_value=3.0, stage1_oracle_value=4.0, bare_on_extremes=8, flips=0,
    branch_depth=0, continuation_turns=0, freshness_evidence=(0, 0.0),
    root_predictions=(),
)  # fmt: skip
ORACLE = next(strategy for strategy in default_strategies() if strategy.name == "oracle")
ORACLE_JOINT = next(strategy for strategy in default_strategies() if strategy.name == "oracle_joint")


def test_paired_ratio_divides_seed_by_seed_and_counts_the_seeds_at_or_above() -> None:
    def seeds(*mixed: int) -> list[list[StepResult]]:
        return [[dataclasses.replace(STEP, mixed=count)] for count in mixed]

    # Ratios 1.5, 1.0 and 0.5 over the three seeds; a seed where uniform found none is left out.
    assert paired_ratio(seeds(6, 4, 2, 7), seeds(4, 4, 4, 0)) == "1.00 ± 0.50 (2/3)"
    assert paired_ratio(seeds(3), seeds(0)) == "—"


def test_stage1_share_pools_the_steps() -> None:
    other = dataclasses.replace(STEP, stage1_value=5.0, stage1_oracle_value=6.0)
    assert stage1_share([STEP]) == pytest.approx(0.75)
    assert stage1_share([STEP, other]) == pytest.approx(8.0 / 10.0)


def test_extreme_share_counts_bare_rollouts_only() -> None:
    branched = dataclasses.replace(STEP, rollouts=48, continuations=16)
    assert extreme_share([STEP]) == pytest.approx(8 / 32)
    assert extreme_share([branched]) == pytest.approx(8 / 32)


def test_flips_per_continuation() -> None:
    assert flips_per_continuation([STEP]) is None
    branched = dataclasses.replace(STEP, rollouts=48, continuations=16, flips=4)
    assert flips_per_continuation([branched, STEP]) == pytest.approx(0.25)


def test_per_continuation_pools_the_steps() -> None:
    assert per_continuation([STEP]) is None
    branched = dataclasses.replace(
        STEP, rollouts=48, continuations=16, branch_depth=40, continuation_turns=24
    )
    assert per_continuation([branched, STEP]) == (pytest.approx(2.5), pytest.approx(1.5))


def test_calibration_at_the_extremes_and_in_bins() -> None:
    true = np.array([0.01, 0.0, 0.5, 0.55, 0.99, 1.0])
    predicted = np.array([0.1, 0.2, 0.4, 0.6, 0.8, 0.9])
    (low, low_count), (high, high_count) = extreme_calibration(predicted, true)
    assert (low, low_count) == (pytest.approx(0.15), 2)
    assert (high, high_count) == (pytest.approx(0.85), 2)
    # Bins by true p, [0, 0.5) and [0.5, 1]: (mean true p, mean prediction, count).
    assert reliability_bins(predicted, true, bins=2) == [
        (pytest.approx(0.005), pytest.approx(0.15), 2),
        (pytest.approx(0.76), pytest.approx(0.675), 4),
    ]
    none, _ = extreme_calibration(predicted[2:4], true[2:4])
    assert none == (None, 0)


def tiny_config(tasks: int) -> StepConfig:
    return StepConfig(bare_rollouts=4 * tasks, expansion=2.0, min_rollouts=2, max_rollouts=8)


def tiny_step(rewards: list[list[list[float]]], strategy: Strategy = ORACLE) -> StepResult:
    workload = TinyPolicyWorkload(rewards)
    config = tiny_config(len(rewards))
    return run_step(workload, strategy, workload.prompts, {}, config, np.random.default_rng(0), learn=False)


def best_stage1_by_enumeration(
    p: np.ndarray, config: StepConfig, freshness: float
) -> tuple[float, tuple[int, ...]]:
    """The largest Σ V_root(p_i, m_i) over every count vector (each 0 or in [min, max], Σ m ≤ the bare
    budget), and a vector that reaches it: the reference Stage 1 optimum, by brute force."""
    sizes = [0, *range(config.min_rollouts, config.max_rollouts + 1)]
    candidates = (m for m in itertools.product(sizes, repeat=len(p)) if sum(m) <= config.bare_rollouts)
    return max(
        (float(root_value(p, m, expansion=config.expansion, freshness=freshness).sum()), m)
        for m in candidates
    )


@pytest.mark.parametrize(
    ("strategy", "freshness"), [(ORACLE, 0.0), (ORACLE_JOINT, FreshnessEstimate().value)]
)
def test_the_oracle_reads_the_truth_and_reaches_the_enumerated_optimum(
    strategy: Strategy, freshness: float
) -> None:
    rewards = [[[0.9, 0.7], [0.1, 0.2]], [[0.5, 0.5], [0.4, 0.6]], [[0.02, 0.01], [0.0, 0.03]]]
    # Under the uniform starting policy a task succeeds with the mean of its reward table.
    true_p = np.array([(0.9 + 0.7 + 0.1 + 0.2) / 4, 0.5, (0.02 + 0.01 + 0.0 + 0.03) / 4])
    result = tiny_step(rewards, strategy)
    predicted, true = root_pairs([result])
    assert true.tolist() == pytest.approx(true_p.tolist())
    assert predicted.tolist() == pytest.approx(true_p.tolist())
    best, counts = best_stage1_by_enumeration(true_p, tiny_config(len(rewards)), freshness)
    assert result.stage1_oracle_value == pytest.approx(best)
    assert result.stage1_value == pytest.approx(best)
    # The third task (p < 0.05) gets the optimum's bare rollouts: none under the paper's objective; the
    # joint one spends some once the two others are full (their continuations cover the contrast).
    assert result.bare_on_extremes == counts[2]


def test_a_decided_prefix_never_flips() -> None:
    """The reward is decided by the first action: a continuation from the first turn repeats it."""
    result = tiny_step([[[1.0, 1.0], [0.0, 0.0]]])
    assert result.continuations > 0
    assert result.flips == 0
