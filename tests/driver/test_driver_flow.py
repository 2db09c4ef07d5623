"""The driver on the simulated workload against a real service (embedded store)."""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from dataclasses import replace

import httpx
import pytest
from driver_support import assert_every_promise_kept, step_request

from trace_client import AsyncTraceClient, Backoff
from trace_client.driver import DriverConfig, History, Progress, RolloutDriver, TurnResult
from trace_lab.local import ThreadedService
from trace_lab.sim import RolloutState, SimWorkload
from trace_lab.sim.workers import SimAgent
from trace_proto import ExpandEvent, ExpandRequest, Policy, TreeStatus, paths

FAST_RETRIES = Backoff(initial_delay=0.01, max_delay=0.05)


async def test_every_tree_completes_and_every_continuation_runs_once(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    seen: list[Progress] = []
    # Small batches over few trees: many requests, each tree's events spread over several of them.
    config = DriverConfig(concurrency=16, batch_events=16, batch_trees=3)
    async with AsyncTraceClient(live.url) as client:
        driver = RolloutDriver(client, agent.next_turn, config=config, on_progress=seen.append)
        result = await driver.run_step(step_request(workload, rounds=2))
        await assert_every_promise_kept(client, result)
    assert result.instructions
    assert seen[-1] == result.progress
    assert result.progress.bare_finished == result.progress.bare_rollouts
    assert result.progress.continuations_finished == result.progress.continuations
    assert result.progress.continuations == sum(i.count for i in result.instructions)
    for finished in result.trees:
        for node in finished.tree.nodes:
            if node.instruction_id is None:
                continue
            assert node.parent_id is not None
            branch, prefix = finished.turns[node.node_id].state, finished.turns[node.parent_id].state
            assert isinstance(branch, RolloutState) and isinstance(prefix, RolloutState)
            # the continuation resumed from exactly the instructed prefix, turn objects and all
            assert len(branch.history) == len(prefix.history) + 1
            assert all(a is b for a, b in zip(branch.history, prefix.history, strict=False))


class LosesFirstInstructions(httpx.AsyncBaseTransport):
    """Forwards to the service, but the first `/v1/expand` answer carrying instructions is lost on the
    way back (the client retries: the events come back as duplicates, without the instructions)."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.lost = 0

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        body = await response.aread()
        if request.url.path == paths.EXPAND and not self.lost and json.loads(body)["instructions"]:
            self.lost += 1
            raise httpx.ReadTimeout("answer lost on purpose", request=request)
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_instructions_whose_answer_was_lost_are_claimed(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    transport = LosesFirstInstructions()
    config = DriverConfig(poll_interval=0.1, step_timeout=30)
    async with AsyncTraceClient(live.url, transport=transport, backoff=FAST_RETRIES) as client:
        result = await RolloutDriver(client, agent.next_turn, config=config).run_step(step_request(workload))
        await assert_every_promise_kept(client, result)
    assert transport.lost == 1


class StealsABareStart(httpx.AsyncBaseTransport):
    """Forwards to the service; right after the allocation another worker starts one bare rollout of
    the first tree and never finishes it, so one of the driver's starts is rejected."""

    def __init__(self) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.tree_id = ""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        response = await self.inner.handle_async_request(request)
        if request.url.path != paths.ALLOCATE:
            return response
        body = await response.aread()
        self.tree_id = json.loads(body)["trees"][0]["tree_id"]
        intruder = ExpandEvent(event_id="intruder", tree_id=self.tree_id, node_id="intruder")
        start = httpx.Request(
            "POST",
            request.url.copy_with(path=paths.EXPAND),
            content=ExpandRequest(events=[intruder]).model_dump_json().encode(),
            headers={"Content-Type": "application/json"},
        )
        await (await self.inner.handle_async_request(start)).aread()
        return httpx.Response(response.status_code, headers=response.headers, content=body)

    async def aclose(self) -> None:
        await self.inner.aclose()


async def test_a_tree_nothing_can_finish_is_closed(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    transport = StealsABareStart()
    config = DriverConfig(poll_interval=0.1, step_timeout=30)
    async with AsyncTraceClient(live.url, transport=transport) as client:
        result = await RolloutDriver(client, agent.next_turn, config=config).run_step(step_request(workload))
    assert not result.timed_out
    # the rejected start, then the turns its rollout had made before it heard (their parent is unknown)
    first, *later = result.rejected
    assert first.status == 409 and "already started" in first.error
    assert all(item.status == 409 and "unknown parent" in item.error for item in later)
    assert {item.event_id.split(":")[0] for item in result.rejected} == {transport.tree_id}
    status = {tree.tree.tree_id: tree.tree.status for tree in result.trees}
    assert status.pop(transport.tree_id) is TreeStatus.CLOSED
    assert set(status.values()) == {TreeStatus.COMPLETE}


class RefusesAContinuationsReport(httpx.AsyncBaseTransport):
    """Forwards to the service, but answers the first `/v1/expand` that starts a continuation as a whole
    with `status` (as a gateway in front of it might), so the service never sees that batch's events."""

    def __init__(self, status: int) -> None:
        self.inner = httpx.AsyncHTTPTransport()
        self.status = status
        self.refused: set[str] = set()  # the trees of the refused batch

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == paths.EXPAND and not self.refused:
            events = json.loads(await request.aread())["events"]
            if any(event.get("instruction_id") for event in events):
                self.refused = {event["tree_id"] for event in events}
                return httpx.Response(self.status, json={"detail": "refused on purpose"})
        return await self.inner.handle_async_request(request)

    async def aclose(self) -> None:
        await self.inner.aclose()


# 410 and 409 are also event statuses (tree finished; a continuation another worker runs): a refusal of
# the whole request with one of them is still no verdict on its events
@pytest.mark.parametrize("status", [413, 410, 409])
async def test_the_trees_of_a_refused_report_are_closed(
    live: ThreadedService, workload: SimWorkload, status: int
) -> None:
    rewards = itertools.count()

    def two_turns(history: History) -> TurnResult:
        """Rollouts of two turns with mixed rewards, so every continuation is the one turn that starts it."""
        if history.depth == 0:
            return TurnResult(text="first")
        return TurnResult(text="second", done=True, reward=float(next(rewards) % 2))

    transport = RefusesAContinuationsReport(status)
    # one event a request: the refused one is a continuation's start and nothing else of its tree
    config = DriverConfig(batch_events=1, poll_interval=0.1, step_timeout=10)
    async with AsyncTraceClient(live.url, transport=transport) as client:
        result = await RolloutDriver(client, two_turns, config=config).run_step(step_request(workload))
    assert not result.timed_out
    assert transport.refused
    assert {item.status for item in result.rejected} == {status}
    by_tree = {tree.tree.tree_id: tree.tree.status for tree in result.trees}
    assert {by_tree.pop(tree_id) for tree_id in transport.refused} == {TreeStatus.CLOSED}
    assert set(by_tree.values()) == {TreeStatus.COMPLETE}


@pytest.mark.parametrize(
    ("fault", "error"),
    [
        ("raises", "RuntimeError: the tool crashed"),
        ("wrong type", "TypeError: next_turn returned str, not a TurnResult"),
        ("no reward", "ValueError: the final turn carries no reward"),
        ("never ends", "RuntimeError: the rollout did not end within max_turns=16"),
    ],
)
async def test_a_failing_callable_fails_only_its_rollout(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent, fault: str, error: str
) -> None:
    request = step_request(workload, policy=Policy.UNIFORM)  # every prompt active
    target = request.prompts[0].prompt_id
    faults = 0

    async def next_turn(history: History) -> TurnResult:
        """The target prompt's agent misbehaves once at its second turn, or never ends a rollout."""
        nonlocal faults
        if history.prompt.prompt_id != target:
            return await agent.next_turn(history)
        if fault == "never ends":
            return TurnResult(text="still going")
        if faults or history.depth != 1:
            return await agent.next_turn(history)
        faults += 1
        if fault == "raises":
            raise RuntimeError("the tool crashed")
        if fault == "wrong type":
            return "a string"  # type: ignore[return-value]
        return TurnResult(text="final answer", done=True)  # and no reward to go with it

    async with AsyncTraceClient(live.url) as client:
        result = await RolloutDriver(client, next_turn, config=DriverConfig(max_turns=16)).run_step(request)
        assert {tree.tree.status for tree in result.trees} == {TreeStatus.COMPLETE}
    failed = [tree for tree in result.trees if tree.failures]
    assert [tree.prompt.prompt_id for tree in failed] == [target]
    assert result.progress.failed == len(failed[0].failures) >= 1
    for node_id, message in failed[0].failures.items():
        assert message.startswith(error)
        (leaf,) = (node for node in failed[0].tree.nodes if node.node_id == node_id)
        assert leaf.reward == 0.0
        assert node_id not in failed[0].turns


async def test_a_score_callable_rewards_unscored_final_turns(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    scored: dict[int, float] = {}

    async def unscored(history: History) -> TurnResult:
        turn = await agent.next_turn(history)
        return replace(turn, reward=None) if turn.done else turn

    def score(history: History) -> float:  # synchronous on purpose
        assert history.last_turn is not None and isinstance(history.last_turn.state, RolloutState)
        reward = history.last_turn.state.reward
        assert reward is not None
        scored[id(history.last_turn.state)] = reward
        return reward

    async with AsyncTraceClient(live.url) as client:
        result = await RolloutDriver(client, unscored, score=score).run_step(step_request(workload))
        await assert_every_promise_kept(client, result)
    leaves = [
        (finished, node)
        for finished in result.trees
        for node in finished.tree.nodes
        if node.reward is not None
    ]
    assert len(scored) == len(leaves)
    for finished, node in leaves:
        state = finished.turns[node.node_id].state
        assert node.reward == scored[id(state)] == finished.turns[node.node_id].reward


async def test_the_deadline_closes_what_is_left(
    live: ThreadedService, workload: SimWorkload, agent: SimAgent
) -> None:
    request = step_request(workload, pool=6, budget=12, policy=Policy.UNIFORM)
    stuck = request.prompts[0].prompt_id

    async def next_turn(history: History) -> TurnResult:
        if history.prompt.prompt_id == stuck and history.depth == 1:
            await asyncio.Event().wait()  # an agent that never answers
        return await agent.next_turn(history)

    config = DriverConfig(step_timeout=3.0, poll_interval=0.1)
    started = time.monotonic()
    async with AsyncTraceClient(live.url) as client:
        result = await RolloutDriver(client, next_turn, config=config).run_step(request)
    assert time.monotonic() - started < 3.0 + 6.0  # the deadline plus the final report and the closing
    assert result.timed_out
    status = {tree.prompt.prompt_id: tree.tree.status for tree in result.trees}
    assert status.pop(stuck) is TreeStatus.CLOSED
    assert set(status.values()) == {TreeStatus.COMPLETE}


async def test_a_blocking_callable_runs_in_threads_and_times_out(
    live: ThreadedService, workload: SimWorkload
) -> None:
    request = step_request(workload, pool=4, budget=8, policy=Policy.UNIFORM)
    slow = request.prompts[0].prompt_id

    def scripted(history: History) -> TurnResult:
        """Three turns; the reward alternates between prompts. One prompt's second turn is too slow."""
        if history.prompt.prompt_id == slow and history.depth == 1:
            time.sleep(0.6)
        done = history.depth == 2
        reward = float(request.prompts.index(history.prompt) % 2) if done else None
        return TurnResult(text=f"turn {history.depth}", done=done, reward=reward)

    config = DriverConfig(threaded=True, turn_timeout=0.2)
    async with AsyncTraceClient(live.url) as client:
        result = await RolloutDriver(client, scripted, config=config).run_step(request)
        assert {tree.tree.status for tree in result.trees} == {TreeStatus.COMPLETE}
    failures = {tree.prompt.prompt_id: list(tree.failures.values()) for tree in result.trees if tree.failures}
    assert list(failures) == [slow]
    assert all(message.startswith("TimeoutError") for message in failures[slow])
