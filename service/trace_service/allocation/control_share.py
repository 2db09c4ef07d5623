"""The randomized control share of an allocation (pure, no I/O).

An allocation spends a share ε of its bare rollouts on *control* trees: prompts drawn uniformly at random
from the whole pool, whether or not the policy's Stage 1 would give them any, each with uniform's group
size and uniform's Stage 2.  They are a random sample of what uniform allocation would have done on this
pool at this budget, so their outcomes estimate, without bias, uniform's mixed groups and the predictor's
calibration on prompts the policy did not choose.  The policy's Stage 1 allocates the rest of the budget
over a random draw of the rest of the pool as large as its share (``plan_roots``).  The share itself
is the job's to choose from its evidence (``allocation.split``).

With n uniform's group size (:func:`uniform_group_size`), the number of control trees is

    K = min(⌊ε·M / n + U⌋, ⌊M / n⌋, max_prompts, B),   U ~ Uniform[0, 1),

so that E[K·n] = ε·M whenever the caps do not bind (stochastic rounding keeps the share exact on
average for budgets of a few groups), and the K prompts are a uniform draw without replacement.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from trace_service.allocation._validate import IntArray, non_negative_int
from trace_service.allocation.policies import uniform_group_size
from trace_service.allocation.policy_rules import RootInputs, RootRule

BoolArray = npt.NDArray[np.bool_]


def draw_controls(inputs: RootInputs, share: float, rng: np.random.Generator) -> IntArray:
    """Bare rollouts per prompt of the control trees (0 for the others): the module's K prompts, drawn
    uniformly without replacement, with uniform's group size each."""
    if not (math.isfinite(share) and 0.0 <= share <= 1.0):
        raise ValueError(f"the control share must lie in [0, 1], got {share}")
    counts = np.zeros(inputs.n_prompts, dtype=np.int64)
    size = uniform_group_size(
        inputs.n_prompts,
        inputs.budget,
        min_rollouts=inputs.min_rollouts,
        max_rollouts=inputs.max_rollouts,
        max_prompts=inputs.max_prompts,
    )
    if share == 0.0 or size == 0:
        return counts
    cap = min(inputs.budget // size, inputs.max_prompts or inputs.n_prompts, inputs.n_prompts)
    trees = min(math.floor(share * inputs.budget / size + rng.random()), cap)
    counts[rng.choice(inputs.n_prompts, size=trees, replace=False)] = size
    return counts


@dataclass(frozen=True)
class RootPlan:
    """Stage 1's answer: bare rollouts per prompt (0 = skip) and which trees are controls."""

    counts: IntArray
    control: BoolArray


def plan_roots(rule: RootRule, inputs: RootInputs, share: float, rng: np.random.Generator) -> RootPlan:
    """The control trees (:func:`draw_controls`), then the policy's Stage 1 rule with what the controls
    left of the budget and of ``max_prompts``, over a uniform draw of ``⌈(1 − share)·B⌉`` of the other
    prompts: the policy arm then sees as many prompts per rollout as the whole allocation does, so its
    trees sample what the rule does on the whole pool at any share.  Never more than the budget, never
    more active prompts than ``max_prompts``; ``share`` 0 is the rule alone."""
    controls = draw_controls(inputs, share, rng)
    control = controls > 0
    rest = np.flatnonzero(~control)
    spent = int(controls.sum())
    counts = controls.copy()
    offered = min(rest.size, math.ceil((1.0 - share) * inputs.n_prompts))
    if offered < rest.size:
        rest = np.sort(rng.choice(rest, size=offered, replace=False))
    if rest.size:
        max_prompts = None if inputs.max_prompts is None else inputs.max_prompts - int(control.sum())
        if max_prompts is None or max_prompts > 0:
            counts[rest] = rule.counts(_restricted(inputs, rest, inputs.budget - spent, max_prompts))
    return RootPlan(counts, control)


def _restricted(inputs: RootInputs, prompts: IntArray, budget: int, max_prompts: int | None) -> RootInputs:
    """The inputs of the prompts at ``prompts`` only, with another budget and prompt cap."""

    predicted, streak = inputs.predicted, inputs.zero_variance_streak
    return replace(
        inputs,
        n_prompts=int(prompts.size),
        budget=non_negative_int(budget, "budget"),
        max_prompts=max_prompts,
        predicted=None if predicted is None else predicted[prompts],
        zero_variance_streak=None if streak is None else streak[prompts],
    )
