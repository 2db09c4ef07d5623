"""`POST /v1/allocate`: how many bare rollouts each candidate prompt gets (Stage 1)."""

import math
from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, JsonValue, StrictBool, StrictInt, computed_field, field_validator, model_validator

from trace_proto.v1.common import (
    DEFAULT_JOB,
    Count,
    FeatureVector,
    FiniteFloat,
    Identifier,
    Integral,
    JobName,
    Probability,
    Real,
    RequestModel,
    ResponseModel,
    Text,
    repeated,
)
from trace_proto.v1.limits import (
    MAX_BUDGET,
    MAX_EXPANSION,
    MAX_PROMPTS_PER_REQUEST,
    MAX_ROLLOUTS_PER_PROMPT,
    MAX_ROUNDS,
    MAX_STEP,
    MAX_TURNS_PER_HISTORY,
)
from trace_proto.v1.stats import GainRatio


class Policy(StrEnum):
    """Allocation rule of one request; the baselines let users A/B them on the same infrastructure.

    Each rule has a Stage 1 (bare rollouts per prompt) and a Stage 2 (where the continuation budget
    `m_i·N` branches). "Uniform" Stage 1 gives every kept prompt the same count; "uniform" Stage 2
    spreads continuations evenly over the candidate prefixes; "random" Stage 2 places them at
    randomly chosen prefixes. `docs/allocation.md` describes each rule.

    - `trace` (the default): TRACE Stage 1 (maximise the expected number of mixed groups of the bare
      rollouts, from the predictor; 0 skips a prompt) and TRACE Stage 2 (branch where a continuation
      most likely flips the observed outcome), each tree spending its own `expansion_budget`. Chosen
      by what a policy-gradient learner gains per generated token on held-out tasks.
    - `trace_paper`: the paper's TRACE: `trace`'s Stage 1 and Stage 2 reading the predictor as it is,
      with no trust map (`trace` reads it through one fitted to the job's control groups).
    - `trace_joint`: TRACE with Stage 1's joint objective (the expected mixed trees, counting the
      contrast the prompt's Stage 2 continuations will add, at the freshness learned from earlier
      trees), with half of each tree's `expansion_budget` shared per allocation: every tree keeps
      half (rounded down); a tree whose bare rollouts already disagree leaves the other half to the
      trees whose bare rollouts agree, which may then ask for more than their own (never more than
      the allocation's total) and branch from first turns only. The most mixed groups; a learner
      gained less from them per token than from `trace`.
    - `trace_shared`: `trace_joint` sharing all of each tree's `expansion_budget`, at any depth: a
      tree whose bare rollouts already disagree gets no continuations unless it decides last. The
      fewest mixed prefixes inside a tree: for trainers that learn from whole groups.
    - `uniform`: uniform Stage 1 and uniform Stage 2 (the paper's uniform/uniform ablation; with
      `expansion = 0` it is plain GRPO).
    - `dapo`: DAPO-style dynamic sampling: uniform Stage 1; a tree whose bare rollouts all agree is
      filtered out (no continuations: its continuation budget is returned unspent), the others get
      uniform Stage 2.
    - `greso`: GRESO-style skipping of prompts that were all-correct or all-wrong in recent steps
      (kept with a small probability), uniform over the rest; uniform Stage 2.
    - `pcl`: PCL-style selection of the prompts whose predicted success is closest to 0.5, the same
      count each; uniform Stage 2.
    - `knapsack`: Knapsack RL: the Stage 1 objective weighted by `p(1−p)²`, solved exactly; uniform
      Stage 2.
    - `treepo`: TreePO-style tree rollouts: uniform Stage 1, random Stage 2.
    - `trace_root`: `trace`'s Stage 1 with random Stage 2 (ablation of Stage 2).
    - `trace_prefix`: uniform Stage 1 with TRACE Stage 2 (ablation of Stage 1).
    """

    TRACE = "trace"
    UNIFORM = "uniform"
    DAPO = "dapo"
    GRESO = "greso"
    PCL = "pcl"
    KNAPSACK = "knapsack"
    TREEPO = "treepo"
    TRACE_ROOT = "trace_root"
    TRACE_PREFIX = "trace_prefix"
    TRACE_PAPER = "trace_paper"
    TRACE_JOINT = "trace_joint"
    TRACE_SHARED = "trace_shared"


