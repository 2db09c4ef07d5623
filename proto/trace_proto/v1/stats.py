"""`GET /v1/jobs/{job}/stats`: what allocation achieved, per training step; `DELETE /v1/jobs/{job}`."""

import itertools
from typing import Annotated, Self

from pydantic import Field, computed_field, model_validator

from trace_proto.v1.common import Count, JobName, Probability, Real, ResponseModel


class ArmTotals(ResponseModel):
    """The complete trees of one arm of a job (its policy's trees, or its control trees)."""

    trees: Count
    mixed: Count
    bare_rollouts: Count = Field(description="Scored bare rollouts.")
    turns: Count = Field(description="Turns generated, continuations included.")


class StepStats(ResponseModel):
    """One training step of a job; counts of continuations are in rollouts."""

    step: Count
    prompts: Count = Field(description="Candidate prompts in the allocation request.")
    active: Count = Field(description="Prompts given rollouts (one tree each).")
    skipped: Count = Field(description="Prompts given none.")
    trees_complete: Count = Field(description="Trees complete or closed.")
    mixed: Count = Field(description="Trees whose leaves hold both a success and a failure.")
    budget_promised: Count = Field(description="Bare rollouts allocated.")
    rollouts_spent: Count = Field(description="Bare rollouts with a scored leaf.")
    continuations_promised: Count
    continuations_spent: Count = Field(description="Continuations with a scored leaf.")
    fallback_units: Count = Field(description="Continuations placed by the uniform fallback.")
    turns: Count = Field(default=0, description="Turns reported: what the step's trees generated.")
    control_trees: Count = Field(
        default=0, description="Active prompts drawn as controls (uniform's rules, counted in `active`)."
    )
    control_mixed: Count = Field(default=0, description="Mixed trees among the control trees.")
    policy_share: Probability = Field(
        default=1.0,
        description="The share of the step's budget meant for the policy's trees (the allocations' mean; "
        "the rest went to control trees), as the job's evidence chose it.",
    )
    policy: ArmTotals | None = Field(
        default=None, description="The step's complete policy trees (what the gain reads of this step)."
    )
    control: ArmTotals | None = Field(default=None, description="The step's complete control trees.")
    branch_deep: ArmTotals | None = Field(
        default=None,
        description="The step's complete policy trees that could branch at any depth (the shape split, "
        "`split.deep_branch_share`).",
    )
    branch_first: ArmTotals | None = Field(
        default=None, description="The step's complete policy trees that branched from first turns only."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def effective_ratio(self) -> float | None:
        """`mixed / active`: share of active prompts whose tree is mixed (skipped prompts excluded)."""
        return self.mixed / self.active if self.active else None

    @model_validator(mode="after")
    def _check_counts(self) -> Self:
        if self.active + self.skipped != self.prompts:
            raise ValueError(
                f"step {self.step}: active ({self.active}) + skipped ({self.skipped}) "
                f"!= prompts ({self.prompts})"
            )
        if self.control_trees > self.active or self.control_mixed > min(self.mixed, self.control_trees):
            raise ValueError(
                f"step {self.step}: control_trees ({self.control_trees}) cannot exceed active and "
                f"control_mixed ({self.control_mixed}) neither mixed nor control_trees"
            )
        if self.trees_complete > self.active or self.mixed > self.active:
            raise ValueError(
                f"step {self.step}: trees_complete ({self.trees_complete}) and mixed ({self.mixed}) "
                f"cannot exceed active ({self.active})"
            )
        return self


class GainRatio(ResponseModel):
    """A ratio of the policy's figure to uniform's, with its 90% interval."""

    ratio: Annotated[Real, Field(ge=0.0)]
    low: Annotated[Real, Field(ge=0.0)]
    high: Annotated[Real, Field(ge=0.0)]


class GainEstimate(ResponseModel):
    """Whether the job's policy beats uniform allocation, measured on the job itself: mixed groups per
    bare rollout and per generated turn of the policy's trees over those of the control trees (a random
    sample of uniform's allocation on the same pools), over the steps reported. The ratio is corrected
    for the second-order bias of a quotient of sums; the 90% intervals come from the delta method on the
    log ratio, each complete tree one observation; null while either arm has no mixed tree."""

    policy: ArmTotals
    control: ArmTotals
    per_bare_rollout: GainRatio | None = None
    per_turn: GainRatio | None = None


class ControlCalibration(ResponseModel):
    """The predictor on the job's control prompts only (drawn at random, so the prompts the policy
    skips count as much as the others): the prediction each had at allocation against its bare
    outcomes, over the job's most recent control groups."""

    groups: Count
    rollouts: Count
    brier: Probability | None = Field(default=None, description="Mean (Ṽ − reward)² per bare rollout.")
    brier_constant: Probability | None = Field(
        default=None, description="The same for one constant, the control rollouts' success rate."
    )
    skill: Real | None = Field(
        default=None, description="1 − brier / brier_constant: above 0 when Ṽ tells prompts apart."
    )


class JobStats(ResponseModel):
    """Per-step statistics of one job, in increasing step order, and its gain over uniform."""

    job: JobName
    steps: list[StepStats]
    gain: GainEstimate | None = Field(
        default=None,
        description="Over the steps reported (choose them with `from_step` and `to_step`, e.g. to leave out "
        "warm-up); null when none of them drew control trees.",
    )
    calibration: ControlCalibration | None = Field(
        default=None, description="The predictor on control prompts; null before any control tree."
    )

    @model_validator(mode="after")
    def _check_order(self) -> Self:
        step_numbers = [stats.step for stats in self.steps]
        if any(later <= earlier for earlier, later in itertools.pairwise(step_numbers)):
            raise ValueError(f"job {self.job!r}: steps must be strictly increasing; got {step_numbers}")
        return self


class JobDeleted(ResponseModel):
    """What `DELETE /v1/jobs/{job}` removed: every tree of the job, its prompts' outcomes, its statistics,
    its instructions and its predictor."""

    job: JobName
    keys_deleted: Count = Field(description="Store keys removed (0: the job held nothing).")
