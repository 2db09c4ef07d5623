"""A request that fails between two store calls, then is retried: the retry must finish what the first
attempt left half done.

A replica that dies between two store calls of one request leaves exactly what a Redis connection error
at that point leaves, so a store call that fails once stands in for both, deterministically.  Every
retry is what a client does on a 503: the same body, and for an allocation the same idempotency key.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

import pytest
from fault_support import fail_once, new_prefix, replica_settings
from redis.exceptions import ConnectionError as RedisConnectionError
from support import rollout

from trace_client import TraceClient, TraceUnavailable
from trace_lab.local import RedisServer, ThreadedService
from trace_proto import AllocateRequest, ExpandEvent, Instruction, Policy, PromptIn, TreeAllocation
from trace_service.store import TreeStore, connect
from trace_service.store.runner import ScriptCall

T = TypeVar("T")

#: Short leases and a fast sweeper, so that whatever the service recovers by itself comes back quickly;
#: the wait for it is generous, since a busy machine (the whole suite on two cores) slows the sweeper.
_LEASE = 0.3
_RECOVERY_SECONDS = 15.0


@pytest.fixture(scope="module")
def replica(redis_server: RedisServer) -> Iterator[ThreadedService]:
    settings = replica_settings(
        redis_server.url,
        new_prefix(),
        lease_seconds=_LEASE,
        decision_lease_seconds=_LEASE,
        sweep_interval_seconds=0.1,
    )
    with ThreadedService.from_settings(settings) as live:
        yield live


@pytest.fixture
def job() -> str:
    """Each test its own job: the replica is shared, and claims are per job."""
    return f"job-{uuid.uuid4().hex[:8]}"


def store_of(live: ThreadedService) -> TreeStore:
    store: TreeStore = live.app.state.engine.store
    return store


def one_tree(client: TraceClient, job: str, expansion: float = 1.0) -> TreeAllocation:
    request = AllocateRequest(
        job=job, step=0, budget=2, expansion=expansion, prompts=[PromptIn(prompt_id="p")]
    )
    return client.allocate(request).trees[0]


def bare_rollouts(tree: TreeAllocation) -> list[ExpandEvent]:
    """Every bare rollout of the tree, two turns each, one success and one failure."""
    return [e for j in range(tree.rollouts) for e in rollout(tree.tree_id, None, 2, float(j % 2))]


def eventually(probe: Callable[[], T], done: Callable[[T], bool]) -> T:
    """Probe until `done` holds or the recovery time is over (the sweeper and leases run on timers)."""
    deadline = time.monotonic() + _RECOVERY_SECONDS
    value = probe()
    while not done(value) and time.monotonic() < deadline:
        time.sleep(0.05)
        value = probe()
    return value


def offered(client: TraceClient, job: str) -> list[Instruction]:
    return eventually(lambda: client.claim_instructions(job).instructions, bool)


def test_a_failed_stage2_decision_is_taken_over_and_offered(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The recovery the other tests expect: the decision fails before it is recorded and its worker
    never comes back; the claim lapses, the sweeper decides the round (loading the tree itself) and
    the instructions are offered to any worker."""
    with TraceClient(replica.url, max_retries=0) as client:
        tree = one_tree(client, job)
        fail_once(monkeypatch, store_of(replica), "commit_decision")
        with pytest.raises(TraceUnavailable):
            client.expand(bare_rollouts(tree))
        assert sum(i.count for i in offered(client, job)) == tree.expansion_budget


