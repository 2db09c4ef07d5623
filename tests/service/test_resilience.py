"""Concurrency, leases, lapsed decisions, restarts of the service and of Redis."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest
from redis.exceptions import DataError
from support import make_settings, rollout, running_engine, turn

from trace_client import AsyncTraceClient, TraceClient
from trace_lab.local import RedisServer, ThreadedService, free_port
from trace_proto import AllocateRequest, PromptIn
from trace_service.engine import maintenance


def one_prompt(client: TraceClient, budget: int = 4, expansion: float = 1.0) -> tuple[str, int, int]:
    allocation = client.allocate(
        AllocateRequest(
            step=0, budget=budget, expansion=expansion, prompts=[PromptIn(prompt_id="p", text="t")]
        )
    )
    tree = allocation.trees[0]
    return tree.tree_id, tree.rollouts, tree.expansion_budget


async def test_concurrent_clients_never_overspend(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        tree_id, rollouts, expansion = one_prompt(client)
    clients = [AsyncTraceClient(service.url) for _ in range(12)]
    try:
        # Twelve workers race to start bare rollouts of a tree that was promised four.
        starts = [turn(tree_id, None) for _ in clients]
        answers = await asyncio.gather(*(c.expand([e]) for c, e in zip(clients, starts, strict=True)))
        assert sum(a.accepted for a in answers) == rollouts
        started = [e for e, a in zip(starts, answers, strict=True) if a.accepted]
        # The winners finish at the same moment: Stage 2 is decided exactly once, within its budget.
        finishes = await asyncio.gather(
            *(
                clients[i].expand([turn(tree_id, e.node_id, done=True, reward=float(i % 2))])
                for i, e in enumerate(started)
            )
        )
        issued = [i for f in finishes for i in f.instructions]
        assert sum(i.count for i in issued) == expansion
    finally:
        for c in clients:
            await c.aclose()


async def test_continuations_are_capped_by_their_instruction(service: ThreadedService) -> None:
    with TraceClient(service.url) as client:
        tree_id, rollouts, _ = one_prompt(client, budget=2, expansion=2.0)
        response = client.expand([e for j in range(rollouts) for e in rollout(tree_id, None, 2, float(j))])
        instructions = response.instructions
        assert sum(i.count for i in instructions) == 4
    target = instructions[0]
    clients = [AsyncTraceClient(service.url) for _ in range(8)]
    try:
        results = await asyncio.gather(
            *(c.expand([turn(tree_id, target.node_id, instruction=target.instruction_id)]) for c in clients)
        )
        assert sum(r.accepted for r in results) == target.count
        assert sum(len(r.rejected) for r in results) == len(clients) - target.count
    finally:
        for c in clients:
            await c.aclose()


def test_an_unstarted_instruction_is_offered_again_after_its_lease(store_url: str) -> None:
    settings = make_settings(store_url)
    service = ThreadedService.from_settings(settings)
    now = [time.time()]
    service.app.state.clock = lambda: now[0]  # leases run on this clock: the test moves it
    with service, TraceClient(service.url) as client:
        tree_id, rollouts, _ = one_prompt(client, budget=2, expansion=1.0)
        issued = client.expand(
            [e for j in range(rollouts) for e in rollout(tree_id, None, 2, float(j))]
        ).instructions
        assert issued
        assert client.claim_instructions("default").instructions == []  # leased to the reporting worker
        now[0] += settings.lease_seconds + 1
        offered = client.claim_instructions("default").instructions
        assert {i.instruction_id for i in offered} == {i.instruction_id for i in issued}
        assert client.claim_instructions("default").instructions == []  # leased again, to us
        # Starting every continuation takes the instruction off the queue for good.
        client.expand(
            [turn(tree_id, i.node_id, instruction=i.instruction_id) for i in issued for _ in range(i.count)]
        )
        now[0] += settings.lease_seconds + 1
        assert client.claim_instructions("default").instructions == []


async def test_a_lapsed_stage2_decision_is_taken_over(store_url: str) -> None:
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(
            AllocateRequest(step=0, budget=2, expansion=1.0, prompts=[PromptIn(prompt_id="p")]), None
        )
        tree_id = allocation.trees[0].tree_id
        # A replica records the last leaves and dies before deciding Stage 2: its claim just lapses.
        events = [e for j in range(2) for e in rollout(tree_id, None, 2, float(j))]
        (batch,) = await engine.store.apply_events(
            [(tree_id, events)], now=time.time(), success_threshold=0.5, decision_lease=0.05
        )
        assert batch.decision_round == 1
        # The claim comes with the tree as the decision must see it: what loading it gives.
        assert batch.tree is not None
        assert batch.tree == await engine.store.load_tree(tree_id)
        assert len(batch.tree.nodes) == len(events)
        assert await engine.sweeper.sweep() == 0  # still claimed
        await asyncio.sleep(0.1)
        assert await engine.sweeper.sweep() == 1
        offered = (await engine.instructions.claim("default", 10)).instructions
        assert sum(i.count for i in offered) == allocation.trees[0].expansion_budget
        assert await engine.sweeper.sweep() == 0  # decided once


async def test_the_sweeper_works_through_a_long_open_list_a_slice_per_sweep(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Abandoned trees stay open until they expire; each sweep checks a bounded slice of them and the
    next one resumes there, so a lapsed claim anywhere in the list is still found."""
    monkeypatch.setattr(maintenance, "_SWEEP_PAGE", 50)
    monkeypatch.setattr(maintenance, "_SWEEP_PAGES", 2)
    async with running_engine(store_url) as engine:
        prompts = [PromptIn(prompt_id=f"p{i}") for i in range(400)]
        allocation = await engine.allocation.allocate(
            AllocateRequest(step=0, budget=800, min_rollouts=2, expansion=1.0, prompts=prompts), None
        )
        tree_id = allocation.trees[-1].tree_id
        events = [e for j in range(2) for e in rollout(tree_id, None, 2, float(j))]
        (batch,) = await engine.store.apply_events(
            [(tree_id, events)], now=time.time(), success_threshold=0.5, decision_lease=0.0
        )
        assert batch.decision_round == 1
        checked: list[int] = []
        progress = engine.store.progress

        async def counted(tree_ids: list[str]) -> object:
            checked.append(len(tree_ids))
            return await progress(tree_ids)

        monkeypatch.setattr(engine.store, "progress", counted)
        acted = []
        for _ in range(12):  # 400 trees, about 100 per sweep: every tree is seen within a few sweeps
            checked.clear()
            acted.append(await engine.sweeper.sweep())
            assert len(checked) <= 2 and sum(checked) < 150  # a slice (SSCAN's count is a hint)
        assert sum(acted) == 1
        offered = (await engine.instructions.claim("default", 10)).instructions
        (meta,) = await engine.store.load_metas([tree_id])
        assert sum(i.count for i in offered) == meta.expansion_budget > 0


