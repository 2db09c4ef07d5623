"""Turns on their way to the service as `/v1/expand` events, and what the service answers to them."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Callable
from typing import Final

from trace_client.client import AsyncTraceClient
from trace_client.driver._books import Tally, Tree, Trees
from trace_client.driver.types import DriverConfig, History, TurnResult
from trace_client.errors import TraceAPIError, TraceError, TraceResponseError
from trace_proto import EventStatus, ExpandEvent, ExpandResponse, Instruction, RejectedEvent

logger = logging.getLogger(__name__)

#: Error statuses of a whole `/v1/expand` request that a later resend may get past (load shedding).
_RESEND_STATUSES: Final = frozenset({408, 429})


class Reporter:
    """Sends events in batches, one request at a time (so parents always precede their children)."""

    def __init__(self, client: AsyncTraceClient, config: DriverConfig) -> None:
        self._client = client
        self._config = config
        self._pending: list[ExpandEvent] = []
        self._arrived = asyncio.Event()
        self._full = asyncio.Event()
        self._idle = asyncio.Event()
        self._idle.set()

    def add(self, event: ExpandEvent) -> None:
        self._pending.append(event)
        self._arrived.set()
        self._idle.clear()
        if len(self._pending) >= self._config.batch_events:
            self._full.set()

    async def drain(self) -> None:
        """Until every event added so far has an answer (or was refused)."""
        await self._idle.wait()

    async def run(self, answers: Answers) -> None:
        """Send batches until cancelled, handing each answer (or refusal) to `answers`."""
        while True:
            await self._arrived.wait()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.batch_latency):
                    await self._full.wait()
            batch = self._take_batch()
            if len(self._pending) < self._config.batch_events:
                self._full.clear()
            if not self._pending:
                self._arrived.clear()
            try:
                response = await self._client.expand(batch, on_rejected="ignore")  # see Answers
            except TraceAPIError as error:
                if error.status in _RESEND_STATUSES or error.status >= 500:
                    await self._requeue(batch, error)
                else:
                    answers.on_refused(batch, error)  # the request as a whole is wrong: resending cannot help
            except TraceResponseError as error:
                answers.on_refused(batch, error)  # not a v1 answer: a resend would get the same
            except TraceError as error:
                await self._requeue(batch, error)
            else:
                answers.on_answer(batch, response)
            if not self._pending:
                self._idle.set()

    def _take_batch(self) -> list[ExpandEvent]:
        """The oldest events of the first `batch_trees` trees in line, up to `batch_events`; each tree's
        events keep their order."""
        trees: set[str] = set()
        batch: list[ExpandEvent] = []
        rest: list[ExpandEvent] = []
        for event in self._pending:
            fits = event.tree_id in trees or len(trees) < self._config.batch_trees
            if fits and len(batch) < self._config.batch_events:
                trees.add(event.tree_id)
                batch.append(event)
            else:
                rest.append(event)
        self._pending = rest
        return batch

    async def _requeue(self, batch: list[ExpandEvent], error: TraceError) -> None:
        """The service could not take the batch: keep it first in line (its event ids make a resend safe)
        and try again after a pause; the step's deadline bounds the retries."""
        logger.warning("reporting %d turns failed, retrying: %s", len(batch), error)
        self._pending[:0] = batch
        self._arrived.set()
        await asyncio.sleep(self._config.poll_interval)