def test_an_allocation_retried_after_a_store_failure_has_its_trees(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TraceClient(replica.url, max_retries=0) as client:
        request = AllocateRequest(job=job, step=0, budget=2, prompts=[PromptIn(prompt_id="p")])
        fail_once(monkeypatch, store_of(replica), "create_trees")
        with pytest.raises(TraceUnavailable):
            client.allocate(request, idempotency_key="step-0")
        tree = client.allocate(request, idempotency_key="step-0").trees[0]
        assert client.expand(bare_rollouts(tree)).accepted == 2 * tree.rollouts


def test_a_stage2_claim_whose_decision_was_never_recorded_is_still_decided(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """apply_events.lua claims the decision; the claimant fails before recording it.  The claim lapses
    and the sweeper, which reads the claim from the tree itself, decides the round."""
    with TraceClient(replica.url, max_retries=0) as client:
        tree = one_tree(client, job)
        fail_once(monkeypatch, store_of(replica), "commit_decision")
        with pytest.raises(TraceUnavailable):
            client.expand(bare_rollouts(tree))
        instructions = client.expand(bare_rollouts(tree)).instructions or offered(client, job)
        assert sum(i.count for i in instructions) == tree.expansion_budget


def test_instructions_claimed_between_their_offer_and_their_record_are_still_offered(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A decision offers its instructions, then records them: a worker that claims in between finds
    them offered but not recorded while the decision is under way, and they stay offered."""
    store, engine = store_of(replica), replica.app.state.engine
    run = store.scripts.run
    early: list[list[Instruction]] = []

    async def claim_before_the_record(call: ScriptCall) -> object:
        if call.script == "commit_decision" and not early:
            early.append((await engine.instructions.claim(job, 10)).instructions)
        return await run(call)

    monkeypatch.setattr(store.scripts, "run", claim_before_the_record)
    with TraceClient(replica.url, max_retries=0) as client:
        tree = one_tree(client, job)
        fail_once(monkeypatch, store, "commit_decision")  # the sweeper's decision then offers them at once
        with pytest.raises(TraceUnavailable):
            client.expand(bare_rollouts(tree))
        assert sum(i.count for i in offered(client, job)) == tree.expansion_budget
    assert early == [[]]  # the claim came in between, and took nothing not yet recorded


def test_instructions_recorded_but_whose_answer_was_lost_are_still_offered(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """commit_decision.lua records the instructions, then the replica fails before answering: the
    instructions were offered before they were recorded, so a worker can claim them."""
    store = store_of(replica)
    original = store.commit_decision

    async def recorded_then_lost(*args: object, **kwargs: object) -> tuple[bool, bool]:
        monkeypatch.setattr(store, "commit_decision", original)
        await original(*args, **kwargs)  # type: ignore[arg-type]
        raise RedisConnectionError("injected: the answer of commit_decision was lost")

    monkeypatch.setattr(store, "commit_decision", recorded_then_lost)
    with TraceClient(replica.url, max_retries=0) as client:
        tree = one_tree(client, job)
        with pytest.raises(TraceUnavailable):
            client.expand(bare_rollouts(tree))
        instructions = client.expand(bare_rollouts(tree)).instructions or offered(client, job)
        assert sum(i.count for i in instructions) == tree.expansion_budget


def test_a_tree_completed_before_a_store_failure_still_trains_the_predictor(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    with TraceClient(replica.url, max_retries=0) as client:

        def complete_a_tree() -> int:
            """Examples the predictor has seen once one more tree is complete and trained on."""
            before = client.predictor_info(job).examples_seen
            tree = one_tree(client, job, expansion=0.0)  # no Stage 2: the bare rollouts complete it
            try:
                client.expand(bare_rollouts(tree))
            except TraceUnavailable:
                client.expand(bare_rollouts(tree))  # what the client's retry does
            assert client.get_tree(tree.tree_id).status == "complete"
            return eventually(lambda: client.predictor_info(job).examples_seen, lambda seen: seen > before)

        learned_from_one = complete_a_tree()  # the same tree shape without a failure: the control
        fail_once(monkeypatch, store_of(replica), "record_completion")
        assert complete_a_tree() == 2 * learned_from_one


async def on_a_job(store: TreeStore, write: Callable[[], Awaitable[object]]) -> None:
    """A write of a job's predictor, which only a job that exists gets."""
    await store.index_allocation("job", 0, "a1", 1, [], 0, time.time())
    await write()


#: Store writes that create keys.
WRITES: dict[str, Callable[[TreeStore], Awaitable[None]]] = {
    "publish_weights": lambda store: on_a_job(store, lambda: store.publish_weights("job", 1, b"weights")),
    "publish_weights of a new job": lambda store: store.publish_weights("job", 1, b"weights", new_job=True),
    "save_predictor": lambda store: on_a_job(store, lambda: store.save_predictor("job", b"whole")),
    "hold_trainer_lease": lambda store: on_a_job(
        store, lambda: store.hold_trainer_lease("job", "a", 30.0, 1.0)
    ),
    "trainers": lambda store: store.trainers("owner", time.time(), 60.0),
    "index_allocation": lambda store: store.index_allocation("job", 0, "a1", 8, ["t1", "t2"], 4, time.time()),
    "queue_instructions": lambda store: store.queue_instructions("job", "t1", {"i1": time.time()}),
    "push_completed": lambda store: store.push_completed("job", "t1"),
}


@pytest.mark.parametrize("write", sorted(WRITES))
async def test_every_key_gets_its_expiry_in_the_write_that_creates_it(
    redis_server: RedisServer, monkeypatch: pytest.MonkeyPatch, write: str
) -> None:
    """No separate EXPIRE round trip that a dying replica could miss: with EXPIRE refused outright the
    writes still succeed, and every key they made expires."""
    store = TreeStore(connect(redis_server.url), prefix=new_prefix())
    try:

        async def refused(*args: object, **kwargs: object) -> None:
            raise RedisConnectionError("injected: a separate EXPIRE would have failed here")

        monkeypatch.setattr(store.redis, "expire", refused)
        await WRITES[write](store)
        keys = [key async for key in store.redis.scan_iter(match=f"{store.keys.prefix}:*")]
        ttls = [await store.redis.ttl(key) for key in keys]
        assert ttls
        assert min(ttls) > 0
    finally:
        await store.aclose()


@pytest.mark.parametrize("method", ["draw_continuations", "commit_decision"])
def test_a_shared_draw_interrupted_is_drawn_once(
    replica: ThreadedService, job: str, monkeypatch: pytest.MonkeyPatch, method: str
) -> None:
    """Under `trace_shared` the tree whose bare rollouts agree draws its own share and the one the
    mixed tree left; the decision fails (before or after the draw is recorded) and is taken over: the
    draw is the same, so the allocation's total is offered once, never twice."""
    with TraceClient(replica.url, max_retries=0) as client:
        request = AllocateRequest(
            job=job,
            step=0,
            budget=4,
            expansion=1.0,
            policy=Policy.TRACE_SHARED,
            control_share=0.0,
            prompts=[PromptIn(prompt_id="p1"), PromptIn(prompt_id="p2")],
        )
        donor, taker = client.allocate(request).trees
        assert client.expand(bare_rollouts(donor)).completed == [donor.tree_id]
        fail_once(monkeypatch, store_of(replica), method)
        agreeing = [e for _ in range(taker.rollouts) for e in rollout(taker.tree_id, None, 2, 0.0)]
        with pytest.raises(TraceUnavailable):
            client.expand(agreeing)
        instructions = client.expand(agreeing).instructions or offered(client, job)
        assert sum(i.count for i in instructions) == donor.expansion_budget + taker.expansion_budget
