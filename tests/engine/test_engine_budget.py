"""The store's byte budget: measured, and at it new allocations are refused while the trees in flight
finish."""

from __future__ import annotations

import pytest
from engine_support import Wired, wire
from support import make_settings, rollout

from trace_proto import AllocateRequest, Policy, PromptIn
from trace_service.engine import StoreFullError


def request(step: int) -> AllocateRequest:
    return AllocateRequest(
        job="job",
        step=step,
        budget=8,
        expansion=0.0,
        policy=Policy.UNIFORM,
        prompts=[PromptIn(prompt_id=f"p{i}", text=f"solve task {i}") for i in range(4)],
    )


async def test_the_in_process_store_is_measured_by_what_it_holds(wired: Wired) -> None:
    await wired.engine.budget.measure()
    empty = wired.engine.budget.used
    await wired.engine.allocation.allocate(request(0), None)
    await wired.engine.budget.measure()
    assert wired.engine.budget.used > empty
    assert wired.sample("trace_store_bytes") == wired.engine.budget.used
    assert wired.engine.budget.budget == 0  # no maxmemory in process, none configured: no budget


async def test_a_full_store_refuses_new_allocations_and_lets_trees_in_flight_finish() -> None:
    async with wire(make_settings(store_max_bytes=1)) as wired:
        answer = await wired.engine.allocation.allocate(request(0), "key-0")  # not measured yet: room
        await wired.engine.budget.measure()
        with pytest.raises(StoreFullError, match="the tree store is full"):
            await wired.engine.allocation.allocate(request(1), None)
        assert wired.sample("trace_store_full_refusals_total") == 1
        # An answer already given is no new work: its retry gets it.
        assert (await wired.engine.allocation.allocate(request(0), "key-0")).trees == answer.trees
        events = [
            e
            for tree in answer.trees
            for _ in range(tree.rollouts)
            for e in rollout(tree.tree_id, None, 2, 1.0)
        ]
        assert (await wired.engine.intake.expand(events)).accepted == len(events)
        progress = [await wired.store.load_tree(tree.tree_id) for tree in answer.trees]
        assert all(tree is not None and tree.meta.finished for tree in progress)
