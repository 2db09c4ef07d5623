"""A job's gain over uniform allocation, from its control trees (pure).

Each complete tree is one observation ``(x, c)``: ``x`` = 1 when the tree is mixed, ``c`` its cost
(scored bare rollouts, or turns generated).  The sums are kept per step and arm (:class:`ArmSums`), and
an estimate reads a window of steps, each step ``s`` with a weight ``w_s`` (1 for the job's statistics,
a decay with age for the split of the next allocation, ``allocation.split``).  Per arm — the policy's
trees, and the control trees drawn at random for uniform's rules (``allocation.control_share``) — the rate of
mixed groups per unit of cost is the ratio estimator

    r = Σ w x / Σ w c,
    ν = Var(r)/r² ≈ n/(n − 1) · Σ_s w_s² (X_s − 2r·XC_s + r²·CC_s) / (r·Σ w c)²     (x² = x),

with ``X_s, XC_s, CC_s`` the step's sums of x, x·c, c² and n the window's effective number of trees
``(Σ w)² / Σ w²`` (over trees).  A ratio of sums is biased at second order,
``E[r̂] ≈ r·(1 + β)``, ``β = (S_cc/c̄² − S_xc/(x̄·c̄)) / n`` (S the weighted covariances of the trees'
costs and outcomes), and so is the inverse of the control's rate, ``E[1/r̂] ≈ (1 − β + ν)/r``.  The
gain is the bias-corrected quotient

    R = (r_policy / r_control) / ((1 + β_policy)·(1 − β_control + ν_control)),

and its interval ``exp(L ± z·s)`` is centred on the bias-corrected log ratio
``L = log(r_p/r_c) − (β_p − ν_p/2) + (β_c − ν_c/2)`` with ``s² = ν_policy + ν_control`` (the arms are
independent samples), z the normal quantile of the level (1.645 for 90%).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields
from typing import Literal

#: The two arms of a job: its policy's trees, and its control trees.
POLICY, CONTROL = "policy", "control"
#: The policy's trees again, by the shape of their Stage 2: those that may branch below their first turn,
#: and those that branch from first turns only (``allocation.split``, ``decide_shape``).
BRANCH_DEEP, BRANCH_FIRST = "branch_deep", "branch_first"
#: Every arm a step's totals keep sums of.
STEP_TOTAL_ARMS = (POLICY, CONTROL, BRANCH_DEEP, BRANCH_FIRST)
#: The normal quantile of a two-sided 90% interval.
Z_90 = 1.6448536269514722

Unit = Literal["bare", "turns"]


@dataclass(frozen=True, slots=True)
class ArmSums:
    """The sums the estimator needs over one arm's complete trees."""

    trees: int = 0
    mixed: int = 0
    bare: int = 0
    bare_sq: int = 0
    mixed_bare: int = 0
    turns: int = 0
    turns_sq: int = 0
    mixed_turns: int = 0

    @classmethod
    def of_tree(cls, *, mixed: bool, bare: int, turns: int) -> ArmSums:
        x = int(mixed)
        return cls(1, x, bare, bare * bare, x * bare, turns, turns * turns, x * turns)

    def __add__(self, other: ArmSums) -> ArmSums:
        return ArmSums(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))

    def figures(self, arm: str) -> dict[str, int]:
        """The sums as named figures of a step's totals (``<arm>_<sum>``)."""
        return {f"{arm}_{f.name}": getattr(self, f.name) for f in fields(self)}

    @classmethod
    def figure_names(cls, arm: str) -> list[str]:
        """The names :meth:`figures` gives the arm's sums."""
        return [f"{arm}_{f.name}" for f in fields(cls)]

    @classmethod
    def from_figures(cls, totals: Mapping[str, int], arm: str) -> ArmSums:
        """The sums read back from a step's totals (an absent figure is 0)."""
        return cls(*(int(totals.get(f"{arm}_{f.name}", 0)) for f in fields(cls)))

    def costs(self, unit: Unit) -> tuple[int, int, int]:
        """``(Σc, Σc², Σx·c)`` in the unit."""
        if unit == "bare":
            return self.bare, self.bare_sq, self.mixed_bare
        return self.turns, self.turns_sq, self.mixed_turns


@dataclass(frozen=True, slots=True)
class Rate:
    """An arm's mixed trees per unit of cost: the rate, its relative variance ν and relative bias β."""

    rate: float
    relative_variance: float
    relative_bias: float


