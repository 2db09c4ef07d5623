"""A job's gain over uniform allocation, from its control trees (pure).

Each complete tree is one observation ``(x, c)``: ``x`` = 1 when the tree is mixed, ``c`` its cost
(scored bare rollouts, or turns generated).  Per arm — the policy's trees, and the control trees drawn at
random for uniform's rules (``allocation.control_share``) — the rate of mixed groups per unit of cost is the
ratio estimator ``r = Σx / Σc`` with the delta-method variance

    Var(r) ≈ n/(n − 1) · Σ (x − r·c)² / (Σc)²
           = n/(n − 1) · (Σx − 2r·Σxc + r²·Σc²) / (Σc)²          (x² = x),

and the gain is ``R = r_policy / r_control`` with the interval ``R·exp(±z·s)``,
``s² = Var(r_policy)/r_policy² + Var(r_control)/r_control²`` (the arms are independent samples), z the
normal quantile of the level (1.645 for 90%).  The sums are kept per step and arm
(:meth:`ArmSums.figures`), so any window of steps adds up.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Literal

#: The two arms of a job: its policy's trees, and its control trees.
POLICY, CONTROL = "policy", "control"
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
    def from_figures(cls, totals: Mapping[str, int], arm: str) -> ArmSums:
        """The sums read back from a step's totals (an absent figure is 0)."""
        return cls(*(int(totals.get(f"{arm}_{f.name}", 0)) for f in fields(cls)))

    def rate(self, unit: Unit) -> tuple[float, float] | None:
        """``(r, Var(r))`` of mixed trees per unit of cost (module docstring); None without any cost."""
        cost = self.bare if unit == "bare" else self.turns
        cost_sq = self.bare_sq if unit == "bare" else self.turns_sq
        mixed_cost = self.mixed_bare if unit == "bare" else self.mixed_turns
        if cost <= 0 or self.trees < 2:
            return None
        r = self.mixed / cost
        spread = max(self.mixed - 2 * r * mixed_cost + r * r * cost_sq, 0.0)
        return r, self.trees / (self.trees - 1) * spread / cost**2


def gain_ratio(
    policy: ArmSums, control: ArmSums, unit: Unit, z: float = Z_90
) -> tuple[float, float, float] | None:
    """``(R, low, high)``: the policy's mixed groups per unit over the controls', with its interval;
    None while either arm has no mixed tree (or fewer than two trees)."""
    mine, theirs = policy.rate(unit), control.rate(unit)
    if mine is None or theirs is None or mine[0] <= 0 or theirs[0] <= 0:
        return None
    ratio = mine[0] / theirs[0]
    spread = z * math.sqrt(mine[1] / mine[0] ** 2 + theirs[1] / theirs[0] ** 2)
    return ratio, ratio * math.exp(-spread), ratio * math.exp(spread)