def test_a_serving_only_replica_uses_what_a_trainer_replica_publishes(redis_server: RedisServer) -> None:
    """TRACE_TRAINER=false: the replica never trains, even with no trainer around; once a trainer
    replica joins, it trains on the trees the serving replica completed and the serving one loads it."""
    trainer_settings = make_settings(redis_server.url)
    serving_settings = trainer_settings.model_copy(update={"trainer": False})
    with ThreadedService.from_settings(serving_settings) as serving, TraceClient(serving.url) as client:
        prompts = [PromptIn(prompt_id=f"p{i}", text=f"task {i % 3}") for i in range(24)]
        allocation = client.allocate(
            AllocateRequest(step=0, budget=96, min_rollouts=4, expansion=0.0, prompts=prompts)
        )
        events = [
            e for tree in allocation.trees for j in range(tree.rollouts)
            for e in rollout(tree.tree_id, None, 3, float(j % 2))
        ]  # fmt: skip
        assert len(client.expand(events).completed) == len(allocation.trees)
        time.sleep(5 * serving_settings.train_interval_seconds)
        assert client.predictor_info().version == 0
        with ThreadedService.from_settings(trainer_settings):
            deadline = time.monotonic() + 30
            while client.predictor_info().version == 0 and time.monotonic() < deadline:
                time.sleep(0.1)
        info = client.predictor_info()
        assert info.version > 0
        # The prior's calibration, fitted to the 24 trees' groups, travels with the weights.
        assert info.prior is not None and info.prior.groups >= 16
        assert set(info.prior.log_likelihood) == {"network", "history"}
        assert info.prior.source in ("network", "history") and info.prior.concentration > 0


