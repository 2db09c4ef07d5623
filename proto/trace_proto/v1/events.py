"""`POST /v1/expand` and `GET /v1/instructions`: finished turns in, branching instructions out."""

from enum import IntEnum
from typing import Annotated, Self

from pydantic import Field, StrictBool, model_validator

from trace_proto.v1.common import (
    DEFAULT_JOB,
    Count,
    FeatureVector,
    FiniteFloat,
    Identifier,
    JobName,
    Real,
    RequestModel,
    ResponseModel,
    Text,
)
from trace_proto.v1.limits import DEFAULT_CLAIM, MAX_CLAIM, MAX_EVENTS_PER_REQUEST


class ExpandEvent(RequestModel):
    """One finished turn of a rollout: a node of the prompt's tree.

    A parent must be reported before its child or in the same request. A turn that ends the rollout
    (`done`) is a leaf and carries its reward; a reward on any other turn is an error, so a worker that
    forgets `done` is told rather than silently treated as unfinished. A rollout has at most
    `MAX_TURNS_PER_HISTORY` (1,024) turns: a turn at that depth must end it.
    """

    event_id: Identifier = Field(
        description="Client-made and unique; a repeated event_id is acknowledged and ignored."
    )
    tree_id: Identifier
    node_id: Identifier = Field(description="Client-chosen, unique within the tree.")
    parent_id: Identifier | None = Field(
        default=None, description="null: the turn starts from the prompt; otherwise a node of the same tree."
    )
    text: Text | None = Field(default=None, description="The turn's thought, action and observation.")
    features: FeatureVector | None = None
    done: StrictBool = Field(default=False, description="The turn ended the rollout; the node is a leaf.")
    reward: FiniteFloat | None = Field(
        default=None, description="Required when done; binarised by the service's threshold."
    )
    instruction_id: Identifier | None = Field(
        default=None, description="Set on the first turn of a continuation started because of an instruction."
    )

    @model_validator(mode="after")
    def _check_leaf(self) -> Self:
        if self.done and self.reward is None:
            raise ValueError(f"event {self.event_id!r}: a turn with done=true needs a reward")
        if not self.done and self.reward is not None:
            raise ValueError(
                f"event {self.event_id!r}: reward is only allowed on a turn that ends the rollout (done=true)"
            )
        if self.parent_id == self.node_id:
            raise ValueError(f"event {self.event_id!r}: node {self.node_id!r} cannot be its own parent")
        return self


class ExpandRequest(RequestModel):
    """A batch of finished turns, possibly from many trees."""

    events: list[ExpandEvent] = Field(min_length=1, max_length=MAX_EVENTS_PER_REQUEST)


class EventStatus(IntEnum):
    """What the service did with one event of `POST /v1/expand`, as an HTTP-style code: the first two
    are counted in `accepted` and `duplicates`, the others are a `RejectedEvent`'s `status`."""

    ACCEPTED = 200
    DUPLICATE = 208  # its event_id, or the very same node, was reported before
    UNKNOWN_TREE = 404
    CONFLICT = 409  # unknown parent, a node_id reused with other content, or nothing left to start
    TREE_FINISHED = 410  # the tree is complete or closed and takes no more turns
    INVALID = 422  # the event cannot belong to this tree (or this server cannot use its features)


class RejectedEvent(ResponseModel):
    """An event the service did not apply; the others of the request were still processed."""

    event_id: Identifier
    status: Annotated[int, Field(ge=400, le=599)] = Field(
        description="HTTP-style class of the error: 404 unknown tree, 409 unknown parent or a node_id "
        "reused with different content, 410 tree closed, 422 invalid for this tree."
    )
    error: str = Field(description="What was wrong, for a person.")


class Instruction(ResponseModel):
    """Start `count` continuations from the history that ends at `node_id`."""

    instruction_id: Identifier = Field(description="Echo it on the first turn of each continuation.")
    tree_id: Identifier
    node_id: Identifier
    count: Annotated[int, Field(ge=1)]


class ExpandResponse(ResponseModel):
    """What the service did with a batch of events."""

    accepted: Count
    duplicates: Count = Field(description="Events whose event_id had been seen before.")
    rejected: list[RejectedEvent] = Field(default_factory=list)
    instructions: list[Instruction] = Field(default_factory=list, description="Produced by these events.")
    completed: list[Identifier] = Field(default_factory=list, description="tree_ids these events completed.")


class InstructionsQuery(RequestModel):
    """Query of `GET /v1/instructions`: claim instructions that nobody has started.

    Query strings carry text, so `max` is parsed from its decimal string (the one lax number in v1).
    """

    job: JobName = DEFAULT_JOB
    max: Annotated[int, Field(ge=1, le=MAX_CLAIM)] = Field(
        default=DEFAULT_CLAIM, description="Most instructions to claim."
    )


class InstructionsResponse(ResponseModel):
    """Claimed instructions: leased to the caller, offered again if not started within the lease."""

    instructions: list[Instruction]
    lease_seconds: Annotated[Real, Field(gt=0.0)]
