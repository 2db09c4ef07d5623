"""Does the service's own estimate of a job's gain over uniform hold up? `bench/learning.py` runs every
arm as its own job; an arm with control trees gets the service's estimate (`GET /v1/jobs/{job}/stats`,
its `gain`), and the run has the real thing beside it: the contract's uniform policy as an arm of its
own (`uniform_tree`, the same budget shape as the control trees). The measured ratio is the arm's
policy trees' mixed groups per unit over `uniform_tree`'s, both from the trees the arms fetched, by the
same estimator (`trace_service.allocation.gain`); the estimate covers it when the measured ratio lies in
its 90% interval.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from trace_proto import GainEstimate, GainRatio
from trace_service.allocation.gain import ArmSums, Unit, gain_ratio, unweighted

#: The arm that stands for the real uniform allocation the control trees sample, and the arm left out:
#: GRPO's flat groups, whose controls sample flat groups, not the reference.
REFERENCE = "uniform_tree"
FLAT = "uniform"
UNITS: tuple[tuple[Unit, str], ...] = (("bare", "per bare rollout"), ("turns", "per turn"))


class GainCurve(Protocol):
    """What this report reads of an arm's run."""

    @property
    def policy_trees(self) -> ArmSums: ...
    @property
    def control_trees(self) -> ArmSums: ...
    @property
    def estimate(self) -> GainEstimate | None: ...
    @property
    def trust(self) -> float | None: ...


@dataclass(frozen=True)
class Check:
    """One arm on one (family, seed), in one unit: the service's estimate and the measured ratio."""

    family: str
    seed: int
    arm: str
    unit: str
    estimate: GainRatio | None
    measured: float | None
    trust: float | None = None

    @property
    def covered(self) -> bool | None:
        if self.estimate is None or self.measured is None:
            return None
        return self.estimate.low <= self.measured <= self.estimate.high


def checks(results: Mapping[str, Mapping[int, Mapping[str, GainCurve]]]) -> list[Check]:
    """Every arm with an estimate, in every (family, seed) whose run has the reference arm."""
    found = []
    for family, per_seed in results.items():
        for seed, curves in per_seed.items():
            reference = curves.get(REFERENCE)
            if reference is None:
                continue
            uniform = reference.policy_trees + reference.control_trees
            for name, curve in curves.items():
                if curve.estimate is None or name in (REFERENCE, FLAT):
                    continue
                for unit, label in UNITS:
                    measured = gain_ratio(unweighted(curve.policy_trees), unweighted(uniform), unit)
                    estimate = curve.estimate.per_bare_rollout if unit == "bare" else curve.estimate.per_turn
                    found.append(
                        Check(
                            family,
                            seed,
                            name,
                            label,
                            estimate,
                            None if measured is None else measured.ratio,
                            curve.trust,
                        )
                    )
    return found


def print_report(found: Sequence[Check]) -> None:
    if not found:
        return
    print(
        f"\nThe service's gain estimate against the real uniform arm ({REFERENCE}): mixed groups per unit, "
        "the arm's policy trees over uniform's"
    )
    header = (
        f"{'family':<11} {'seed':>4} {'arm':<16} {'unit':<17} {'estimate [90%]':>22} {'measured':>9} covered"
    )
    print(header)
    print("-" * len(header))
    for check in found:
        estimate = check.estimate
        cell = "—" if estimate is None else f"{estimate.ratio:.2f} [{estimate.low:.2f}, {estimate.high:.2f}]"
        measured = "—" if check.measured is None else f"{check.measured:.2f}"
        covered = {None: "—", True: "yes", False: "no"}[check.covered]
        row = f"{check.family:<11} {check.seed:>4} {check.arm:<16} {check.unit:<17}"
        trust = "—" if check.trust is None else f"{check.trust:.2f}"
        print(f"{row} {cell:>22} {measured:>9} {covered:>7} {trust:>11}")
    decided = [check for check in found if check.covered is not None]
    for _, label in UNITS:
        runs = [check for check in decided if check.unit == label]
        if runs:
            share = sum(bool(check.covered) for check in runs) / len(runs)
            print(f"covered {label}: {share:.0%} of {len(runs)} (family, seed, arm) runs")
    errors = [
        (check.estimate.ratio - check.measured) / check.measured
        for check in decided
        if check.estimate is not None and check.measured
    ]
    if errors:
        mean_abs = sum(abs(e) for e in errors) / len(errors)
        print(
            f"point estimate off by {mean_abs:.1%} on average ({sum(errors) / len(errors):+.1%} signed, "
            f"{max(abs(e) for e in errors):.0%} at most) over {len(errors)} checks"
        )
