"""The worker driver's run: one step, or one tree, of allocate → bare rollouts → expand → continuations
(`trace_client.driver` describes it)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import math
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field, replace
from typing import Final, TypeVar

from trace_client.client import AsyncTraceClient
from trace_client.driver.types import (
    DriverConfig,
    FinishedTree,
    History,
    NextTurn,
    Progress,
    ProgressCallback,
    Score,
    StepResult,
    TurnResult,
)
from trace_client.errors import TraceAPIError, TraceError, TraceResponseError
from trace_proto import (
    AllocateRequest,
    EventStatus,
    ExpandEvent,
    ExpandResponse,
    Instruction,
    PromptIn,
    RejectedEvent,
    TreeAllocation,
    TreeResponse,
    TreeStatus,
)
from trace_proto.v1.limits import MAX_CLAIM

logger = logging.getLogger(__name__)

T = TypeVar("T")

#: Characters of an error message kept in a failure leaf's text.
_FAILURE_TEXT_CHARS: Final = 2_000
#: Concurrent requests when closing or fetching a step's trees.
_FETCH_CONCURRENCY: Final = 16
#: After the deadline, how long the driver still tries to report turns that were already done.
_FINAL_REPORT_SECONDS: Final = 5.0
#: Longest pause between two status checks of a tree that waits on the service (the pause doubles
#: from `poll_interval` while the tree stays open, so a long wait costs the service little).
_MAX_CHECK_SECONDS: Final = 10.0
#: Error statuses of a whole `/v1/expand` request that a later resend may get past (load shedding).
_RESEND_STATUSES: Final = frozenset({408, 429})


class RolloutDriver:
    """Runs training steps against a trace-rollout service around user callables (see the module doc).

    Args:
        client: The service's async client (its retries and timeouts apply to every call).
        next_turn: `next_turn(history) -> TurnResult`, sync or async: the next turn after `history`.
        score: `score(history) -> float`, sync or async: the reward of a finished rollout whose last
            turn carries none.
        config: How to run (concurrency, batching, deadlines).
        on_progress: Called with a `Progress` every `config.progress_interval` seconds and at the end.
    """

    def __init__(
        self,
        client: AsyncTraceClient,
        next_turn: NextTurn,
        *,
        score: Score | None = None,
        config: DriverConfig | None = None,
        on_progress: ProgressCallback | None = None,
    ) -> None:
        self.client = client
        self.next_turn = next_turn
        self.score = score
        self.config = config or DriverConfig()
        self.on_progress = on_progress
        self._runs: dict[str, _Run] = {}  # job -> the trees run_tree is running for it

    async def run_step(self, request: AllocateRequest) -> StepResult:
        """Allocate, run every tree to completion (or to the deadline) and return the trees.

        Raises the client's `TraceError` when the service cannot be reached to allocate, or to close and
        fetch the trees at the end.
        """
        started = time.monotonic()
        allocation = await self.client.allocate(request)
        prompts = {prompt.prompt_id: prompt for prompt in request.prompts}
        run = _Run(self, allocation.job, allocation.step, started)
        run.start()
        try:
            trees = [run.add(tree, prompts[tree.prompt_id]) for tree in allocation.trees]
            timed_out = await run.complete(trees, _remaining(self.config.step_timeout, started))
        except BaseException:
            await run.stop()
            raise
        await _cancel(*run.rollouts.tasks)  # rollouts of trees that a rejection finished early
        try:
            exported = await run.export(trees)
        finally:
            progress = await run.stop()
        return StepResult(
            allocation=allocation,
            trees=[
                FinishedTree(tree.prompt, tree.allocation, exported[tree.tree_id], tree.turns, tree.failures)
                for tree in trees
            ],
            instructions=run.rollouts.instructions,
            rejected=run.answers.rejected,
            timed_out=timed_out,
            progress=progress,
        )

    async def run_tree(self, tree: TreeAllocation, prompt: PromptIn, *, job: str, step: int) -> FinishedTree:
        """Run one allocated tree to completion (or to `step_timeout`, then it is closed) and return it.

        `tree` is one entry of the `AllocateResponse` of `job` and `step` (the caller allocated), `prompt`
        the pool entry it was allocated for. Concurrent calls for one job share the reporter, the
        rollout limit and the poller; call them from one event loop. Raises `TraceError` when the tree
        cannot be fetched (or closed) at the end.
        """
        if tree.prompt_id != prompt.prompt_id:
            raise ValueError(
                f"tree {tree.tree_id} was allocated for {tree.prompt_id!r}, not for {prompt.prompt_id!r}"
            )
        started = time.monotonic()
        run = self._shared_run(job, step, started)
        books = run.add(tree, prompt)
        try:
            await run.complete([books], _remaining(self.config.step_timeout, started))
            exported = await run.export([books])
        finally:
            run.trees.remove(books)
            if not run.trees and self._runs.get(job) is run:
                del self._runs[job]  # before awaiting: a call that comes meanwhile starts a fresh run
                await run.stop()
        return FinishedTree(prompt, tree, exported[tree.tree_id], books.turns, books.failures)

    def _shared_run(self, job: str, step: int, started: float) -> _Run:
        run = self._runs.get(job)
        if run is None:
            run = self._runs[job] = _Run(self, job, step, started)
            run.start()
        elif run.loop is not asyncio.get_running_loop():
            raise RuntimeError(f"run_tree for job {job!r} is already running in another event loop")
        run.step = max(run.step, step)
        return run


@dataclass(eq=False)
class _Tree:
    """The driver's books on one tree."""

    allocation: TreeAllocation
    prompt: PromptIn
    histories: dict[str, History] = field(default_factory=dict)
    turns: dict[str, TurnResult] = field(default_factory=dict)
    failures: dict[str, str] = field(default_factory=dict)
    instructions: set[str] = field(default_factory=set)
    running: int = 0  # local rollouts queued or running
    unacknowledged: int = 0  # events sent or queued without an answer yet
    nodes_made: int = 0
    next_check: float = 0.0  # monotonic time of its next status check while it waits
    check_pause: float = 0.0
    finished: bool = False
    broken: bool = False  # an event of it was rejected, so its books cannot close
    done: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: set[asyncio.Task[None]] = field(default_factory=set)  # its rollouts

    @property
    def tree_id(self) -> str:
        return self.allocation.tree_id

    @property
    def waiting(self) -> bool:
        """Open with nothing left to do here: only the service (or another worker) can move it on."""
        return not self.finished and self.running == 0 and self.unacknowledged == 0


