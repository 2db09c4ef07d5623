"""Typed records the tree store reads and writes (what the Lua scripts keep as hashes and JSON), and the
scripts' replies parsed into named results."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

import numpy as np
import orjson

from trace_service.allocation.books import TreeBooks, settles_to
from trace_service.allocation.tree import ROOT, TreeTargets, continuation_flips, tree_targets
from trace_service.lifecycle import FINISHED, EventStatus, TreeStatus, is_mixed
from trace_service.store.runner import pairs


@dataclass(frozen=True)
class NewTree:
    """A tree as /v1/allocate creates it."""

    tree_id: str
    allocation_id: str
    job: str
    step: int
    prompt_id: str
    prompt_text: str
    prompt_features: list[float] | None
    rollouts: int
    expansion_budget: int
    rounds: int
    policy: str
    predicted_success: float
    return_unspent: bool
    prior_outcomes: tuple[int, int]  # the prompt's (successes, trials) before this step
    max_branch_depth: int | None = None  # continuations only from prefixes this shallow (None: any)
    control: bool = False  # drawn at random for the allocation's control share
    mixed_chance: float = 0.0  # P(its bare group is mixed) at the values Stage 1 read
    shape: str | None = None  # its arm of the shape split (gain.BRANCH_DEEP or BRANCH_FIRST), if drawn

    def hash_fields(self, now: float) -> list[str]:
        """What a new tree stores, as a flat field/value list: its immutable spec as one JSON field, the
        prompt text as another (the scripts that run on every event read neither), and the few fields
        those scripts read.  Counters start absent (read as 0), which keeps creating thousands of trees
        cheap."""
        spec = {
            "allocation_id": self.allocation_id,
            "step": self.step,
            "prompt_id": self.prompt_id,
            "features": self.prompt_features,
            "prior": self.prior_outcomes,
            "policy": self.policy,
            "predicted": self.predicted_success,
            "return_unspent": self.return_unspent,
            "max_branch_depth": self.max_branch_depth,
            "control": self.control,
            "mixed_chance": self.mixed_chance,
            "shape": self.shape,
            "created_at": now,
        }
        return [
            "spec", orjson.dumps(spec).decode(),
            "prompt", self.prompt_text,
            "job", self.job,
            "status", TreeStatus.COLLECTING.value,
            "rollouts", str(self.rollouts),
            "expansion_budget", str(self.expansion_budget),
            "rounds", str(self.rounds),
            "settles_to", settles_to(0, self.rounds, self.expansion_budget, self.rollouts).value,
        ]  # fmt: skip


#: Counters a new tree starts without (absent reads as 0).
_COUNTERS = (
    "round", "bare_started", "bare_leaves", "bare_successes", "cont_started", "cont_leaves", "successes",
    "promised", "returned", "fallback", "turns",
)  # fmt: skip


@dataclass(frozen=True)
class TreeMeta:
    """A tree's header and counters (everything in its meta hash but the prompt text)."""

    #: The meta hash fields a TreeMeta is read from.
    FIELDS = (
        "spec", "job", "status", "rollouts", "expansion_budget", "rounds", "finished_at", *_COUNTERS,
    )  # fmt: skip
    #: The fields only the scripts use: a Stage 2 claim (round, token, lease end), the last update, what
    #: the tree becomes once settled (``allocation.books.settles_to``, written with its books) and the
    #: two marks of retention by need (``retain_tree.lua``).
    SCRIPT_FIELDS = (
        "decision_round", "decision_token", "decision_until", "updated_at", "settles_to", "retain_read",
        "retain_learned",
    )  # fmt: skip

    tree_id: str
    allocation_id: str
    job: str
    step: int
    prompt_id: str
    prompt_features: list[float] | None
    rollouts: int
    expansion_budget: int
    rounds: int
    round: int
    policy: str
    predicted_success: float
    return_unspent: bool
    prior_outcomes: tuple[int, int]
    status: TreeStatus
    bare_started: int
    bare_leaves: int
    bare_successes: int
    cont_started: int
    cont_leaves: int
    successes: int
    promised: int
    returned: int
    fallback: int
    turns: int  # turns reported: what the tree generated
    created_at: float
    finished_at: float
    max_branch_depth: int | None = None
    control: bool = False
    mixed_chance: float = 0.0
    shape: str | None = None

    @property
    def leaves(self) -> int:
        return self.bare_leaves + self.cont_leaves

    @property
    def books(self) -> TreeBooks:
        """The tree's Stage 2 books."""
        return TreeBooks(self.expansion_budget, self.promised, self.returned, self.rounds, self.rollouts)

    @property
    def mixed(self) -> bool:
        return is_mixed(self.successes, self.leaves)

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    @classmethod
    def from_hash(cls, tree_id: str, raw: Mapping[str, str | None]) -> TreeMeta:
        """From the hash's fields (at least :attr:`FIELDS`; an absent counter is ``None`` or missing)."""
        spec = orjson.loads(_present(raw, "spec"))
        counters = {name: int(raw.get(name) or 0) for name in _COUNTERS}
        return cls(
            tree_id=tree_id,
            allocation_id=spec["allocation_id"],
            job=_present(raw, "job"),
            step=int(spec["step"]),
            prompt_id=spec["prompt_id"],
            prompt_features=spec["features"],
            prior_outcomes=(int(spec["prior"][0]), int(spec["prior"][1])),
            rollouts=int(_present(raw, "rollouts")),
            expansion_budget=int(_present(raw, "expansion_budget")),
            rounds=int(_present(raw, "rounds")),
            policy=spec["policy"],
            predicted_success=float(spec["predicted"]),
            return_unspent=bool(spec["return_unspent"]),
            status=TreeStatus(_present(raw, "status")),
            created_at=float(spec["created_at"]),
            finished_at=float(raw.get("finished_at") or 0),
            max_branch_depth=spec["max_branch_depth"],
            control=bool(spec["control"]),
            mixed_chance=float(spec["mixed_chance"]),
            shape=spec.get("shape"),  # absent in trees created before the shape split
            **counters,
        )


