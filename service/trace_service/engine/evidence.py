"""What a job's finished trees say: how much of its next allocation follows the policy
(``trace_service.allocation.split``), the trust map Stage 1 reads the predictor through, fitted to its
control and policy groups, and the predictor's calibration on control prompts alone
(``trace_service.allocation.trust``)."""

from __future__ import annotations

import numpy as np

from trace_proto import BudgetSplit, ControlCalibration, GainRatio, PredictorInfo, TrustMap
from trace_service.allocation.gain import Gain
from trace_service.allocation.split import (
    BranchShape,
    Split,
    decide_shape,
    decide_split,
    evidence_steps,
)
from trace_service.allocation.trust import Trust, control_calibration, fit_trust
from trace_service.offload import off_loop
from trace_service.store import GroupOutcome, TreeStore


class JobEvidence:
    """Reads a job's recent groups from the store and fits what they say.

    The trust map is fitted to the control groups and the policy's together: the policy chose its
    prompts by their predictions alone, never by the outcomes to come, so its groups say as truly how
    outcomes follow predictions (on the prompts it chose), and there are many more of them.  The
    calibration reported is the control groups' alone: a random sample of the whole pool."""

    def __init__(self, store: TreeStore, half_life: float) -> None:
        self.store = store
        self.half_life = half_life

    def steps_read(self, step: int, floor: float) -> range:
        """The earlier steps whose totals the split of ``step`` reads (none when the floor is 0)."""
        return evidence_steps(step, self.half_life) if floor > 0 else range(0)

    def split(self, step_totals: dict[int, dict[str, int]], step: int, floor: float) -> Split:
        """The share of the allocation of ``step`` that follows the policy, from the job's per-step
        totals of the earlier steps; all of it when the floor is 0 (no controls, no evidence)."""
        if floor == 0.0:
            return Split(policy_share=1.0, policy_better=0.5, gain=None)
        return decide_split(step_totals, step, floor, self.half_life)

    def shape(self, step_totals: dict[int, dict[str, int]], step: int, floor: float) -> BranchShape:
        """The share of the policy's trees of ``step`` that may branch below their first turn, from the
        same totals."""
        return decide_shape(step_totals, step, floor, self.half_life)

    @staticmethod
    async def fitted(controls: list[GroupOutcome], policy: list[GroupOutcome]) -> Trust:
        """The trust map fitted to a job's control and policy groups, off the event loop when they are
        many."""
        outcomes = controls + policy
        return await off_loop(len(outcomes), _fit, outcomes)

    async def calibration(self, job: str) -> ControlCalibration | None:
        """The predictor's Brier score on the job's control groups against one constant's; None before
        any control tree."""
        return _calibration(await self.store.group_outcomes(job, control=True))

    async def describe(self, info: PredictorInfo) -> PredictorInfo:
        """``info`` (GET /v1/predictor) with the predictor on its job's control prompts and the trust
        map Stage 1 applies now."""
        controls, policy = await self.store.arm_groups(info.job)
        trust = await self.fitted(controls, policy)
        return info.model_copy(update={"control": _calibration(controls), "trust": trust_map(trust)})


def _calibration(outcomes: list[GroupOutcome]) -> ControlCalibration | None:
    if not outcomes:
        return None
    measured = control_calibration(*_columns(outcomes))
    return ControlCalibration(
        groups=measured.groups,
        rollouts=measured.rollouts,
        brier=measured.brier,
        brier_constant=measured.brier_constant,
        skill=measured.skill,
    )


def trust_map(trust: Trust) -> TrustMap:
    """The wire form of a trust map."""
    return TrustMap(
        intercept=trust.intercept,
        slope=trust.slope,
        fitted_slope=trust.fitted_slope,
        slope_error=trust.slope_error,
        center=trust.center,
        groups=trust.groups,
        dispersion=trust.dispersion,
    )


def budget_split(split: Split, shape: BranchShape) -> BudgetSplit:
    """The wire form of a split and the shape of the policy's Stage 2."""
    return BudgetSplit(
        policy_share=split.policy_share,
        policy_better=split.policy_better,
        gain_per_turn=_gain_ratio(split.gain),
        deep_branch_share=shape.deep_share,
        deep_branch_better=shape.deep_better,
        deep_gain_per_turn=_gain_ratio(shape.gain),
    )


def _gain_ratio(gain: Gain | None) -> GainRatio | None:
    return None if gain is None else GainRatio(ratio=gain.ratio, low=gain.low, high=gain.high)


def _columns(outcomes: list[GroupOutcome]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([o.predicted for o in outcomes], dtype=np.float64),
        np.array([o.successes for o in outcomes], dtype=np.float64),
        np.array([o.trials for o in outcomes], dtype=np.float64),
    )


def _fit(outcomes: list[GroupOutcome]) -> Trust:
    return fit_trust(*_columns(outcomes))