class _Reporter:
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

    async def run(self, answers: _Answers) -> None:
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
                response = await self._client.expand(batch, on_rejected="ignore")  # see _Answers
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


@dataclass
class _Tally:
    """The run's counters, as `Progress` reports them."""

    trees: int = 0
    trees_finished: int = 0
    bare_rollouts: int = 0
    bare_finished: int = 0
    continuations: int = 0
    continuations_finished: int = 0
    failed: int = 0
    turns_reported: int = 0

    def progress(self, step: int, elapsed: float) -> Progress:
        return Progress(
            step=step,
            trees=self.trees,
            trees_finished=self.trees_finished,
            bare_rollouts=self.bare_rollouts,
            bare_finished=self.bare_finished,
            continuations=self.continuations,
            continuations_finished=self.continuations_finished,
            failed=self.failed,
            turns_reported=self.turns_reported,
            elapsed=elapsed,
        )


class _Trees:
    """The run's trees by id, and `changed`, set whenever one of them may have stopped waiting or finished
    (it wakes the supervisor)."""

    def __init__(self, tally: _Tally) -> None:
        self._tally = tally
        self._by_id: dict[str, _Tree] = {}
        self.changed = asyncio.Event()

    def __len__(self) -> int:
        return len(self._by_id)

    def get(self, tree_id: str) -> _Tree | None:
        return self._by_id.get(tree_id)

    def add(self, allocation: TreeAllocation, prompt: PromptIn) -> _Tree:
        if allocation.tree_id in self._by_id:
            raise ValueError(f"tree {allocation.tree_id} is already running")
        tree = self._by_id[allocation.tree_id] = _Tree(allocation, prompt)
        self._tally.trees += 1
        return tree

    def waiting(self) -> list[_Tree]:
        return [tree for tree in self._by_id.values() if tree.waiting]

    def finish(self, tree: _Tree) -> None:
        if not tree.finished:
            tree.finished = True
            self._tally.trees_finished += 1
        tree.done.set()
        self.changed.set()

    def remove(self, tree: _Tree) -> None:
        """Forget a tree that was exported; rollouts of it still running are cancelled."""
        self.finish(tree)
        for task in tree.tasks:
            task.cancel()
        self._by_id.pop(tree.tree_id, None)


