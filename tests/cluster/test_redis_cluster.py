"""The service on a three-master Redis Cluster: the whole v1 flow with trees spread over the masters, two
replicas under duplicate/reordered storms, and every key written carries an expiry (arq's rule)."""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator

import pytest
import redis
from support import make_settings, rollout

from trace_client import TraceClient
from trace_lab.load import Ledger, LoadConfig, LoadRun, Replicas, export_run
from trace_lab.local import RedisCluster, RedisNotInstalled, ThreadedService
from trace_proto import AllocateRequest, ExpandEvent, Instruction, PromptIn, TreeStatus

_TREES = 12  # all on one master by chance: 3 · 3⁻¹² ≈ 6e-6
STORM = LoadConfig(steps=1, prompts=12, rollouts_per_prompt=4, workers=4, storm=True)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisCluster]:
    nodes = RedisCluster(tmp_path_factory.mktemp("cluster"))
    try:
        nodes.start()
    except RedisNotInstalled as missing:
        pytest.skip(str(missing))
    try:
        yield nodes
    finally:
        nodes.stop()


def node(port: int) -> redis.Redis:
    return redis.Redis(host="127.0.0.1", port=port, decode_responses=True)


def continuations(instructions: list[Instruction]) -> list[ExpandEvent]:
    return [
        e
        for i in instructions
        for k in range(i.count)
        for e in rollout(i.tree_id, i.node_id, 2, float(k % 2), i.instruction_id)
    ]


def keys_by_node(cluster: RedisCluster, prefix: str) -> dict[int, dict[str, int]]:
    """Every key under `prefix` on every master, with its TTL in seconds (-1: none)."""
    found: dict[int, dict[str, int]] = {}
    for port in cluster.ports:
        with node(port) as master:
            found[port] = {
                key: int(master.ttl(key)) for key in master.scan_iter(match=f"{prefix}:*", count=1000)
            }
    return found


def assert_every_key_expires(cluster: RedisCluster, prefix: str) -> None:
    keys = keys_by_node(cluster, prefix)
    assert any(keys.values())
    without_expiry = {key: ttl for found in keys.values() for key, ttl in found.items() if ttl <= 0}
    assert without_expiry == {}


def wait_for_published_weights(cluster: RedisCluster, prefix: str, job: str) -> None:
    """Until the first publication of predictor weights has its expiry.  A replica shut down while it
    publishes for the first time leaves an immortal key (tests/fault/test_fault_store_windows.py shows
    that bug on its own); waiting keeps it out of these tests."""
    weights = f"{prefix}:{{j:{job}}}:weights"
    deadline = time.monotonic() + 120
    with redis.RedisCluster(host="127.0.0.1", port=cluster.ports[0]) as client:
        while client.ttl(weights) <= 0 and time.monotonic() < deadline:
            time.sleep(0.05)


def test_the_v1_flow_on_a_three_master_cluster(cluster: RedisCluster) -> None:
    settings = make_settings(cluster.url, store_cluster=True)
    prompts = [PromptIn(prompt_id=f"p{i}", text=f"task {i}") for i in range(_TREES)]
    live = ThreadedService.from_settings(settings)
    now = [time.time()]
    live.app.state.clock = lambda: now[0]  # leases run on this clock: the test moves it instead of waiting
    with live, TraceClient(live.url, max_retries=0) as client:
        allocation = client.allocate(
            AllocateRequest(job="cluster", step=0, budget=4 * _TREES, expansion=1.0, prompts=prompts)
        )
        trees = {tree.tree_id: tree for tree in allocation.trees}
        assert len(trees) == _TREES

        # Bare rollouts of every tree in one request: one Lua script per tree, each on its tree's slot.
        bare = [
            e
            for tree in allocation.trees
            for j in range(tree.rollouts)
            for e in rollout(tree.tree_id, None, 3, float(j % 2))
        ]
        answer = client.expand(bare)
        assert (answer.accepted, answer.rejected) == (len(bare), [])
        issued = answer.instructions
        assert {i.tree_id for i in issued} == set(trees)
        promised = {tree_id: sum(i.count for i in issued if i.tree_id == tree_id) for tree_id in trees}
        # Every tree's bare group is mixed: under `trace` each keeps half its share, the last takes the rest.
        assert all(promised[t] == client.get_tree(t).expansion_budget > 0 for t in trees)
        assert sum(promised.values()) == sum(tree.expansion_budget for tree in trees.values())

        # Half the trees run their inline instructions; the others leave theirs to the lease.
        ids = sorted(trees)
        inline, leased, closed = set(ids[: _TREES // 2]), set(ids[_TREES // 2 : -1]), ids[-1]
        done = client.expand(continuations([i for i in issued if i.tree_id in inline]))
        assert set(done.completed) == inline
        assert client.claim_instructions("cluster").instructions == []  # still leased to the first worker
        now[0] += settings.lease_seconds + 1
        offered = client.claim_instructions("cluster", 1024).instructions
        assert {i.instruction_id for i in offered} == {
            i.instruction_id for i in issued if i.tree_id not in inline
        }
        done = client.expand(continuations([i for i in offered if i.tree_id in leased]))
        assert set(done.completed) == leased
        assert client.close_tree(closed).status is TreeStatus.CLOSED

        for tree_id, tree in trees.items():
            exported = client.get_tree(tree_id)
            leaves = [n for n in exported.nodes if n.reward is not None]
            if tree_id == closed:
                assert (exported.status, len(leaves)) == (TreeStatus.CLOSED, tree.rollouts)
            else:
                assert exported.status is TreeStatus.COMPLETE
                assert len(leaves) == tree.rollouts + promised[tree_id]
                assert exported.mixed
        (step,) = client.job_stats("cluster").steps
        assert (step.active, step.trees_complete, step.rollouts_spent) == (_TREES, _TREES, 4 * _TREES)
        assert step.continuations_promised == sum(promised.values())
        assert step.continuations_spent == sum(promised.values()) - promised[closed]

        # The trainer takes completed trees from the store and publishes weights there.
        wait_for_published_weights(cluster, settings.store_prefix, "cluster")
        assert client.predictor_info("cluster").version > 0

    keys = keys_by_node(cluster, settings.store_prefix)
    tree_metas = Counter(port for port, found in keys.items() for key in found if key.endswith(":meta"))
    assert sum(tree_metas.values()) == _TREES
    assert len(tree_metas) >= 2  # the trees' slots are spread over the masters
    assert_every_key_expires(cluster, settings.store_prefix)


async def test_two_replicas_under_storms_on_a_cluster(cluster: RedisCluster) -> None:
    """Concurrent duplicate and reordered batches from two replicas: claims, decisions, sweeps and job
    indexes on several slots at once."""
    settings = make_settings(cluster.url, store_cluster=True, lease_seconds=2, decision_lease_seconds=2)
    with ThreadedService.from_settings(settings) as first, ThreadedService.from_settings(settings) as second:
        replicas = Replicas([first.url, second.url], Ledger())
        try:
            run = LoadRun(replicas, STORM)
            await run.run()
            audit = await export_run(replicas, run)
        finally:
            await replicas.aclose()
        wait_for_published_weights(cluster, settings.store_prefix, STORM.job)
    assert audit.clean
    assert audit.complete == audit.trees == 12
    assert not replicas.ledger.failures  # a CROSSSLOT error would be a 503 here
    assert_every_key_expires(cluster, settings.store_prefix)
