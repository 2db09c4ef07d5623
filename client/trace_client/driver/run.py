"""The worker driver's run: one step, or one tree, of allocate → bare rollouts → expand → continuations
(`trace_client.driver` describes it)."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
from collections.abc import Sequence
from typing import Final

from trace_client.client import AsyncTraceClient
from trace_client.driver._books import Tally, Tree, Trees
from trace_client.driver._events import Answers, Outbox, Reporter
from trace_client.driver._rollouts import Agent, Rollouts
from trace_client.driver._supervisor import Supervisor
from trace_client.driver.types import (
    DriverConfig,
    FinishedTree,
    NextTurn,
    Progress,
    ProgressCallback,
    Score,
    StepResult,
    TurnRecorded,
)
from trace_proto import AllocateRequest, PromptIn, TreeAllocation, TreeResponse

#: Concurrent requests when closing or fetching a step's trees.
_FETCH_CONCURRENCY: Final = 16
#: After the deadline, how long the driver still tries to report turns that were already done.
_FINAL_REPORT_SECONDS: Final = 5.0


class RolloutDriver:
    """Runs training steps against a trace-rollout service around user callables (see the module doc).

    Args:
        client: The service's async client (its retries and timeouts apply to every call).
        next_turn: `next_turn(history) -> TurnResult`, sync or async: the next turn after `history`.
        score: `score(history) -> float`, sync or async: the reward of a finished rollout whose last
            turn carries none.
        config: How to run (concurrency, batching, deadlines).
        on_progress: Called with a `Progress` every `config.progress_interval` seconds and at the end.
        on_turn: Called with `(tree_id, node_id, turn)` as each turn `next_turn` returned is recorded
            (before it is sent), for a caller that keys its own state by node (`trace_client.envs`).
    """

    def __init__(
        self,
        client: AsyncTraceClient,
        next_turn: NextTurn,
        *,
        score: Score | None = None,
        config: DriverConfig | None = None,
        on_progress: ProgressCallback | None = None,
        on_turn: TurnRecorded | None = None,
    ) -> None:
        self.client = client
        self.next_turn = next_turn
        self.score = score
        self.config = config or DriverConfig()
        self.on_progress = on_progress
        self.on_turn = on_turn
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


class _Run:
    """The trees of one job in flight under one driver, put together from the books, the event pipeline,
    the rollouts and the supervisor, with the progress feed. `run_step` makes one per step; `run_tree`
    calls of a job share one while any is open."""

    def __init__(self, driver: RolloutDriver, job: str, step: int, started: float) -> None:
        self._driver = driver
        self._client = driver.client
        self._config = driver.config
        self.step = step
        self._started = started
        self.loop = asyncio.get_running_loop()
        self._tally = Tally()
        self.trees = Trees(self._tally)
        self._reporter = Reporter(self._client, self._config)
        outbox = Outbox(self._reporter, self.trees)
        agent = Agent(lambda: driver.next_turn, lambda: driver.score, lambda: driver.on_turn, self._config)
        self.rollouts = Rollouts(agent, self._config, self.trees, outbox, self._tally)
        self.answers = Answers(self.trees, outbox, self.rollouts.start_instruction, self._tally)
        self._supervisor = Supervisor(self._client, self._config, job, self.trees, self.rollouts)
        self._background: list[asyncio.Task[None]] = []

    def start(self) -> None:
        self._background = [
            asyncio.create_task(self._reporter.run(self.answers)),
            asyncio.create_task(self._supervisor.run()),
            asyncio.create_task(self._report_progress()),
        ]

    def add(self, allocation: TreeAllocation, prompt: PromptIn) -> Tree:
        """Take on a tree and start its bare rollouts."""
        tree = self.trees.add(allocation, prompt)
        self.rollouts.start_bare(tree)
        return tree

    async def complete(self, trees: Sequence[Tree], seconds_left: float | None) -> bool:
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

    async def export(self, trees: Sequence[Tree]) -> dict[str, TreeResponse]:
        """Each tree as the service exports it; open ones (past the deadline) are closed first."""
        gate = asyncio.Semaphore(_FETCH_CONCURRENCY)

        async def export(tree: Tree) -> TreeResponse:
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
