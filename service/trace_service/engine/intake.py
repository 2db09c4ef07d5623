"""POST /v1/expand: events recorded tree by tree, and what they make due: a Stage 2 decision, a tree's
completion, or the instructions again for a worker that lost them."""

from __future__ import annotations

import asyncio
from collections.abc import Sequence

from trace_proto import ExpandEvent, ExpandResponse, Instruction, RejectedEvent
from trace_service.engine.common import Clock
from trace_service.engine.completion import Completion
from trace_service.engine.stage2_rounds import Stage2
from trace_service.lifecycle import EventStatus, TreeStatus
from trace_service.metrics import Metrics
from trace_service.offload import release
from trace_service.predictor import HistoryFeaturizer
from trace_service.settings import Settings
from trace_service.store import AppliedBatch, TreeStore

#: Trees whose follow-ups (decisions, completions) run concurrently, over all requests of this process.
_CONCURRENT_TREES = 32


class Intake:
    def __init__(
        self,
        store: TreeStore,
        featurizer: HistoryFeaturizer,
        settings: Settings,
        metrics: Metrics,
        stage2: Stage2,
        completion: Completion,
        clock: Clock,
    ) -> None:
        self.store = store
        self.featurizer = featurizer
        self.settings = settings
        self.metrics = metrics
        self.stage2 = stage2
        self.completion = completion
        self.clock = clock
        # Trees of all requests followed up at once: bounds store connections (the embedded store's pool
        # holds 100) and keeps one huge batch from starving the others.
        self._tree_slots = asyncio.Semaphore(_CONCURRENT_TREES)

    async def expand(self, events: Sequence[ExpandEvent]) -> ExpandResponse:
        """Record events tree by tree (each tree's batch atomically, trees concurrently), run the Stage 2
        decisions they make due, and report per event."""
        with self.metrics.expand_duration.time():
            # An event this server cannot use is refused before anything is recorded: once stored, a
            # bad feature vector would fail every Stage 2 decision of its tree.
            refused: list[RejectedEvent] = []
            by_tree: dict[str, list[int]] = {}
            featurizer = self.featurizer
            for index, event in enumerate(events):
                if event.features is None or (problem := featurizer.feature_problem(event.features)) is None:
                    by_tree.setdefault(event.tree_id, []).append(index)
                else:
                    refused.append(
                        RejectedEvent(event_id=event.event_id, status=EventStatus.INVALID, error=problem)
                    )
            by_tree = {tree_id: parents_first(events, indices) for tree_id, indices in by_tree.items()}
            tree_events = [(tree_id, [events[i] for i in idx]) for tree_id, idx in by_tree.items()]
            # Every tree's events in one store round trip; what they make due, tree by tree.
            batches = await self.store.apply_events(
                tree_events,
                now=self.clock(),
                success_threshold=self.settings.success_threshold,
                decision_lease=self.settings.decision_lease_seconds,
            )
            # Instructions whose continuations have all started leave the claim queue: one call per job.
            started: dict[str, list[tuple[str, str]]] = {}
            for (tree_id, _), batch in zip(tree_events, batches, strict=True):
                if not isinstance(batch, Exception) and batch.fully_started:
                    started.setdefault(batch.job, []).extend((tree_id, i) for i in batch.fully_started)
            for job, entries in started.items():
                await self.store.dequeue_instructions(job, entries)
            # A tree whose events failed to apply does not stop the others' follow-ups; the request
            # then fails, and its retry finds the others' events already recorded (duplicates).
            outcomes = await asyncio.gather(
                *(
                    self._follow_up(tree_id, tree_batch, batch)
                    for (tree_id, tree_batch), batch in zip(tree_events, batches, strict=True)
                    if not isinstance(batch, Exception)
                )
            )
            failures = [batch for batch in batches if isinstance(batch, Exception)]
            # The trees handed over for decisions are freed beside the loop (a large one's nodes take a
            # quarter of a second per hundred thousand).
            nodes = sum(len(b.tree.nodes) for b in batches if not isinstance(b, Exception) and b.tree)
            handed_over: list[object] = [batches]
            del batches
            await release(nodes, handed_over)
            if failures:
                raise failures[0]
        accepted = duplicates = 0
        rejected = refused
        instructions: list[Instruction] = []
        completed: list[str] = []
        for (tree_id, indices), (codes, tree_instructions, done) in zip(
            by_tree.items(), outcomes, strict=True
        ):
            for index, (code, message) in zip(indices, codes, strict=True):
                if code is EventStatus.ACCEPTED:
                    accepted += 1
                elif code is EventStatus.DUPLICATE:
                    duplicates += 1
                else:
                    rejected.append(
                        RejectedEvent(event_id=events[index].event_id, status=code, error=message)
                    )
            instructions.extend(tree_instructions)
            if done:
                completed.append(tree_id)
        self.metrics.expand_events.labels("accepted").inc(accepted)
        self.metrics.expand_events.labels("duplicate").inc(duplicates)
        self.metrics.expand_events.labels("rejected").inc(len(rejected))
        return ExpandResponse(
            accepted=accepted,
            duplicates=duplicates,
            rejected=rejected,
            instructions=instructions,
            completed=completed,
        )

    async def _follow_up(
        self, tree_id: str, events: list[ExpandEvent], batch: AppliedBatch
    ) -> tuple[list[tuple[EventStatus, str]], list[Instruction], bool]:
        """What one tree's applied events make due: a Stage 2 decision, the tree's completion, or the
        instructions again for a worker that resent its rollout ends."""
        codes = [(outcome.code, outcome.message) for outcome in batch.outcomes]
        job = batch.job
        if not job:  # unknown tree: every event was rejected
            return codes, [], False
        async with self._tree_slots:
            spent, label = self.metrics.budget_spent, self.metrics.job_label(job)
            spent.labels(label, "bare").inc(batch.new_bare_leaves)
            spent.labels(label, "continuation").inc(batch.new_continuation_leaves)
            instructions: list[Instruction] = []
            completed = batch.completed
            if batch.decision_round:
                instructions, completed = await self.stage2.decide(
                    tree_id, batch.decision_round, batch.token, inline=True, tree=batch.tree
                )
            elif batch.completed:
                await self.completion.completed(tree_id, batch.meta)
            elif batch.status is TreeStatus.EXPANDING and _resent_rollout_ends(events, codes):
                instructions = await self._reoffer(job, tree_id)
            return codes, instructions, completed

    async def _reoffer(self, job: str, tree_id: str) -> list[Instruction]:
        """A worker resending rollout ends it already reported most likely lost the answer that carried
        the tree's instructions: give it the unstarted ones again, leased to it.  The store still caps
        each instruction's continuations, so a second taker can never over-spend."""
        unstarted = await self.store.with_tree(
            tree_id,
            lambda tree: [
                i for i in tree.instructions.values() if i.unstarted > 0 and i.round == tree.meta.round
            ],
        )
        if unstarted is None:
            return []
        lease_until = self.clock() + self.settings.lease_seconds
        await self.store.queue_instructions(job, tree_id, {i.instruction_id: lease_until for i in unstarted})
        return [
            Instruction(
                instruction_id=i.instruction_id, tree_id=tree_id, node_id=i.node_id, count=i.unstarted
            )
            for i in unstarted
        ]


def parents_first(events: Sequence[ExpandEvent], indices: list[int]) -> list[int]:
    """Order one tree's events so that a parent reported in the same request precedes its children
    (the contract allows any order within a request); otherwise keep the order they came in."""
    position = {events[i].node_id: i for i in indices}
    ordered: list[int] = []
    placed: set[int] = set()
    for start in indices:
        chain = []
        index: int | None = start
        while index is not None and index not in placed and index not in chain:
            chain.append(index)
            parent = events[index].parent_id
            index = position.get(parent) if parent is not None else None
        for i in reversed(chain):
            placed.add(i)
            ordered.append(i)
    return ordered


def _resent_rollout_ends(events: Sequence[ExpandEvent], codes: Sequence[tuple[EventStatus, str]]) -> bool:
    """Every event was a duplicate and at least one ended a rollout: a retry of an answered request."""
    return all(code is EventStatus.DUPLICATE for code, _ in codes) and any(event.done for event in events)
