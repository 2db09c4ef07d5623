"""Tree state: Redis in production, the same scripts on an in-process Redis by default."""

from __future__ import annotations

from trace_service.store.records import (
    AllocationCounts,
    AllocationReads,
    AppliedBatch,
    CommittedDecision,
    EventOutcome,
    GroupOutcome,
    NewTree,
    PromptOutcomes,
    StoredInstruction,
    StoredNode,
    StoredTree,
    TreeMeta,
    TreeProgress,
)
from trace_service.store.runner import RedisClient, ScriptRunner
from trace_service.store.store import TreeStore

__all__ = [
    "AllocationCounts",
    "AllocationReads",
    "AppliedBatch",
    "CommittedDecision",
    "EventOutcome",
    "GroupOutcome",
    "NewTree",
    "PromptOutcomes",
    "RedisClient",
    "ScriptRunner",
    "StoredInstruction",
    "StoredNode",
    "StoredTree",
    "TreeMeta",
    "TreeProgress",
    "TreeStore",
    "connect",
]


def connect(url: str | None, *, cluster: bool = False) -> RedisClient:
    """A Redis client for ``url``, or an in-process Redis (fakeredis with Lua) when ``url`` is empty."""
    if not url:
        import fakeredis

        return fakeredis.FakeAsyncRedis()
    if cluster:
        from redis.asyncio.cluster import RedisCluster

        return RedisCluster.from_url(url)
    from redis.asyncio import Redis
    from redis.asyncio.retry import Retry
    from redis.backoff import ExponentialBackoff

    # A connection pooled before a Redis restart fails on first use: retry such failures on a fresh one
    # (every store operation is idempotent or a Lua script that checks before it writes).
    return Redis.from_url(
        url, health_check_interval=30, retry=Retry(ExponentialBackoff(cap=0.5, base=0.02), retries=3)
    )
