"""A job's gain over uniform and its trust in the predictor as a trainer's log figures, for every
integration alike (`trace/gain/*`, `trace/split/*`, `trace/trust/slope`, `trace/control/brier_skill`).

The figures come from the service: its estimate from the job's control trees (`GET /v1/jobs/{job}/stats`,
`gain` and `calibration`) and the trust map the allocation read the predictor through. A figure the
service has not measured yet is left out (trainers' loggers take numbers only).
"""

from __future__ import annotations

from typing import Final

from trace_proto import AllocateResponse, GainRatio, JobStats

#: Every figure this module can add to a trainer's log, and what it says.
GAIN_METRICS: Final = {
    "trace/gain/per_bare_rollout": "mixed trees per bare rollout, the policy's over its control trees'",
    "trace/gain/per_bare_rollout_low": "the low end of its 90% interval",
    "trace/gain/per_bare_rollout_high": "the high end of its 90% interval",
    "trace/gain/per_turn": "mixed trees per generated turn, the policy's over uniform's",
    "trace/gain/per_turn_low": "the low end of its 90% interval",
    "trace/gain/per_turn_high": "the high end of its 90% interval",
    "trace/gain/control_trees": "complete control trees the estimate is measured on",
    "trace/split/policy_share": "the share of the step's budget that followed the policy (the rest: uniform)",
    "trace/split/policy_better": "P(the policy finds more mixed groups per turn than uniform), evidence",
    "trace/split/deep_branch_share": "the share of the policy's trees that may branch below a first turn",
    "trace/trust/slope": "how far Stage 1 trusted the predictor (0: uniform's allocation; 1: as it is)",
    "trace/control/brier_skill": "the predictor's Brier skill on control prompts (> 0: it tells them apart)",
}


def gain_metrics(allocation: AllocateResponse | None, stats: JobStats | None) -> dict[str, float]:
    """The figures of :data:`GAIN_METRICS` that the allocation and the job's stats hold."""
    figures: dict[str, float] = {}
    if allocation is not None and allocation.trust is not None:
        figures["trace/trust/slope"] = allocation.trust.slope
    if allocation is not None and allocation.split is not None:
        figures["trace/split/policy_share"] = allocation.split.policy_share
        figures["trace/split/policy_better"] = allocation.split.policy_better
        figures["trace/split/deep_branch_share"] = allocation.split.deep_branch_share
    if stats is None:
        return figures
    if stats.gain is not None:
        figures["trace/gain/control_trees"] = float(stats.gain.control.trees)
        for unit, ratio in (
            ("per_bare_rollout", stats.gain.per_bare_rollout),
            ("per_turn", stats.gain.per_turn),
        ):
            figures.update(_ratio(f"trace/gain/{unit}", ratio))
    if stats.calibration is not None and stats.calibration.skill is not None:
        figures["trace/control/brier_skill"] = stats.calibration.skill
    return figures


def _ratio(name: str, ratio: GainRatio | None) -> dict[str, float]:
    if ratio is None:
        return {}
    return {name: ratio.ratio, f"{name}_low": ratio.low, f"{name}_high": ratio.high}