def _present(raw: Mapping[str, str | None], name: str) -> str:
    value = raw.get(name)
    if value is None:
        raise KeyError(f"tree meta lacks {name!r}")
    return value


@dataclass(frozen=True)
class TreeProgress:
    """The three fields that say whether a tree needs the sweeper: it is finished, or a Stage 2 claim
    (``decision_round`` > 0) lapsed at ``decision_until``."""

    status: TreeStatus
    decision_round: int
    decision_until: float

    @property
    def finished(self) -> bool:
        return self.status in FINISHED

    def claim_lapsed(self, now: float) -> bool:
        return not self.finished and self.decision_round > 0 and self.decision_until <= now


class StoredNode(NamedTuple):
    """One turn node.  A tuple of atoms (its features too): the garbage collector stops tracking it
    the first time it looks, so the hundreds of thousands of a large tree never cost a collection."""

    node_id: str
    parent_id: str | None
    depth: int
    origin: str  # "" for a bare rollout, else the instruction that started the continuation
    done: bool
    reward: float | None
    text: str
    features: tuple[float, ...] | None
    instruction_id: str | None
    reported_at: float

    @classmethod
    def from_json(cls, node_id: str, raw: str) -> StoredNode:
        data = orjson.loads(raw)
        return cls(
            node_id=node_id,
            parent_id=data["parent"] or None,
            depth=int(data["depth"]),
            origin=data["origin"],
            done=bool(data["done"]),
            reward=float(data["reward"]) if data["reward"] != "" else None,
            text=data["text"],
            features=tuple(orjson.loads(data["features"])) if data["features"] else None,
            instruction_id=data["instruction"] or None,
            reported_at=float(data["reported_at"]),
        )


@dataclass(frozen=True)
class StoredInstruction:
    instruction_id: str
    node_id: str
    count: int
    started: int
    round: int
    created_at: float

    @property
    def unstarted(self) -> int:
        return self.count - self.started

    @classmethod
    def from_json(cls, instruction_id: str, raw: str) -> StoredInstruction:
        data = orjson.loads(raw)
        return cls(
            instruction_id,
            data["node"],
            int(data["count"]),
            int(data["started"]),
            int(data["round"]),
            float(data["at"]),
        )


