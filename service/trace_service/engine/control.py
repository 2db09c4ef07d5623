"""What a job's control trees say: the trust map Stage 1 reads the predictor through, and the
predictor's calibration on control prompts (``trace_service.allocation.trust``)."""

from __future__ import annotations

import numpy as np

from trace_proto import ControlCalibration, PredictorInfo, TrustMap
from trace_service.allocation.trust import Trust, control_calibration, fit_trust
from trace_service.offload import off_loop
from trace_service.store import ControlOutcome, TreeStore


class ControlEvidence:
    """Reads a job's recent control groups from the store and fits what they say."""

    def __init__(self, store: TreeStore) -> None:
        self.store = store

    async def trust(self, job: str) -> Trust:
        """The trust map fitted to the job's control groups (every prediction alike before any)."""
        outcomes = await self.store.control_outcomes(job)
        return await off_loop(len(outcomes), _fitted, outcomes)

    async def calibration(self, job: str) -> ControlCalibration | None:
        """The predictor's Brier score on the job's control groups against one constant's; None before
        any control tree."""
        return _calibration(await self.store.control_outcomes(job))

    async def describe(self, info: PredictorInfo) -> PredictorInfo:
        """``info`` (GET /v1/predictor) with the predictor on its job's control prompts and the trust
        map Stage 1 applies now."""
        outcomes = await self.store.control_outcomes(info.job)
        trust = await off_loop(len(outcomes), _fitted, outcomes)
        return info.model_copy(update={"control": _calibration(outcomes), "trust": trust_map(trust)})


def _calibration(outcomes: list[ControlOutcome]) -> ControlCalibration | None:
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


def _columns(outcomes: list[ControlOutcome]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return (
        np.array([o.predicted for o in outcomes], dtype=np.float64),
        np.array([o.successes for o in outcomes], dtype=np.float64),
        np.array([o.trials for o in outcomes], dtype=np.float64),
    )


def _fitted(outcomes: list[ControlOutcome]) -> Trust:
    return fit_trust(*_columns(outcomes))