class _Outbox:
    """Turns on their way to the service, as events: each event's id is fixed when its turn is made (so a
    resend counts as a duplicate), each tree counts its unanswered events (a tree with any is not waiting),
    and each event remembers the rollout that made it, so that a rejection can stop that rollout."""

    def __init__(self, reporter: _Reporter, trees: _Trees) -> None:
        self._reporter = reporter
        self._trees = trees
        self._nonce = uuid.uuid4().hex[:8]  # node ids of this run never collide with another worker's
        self._owners: dict[str, asyncio.Task[object]] = {}  # event_id -> the rollout that made it

    def send_turn(
        self,
        tree: _Tree,
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
        self, tree: _Tree, parent_id: str | None, instruction_id: str | None, message: str, reward: float
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

    def _new_node(self, tree: _Tree) -> str:
        tree.nodes_made += 1
        return f"{self._nonce}-{tree.nodes_made}"

    def _send(
        self,
        tree: _Tree,
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


class _Agent:
    """The user's callables as the driver calls them: in a worker thread when `threaded`, each call
    within `turn_timeout`, and what they return checked."""

    def __init__(self, driver: RolloutDriver) -> None:
        # read from the driver at each call, as a caller may swap its callables between calls
        self._driver = driver
        self._config = driver.config

    async def next_turn(self, history: History) -> TurnResult:
        """The turn after `history`; a final turn without a reward gets the score's."""
        turn = await self._call(self._driver.next_turn, history)
        if not isinstance(turn, TurnResult):
            raise TypeError(f"next_turn returned {type(turn).__name__}, not a TurnResult")
        if turn.done and turn.reward is None:
            turn = replace(turn, reward=await self._score(history.then(turn)))
        return turn

    async def _score(self, history: History) -> float:
        if self._driver.score is None:
            raise ValueError("the final turn carries no reward and the driver was given no score callable")
        reward = await self._call(self._driver.score, history)
        if isinstance(reward, bool) or not isinstance(reward, int | float) or not math.isfinite(reward):
            raise ValueError(f"score returned {reward!r}, not a finite number")
        return float(reward)

    async def _call(self, function: Callable[[History], T | Awaitable[T]], history: History) -> T:
        async def call() -> T:
            if self._config.threaded and not inspect.iscoroutinefunction(function):
                value = await asyncio.to_thread(function, history)
            else:
                value = function(history)
            if inspect.isawaitable(value):
                return await value
            return value

        if self._config.turn_timeout is None:
            return await call()
        async with asyncio.timeout(self._config.turn_timeout):
            return await call()


class _Rollouts:
    """The run's rollouts, at most `concurrency` at a time: each runs turn by turn from its start history
    to a leaf and sends every turn as an event; a failure becomes a failure leaf. Bare rollouts start
    with their tree, continuations from an instruction's node."""

    def __init__(self, driver: RolloutDriver, trees: _Trees, outbox: _Outbox, tally: _Tally) -> None:
        self._config = driver.config
        self._agent = _Agent(driver)
        self._trees = trees
        self._outbox = outbox
        self._tally = tally
        self._slots = asyncio.Semaphore(self._config.concurrency)
        self.tasks: set[asyncio.Task[None]] = set()
        self.instructions: list[Instruction] = []

    def start_bare(self, tree: _Tree) -> None:
        self._tally.bare_rollouts += tree.allocation.rollouts
        for _ in range(tree.allocation.rollouts):
            self._spawn(tree, History(tree.prompt, tree.tree_id), None, None)

    def start_instruction(self, instruction: Instruction) -> None:
        """Start an instruction's continuations once, from the exact history that ends at its node."""
        tree = self._trees.get(instruction.tree_id)
        if tree is None or tree.finished or instruction.instruction_id in tree.instructions:
            return  # another worker's tree (left to its lease), or already started here
        start = tree.histories.get(instruction.node_id)
        if start is None:
            logger.warning(
                "instruction %s branches from node %s, which this driver did not run",
                instruction.instruction_id,
                instruction.node_id,
            )
            return
        tree.instructions.add(instruction.instruction_id)
        self.instructions.append(instruction)
        self._tally.continuations += instruction.count
        for _ in range(instruction.count):
            self._spawn(tree, start, instruction.node_id, instruction.instruction_id)

    def _spawn(self, tree: _Tree, start: History, parent_id: str | None, instruction_id: str | None) -> None:
        tree.running += 1
        task = asyncio.create_task(self._rollout(tree, start, parent_id, instruction_id))
        for tasks in (self.tasks, tree.tasks):
            tasks.add(task)
            task.add_done_callback(tasks.discard)

    async def _rollout(
        self, tree: _Tree, start: History, parent_id: str | None, instruction_id: str | None
    ) -> None:
        try:
            async with self._slots:
                ended = await self._turns(tree, start, parent_id, instruction_id)
            if ended:
                if instruction_id is None:
                    self._tally.bare_finished += 1
                else:
                    self._tally.continuations_finished += 1
        finally:
            tree.running -= 1
            self._trees.changed.set()

    async def _turns(
        self, tree: _Tree, history: History, parent_id: str | None, instruction_id: str | None
    ) -> bool:
        """Run one rollout from `history` to its leaf; True once its leaf (or failure leaf) is reported."""
        parent, instruction = parent_id, instruction_id
        try:
            while not tree.finished:
                if history.depth >= self._config.max_turns:
                    raise RuntimeError(f"the rollout did not end within max_turns={self._config.max_turns}")
                turn = await self._agent.next_turn(history)
                history = history.then(turn)
                parent = self._outbox.send_turn(tree, parent, instruction, turn, history)
                instruction = None
                if turn.done:
                    return True
            return False
        except asyncio.CancelledError:
            raise
        except Exception as error:
            if tree.finished:
                return False
            self._report_failure(tree, parent, instruction, error)
            return True

    def _report_failure(
        self, tree: _Tree, parent_id: str | None, instruction_id: str | None, error: Exception
    ) -> None:
        message = f"{type(error).__name__}: {error}"[:_FAILURE_TEXT_CHARS]
        logger.warning("rollout in tree %s failed: %s", tree.tree_id, message)
        self._tally.failed += 1
        self._outbox.send_failure(tree, parent_id, instruction_id, message, self._config.failure_reward)


class _Answers:
    """What the service answered to each batch of events: per event acknowledged or rejected (by its
    `EventStatus`), the batch as a whole refused, inline instructions to start, trees it completed."""

    def __init__(self, trees: _Trees, outbox: _Outbox, rollouts: _Rollouts, tally: _Tally) -> None:
        self._trees = trees
        self._outbox = outbox
        self._rollouts = rollouts
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
            self._rollouts.start_instruction(instruction)
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


class _Supervisor:
    """Looks after the trees that wait on the service, at most every `poll_interval`: claims the job's
    leased instructions, checks each waiting tree's status (less often while it stays open) and closes
    those nothing can finish any more."""

    def __init__(
        self, client: AsyncTraceClient, config: DriverConfig, job: str, trees: _Trees, rollouts: _Rollouts
    ) -> None:
        self._client = client
        self._config = config
        self._job = job
        self._trees = trees
        self._rollouts = rollouts
        self._last_poll = 0.0

    async def run(self) -> None:
        while True:
            self._trees.changed.clear()
            # asyncio.timeout, not wait_for: Python 3.11's wait_for swallows a cancellation that comes
            # as the event is set, and the run could then never be stopped
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._config.poll_interval):
                    await self._trees.changed.wait()
            waiting = self._trees.waiting()
            if waiting and time.monotonic() - self._last_poll >= self._config.poll_interval:
                self._last_poll = time.monotonic()
                await self._poll(waiting)

    async def _poll(self, waiting: list[_Tree]) -> None:
        """An unreachable service is tried again at the next poll."""
        try:
            await self._poll_service(waiting)
        except TraceError as error:
            logger.warning("polling the service failed, trying again: %s", error)

    async def _poll_service(self, waiting: list[_Tree]) -> None:
        claimed = await self._client.claim_instructions(self._job, MAX_CLAIM)
        for instruction in claimed.instructions:
            self._rollouts.start_instruction(instruction)
        for tree in waiting:
            if not tree.waiting:
                continue  # a claimed instruction gave it work
            if tree.broken:
                await self._close(tree)
                continue
            now = time.monotonic()
            if now < tree.next_check:
                continue
            status = (await self._client.get_tree(tree.tree_id)).status
            if status in (TreeStatus.COMPLETE, TreeStatus.CLOSED):
                self._trees.finish(tree)
            elif status is TreeStatus.COLLECTING:
                await self._close(tree)  # its bare rollouts all ended here, yet not all were scored
            else:  # expanding: a decision or a leased instruction is pending elsewhere
                tree.check_pause = min(
                    max(2 * tree.check_pause, self._config.poll_interval), _MAX_CHECK_SECONDS
                )
                tree.next_check = now + tree.check_pause

    async def _close(self, tree: _Tree) -> None:
        logger.warning("closing tree %s: nothing can finish it", tree.tree_id)
        await self._client.close_tree(tree.tree_id)
        self._trees.finish(tree)


class _Run:
    """The trees of one job in flight under one driver, put together from the parts above, with the
    progress feed. `run_step` makes one per step; `run_tree` calls of a job share one while any is
    open."""

    def __init__(self, driver: RolloutDriver, job: str, step: int, started: float) -> None:
        self._driver = driver
        self._client = driver.client
        self._config = driver.config
        self.step = step
        self._started = started
        self.loop = asyncio.get_running_loop()
        self._tally = _Tally()
        self.trees = _Trees(self._tally)
        self._reporter = _Reporter(self._client, self._config)
        outbox = _Outbox(self._reporter, self.trees)
        self.rollouts = _Rollouts(driver, self.trees, outbox, self._tally)
        self.answers = _Answers(self.trees, outbox, self.rollouts, self._tally)
        self._supervisor = _Supervisor(self._client, self._config, job, self.trees, self.rollouts)
        self._background: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._background = [
            asyncio.create_task(self._reporter.run(self.answers)),
            asyncio.create_task(self._supervisor.run()),
            asyncio.create_task(self._report_progress()),
        ]

    def add(self, allocation: TreeAllocation, prompt: PromptIn) -> _Tree:
        """Take on a tree and start its bare rollouts."""
        tree = self.trees.add(allocation, prompt)
        self.rollouts.start_bare(tree)
        return tree

    async def complete(self, trees: Sequence[_Tree], seconds_left: float | None) -> bool:
        """Until every one of `trees` is finished; True when the deadline came first (their rollouts are
        then stopped and what they had done is reported, as far as the service takes it in time)."""
        try:
            async with asyncio.timeout(seconds_left):
                for tree in trees:
                    await tree.done.wait()
            return False
        except TimeoutError:
            await _cancel(*(task for tree in trees for task in tree.tasks))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(_FINAL_REPORT_SECONDS):
                    await self._reporter.drain()
            return True

    async def export(self, trees: Sequence[_Tree]) -> dict[str, TreeResponse]:
        """Each tree as the service exports it; open ones (past the deadline) are closed first."""
        gate = asyncio.Semaphore(_FETCH_CONCURRENCY)

        async def export(tree: _Tree) -> TreeResponse:
            async with gate:
                if tree.finished:
                    return await self._client.get_tree(tree.tree_id)
                self.trees.finish(tree)
                return await self._client.close_tree(tree.tree_id)

        exported = await asyncio.gather(*(export(tree) for tree in trees))
        return {tree.tree_id: response for tree, response in zip(trees, exported, strict=True)}

    async def stop(self) -> Progress:
        """Cancel the background tasks and any rollout still running; publish the final progress."""
        await _cancel(*self._background, *self.rollouts.tasks)
        final = self.snapshot()
        self._publish(final, final=True)
        return final

    def snapshot(self) -> Progress:
        return self._tally.progress(self.step, time.monotonic() - self._started)

    async def _report_progress(self) -> None:
        while True:
            await asyncio.sleep(self._config.progress_interval)
            self._publish(self.snapshot(), final=False)

    def _publish(self, progress: Progress, *, final: bool) -> None:
        if self._driver.on_progress is not None:
            self._driver.on_progress(progress)
        if self._config.progress:
            sys.stderr.write(f"\r{progress.line()}" + ("\n" if final else ""))
            sys.stderr.flush()


def _remaining(timeout: float | None, started: float) -> float | None:
    """What is left of a deadline of `timeout` seconds counted from `started`."""
    return None if timeout is None else max(0.0, timeout - (time.monotonic() - started))


async def _cancel(*tasks: asyncio.Task[None]) -> None:
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
