"""`GET /v1/trees/{tree_id}`: a prompt's rollout tree with values and advantages per node."""

from enum import StrEnum
from typing import Annotated, Self

from pydantic import Field, model_validator

from trace_proto.v1.common import (
    Count,
    Identifier,
    JobName,
    Probability,
    Real,
    ResponseModel,
    repeated,
)


class TreeStatus(StrEnum):
    """Life cycle of a tree.

    - `collecting`: bare rollouts are still running.
    - `expanding`: bare rollouts are scored; promised continuations are outstanding.
    - `complete`: every bare rollout and every promised continuation has a scored leaf.
    - `closed`: the trainer closed it early (`POST /v1/trees/{tree_id}/close`).
    """

    COLLECTING = "collecting"
    EXPANDING = "expanding"
    COMPLETE = "complete"
    CLOSED = "closed"


class TreeNode(ResponseModel):
    """One turn of the tree; the prompt itself (depth 0) is summarised by the tree's `value`."""

    node_id: Identifier
    parent_id: Identifier | None = Field(default=None, description="null: the turn starts from the prompt.")
    depth: Annotated[int, Field(ge=1)] = Field(description="Turns from the prompt to this node, inclusive.")
    visits: Count = Field(description="`n_y`: scored leaves at or below this node.")
    successes: Count = Field(description="Successful leaves among them.")
    value: Probability | None = Field(
        default=None, description="V̂(y) = successes / visits; null while visits = 0."
    )
    predicted: Probability | None = Field(
        default=None, description="Ṽ(H) when a decision used this node, else null."
    )
    advantage: Real | None = Field(
        default=None,
        description=(
            "A(y) = (V̂(y) − V̂(parent)) + (V̂(y) − V̂(root)), the advantage of the turn segment ending "
            "here (docs/allocation.md, “What a tree gives the trainer”); null while undefined."
        ),
    )
    reward: Real | None = Field(
        default=None, description="The reward as reported, on leaves; null elsewhere."
    )
    instruction_id: Identifier | None = Field(
        default=None, description="The instruction that started this continuation."
    )

    @model_validator(mode="after")
    def _check_counts(self) -> Self:
        if self.successes > self.visits:
            raise ValueError(
                f"node {self.node_id!r}: successes ({self.successes}) exceed visits ({self.visits})"
            )
        return self


class TreeResponse(ResponseModel):
    """A tree as the trainer consumes it."""

    tree_id: Identifier
    prompt_id: Identifier
    job: JobName
    step: Count
    status: TreeStatus
    mixed: bool = Field(description="The leaves hold both a success and a failure.")
    rollouts: Count = Field(description="Bare rollouts allocated (`m_i`).")
    expansion_budget: Count = Field(description="Continuations promised to this tree.")
    control: bool = Field(default=False, description="A control tree of its allocation's control share.")
    value: Probability | None = Field(
        default=None, description="Root V̂: success rate of all scored leaves; null before any."
    )
    nodes: list[TreeNode]

    @model_validator(mode="after")
    def _check_structure(self) -> Self:
        node_ids = [node.node_id for node in self.nodes]
        duplicates = repeated(node_ids)
        if duplicates:
            raise ValueError(f"tree {self.tree_id!r}: node_id values must be unique; repeated: {duplicates}")
        known = set(node_ids)
        orphans = [
            node.node_id for node in self.nodes if node.parent_id is not None and node.parent_id not in known
        ]
        if orphans:
            raise ValueError(f"tree {self.tree_id!r}: nodes whose parent is not in the tree: {orphans[:5]}")
        return self
