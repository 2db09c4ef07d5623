"""`run_tree`: one allocated tree per call, as a per-prompt framework loop runs them, on the core of
`run_step` (shared reporter, rollout limit and poller per job)."""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest
from driver_support import step_request

from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, FinishedTree, History, Progress, RolloutDriver, TurnResult
from trace_lab.local import ThreadedService
from trace_lab.sim import SimWorkload
from trace_lab.sim.workers import SimAgent
from trace_proto import AllocateResponse, Policy, PromptIn, TreeStatus, paths


class CountsExpandTrees(httpx.AsyncBaseTransport):
    """Forwards to the service and records, per `/v1/expand` request, the trees its events belong to."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.trees_per_request: list[set[str]] = []

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == paths.EXPAND:
            events = json.loads(request.content)["events"]
            self.trees_per_request.append({event["tree_id"] for event in events})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def run_every_tree(
    driver: RolloutDriver, allocation: AllocateResponse, pool: dict[str, PromptIn]
) -> list[FinishedTree]:
    return await asyncio.gather(
        *(
            driver.run_tree(tree, pool[tree.prompt_id], job=allocation.job, step=allocation.step)
            for tree in allocation.trees
        )
    )


async def test_concurrent_trees_complete_with_every_continuation_and_share_batches(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    request = step_request(workload, rounds=2)
    pool = {prompt.prompt_id: prompt for prompt in request.prompts}
    transport = CountsExpandTrees()
    seen: list[Progress] = []
    async with AsyncTraceClient(live.url, transport=transport) as client:
        allocation = await client.allocate(request)
        driver = RolloutDriver(client, agent.next_turn, on_progress=seen.append)
        finished = await run_every_tree(driver, allocation, pool)
        (stats,) = (await client.job_stats(allocation.job)).steps
    assert [tree.tree.tree_id for tree in finished] == [tree.tree_id for tree in allocation.trees]
    assert {tree.tree.status for tree in finished} == {TreeStatus.COMPLETE}
    assert sum(tree.tree.expansion_budget for tree in finished) > 0, "no tree had a Stage 2 to run"
    for tree in finished:
        leaves = [node for node in tree.tree.nodes if node.reward is not None]
        continuations = [node for node in tree.tree.nodes if node.instruction_id is not None]
        assert len(leaves) == tree.allocation.rollouts + len(continuations)
        assert set(tree.turns) == {node.node_id for node in tree.tree.nodes}  # every turn ran here
    assert stats.rollouts_spent == stats.budget_promised
    assert stats.continuations_spent == stats.continuations_promised
    assert max(len(trees) for trees in transport.trees_per_request) > 1, "each tree reported on its own"
    assert seen[-1].trees == seen[-1].trees_finished == len(allocation.trees)


async def test_a_tree_past_the_deadline_comes_back_closed_and_the_others_complete(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    request = step_request(workload, pool=6, budget=12, policy=Policy.UNIFORM)
    pool = {prompt.prompt_id: prompt for prompt in request.prompts}
    stuck = request.prompts[0].prompt_id

    async def next_turn(history: History) -> TurnResult:
        if history.prompt.prompt_id == stuck and history.depth == 1:
            await asyncio.Event().wait()  # an agent that never answers
        return await agent.next_turn(history)

    started = time.monotonic()
    async with AsyncTraceClient(live.url) as client:
        allocation = await client.allocate(request)
        driver = RolloutDriver(client, next_turn, config=DriverConfig(step_timeout=3.0, poll_interval=0.1))
        finished = await run_every_tree(driver, allocation, pool)
        # the shared run ended with its last tree: a later call for the job starts a fresh one
        again = await client.allocate(request.model_copy(update={"step": 1}))
        healthy = next(tree for tree in again.trees if tree.prompt_id != stuck)
        later = await driver.run_tree(healthy, pool[healthy.prompt_id], job=again.job, step=again.step)
    assert time.monotonic() - started < 2 * (3.0 + 6.0)
    status = {tree.prompt.prompt_id: tree.tree.status for tree in finished}
    assert status.pop(stuck) is TreeStatus.CLOSED
    assert set(status.values()) == {TreeStatus.COMPLETE}
    assert later.tree.status is TreeStatus.COMPLETE


async def test_a_tree_must_come_with_the_prompt_it_was_allocated_for(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    request = step_request(workload, pool=4, budget=8)
    async with AsyncTraceClient(live.url) as client:
        allocation = await client.allocate(request)
        tree = allocation.trees[0]
        other = next(prompt for prompt in request.prompts if prompt.prompt_id != tree.prompt_id)
        with pytest.raises(ValueError, match="was allocated for"):
            await RolloutDriver(client, agent.next_turn).run_tree(tree, other, job=allocation.job, step=0)
