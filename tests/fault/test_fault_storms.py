"""Duplicate and reordered event storms over two replicas: every event sent three times at once, batches
shuffled, children before their parents within a batch.  Every event must take effect exactly once."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator, Sequence

import pytest
from fault_support import assert_clean, new_prefix, replica_settings
from support import rollout

from trace_client import AsyncTraceClient
from trace_lab.load import UNKNOWN_PARENT, Ledger, LoadConfig, LoadRun, Replicas, export_run
from trace_lab.local import RedisServer, ThreadedService
from trace_proto import AllocateRequest, ExpandEvent, ExpandResponse, Instruction, PromptIn, TreeStatus

_COPIES = 3
_BATCHES = 3
_ROUNDS = 10


@pytest.fixture(scope="module")
def replicas(redis_server: RedisServer) -> Iterator[list[ThreadedService]]:
    settings = replica_settings(redis_server.url, new_prefix())
    with ThreadedService.from_settings(settings) as first, ThreadedService.from_settings(settings) as second:
        yield [first, second]


def children_first(
    batch: Sequence[ExpandEvent], depth: dict[str, int], rng: random.Random
) -> list[ExpandEvent]:
    return sorted(rng.sample(list(batch), len(batch)), key=lambda event: -depth[event.node_id])


def depths(events: Sequence[ExpandEvent], known: dict[str, int]) -> dict[str, int]:
    """Depth of every node, given the depths of the nodes the events attach to; events in chain order."""
    depth = dict(known)
    for event in events:
        depth[event.node_id] = 1 + (depth[event.parent_id] if event.parent_id else 0)
    return depth


async def storm(
    clients: Sequence[AsyncTraceClient], events: Sequence[ExpandEvent], depth: dict[str, int], seed: int
) -> tuple[list[ExpandResponse], set[str]]:
    """Send `events` as shuffled batches, each batch three times at once over the replicas, children first
    within a batch, until each event is acknowledged or refused for good; a child refused because its
    parent had not arrived yet goes again in the next round, unless its parent was refused for good.
    Returns every answer and the node ids refused for good."""
    rng = random.Random(seed)
    answers: list[ExpandResponse] = []
    refused_for_good: set[str] = set()
    remaining = list(events)
    for _ in range(_ROUNDS):
        batches: list[list[ExpandEvent]] = [[] for _ in range(_BATCHES)]
        for event in rng.sample(remaining, len(remaining)):
            batches[rng.randrange(_BATCHES)].append(event)
        copies = [children_first(batch, depth, rng) for batch in batches if batch for _ in range(_COPIES)]
        round_answers = await asyncio.gather(
            *(clients[i % len(clients)].expand(copy) for i, copy in enumerate(copies))
        )
        answers.extend(round_answers)
        acknowledged = {
            event.event_id
            for copy, answer in zip(copies, round_answers, strict=True)
            for event in copy
            if event.event_id not in {item.event_id for item in answer.rejected}
        }
        reasons = {item.event_id: item.error for answer in round_answers for item in answer.rejected}
        waiting = []
        for event in (e for e in remaining if e.event_id not in acknowledged):
            if UNKNOWN_PARENT in reasons[event.event_id] and event.parent_id not in refused_for_good:
                waiting.append(event)
            else:
                refused_for_good.add(event.node_id)
        if not waiting:
            return answers, refused_for_good
        remaining = waiting
    raise AssertionError(f"{len(remaining)} events still waiting for their parents after {_ROUNDS} rounds")


async def test_a_storm_of_copies_takes_effect_exactly_once(replicas: list[ThreadedService]) -> None:
    clients = [AsyncTraceClient(live.url, max_retries=0) for live in replicas]
    try:
        allocation = await clients[0].allocate(
            AllocateRequest(
                job="storm-tree", step=0, budget=4, expansion=1.0, prompts=[PromptIn(prompt_id="p")]
            )
        )
        tree = allocation.trees[0]
        bare = [e for j in range(tree.rollouts) for e in rollout(tree.tree_id, None, 3, float(j % 2))]
        depth = depths(bare, {})
        answers, refused = await storm(clients, bare, depth, seed=1)
        assert refused == set()
        assert sum(a.accepted for a in answers) == len(bare)  # once each; every other copy a duplicate
        # The decision was made once: copies of the batch that ended the bare rollouts may get the same
        # instructions again (resending is how a worker recovers a lost answer), never other ones.
        offered: dict[str, Instruction] = {}
        for answer in answers:
            for instruction in answer.instructions:
                assert offered.setdefault(instruction.instruction_id, instruction) == instruction
        instructions = list(offered.values())
        assert instructions
        promised = sum(i.count for i in instructions)
        assert promised <= tree.expansion_budget

        # Every continuation promised, plus one more from the first instruction: exactly one never starts.
        starts = [*(i for i in instructions for _ in range(i.count)), instructions[0]]
        runs = [rollout(tree.tree_id, i.node_id, 2, 1.0, i.instruction_id) for i in starts]
        flat = [e for run in runs for e in run]
        answers, refused = await storm(clients, flat, depths(flat, depth), seed=2)
        assert len(refused) == 2  # both turns of exactly one continuation
        assert sum(a.accepted for a in answers) == len(flat) - 2

        exported = await clients[1].get_tree(tree.tree_id)
        assert exported.status is TreeStatus.COMPLETE
        assert {n.node_id for n in exported.nodes} == {e.node_id for e in bare + flat} - refused
        for instruction in instructions:
            started = [n for n in exported.nodes if n.instruction_id == instruction.instruction_id]
            assert len(started) == instruction.count
        (step,) = (await clients[0].job_stats("storm-tree")).steps
        assert (step.rollouts_spent, step.continuations_promised, step.continuations_spent) == (
            tree.rollouts,
            promised,
            promised,
        )
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


async def test_a_storm_load_takes_effect_exactly_once(replicas: list[ThreadedService]) -> None:
    load = LoadConfig(job="storm-load", steps=1, prompts=8, rollouts_per_prompt=4, workers=4, storm=True)
    pool = Replicas([live.url for live in replicas], Ledger())
    try:
        run = LoadRun(pool, load)
        await run.run()
        audit = await export_run(pool, run)
    finally:
        await pool.aclose()
    assert_clean(audit)
    assert audit.complete == audit.trees
    assert pool.ledger.accepted == audit.events  # no answer was lost: every event accepted exactly once
    assert not pool.ledger.failures