@dataclass(frozen=True)
class StoredTree:
    """A whole tree: header, prompt text, nodes (parents before children), instructions, decision-time
    predictions."""

    meta: TreeMeta
    prompt_text: str
    nodes: list[StoredNode]
    instructions: dict[str, StoredInstruction] = field(default_factory=dict)
    predictions: dict[str, float] = field(default_factory=dict)
    #: A Stage 2 decision was claimed and not yet recorded when the tree was read: instructions it has
    #: offered may still be on their way to ``instructions``.
    deciding: bool = False

    @classmethod
    def from_hashes(
        cls, tree_id: str, meta: list[Any], nodes: list[Any], instructions: list[Any], predictions: list[Any]
    ) -> StoredTree | None:
        """A tree from its four hashes as flat field/value lists (what the scripts return); None when
        the tree does not exist."""
        if not meta:
            return None
        header = pairs(meta)
        parsed = _in_order([StoredNode.from_json(node_id, raw) for node_id, raw in pairs(nodes).items()])
        return cls(
            meta=TreeMeta.from_hash(tree_id, header),
            prompt_text=header["prompt"],
            nodes=parsed,
            instructions={
                key: StoredInstruction.from_json(key, raw) for key, raw in pairs(instructions).items()
            },
            predictions={key: float(value) for key, value in pairs(predictions).items()},
            deciding=int(header.get("decision_round") or 0) > 0,
        )

    def parent_indices(self) -> list[int]:
        """Each node's parent as an index into ``nodes`` (``ROOT`` for a turn that starts from the prompt)."""
        index = {node.node_id: i for i, node in enumerate(self.nodes)}
        return [index[node.parent_id] if node.parent_id else ROOT for node in self.nodes]

    def rewards(self) -> list[float]:
        """Each node's reward, NaN where it is not a scored leaf (``allocation.tree``'s layout)."""
        return [node.reward if node.done and node.reward is not None else math.nan for node in self.nodes]

    def targets(self, success_threshold: float) -> TreeTargets:
        """Visits, successes and recursive values V̂ of every node (``trace_service.allocation.tree``)."""
        return tree_targets(self.parent_indices(), self.rewards(), success_threshold=success_threshold)

    def continuation_flips(self, success_threshold: float) -> tuple[int, float]:
        """The continuations' flips against fresh rollouts' (``allocation.tree.continuation_flips``)."""
        return continuation_flips(
            self.parent_indices(),
            self.rewards(),
            [not node.origin for node in self.nodes],
            self.meta.predicted_success,
            success_threshold=success_threshold,
        )


def _in_order(nodes: list[StoredNode]) -> list[StoredNode]:
    """The nodes by (depth, reported_at, node_id): parents before children, each depth as reported.

    A list sort of a large tree would hold the interpreter for a third of a second in one call; numpy
    sorts by depth and time without it, and only nodes reported at the same instant (one batch) are
    sorted by id, a batch at a time."""
    depth = np.fromiter((node.depth for node in nodes), dtype=np.int64, count=len(nodes))
    reported = np.fromiter((node.reported_at for node in nodes), dtype=np.float64, count=len(nodes))
    order = np.lexsort((reported, depth))
    key_changes = np.flatnonzero((np.diff(depth[order]) != 0) | (np.diff(reported[order]) != 0)) + 1
    ordered: list[StoredNode] = []
    for run in np.split(order, key_changes):
        batch = [nodes[i] for i in run.tolist()]
        if len(batch) > 1:
            batch.sort(key=lambda node: node.node_id)
        ordered.extend(batch)
    return ordered


@dataclass(frozen=True)
class EventOutcome:
    """What happened to one event (``message`` says why it was not accepted)."""

    code: EventStatus
    message: str