class Outbox:
    """Turns on their way to the service, as events: each event's id is fixed when its turn is made (so a
    resend counts as a duplicate), each tree counts its unanswered events (a tree with any is not waiting),
    and each event remembers the rollout that made it, so that a rejection can stop that rollout."""

    def __init__(self, reporter: Reporter, trees: Trees) -> None:
        self._reporter = reporter
        self._trees = trees
        self._nonce = uuid.uuid4().hex[:8]  # node ids of this run never collide with another worker's
        self._owners: dict[str, asyncio.Task[object]] = {}  # event_id -> the rollout that made it

    def send_turn(
        self,
        tree: Tree,
        parent_id: str | None,
        instruction_id: str | None,
        turn: TurnResult,
        history: History,
    ) -> str:
        """Record the turn in the tree's books and send it; returns its node id."""
        node_id = self._new_node(tree)
        tree.histories[node_id] = history
        tree.turns[node_id] = turn
        self._send(
            tree,
            node_id,
            parent_id,
            instruction_id,
            text=turn.text,
            features=None if turn.features is None else [float(x) for x in turn.features],
            done=turn.done,
            reward=turn.reward,
        )
        return node_id

    def send_failure(
        self, tree: Tree, parent_id: str | None, instruction_id: str | None, message: str, reward: float
    ) -> None:
        """Send the leaf that ends a failed rollout, with `reward`, and list it in the tree's failures."""
        node_id = self._new_node(tree)
        tree.failures[node_id] = message
        self._send(
            tree,
            node_id,
            parent_id,
            instruction_id,
            text=f"[rollout failed] {message}",
            done=True,
            reward=reward,
        )

    def answered(self, event: ExpandEvent) -> asyncio.Task[object] | None:
        """Count the event as answered; returns the rollout that made it."""
        tree = self._trees.get(event.tree_id)
        if tree is not None:
            tree.unacknowledged -= 1
        return self._owners.pop(event.event_id, None)

    def _new_node(self, tree: Tree) -> str:
        tree.nodes_made += 1
        return f"{self._nonce}-{tree.nodes_made}"

    def _send(
        self,
        tree: Tree,
        node_id: str,
        parent_id: str | None,
        instruction_id: str | None,
        *,
        text: str | None,
        done: bool,
        reward: float | None,
        features: list[float] | None = None,
    ) -> None:
        """Queue the node's event; its id is the tree's and the node's, so a resend is a duplicate."""
        event = ExpandEvent(
            event_id=f"{tree.tree_id}:{node_id}",
            tree_id=tree.tree_id,
            node_id=node_id,
            parent_id=parent_id,
            text=text,
            features=features,
            done=done,
            reward=reward,
            instruction_id=instruction_id,
        )
        task = asyncio.current_task()
        if task is not None:
            self._owners[event.event_id] = task
        tree.unacknowledged += 1
        self._reporter.add(event)


class Answers:
    """What the service answered to each batch of events: per event acknowledged or rejected (by its
    `EventStatus`), the batch as a whole refused, inline instructions to start, trees it completed."""

    def __init__(
        self, trees: Trees, outbox: Outbox, start_instruction: Callable[[Instruction], None], tally: Tally
    ) -> None:
        self._trees = trees
        self._outbox = outbox
        self._start_instruction = start_instruction
        self._tally = tally
        self.rejected: list[RejectedEvent] = []

    def on_answer(self, batch: list[ExpandEvent], response: ExpandResponse) -> None:
        rejected = {item.event_id: item for item in response.rejected}
        for event in batch:
            owner = self._outbox.answered(event)
            item = rejected.get(event.event_id)
            if item is None:
                self._tally.turns_reported += 1
            else:
                self._reject(event, item, owner)
        for instruction in response.instructions:
            self._start_instruction(instruction)
        for tree_id in response.completed:
            tree = self._trees.get(tree_id)
            if tree is not None:
                self._trees.finish(tree)
        self._trees.changed.set()

    def on_refused(self, batch: list[ExpandEvent], error: TraceError) -> None:
        status = error.status if isinstance(error, TraceAPIError) else 400
        logger.error("the service refused %d turns: %s", len(batch), error)
        for event in batch:
            owner = self._outbox.answered(event)
            self._drop(RejectedEvent(event_id=event.event_id, status=status, error=str(error)), owner)
            # the request's status is no verdict on the event (a 410 or 409 here is not an EventStatus)
            tree = self._trees.get(event.tree_id)
            if tree is not None:
                tree.broken = True
        self._trees.changed.set()

    def _reject(self, event: ExpandEvent, item: RejectedEvent, owner: asyncio.Task[object] | None) -> None:
        """The service's verdict on one event, by its `EventStatus`."""
        self._drop(item, owner)
        tree = self._trees.get(event.tree_id)
        if tree is None:
            return
        if item.status == EventStatus.TREE_FINISHED:
            self._trees.finish(tree)
        elif not (event.instruction_id is not None and item.status == EventStatus.CONFLICT):
            # A continuation's conflict means another worker runs it, not that the tree is broken.
            tree.broken = True

    def _drop(self, item: RejectedEvent, owner: asyncio.Task[object] | None) -> None:
        """List the event as rejected; the rollout that made it cannot go on (its next turns would be
        orphans)."""
        self.rejected.append(item)
        if owner is not None:
            owner.cancel()
