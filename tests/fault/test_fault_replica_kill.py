"""Two replicas over one Redis, workers on both; one replica is SIGKILLed mid-run and the workers fail
over to the survivor: no acknowledged event is lost, no budget is over-spent, every tree finishes."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest
from fault_support import assert_clean, new_prefix, process_settings, replica_settings

from trace_lab.load import Ledger, LoadConfig, LoadRun, Replicas, export_run
from trace_lab.local import RedisServer, ServiceProcess, ThreadedService

#: Two steps: the kill falls halfway through the second step's bare rollouts, with Stage 2 decisions,
#: leases and inline instructions in flight on the victim.  A tree the fault leaves stuck is closed at
#: the step's deadline: "completed or explicitly closed" is the requirement (what a kill between two
#: store calls leaves half done is finished by the sweeper: see test_fault_store_windows.py).
LOAD = LoadConfig(
    steps=2, prompts=8, rollouts_per_prompt=4, workers=4, rollouts_per_worker=4, step_timeout=12
)


@pytest.mark.slow  # a `trace-rollout serve` process takes about ten seconds to start (torch)
async def test_a_replica_killed_mid_run_loses_nothing(redis_server: RedisServer, tmp_path: Path) -> None:
    prefix = new_prefix()
    victim = ServiceProcess(redis_server.url, tmp_path, process_settings(prefix)).start()
    try:
        with ThreadedService.from_settings(replica_settings(redis_server.url, prefix)) as survivor:
            victim.wait_ready()
            replicas = Replicas([victim.url, survivor.url], Ledger())
            run = LoadRun(replicas, LOAD)
            acknowledged_at_kill: list[int] = []

            def kill() -> None:
                acknowledged_at_kill.append(len(replicas.ledger.acknowledged))
                victim.kill()

            try:
                await run.run(fault=kill, fault_step=1)
                audit = await export_run(replicas, run)
            finally:
                await replicas.aclose()
    finally:
        victim.stop()
    assert victim.process.returncode == -signal.SIGKILL
    assert acknowledged_at_kill[0] < audit.events  # killed mid-run: work went on on the survivor
    assert_clean(audit)
    failures = replicas.ledger.failures
    assert failures["connection"] > 0  # the workers of the victim noticed and failed over
    assert failures["server_error"] == failures["timeout"] == 0