async def test_a_pipeline_of_scripts_survives_redis_losing_its_scripts(store_url: str) -> None:
    """After a restart Redis has no scripts: pipelined calls that find theirs gone did not run, and run
    again once it is loaded (never twice)."""
    async with running_engine(store_url) as engine:
        allocation = await engine.allocation.allocate(
            AllocateRequest(
                step=0, budget=4, min_rollouts=2, prompts=[PromptIn(prompt_id=f"p{i}") for i in range(2)]
            ),
            None,
        )
        batches = [(tree.tree_id, rollout(tree.tree_id, None, 2, 1.0)) for tree in allocation.trees]
        await engine.store.redis.script_flush()
        applied = await engine.store.apply_events(
            batches, now=time.time(), success_threshold=0.5, decision_lease=30.0
        )
        assert [[o.code for o in batch.outcomes] for batch in applied] == [[200, 200], [200, 200]]
        again = await engine.store.apply_events(
            batches, now=time.time(), success_threshold=0.5, decision_lease=30.0
        )
        assert [[o.code for o in batch.outcomes] for batch in again] == [[208, 208], [208, 208]]


async def test_a_damaged_tree_fails_alone(store_url: str) -> None:
    """One tree whose stored state cannot be read fails the request (503, retried), but the other trees
    of the request are recorded and followed up."""
    async with running_engine(store_url) as engine:
        prompts = [PromptIn(prompt_id=f"p{i}", text=f"prompt {i}") for i in range(2)]
        allocation = await engine.allocation.allocate(
            AllocateRequest(step=0, budget=4, min_rollouts=2, expansion=1.0, prompts=prompts), None
        )
        damaged, healthy = (tree.tree_id for tree in allocation.trees)
        redis, keys = engine.store.redis, engine.store.keys
        await redis.hset(keys.tree(damaged).meta, "spec", "{not json")
        events = [
            e for tree_id in (damaged, healthy) for j in range(2) for e in rollout(tree_id, None, 2, float(j))
        ]
        with pytest.raises(DataError, match=damaged):
            await engine.intake.expand(events)
        tree = await engine.store.load_tree(healthy)
        assert tree is not None and tree.prompt_text == "prompt 1"
        assert sum(i.count for i in tree.instructions.values()) == tree.meta.expansion_budget > 0


