"""The tabular learner's curves and what is reported of them (`bench/learning.py`): held-out success
against cumulative cost, the cost to reach uniform's final success, the tables and the plots."""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from bench.learning_arms import UNIFORM
from bench.plotting import FIXED, line_colors
from bench.protocol import mean_spread, mean_std
from trace_proto import GainEstimate
from trace_service.allocation.gain import ArmSums


@dataclass
class Curve:
    """One arm's run: held-out success after 0, 1, … updates, cumulative cost, per-step groups."""

    success: list[float] = field(default_factory=list)
    rollouts: list[int] = field(default_factory=lambda: [0])
    turns: list[int] = field(default_factory=lambda: [0])
    mixed: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)
    #: The sums of the arm's policy trees and of its control trees (`trace_service.allocation.gain`).
    policy_trees: ArmSums = field(default_factory=ArmSums)
    control_trees: ArmSums = field(default_factory=ArmSums)
    #: The service's estimate of the arm's gain over uniform, read from its job's stats after the run,
    #: and the slope of the trust map its Stage 1 read the predictor through then.
    estimate: GainEstimate | None = None
    trust: float | None = None
    #: The share of each step's bare rollouts meant for the policy's trees (the rest: control trees), and
    #: of its policy trees that could branch below their first turn (the rest: from first turns).
    policy_share: list[float] = field(default_factory=list)
    deep_share: list[float] = field(default_factory=list)

    def mixed_per(self, unit: str) -> float:
        """Mixed groups per turn (``unit`` "turns") or per rollout (``"rollouts"``) over the whole run."""
        cost = getattr(self, unit)[-1]
        return sum(self.mixed) / cost if cost else 0.0

    @property
    def effective_ratio(self) -> float:
        return statistics.fmean(m / a if a else 0.0 for m, a in zip(self.mixed, self.active, strict=True))


def success_at(costs: Sequence[float], success: Sequence[float], cost: float) -> float:
    """The curve's success at `cost`, linear between points; its last point's when it ends before
    (`np.interp` holds the end values outside the curve)."""
    return float(np.interp(cost, costs, success))


def cost_to_reach(costs: Sequence[float], success: Sequence[float], target: float) -> float | None:
    """The cost at which the curve (costs[k], success[k]) first reaches `target`, linear between
    points; None when it never does (past the horizon)."""
    for k, value in enumerate(success):
        if value >= target:
            if k == 0:
                return float(costs[0])
            low, high = success[k - 1], value
            return float(costs[k - 1] + (target - low) / (high - low) * (costs[k] - costs[k - 1]))
    return None


@dataclass(frozen=True)
class ArmFigures:
    """What the tables show of one arm on one (family, seed): the held-out success at uniform's total
    turns (equal compute; after the arm's last step if it generated fewer), the steps it took, and the
    ratios, None past the horizon (or when uniform did not improve on its start, so there is nothing to
    reach)."""

    final_success: float
    steps: int
    turns_ratio: float | None
    rollouts_ratio: float | None
    mixed_per_step: float
    effective_ratio: float
    #: Mixed groups per generated turn and per rollout over uniform's (GRPO's flat groups).
    mixed_per_turn: float
    mixed_per_rollout: float
    #: The mean share of the budget that followed the policy's rule, and of its trees that could branch
    #: below their first turn.
    policy_share: float
    deep_share: float


def arm_figures(curves: dict[str, Curve]) -> dict[str, ArmFigures]:
    uniform = curves[UNIFORM]
    target = uniform.success[-1]
    improved = target > uniform.success[0]

    def ratio(curve: Curve, unit: str) -> float | None:
        mine = cost_to_reach(getattr(curve, unit), curve.success, target)
        theirs = cost_to_reach(getattr(uniform, unit), uniform.success, target)
        if not improved or mine is None or not theirs:
            return None
        return mine / theirs

    return {
        name: ArmFigures(
            final_success=success_at(curve.turns, curve.success, uniform.turns[-1]),
            steps=len(curve.mixed),
            turns_ratio=ratio(curve, "turns"),
            rollouts_ratio=ratio(curve, "rollouts"),
            mixed_per_step=statistics.fmean(curve.mixed),
            effective_ratio=curve.effective_ratio,
            mixed_per_turn=_over(curve.mixed_per("turns"), uniform.mixed_per("turns")),
            mixed_per_rollout=_over(curve.mixed_per("rollouts"), uniform.mixed_per("rollouts")),
            policy_share=statistics.fmean(curve.policy_share) if curve.policy_share else 1.0,
            deep_share=statistics.fmean(curve.deep_share) if curve.deep_share else 1.0,
        )
        for name, curve in curves.items()
    }


def _over(mine: float, theirs: float) -> float:
    return mine / theirs if theirs else float("nan")


def _ratio_cell(value: float | None) -> str:
    return "> horizon" if value is None else f"{value:.2f}"