#: The policies whose Stage 1 or Stage 2 reads the service's predictor (what a client may wait to see
#: trained); the service's policy registry implements the rules and its tests hold it to this set.
PREDICTOR_POLICIES = frozenset(
    {
        Policy.TRACE,
        Policy.TRACE_PAPER,
        Policy.TRACE_SHARED,
        Policy.TRACE_JOINT,
        Policy.TRACE_ROOT,
        Policy.TRACE_PREFIX,
        Policy.PCL,
        Policy.KNAPSACK,
    }
)


#: The share of an allocation's bare rollouts spent on control trees when a request does not say.
DEFAULT_CONTROL_SHARE = 0.1


class PromptIn(RequestModel):
    """One candidate prompt of the pool."""

    prompt_id: Identifier = Field(
        description="Stable across steps: the prompt's outcome history is keyed by it."
    )
    text: Text | None = None
    features: FeatureVector | None = Field(
        default=None, description="Client features, e.g. a pooled hidden state."
    )
    metadata: dict[str, JsonValue] | None = Field(
        default=None, description="Opaque to the service; numbers in it must be finite, as in JSON."
    )

    @field_validator("metadata")
    @classmethod
    def _check_finite(cls, metadata: dict[str, JsonValue] | None) -> dict[str, JsonValue] | None:
        pending: list[JsonValue] = [metadata]
        while pending:  # iteratively: the nesting depth is the caller's
            value = pending.pop()
            if isinstance(value, float) and not math.isfinite(value):
                raise ValueError("metadata holds a NaN or infinite number, which JSON cannot carry")
            if isinstance(value, dict):
                pending.extend(value.values())
            elif isinstance(value, list):
                pending.extend(value)
        return metadata


