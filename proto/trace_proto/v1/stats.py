"""`GET /v1/jobs/{job}/stats`: what allocation achieved, per training step; `DELETE /v1/jobs/{job}`."""

import itertools
from typing import Self

from pydantic import Field, computed_field, model_validator

from trace_proto.v1.common import Count, JobName, ResponseModel


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
        if self.trees_complete > self.active or self.mixed > self.active:
            raise ValueError(
                f"step {self.step}: trees_complete ({self.trees_complete}) and mixed ({self.mixed}) "
                f"cannot exceed active ({self.active})"
            )
        return self


class JobStats(ResponseModel):
    """Per-step statistics of one job, in increasing step order."""

    job: JobName
    steps: list[StepStats]

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
