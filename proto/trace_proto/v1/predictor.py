"""`GET /v1/predictor` and `POST /v1/predict`: a job's success predictor Ṽ(H)."""

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from trace_proto.v1.allocate import TrustMap
from trace_proto.v1.common import (
    DEFAULT_JOB,
    Correlation,
    Count,
    FeatureVector,
    Identifier,
    JobName,
    Probability,
    RequestModel,
    ResponseModel,
    Text,
)
from trace_proto.v1.limits import MAX_HISTORIES_PER_REQUEST, MAX_TURNS_PER_HISTORY, MAX_TURNS_PER_PREDICT
from trace_proto.v1.stats import ControlCalibration


class PriorInfo(ResponseModel):
    """How a prompt's own outcomes are combined with its prior: Beta(κμ, κ(1 − μ)) updated exactly by
    the prompt's earlier successes and failures, κ fitted to finished trees' groups of bare rollouts."""

    source: Literal["network", "history"] = Field(
        description=(
            "Where the prior mean μ comes from: the predictor's network, or one constant for every "
            "prompt (the history-only posterior). The one with the higher held-out likelihood is served."
        )
    )
    concentration: Annotated[float, Field(gt=0)] = Field(
        description="κ: small when a prompt's rollouts agree with each other, so a few outcomes say much."
    )
    log_likelihood: dict[str, float] = Field(
        default_factory=dict,
        description="Mean log marginal likelihood per scored group under each source (higher is better).",
    )
    groups: Count = Field(description="Groups of bare rollouts the comparison was measured on.")


class PredictorInfo(ResponseModel):
    """A job's predictor: its version and its quality on its own held-out trees; metrics are null until
    measured."""

    job: JobName = Field(default=DEFAULT_JOB, description="The job whose predictor this is.")
    version: Count = Field(description="0 = untrained (cold start).")
    examples_seen: Count
    brier: Probability | None = Field(
        default=None, description="Mean squared error of Ṽ against the outcome."
    )
    ece: Probability | None = Field(default=None, description="Expected calibration error.")
    spearman: Correlation | None = Field(
        default=None, description="Rank correlation of Ṽ with the empirical success rate."
    )
    spearman_by_depth: dict[Annotated[int, Field(ge=0)], Correlation] = Field(
        default_factory=dict,
        description="The same by prefix depth (0 = prompt); depths without enough data are absent.",
    )
    device: str = Field(description="Where inference runs, e.g. 'cpu' or 'cuda:0'.")
    continuation_freshness: Probability = Field(
        default=0.5,
        description=(
            "How often a Stage 2 continuation flips the outcome it branched from, relative to a fresh "
            "rollout (1 = as often, 0 = never), learned from finished trees; the `trace` policy's "
            "Stage 1 counts the contrast continuations will add at this rate."
        ),
    )
    prior: PriorInfo | None = Field(
        default=None, description="The served prior and its comparison with the history-only baseline."
    )
    control: ControlCalibration | None = Field(
        default=None,
        description="Ṽ on the job's control prompts only, drawn at random from its pools (unbiased by what "
        "the policy chose); null before any control tree.",
    )
    trust: TrustMap | None = Field(
        default=None, description="The calibration map Stage 1 applies to Ṽ now, fitted to those controls."
    )


class TurnIn(RequestModel):
    """One turn of a history."""

    text: Text | None = None
    features: FeatureVector | None = None


class HistoryIn(RequestModel):
    """A prefix history H: the prompt and the turns so far (none for the prompt alone)."""

    prompt_id: Identifier = Field(description="Keys the prompt's outcome history within the job.")
    prompt_text: Text | None = None
    prompt_features: FeatureVector | None = None
    turns: list[TurnIn] = Field(default_factory=list, max_length=MAX_TURNS_PER_HISTORY)


class PredictRequest(RequestModel):
    """Histories to score by a job's predictor (debugging and offline evaluation)."""

    job: JobName = Field(default=DEFAULT_JOB, description="Whose predictor and prompt outcomes to use.")
    histories: list[HistoryIn] = Field(
        min_length=1,
        max_length=MAX_HISTORIES_PER_REQUEST,
        description=f"At most {MAX_TURNS_PER_PREDICT} turns over all histories.",
    )

    @model_validator(mode="after")
    def _check_work(self) -> Self:
        turns = sum(len(history.turns) for history in self.histories)
        if turns > MAX_TURNS_PER_PREDICT:
            raise ValueError(f"histories hold {turns} turns; at most {MAX_TURNS_PER_PREDICT} per request")
        return self


class PredictResponse(ResponseModel):
    """Ṽ(H) for each history, in request order."""

    predictor_version: Count
    predictions: list[Probability]
