"""Redis (append-only file on) is stopped mid-run and started again: while it is down every call gets a
clear 503 (never a 500, never a hang); after it is back the run finishes with nothing lost, and no
request is refused any more."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fault_support import assert_clean, new_prefix, replica_settings

from trace_client import AsyncTraceClient, TraceUnavailable
from trace_lab.load import Ledger, LoadConfig, LoadRun, Replicas, export_run
from trace_lab.local import RedisServer, ThreadedService

#: A tree the fault leaves stuck would be closed at the step's deadline: "completed or explicitly
#: closed" is the requirement (test_fault_store_windows.py pins each recovery path down).
LOAD = LoadConfig(
    steps=2, prompts=8, rollouts_per_prompt=4, workers=4, rollouts_per_worker=4, step_timeout=12
)
_DOWN_SECONDS = 1.0


@pytest.mark.slow  # about 5 s; up to 15 s when a stranded tree waits for the step's deadline
async def test_redis_restarted_mid_run_gives_503s_then_loses_nothing(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)  # our own: the session's server must not go away under other tests
    redis.start()
    settings = replica_settings(redis.url, new_prefix())
    outage: list[int] = []

    def restart() -> None:
        """SIGTERM (Redis writes its append-only file), a pause, the same port and directory again."""
        outage.append(len(replicas.ledger.acknowledged))
        redis.restart(down_seconds=_DOWN_SECONDS)

    try:
        with (
            ThreadedService.from_settings(settings) as first,
            ThreadedService.from_settings(settings) as second,
        ):
            replicas = Replicas([first.url, second.url], Ledger())
            run = LoadRun(replicas, LOAD)
            try:
                await run.run(fault=restart, fault_step=1)
                audit = await export_run(replicas, run)
            finally:
                await replicas.aclose()
    finally:
        redis.stop()
    assert outage[0] < audit.events  # the outage fell mid-run
    assert_clean(audit)
    ledger = replicas.ledger
    assert set(ledger.failures) == {"unavailable"}  # no 500, no timeout, no refused connection
    assert ledger.unavailable_details  # the 503s say what is wrong
    assert all("store is unavailable" in detail for detail in ledger.unavailable_details)


async def unavailable_in_a_burst(client: AsyncTraceClient, size: int = 32) -> int:
    """Concurrent claims: the replica serves them over as many pooled Redis connections at once."""

    async def claim() -> int:
        try:
            await client.claim_instructions("burst")
        except TraceUnavailable:
            return 1
        return 0

    return sum(await asyncio.gather(*(claim() for _ in range(size))))


async def test_once_redis_is_back_no_request_is_refused(tmp_path: Path) -> None:
    redis = RedisServer(tmp_path)
    redis.start()
    try:
        with ThreadedService.from_settings(replica_settings(redis.url, new_prefix())) as live:
            async with AsyncTraceClient(live.url, max_retries=0) as client:
                assert await unavailable_in_a_burst(client) == 0  # the pool now holds several connections
                redis.restart()
                for _ in range(200):  # at most ten seconds until /readyz sees the store again
                    if (await client.ready()).ready:
                        break
                    await asyncio.sleep(0.05)
                refused = await unavailable_in_a_burst(client)
    finally:
        redis.stop()
    assert refused == 0
