"""GET /v1/instructions: instructions nobody has started, leased to the worker that claims them."""

from __future__ import annotations

from typing import NamedTuple

from trace_proto import Instruction, InstructionsResponse
from trace_service.engine.common import Clock
from trace_service.metrics import OTHER_JOBS, Metrics
from trace_service.settings import Settings
from trace_service.store import StoredInstruction, StoredTree, TreeStore


class Instructions:
    def __init__(self, store: TreeStore, settings: Settings, metrics: Metrics, clock: Clock) -> None:
        self.store = store
        self.settings = settings
        self.metrics = metrics
        self.clock = clock

    async def claim(self, job: str, max_items: int) -> InstructionsResponse:
        """Up to ``max_items`` of ``job``'s offered instructions, each leased for ``lease_seconds``;
        instructions that are finished (all started, or their tree done or gone) leave the queue."""
        now = self.clock()
        lease = self.settings.lease_seconds
        claimed = await self.store.claim_instructions(job, max_items=max_items, lease=lease, now=now)
        instructions: list[Instruction] = []
        finished: list[tuple[str, str]] = []
        on_their_way: dict[str, dict[str, float]] = {}
        # Of each tree, what a claim reads: its instructions while it is not finished (a large tree is
        # read beside the loop).
        trees: dict[str, _OpenInstructions | None] = {}
        for tree_id, instruction_id, offered_until in claimed:
            if tree_id not in trees:
                trees[tree_id] = await self.store.with_tree(tree_id, _open_instructions)
            tree = trees[tree_id]
            stored = tree.instructions.get(instruction_id) if tree else None
            if stored is None and tree and tree.deciding:
                # Offered by a decision not recorded yet (a decision offers, then records): offered
                # again as it was.  Once no decision is under way, an offer never recorded is dropped.
                on_their_way.setdefault(tree_id, {})[instruction_id] = offered_until
                continue
            if stored is None or stored.unstarted <= 0:
                finished.append((tree_id, instruction_id))
                continue
            if offered_until > stored.created_at + 1e-6:
                self.metrics.instruction_lease_expiries.labels(self.metrics.job_label(job)).inc()
            instructions.append(
                Instruction(
                    instruction_id=instruction_id,
                    tree_id=tree_id,
                    node_id=stored.node_id,
                    count=stored.unstarted,
                )
            )
        for tree_id, offers in on_their_way.items():
            await self.store.queue_instructions(job, tree_id, offers)
        await self.store.dequeue_instructions(job, finished)
        backlog = await self.store.queue_length(job)
        if (label := self.metrics.job_label(job)) != OTHER_JOBS:  # a gauge shared by jobs would mean nothing
            self.metrics.instruction_backlog.labels(label).set(backlog)
        return InstructionsResponse(instructions=instructions, lease_seconds=lease)


class _OpenInstructions(NamedTuple):
    instructions: dict[str, StoredInstruction]
    deciding: bool  # a Stage 2 decision was under way when the tree was read


def _open_instructions(tree: StoredTree) -> _OpenInstructions | None:
    """A tree's instructions as one read saw them, none once the tree is finished."""
    return None if tree.meta.finished else _OpenInstructions(tree.instructions, tree.deciding)