class AllocateRequest(RequestModel):
    """A training step's candidate pool and budget."""

    job: JobName = Field(
        default=DEFAULT_JOB,
        description="Namespace of one training run: its trees, its prompts' outcomes and its own predictor.",
    )
    predictor_from: JobName | None = Field(
        default=None,
        description=(
            "A job whose trained predictor this job starts from (for instance the previous run of the same "
            "experiment), copied once, while this job has no predictor of its own; ignored after that. "
            "Unset: a new job starts from a clean predictor."
        ),
    )
    step: Annotated[StrictInt, Field(ge=0, le=MAX_STEP), Integral] = Field(description="The training step.")
    budget: Annotated[StrictInt, Field(ge=0, le=MAX_BUDGET), Integral] = Field(
        description="`M`: bare rollouts to spread over the prompts."
    )
    expansion: Annotated[FiniteFloat, Field(ge=0.0, le=MAX_EXPANSION)] = Field(
        default=1.0,
        description="`N`: each active prompt may branch ⌊m_i·N⌋ continuations (1: the learners gained "
        "more per generated token than at 0 or 2).",
    )
    min_rollouts: Annotated[StrictInt, Field(ge=2, le=MAX_ROLLOUTS_PER_PROMPT), Integral] = Field(
        default=2, description="Fewest rollouts of an active prompt; one rollout can never be mixed."
    )
    max_rollouts: Annotated[StrictInt, Field(ge=2, le=MAX_ROLLOUTS_PER_PROMPT), Integral] = Field(
        default=64, description="Most rollouts of one prompt."
    )
    max_prompts: Annotated[StrictInt, Field(ge=1, le=MAX_PROMPTS_PER_REQUEST), Integral] | None = Field(
        default=None, description="Cap on active prompts (guards against many tiny groups)."
    )
    policy: Policy = Policy.TRACE
    control_share: Annotated[FiniteFloat, Field(ge=0.0, le=1.0)] = Field(
        default=DEFAULT_CONTROL_SHARE,
        description="ε: the least share of `budget` spent on control trees, and the least left to the "
        "policy. Control trees are prompts drawn uniformly at random from the whole pool (skipped or not "
        "by the policy) with uniform's group size and Stage 2: they measure the job's gain over uniform "
        "allocation without bias (`GET /v1/jobs/{job}/stats`), and the share of each allocation that "
        "follows the policy is chosen in [ε, 1 − ε] from that evidence (`split`): a job whose policy finds "
        "fewer mixed groups per generated turn than uniform moves to uniform's allocation. They also fit "
        "how far Stage 1 trusts the predictor (`trust`). 0 turns all of it off, and Stage 1 then reads "
        "the predictor as it is; ε ≥ 0.5 fixes the control share at ε. Workers treat control trees like "
        "any other.",
    )
    rounds: Annotated[StrictInt, Field(ge=1, le=MAX_ROUNDS), Integral] = Field(
        default=1, description="Stage 2 rounds; each round uses the outcomes observed so far."
    )
    return_unspent: StrictBool = Field(
        default=False,
        description="When no prefix is worth a continuation, leave that budget unspent instead of "
        "spreading it uniformly (the fallback).",
    )
    max_branch_depth: Annotated[StrictInt, Field(ge=1, le=MAX_TURNS_PER_HISTORY), Integral] | None = Field(
        default=None,
        description="Continuations start only from prefixes at most this many turns deep (1: the first "
        "turn of a bare rollout, nearly a fresh rollout); null: from any depth (under `trace`, a tree whose "
        "bare rollouts agree branches from first turns either way).",
    )
    shape_from_evidence: StrictBool = Field(
        default=True,
        description="Under `trace` with controls (ε > 0) and more than first turns allowed: each policy "
        "tree branches either at any depth the request allows (deep) or from first turns only, the deep "
        "share chosen by the split's rule from the job's evidence of which shape finds more mixed groups "
        "per generated turn (`split.deep_branch_share`). false: every tree is deep.",
    )
    prompts: list[PromptIn] = Field(min_length=1, max_length=MAX_PROMPTS_PER_REQUEST)

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        if self.min_rollouts > self.max_rollouts:
            raise ValueError(f"min_rollouts ({self.min_rollouts}) exceeds max_rollouts ({self.max_rollouts})")
        duplicates = repeated([prompt.prompt_id for prompt in self.prompts])
        if duplicates:
            raise ValueError(f"prompt_id values must be unique within a request; repeated: {duplicates}")
        feature_lengths = {len(prompt.features) for prompt in self.prompts if prompt.features is not None}
        if len(feature_lengths) > 1:
            raise ValueError(
                f"every prompt's features must have the same length; got lengths {sorted(feature_lengths)}"
            )
        return self


class TreeAllocation(ResponseModel):
    """An active prompt: its tree and budgets."""

    prompt_id: Identifier
    tree_id: Identifier = Field(description="Server-made; every event of this prompt's rollouts names it.")
    rollouts: Annotated[int, Field(ge=1)] = Field(description="`m_i`: bare rollouts to start now.")
    expansion_budget: Count = Field(
        description="⌊m_i·N⌋: continuations Stage 2 may ask for (under `trace` and `trace_shared`, the "
        "tree's share of the allocation's continuations)."
    )
    predicted_success: Probability = Field(description="Ṽ(x_i) when the decision was made.")
    control: bool = Field(
        default=False,
        description="Drawn at random for the control share: uniform's group size and Stage 2, whatever "
        "the policy (nothing changes for the workers).",
    )


class SkippedPrompt(ResponseModel):
    """A prompt given no rollouts this step."""

    prompt_id: Identifier
    predicted_success: Probability


class TrustMap(ResponseModel):
    """How Stage 1 read the predictor: `v' = σ(intercept + slope·(logit Ṽ − center))`, fitted to the
    bare groups of the job's recent trees, control and policy (slope 0: every prompt alike, uniform's
    allocation; 1 with intercept ≈ center: the predictor as it is).  `slope` is the lower 90% bound of
    the fitted slope, never below 0."""

    intercept: Real
    slope: Annotated[Real, Field(ge=0.0)]
    fitted_slope: Annotated[Real, Field(ge=0.0)] = Field(
        description="The slope that fits the groups best; `slope` is its lower 90% bound."
    )
    slope_error: Annotated[Real, Field(ge=0.0)] = Field(description="The fitted slope's standard error.")
    center: Real
    groups: Count = Field(description="Groups (control and policy trees) the map was fitted to.")
    dispersion: Annotated[Real, Field(ge=1.0)] = Field(
        description="How much more a group's rollouts agree than independent draws would."
    )