def print_seed_table(family: str, seed: int, curves: dict[str, Curve]) -> None:
    figures = arm_figures(curves)
    uniform = curves[UNIFORM]
    print(
        f"\n{family}, seed {seed}: uniform's held-out success {uniform.success[0]:.3f} → "
        f"{uniform.success[-1]:.3f} in {uniform.turns[-1]} turns, {uniform.rollouts[-1]} rollouts"
    )
    header = (
        f"{'arm':<14} {'final':>7} {'steps':>6} {'turns→uniform':>14} {'rollouts→uniform':>17}"
        f" {'mixed/step':>11} {'eff. ratio':>11} {'mixed/turn':>11} {'mixed/roll.':>11} {'policy':>7}"
        f" {'deep':>6}"
    )
    print(header)
    print("-" * len(header))
    for name, row in figures.items():
        print(
            f"{name:<14} {row.final_success:>7.3f} {row.steps:>6} {_ratio_cell(row.turns_ratio):>14} "
            f"{_ratio_cell(row.rollouts_ratio):>17} {row.mixed_per_step:>11.1f} {row.effective_ratio:>11.3f}"
            f" {row.mixed_per_turn:>11.2f} {row.mixed_per_rollout:>11.2f} {row.policy_share:>7.2f}"
            f" {row.deep_share:>6.2f}"
        )
    for name, curve in curves.items():
        for what, shares in (("policy", curve.policy_share), ("deep branch", curve.deep_share)):
            if any(share < 1 for share in shares):
                print(f"{what} share by step, {name}: " + " ".join(f"{share:.2f}" for share in shares))


def print_summary(results: dict[str, dict[int, dict[str, Curve]]]) -> None:
    print("\nSummary: mean ± std over seeds; (k/S): only k of S seeds reached uniform's final success")
    header = (
        f"{'family':<10} {'arm':<14} {'final success':>15} {'steps':>6} {'turns→uniform':>20}"
        f" {'rollouts→uniform':>20} {'mixed/step':>14} {'eff. ratio':>13} {'mixed/turn':>13}"
        f" {'mixed/roll.':>13} {'policy':>11} {'deep':>11}"
    )
    print(header)
    print("-" * len(header))
    for family, per_seed in results.items():
        figures = [arm_figures(curves) for curves in per_seed.values()]
        for name in figures[0]:
            rows = [seed_figures[name] for seed_figures in figures]
            final_mean, final_spread = mean_std([row.final_success for row in rows])
            final = f"{final_mean:.3f} ± {final_spread:.3f}"
            steps = statistics.fmean(row.steps for row in rows)
            print(
                f"{family:<10} {name:<14} {final:>15} {steps:>6.1f} "
                f"{mean_spread([r.turns_ratio for r in rows]):>20} "
                f"{mean_spread([r.rollouts_ratio for r in rows]):>20} "
                f"{mean_spread([r.mixed_per_step for r in rows]):>14} "
                f"{mean_spread([r.effective_ratio for r in rows]):>13} "
                f"{mean_spread([r.mixed_per_turn for r in rows]):>13} "
                f"{mean_spread([r.mixed_per_rollout for r in rows]):>13} "
                f"{mean_spread([r.policy_share for r in rows]):>11} "
                f"{mean_spread([r.deep_share for r in rows]):>11}"
            )
    print(
        "final success: exact mean success of the held-out tasks once the arm has generated uniform's\n"
        "turns (equal compute, linear between steps), or after its last update if it generated fewer.\n"
        "steps: policy-gradient steps taken (--horizon turns: until uniform's turns are matched).\n"
        "turns→uniform, rollouts→uniform: the turns (rollouts) an arm needed to reach uniform's final\n"
        "success over uniform's own (< 1: faster than uniform). mixed/step: mixed groups per step;\n"
        "eff. ratio: mixed / active groups. mixed/turn, mixed/roll.: mixed groups per generated turn\n"
        "(per rollout) over uniform's flat groups'. policy: the mean share of the budget that followed\n"
        "the arm's policy (the rest: control trees, uniform's rules). deep: the mean share of its policy\n"
        "trees that could branch below their first turn (the rest: from first turns only)."
    )


def plot(results: dict[str, dict[int, dict[str, Curve]]], out: Path) -> list[Path]:
    """Per family: held-out success over cumulative turns and over steps, mean over seeds."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    written = []
    out.mkdir(parents=True, exist_ok=True)
    for family, per_seed in results.items():
        figure, (by_turns, by_step) = plt.subplots(1, 2, figsize=(13, 5))
        colors = line_colors(list(next(iter(per_seed.values()))))
        for name, color in colors.items():
            arm_curves = [curves[name] for curves in per_seed.values()]
            # Seeds may take different numbers of steps (--horizon turns): the steps every seed took.
            points = min(len(curve.success) for curve in arm_curves)
            success = np.mean([curve.success[:points] for curve in arm_curves], axis=0)
            turns = np.mean([curve.turns[:points] for curve in arm_curves], axis=0)
            style = {"color": color, "linewidth": 2.4 if name in FIXED else 1.2}
            by_turns.plot(turns, success, label=name, **style)
            by_step.plot(np.arange(success.size), success, label=name, **style)
        by_step.xaxis.set_major_locator(MaxNLocator(integer=True))
        by_turns.set_xlabel("cumulative turns generated")
        by_step.set_xlabel("policy-gradient steps")
        for axes in (by_turns, by_step):
            axes.set_ylabel("held-out success (exact)")
            axes.grid(alpha=0.3)
        by_step.legend(ncol=2, fontsize=8)
        figure.suptitle(f"{family}: held-out success, mean over {len(per_seed)} seeds")
        figure.tight_layout()
        path = out / f"learning-{family}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
