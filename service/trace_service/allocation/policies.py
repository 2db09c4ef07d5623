"""Baseline allocation rules behind the same array interface as TRACE, so that the service and the
benchmarks can A/B them on the same infrastructure; which policy uses which rule is the registry's
(:mod:`~trace_service.allocation.policy_rules`, docs/allocation.md, "Policies").

Root rules return int64 rollout counts per prompt (0 = skip) whose sum never exceeds the budget;
branching rules return continuations per candidate prefix.  TRACE itself is
:func:`~trace_service.allocation.stage1.allocate_roots` and
:func:`~trace_service.allocation.stage2.expand_prefixes`; the oracle is TRACE fed the true
probabilities, which only a simulator knows.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from trace_service.allocation._validate import (
    FloatArray,
    IntArray,
    check_limits,
    non_negative_int,
    probabilities,
)
from trace_service.allocation.stage2 import spread_evenly
from trace_service.allocation.stats import mixed_groups


def uniform_prompts(
    n_prompts: int, budget: int, *, min_rollouts: int, max_rollouts: int, max_prompts: int | None
) -> int:
    """How many prompts uniform allocation serves: ``k = min(B, max_prompts, ⌊M / m_min⌋)``."""
    return min(
        check_limits(n_prompts, budget, min_rollouts, max_rollouts, max_prompts), budget // min_rollouts
    )


def uniform_group_size(
    n_prompts: int, budget: int, *, min_rollouts: int, max_rollouts: int, max_prompts: int | None
) -> int:
    """The group size uniform allocation gives at this budget: ``min(⌊M / k⌋, m_max)`` over its
    :func:`uniform_prompts` k (the first of them take one more when M does not divide); 0 when no
    prompt can have ``m_min``."""
    prompts = uniform_prompts(
        n_prompts, budget, min_rollouts=min_rollouts, max_rollouts=max_rollouts, max_prompts=max_prompts
    )
    return min(budget // prompts, max_rollouts) if prompts else 0


def uniform_roots(
    n_prompts: int,
    budget: int,
    *,
    min_rollouts: int = 2,
    max_rollouts: int = 64,
    max_prompts: int | None = None,
    keep: npt.ArrayLike | None = None,
) -> IntArray:
    """GRPO's rule: the same number of rollouts for every prompt, in pool order.

    As many prompts as the budget allows at ``min_rollouts`` each (``max_prompts`` and ``keep`` — a mask
    of prompts allowed at all — restrict them), then the budget is dealt evenly over them up to
    ``max_rollouts``; the first prompts take the remainder, so counts differ by at most one.
    """
    prompts = uniform_prompts(
        non_negative_int(n_prompts, "n_prompts"),
        budget,
        min_rollouts=min_rollouts,
        max_rollouts=max_rollouts,
        max_prompts=max_prompts,
    )
    allowed = np.ones(n_prompts, dtype=bool) if keep is None else np.asarray(keep, dtype=bool)
    if allowed.shape != (n_prompts,):
        raise ValueError(f"keep must have shape ({n_prompts},), got {allowed.shape}")
    active = np.flatnonzero(allowed)[:prompts]
    counts = np.zeros(n_prompts, dtype=np.int64)
    if active.size:
        eligible = np.zeros(n_prompts, dtype=bool)
        eligible[active] = True
        counts = np.minimum(spread_evenly(eligible, min(budget, active.size * max_rollouts)), max_rollouts)
    return counts


def dapo_keep(successes: npt.ArrayLike, visits: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """DAPO dynamic sampling's filter: keep only groups whose rewards are not all equal.

    DAPO allocates uniformly, drops the all-equal groups after generation and refills; the budget spent
    on dropped groups is the waste TRACE aims to avoid.
    """
    return mixed_groups(successes, visits)


def greso_keep(
    zero_variance_streak: npt.ArrayLike, rng: np.random.Generator, *, keep_probability: float = 0.1
) -> npt.NDArray[np.bool_]:
    """GRESO's pre-rollout filter: skip a prompt whose recent groups were all-correct or all-wrong.

    ``zero_variance_streak[i]`` counts prompt i's consecutive recent zero-variance groups; such a prompt
    is kept with probability ``keep_probability ** streak`` (GRESO's exploration), others always.
    """
    streak = np.asarray(zero_variance_streak, dtype=np.int64)
    if np.any(streak < 0):
        raise ValueError("zero_variance_streak must be >= 0")
    if not 0.0 <= keep_probability <= 1.0:
        raise ValueError("keep_probability must lie in [0, 1]")
    return rng.random(streak.size) < keep_probability ** streak.astype(np.float64)


def pcl_roots(
    v: npt.ArrayLike,
    budget: int,
    *,
    rollouts_per_prompt: int = 8,
    target: float = 0.5,
    max_prompts: int | None = None,
) -> IntArray:
    """Prompt curriculum learning: keep the prompts whose predicted success is closest to ``target``,
    each with the same ``rollouts_per_prompt`` (ties go to the earlier prompt), at most
    ``max_prompts`` of them."""
    probs = probabilities(v, "v")
    budget = non_negative_int(budget, "budget")
    if rollouts_per_prompt < 1:
        raise ValueError("rollouts_per_prompt must be >= 1")
    if max_prompts is not None and max_prompts < 1:
        raise ValueError("max_prompts must be >= 1")
    if not 0.0 <= target <= 1.0:
        raise ValueError("target must lie in [0, 1]")
    order = np.lexsort((np.arange(probs.size), np.abs(probs - target)))
    counts = np.zeros(probs.size, dtype=np.int64)
    kept = budget // rollouts_per_prompt
    counts[order[: kept if max_prompts is None else min(kept, max_prompts)]] = rollouts_per_prompt
    return counts


def knapsack_weight(v: npt.ArrayLike) -> FloatArray:
    """Knapsack RL's information weight ``p(1 − p)²``, multiplied into the root value."""
    probs = probabilities(v, "v")
    return probs * (1.0 - probs) ** 2


def random_branching(n_candidates: int, budget: int, rng: np.random.Generator) -> IntArray:
    """TreePO-style branching: continuations dealt to uniformly random candidate prefixes (one
    multinomial draw); nothing when there is no candidate."""
    budget = non_negative_int(budget, "budget")
    n_candidates = non_negative_int(n_candidates, "n_candidates")
    if n_candidates == 0:
        return np.zeros(0, dtype=np.int64)
    return rng.multinomial(budget, np.full(n_candidates, 1.0 / n_candidates)).astype(np.int64)