async def test_one_tree_that_fails_does_not_stop_the_sweeper(
    store_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    async with running_engine(store_url) as engine:
        prompts = [PromptIn(prompt_id=f"p{i}") for i in range(3)]
        allocation = await engine.allocation.allocate(
            AllocateRequest(step=0, budget=6, min_rollouts=2, expansion=0.0, prompts=prompts), None
        )
        trees = [tree.tree_id for tree in allocation.trees]
        # Finished trees whose accounting never ran (their replica died right after the last event).
        applied = await engine.store.apply_events(
            [
                (tree_id, [e for j in range(2) for e in rollout(tree_id, None, 2, float(j))])
                for tree_id in trees
            ],
            now=time.time(),
            success_threshold=0.5,
            decision_lease=30.0,
        )
        assert all(not isinstance(batch, Exception) and batch.completed for batch in applied)
        completion = engine.sweeper.completion
        original = completion.completed

        async def failing_for_one(tree_id: str, meta: object = None) -> None:
            if tree_id == trees[0]:
                raise RuntimeError("a damaged tree")
            await original(tree_id)

        monkeypatch.setattr(completion, "completed", failing_for_one)
        assert await engine.sweeper.sweep() == 2
        assert set(await _open_trees(engine, "default")) == {trees[0]}


async def _open_trees(engine: Any, job: str) -> list[str]:
    cursor, found = 0, []
    while True:
        cursor, page = await engine.store.open_trees(job, cursor)
        found.extend(page)
        if cursor == 0:
            return found


def test_nothing_is_lost_across_a_service_restart(redis_server: RedisServer) -> None:
    settings = make_settings(redis_server.url)
    with ThreadedService.from_settings(settings) as first, TraceClient(first.url) as client:
        tree_id, rollouts, _ = one_prompt(client, budget=2, expansion=1.0)
        half = rollout(tree_id, None, 2, 1.0)
        client.expand(half)
    with ThreadedService.from_settings(settings) as second, TraceClient(second.url) as client:
        rest = rollout(tree_id, None, 2, 0.0)
        response = client.expand([*half, *rest])
        assert response.duplicates == len(half)
        assert response.accepted == len(rest)
        for instruction in response.instructions:
            client.expand(
                [
                    e
                    for _ in range(instruction.count)
                    for e in rollout(tree_id, instruction.node_id, 1, 1.0, instruction.instruction_id)
                ]
            )
        tree = client.get_tree(tree_id)
        assert tree.status == "complete"
        assert sum(n.reward is not None for n in tree.nodes) == rollouts + tree.expansion_budget


def test_redis_down_gives_clear_errors_and_recovers(redis_server: RedisServer) -> None:
    with (
        ThreadedService.from_settings(make_settings(redis_server.url)) as live,
        TraceClient(live.url, max_retries=0) as client,
    ):
        tree_id, _, _ = one_prompt(client, budget=2)
        first = rollout(tree_id, None, 2, 1.0)
        client.expand(first)
        redis_server.stop()
        try:
            answer = httpx.post(f"{live.url}/v1/expand", json={"events": [turn(tree_id, None).model_dump()]})
            assert answer.status_code == 503
            assert answer.headers["retry-after"]
            assert "unavailable" in answer.json()["detail"]
            assert httpx.get(f"{live.url}/readyz").status_code == 503
            assert httpx.get(f"{live.url}/healthz").status_code == 200
            exposition = httpx.get(f"{live.url}/metrics").text
            assert 'trace_store_errors_total{operation="/v1/expand"} 1.0' in exposition
            assert "trace_store_up 0.0" in exposition
        finally:
            redis_server.start()
        response = client.expand([*first, *rollout(tree_id, None, 2, 0.0)])
        assert (response.duplicates, response.accepted) == (2, 2)  # what was recorded survived
        assert httpx.get(f"{live.url}/readyz").status_code == 200


@pytest.mark.parametrize("store_url", ["embedded"], indirect=True)
def test_auth_body_limit_and_request_ids(store_url: str) -> None:
    settings = make_settings(store_url, auth_tokens="s3cret,other", max_body_bytes=2048)
    with ThreadedService.from_settings(settings) as live:
        denied = httpx.get(f"{live.url}/v1/predictor", headers={"X-Request-ID": "abc-1"})
        assert denied.status_code == 401
        assert denied.json()["request_id"] == "abc-1"
        assert denied.headers["x-request-id"] == "abc-1"
        assert httpx.get(f"{live.url}/healthz").status_code == 200  # health stays open
        with TraceClient(live.url, token="other") as client:
            assert client.predictor_info().version == 0
        big = {"step": 0, "budget": 1, "prompts": [{"prompt_id": "p", "text": "x" * 4096}]}
        too_big = httpx.post(f"{live.url}/v1/allocate", json=big, headers={"Authorization": "Bearer s3cret"})
        assert too_big.status_code == 413
        assert too_big.headers["content-type"].startswith("application/problem+json")


@pytest.mark.parametrize("store_url", ["embedded"], indirect=True)
def test_metrics_can_live_on_their_own_port(store_url: str) -> None:
    port = free_port()
    with ThreadedService.from_settings(make_settings(store_url, metrics_port=port)) as live:
        assert httpx.get(f"{live.url}/metrics").status_code == 404
        assert "trace_expand_events_total" in httpx.get(f"http://127.0.0.1:{port}/metrics").text
