"""The store round trips a request waits for, counted at the Redis client on both stores: every command
sent on its own and every pipeline is one.  POST /v1/allocate takes at most four; a tree that completes
takes at most two beyond the script that applied its last event (docs/design.md traces both)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar

import pytest
from engine_support import Wired, wire
from redis.asyncio.client import Pipeline
from support import make_settings, rollout

from trace_proto import AllocateRequest, Policy, PromptIn

_R = TypeVar("_R")


class RoundTrips:
    """The commands and pipelines a client sent, one entry per round trip."""

    def __init__(self) -> None:
        self.sent: list[str] = []
        self.counting = False

    def note(self, what: str) -> None:
        if self.counting:
            self.sent.append(what)

    async def during(self, work: Awaitable[_R]) -> tuple[_R, list[str]]:
        self.sent, self.counting = [], True
        try:
            return await work, self.sent
        finally:
            self.counting = False


@pytest.fixture
async def counted(store_url: str, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[tuple[Wired, RoundTrips]]:
    trips = RoundTrips()
    async with wire(make_settings(store_url)) as wired:
        client = wired.store.redis
        command = client.execute_command

        async def one_command(*args: Any, **options: Any) -> Any:
            trips.note(str(args[0]))
            return await command(*args, **options)

        execute: Callable[..., Awaitable[list[Any]]] = Pipeline.execute

        async def one_pipeline(pipe: Pipeline, *args: Any, **options: Any) -> list[Any]:
            trips.note("pipeline(" + ",".join(str(c[0][0]) for c in pipe.command_stack) + ")")
            return await execute(pipe, *args, **options)

        monkeypatch.setattr(client, "execute_command", one_command)
        monkeypatch.setattr(Pipeline, "execute", one_pipeline)
        yield wired, trips


def request(step: int, policy: Policy) -> AllocateRequest:
    prompts = [PromptIn(prompt_id=f"p{i}", text=f"prompt {i}") for i in range(6)]
    return AllocateRequest(step=step, budget=12, expansion=1.0, policy=policy, prompts=prompts)


@pytest.mark.parametrize("policy", [Policy.TRACE, Policy.TRACE_SHARED, Policy.UNIFORM])
@pytest.mark.parametrize("idempotency_key", [None, "step-key"])
async def test_an_allocation_takes_at_most_four_round_trips(
    counted: tuple[Wired, RoundTrips], policy: Policy, idempotency_key: str | None
) -> None:
    wired, trips = counted
    await wired.engine.allocation.allocate(request(0, policy), "warm-up")  # loads the scripts
    answer, sent = await trips.during(wired.engine.allocation.allocate(request(1, policy), idempotency_key))
    assert answer.trees
    assert len(sent) <= 4, sent
    if idempotency_key:  # the retry: its answer remembered, its trees listed again
        _, again = await trips.during(wired.engine.allocation.allocate(request(1, policy), idempotency_key))
        assert len(again) <= 4, again


async def test_a_completing_tree_takes_at_most_two_round_trips_beyond_its_event(
    counted: tuple[Wired, RoundTrips],
) -> None:
    wired, trips = counted
    for step in range(2):  # the first tree loads the scripts
        (tree, *_) = (
            await wired.engine.allocation.allocate(
                AllocateRequest(
                    step=step,
                    budget=2,
                    expansion=0.0,
                    policy=Policy.UNIFORM,
                    prompts=[PromptIn(prompt_id="p")],
                ),
                None,
            )
        ).trees
        await wired.engine.intake.expand(rollout(tree.tree_id, None, 2, 1.0))
        answer, sent = await trips.during(wired.engine.intake.expand(rollout(tree.tree_id, None, 2, 0.0)))
        assert answer.completed == [tree.tree_id]
    assert sent[0].startswith("pipeline(EVALSHA") or sent[0] == "EVALSHA", sent  # the event's own script
    assert len(sent) - 1 <= 2, sent