@dataclass(frozen=True)
class AppliedBatch:
    """The result of applying one tree's events (``apply_events.lua``).

    ``decision_round`` > 0 hands the caller the claim (``token``) on that Stage 2 round, and ``tree`` the
    tree as that decision must see it; ``completed`` is true for exactly the one batch that completed
    the tree, which also gets its header (``meta``); ``fully_started`` lists the instructions whose
    continuations have now all started (they leave the claim queue).  ``status`` is None (and every
    outcome ``UNKNOWN_TREE``) for a tree that does not exist.
    """

    outcomes: list[EventOutcome]
    job: str
    status: TreeStatus | None
    decision_round: int
    token: str
    completed: bool
    fully_started: list[str]
    new_bare_leaves: int
    new_continuation_leaves: int
    tree: StoredTree | None = None
    meta: TreeMeta | None = None

    @classmethod
    def from_reply(cls, tree_id: str, reply: list[Any]) -> AppliedBatch:
        """From the script's reply: a JSON summary, then what the summary announces (the tree's four
        hashes with a decision, its meta hash on completion)."""
        summary = orjson.loads(reply[0])
        decision, completed = int(summary["decision"]), bool(summary["completed"])
        attached = reply[1:]
        expected = 4 if decision else 1 if completed else 0
        if len(attached) != expected:
            raise ValueError(
                f"the reply carries {len(attached)} hashes where its summary announces {expected}"
            )
        return cls(
            outcomes=[EventOutcome(EventStatus(code), str(message)) for code, message in summary["results"]],
            job=summary["job"],
            status=TreeStatus(summary["status"]) if summary["status"] else None,
            decision_round=decision,
            token=summary["token"],
            completed=completed,
            # cjson writes an empty table as {}: no instruction became fully started.
            fully_started=list(summary["started"]) if isinstance(summary["started"], list) else [],
            new_bare_leaves=int(summary["bare_leaves"]),
            new_continuation_leaves=int(summary["cont_leaves"]),
            tree=StoredTree.from_hashes(tree_id, *attached) if decision else None,
            meta=TreeMeta.from_hash(tree_id, pairs(attached[0])) if completed else None,
        )


class CommittedDecision(NamedTuple):
    """The result of recording a Stage 2 decision (``commit_decision.lua``): whether the caller's claim
    still held (else nothing was recorded), and whether the decision completed the tree."""

    recorded: bool
    completed: bool

    @classmethod
    def from_reply(cls, reply: str | bytes) -> CommittedDecision:
        result = orjson.loads(reply)
        return cls(recorded=bool(result["ok"]), completed=bool(result["completed"]))


@dataclass(frozen=True)
class PromptOutcomes:
    """A prompt's bare-rollout history in a job: successes, trials, and how many of its latest groups in
    a row were all-success or all-failure (GRESO's skipping signal)."""

    successes: int = 0
    trials: int = 0
    zero_variance_streak: int = 0

    @classmethod
    def parse(cls, raw: str) -> PromptOutcomes:
        successes, trials, streak = (int(part) for part in raw.split(","))
        return cls(successes, trials, streak)


@dataclass(frozen=True)
class GroupOutcome:
    """A tree's bare group: the prediction its prompt had at allocation and its bare outcomes."""

    predicted: float
    successes: int
    trials: int

    def __str__(self) -> str:
        return f"{self.predicted!r},{self.successes},{self.trials}"

    @classmethod
    def parse(cls, raw: str) -> GroupOutcome:
        predicted, successes, trials = raw.split(",")
        return cls(float(predicted), int(successes), int(trials))


@dataclass(frozen=True)
class AllocationReads:
    """What /v1/allocate reads before it decides, in one round trip: the answer remembered under its
    idempotency key, each prompt's history, the job's recent groups of each arm (for its trust map) and
    its per-step totals (for the split of its budget)."""

    remembered: tuple[str, str] | None
    history: list[PromptOutcomes]
    control_groups: list[GroupOutcome]
    policy_groups: list[GroupOutcome]
    step_totals: dict[int, dict[str, int]]


@dataclass(frozen=True)
class AllocationCounts:
    """What one allocation of a step made: prompts offered, trees (``controls`` of them control
    trees), bare rollouts promised, and the share of the budget meant for the policy's trees."""

    prompts: int
    trees: int
    bare_promised: int
    controls: int
    policy_share: float = 1.0

    def __str__(self) -> str:
        return f"{self.prompts},{self.trees},{self.bare_promised},{self.controls},{self.policy_share!r}"

    @classmethod
    def parse(cls, raw: str) -> AllocationCounts:
        prompts, trees, bare_promised, controls, share = raw.split(",")
        return cls(int(prompts), int(trees), int(bare_promised), int(controls), float(share))