class BudgetSplit(ResponseModel):
    """How the allocation's bare rollouts were split between the policy's rule and uniform's (the control
    trees), chosen from the job's own evidence: the probability that the policy finds more mixed groups
    per generated turn, kept within the request's `control_share` ε on each side; and, by the same rule,
    how the policy's trees were split between the two shapes of Stage 2."""

    policy_share: Probability = Field(
        description="The share of `budget` meant for the policy's trees; the rest went to control trees."
    )
    policy_better: Probability = Field(
        description="P(the policy finds more mixed groups per generated turn than uniform) on the job's "
        "earlier steps, recent steps weighing more (0.5 before any evidence)."
    )
    gain_per_turn: GainRatio | None = Field(
        default=None,
        description="The gain that probability was read from: the policy's mixed groups per generated turn "
        "over the controls', with its 90% interval; null before both arms have a mixed tree.",
    )
    deep_branch_share: Probability = Field(
        default=1.0,
        description="Under `trace`: the share of the policy's trees that may branch at any depth the request "
        "allows; the others, drawn at random, branch from their rollouts' first turns only (nearly fresh "
        "rollouts of the prompt). Chosen like `policy_share`, from the job's evidence of which shape finds "
        "more mixed groups per generated turn. 1 under the other policies.",
    )
    deep_branch_better: Probability = Field(
        default=0.5,
        description="P(trees branching at any depth find more mixed groups per generated turn than trees "
        "branching from first turns) on the job's earlier steps (0.5 before any evidence).",
    )
    deep_gain_per_turn: GainRatio | None = Field(
        default=None,
        description="The gain that probability was read from: mixed groups per generated turn of the deep "
        "trees over the first-turn trees, with its 90% interval; null before both have a mixed tree.",
    )


class AllocateResponse(ResponseModel):
    """The allocation: every requested prompt appears exactly once, in `trees` or in `skipped`."""

    allocation_id: Identifier
    job: JobName
    step: Count
    policy: Policy
    predictor_version: Count = Field(description="0 = untrained (cold-start estimates).")
    trees: list[TreeAllocation]
    skipped: list[SkippedPrompt]
    expected_mixed: Annotated[Real, Field(ge=0.0)] = Field(
        description="Σ_i V_root(v_i, m_i) at the values Stage 1 read (`trust`): expected number of mixed "
        "groups from the bare rollouts."
    )
    budget: Count = Field(description="`M` as requested.")
    trust: TrustMap | None = Field(
        default=None,
        description="The calibration map Stage 1 applied to Ṽ, fitted to the job's recent groups; null when "
        "the policy reads the predictor as it is (`trace_paper`, the baselines) or the control share is 0.",
    )
    split: BudgetSplit | None = Field(
        default=None, description="How the budget was split between the policy and uniform; null at ε = 0."
    )

    @computed_field  # type: ignore[prop-decorator]
    @property
    def unspent(self) -> int:
        """Bare rollouts not allocated: `budget − Σ rollouts` (too few prompts worth a rollout)."""
        return self.budget - sum(tree.rollouts for tree in self.trees)

    @model_validator(mode="after")
    def _check_consistency(self) -> Self:
        if self.unspent < 0:
            raise ValueError(
                f"trees hold {self.budget - self.unspent} rollouts, more than the budget {self.budget}"
            )
        duplicates = repeated([tree.prompt_id for tree in self.trees] + [s.prompt_id for s in self.skipped])
        if duplicates:
            raise ValueError(f"a prompt appears more than once in trees and skipped: {duplicates}")
        duplicate_trees = repeated([tree.tree_id for tree in self.trees])
        if duplicate_trees:
            raise ValueError(f"tree_id values must be unique; repeated: {duplicate_trees}")
        return self