def arm_rate(steps: Iterable[tuple[float, ArmSums]], unit: Unit, *, haldane: bool = False) -> Rate | None:
    """The module's ``(r, ν, β)`` of one arm from its steps' sums, each with its weight; None with no
    cost or under two trees' worth of evidence, and while the arm has no mixed tree, unless ``haldane``:
    then an arm with none counts half a mixed tree (Haldane's correction) with the relative variance of
    a count of one, ``ν = 1``, so that many trees and no mixed one still say the arm is poor, and never
    better than one mixed tree would (a count of one half's own ``ν = 2`` would make the first mixed
    tree look worse for the arm than none)."""
    weighted = [(w, sums) for w, sums in steps if w > 0 and sums.trees]
    trees = sum(w * s.trees for w, s in weighted)
    trees_sq = sum(w * w * s.trees for w, s in weighted)
    mixed = sum(w * s.mixed for w, s in weighted)
    cost, cost_sq, mixed_cost = (sum(w * s.costs(unit)[k] for w, s in weighted) for k in range(3))
    if cost <= 0 or trees_sq <= 0 or trees * trees / trees_sq < 2:
        return None
    if mixed <= 0:
        if not haldane:
            return None
        mean_weight = trees / sum(s.trees for _, s in weighted)
        return Rate(0.5 * mean_weight / cost, 1.0, 0.0)
    effective = trees * trees / trees_sq
    r = mixed / cost
    relative_variance = relative_variance_at(weighted, unit, r)
    mean_cost, mean_mixed = cost / trees, mixed / trees
    cost_var = max(cost_sq / trees - mean_cost**2, 0.0)
    covariance = mixed_cost / trees - mean_mixed * mean_cost
    relative_bias = (cost_var / mean_cost**2 - covariance / (mean_mixed * mean_cost)) / effective
    return Rate(r, relative_variance, relative_bias)


def relative_variance_at(steps: Iterable[tuple[float, ArmSums]], unit: Unit, rate: float) -> float:
    """The module's ``ν`` of one arm's rate, its spread measured around ``rate`` (the arm's own rate, or
    one both arms share); infinite under two trees' worth of evidence."""
    weighted = [(w, sums) for w, sums in steps if w > 0 and sums.trees]
    trees = sum(w * s.trees for w, s in weighted)
    trees_sq = sum(w * w * s.trees for w, s in weighted)
    cost = sum(w * s.costs(unit)[0] for w, s in weighted)
    if trees_sq <= 0 or trees * trees / trees_sq <= 1 or rate * cost <= 0:
        return math.inf
    effective = trees * trees / trees_sq
    spread = sum(
        w * w * max(s.mixed - 2 * rate * s.costs(unit)[2] + rate * rate * s.costs(unit)[1], 0.0)
        for w, s in weighted
    )
    return effective / (effective - 1) * spread / (rate * cost) ** 2


@dataclass(frozen=True, slots=True)
class Gain:
    """The policy's rate over the controls': the bias-corrected ratio, its interval and the log ratio's
    estimate and standard error that the interval is built from, and the standard error it would have
    if the arms were alike (``null_error``: each arm's spread measured around their pooled rate), whose
    spread does not shrink as a poor arm's first mixed trees come in (``allocation.split`` reads the
    smaller of the two)."""

    ratio: float
    low: float
    high: float
    log_ratio: float
    log_error: float
    null_error: float


def gain_ratio(
    policy: Iterable[tuple[float, ArmSums]],
    control: Iterable[tuple[float, ArmSums]],
    unit: Unit,
    z: float = Z_90,
    *,
    haldane: bool = False,
) -> Gain | None:
    """The module's gain of the policy over the controls from each arm's weighted steps; None while
    either arm has no rate (see :func:`arm_rate` for ``haldane``)."""
    policy, control = list(policy), list(control)
    mine, theirs = arm_rate(policy, unit, haldane=haldane), arm_rate(control, unit, haldane=haldane)
    if mine is None or theirs is None:
        return None
    raw = mine.rate / theirs.rate
    mean_bias = (1 + mine.relative_bias) * (1 - theirs.relative_bias + theirs.relative_variance)
    log_ratio = (
        math.log(raw)
        - (mine.relative_bias - mine.relative_variance / 2)
        + (theirs.relative_bias - theirs.relative_variance / 2)
    )
    error = math.sqrt(mine.relative_variance + theirs.relative_variance)
    pooled = _pooled_rate([*policy, *control], unit)
    null_error = math.sqrt(
        relative_variance_at(policy, unit, pooled) + relative_variance_at(control, unit, pooled)
    )
    return Gain(
        ratio=raw / mean_bias if mean_bias > 0 else raw,
        low=math.exp(log_ratio - z * error),
        high=math.exp(log_ratio + z * error),
        log_ratio=log_ratio,
        log_error=error,
        null_error=null_error,
    )


def _pooled_rate(steps: list[tuple[float, ArmSums]], unit: Unit) -> float:
    """Mixed trees per unit of both arms together (half a mixed tree when neither has one)."""
    mixed = sum(w * s.mixed for w, s in steps)
    cost = sum(w * s.costs(unit)[0] for w, s in steps)
    return max(mixed, 0.5) / cost


def unweighted(sums: ArmSums) -> list[tuple[float, ArmSums]]:
    """One arm's sums as a window of one step of weight 1."""
    return [(1.0, sums)]
