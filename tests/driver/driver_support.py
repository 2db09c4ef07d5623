"""Helpers of the driver tests: requests on the simulated workload and the books every step must close."""

from __future__ import annotations

import collections
import itertools
from typing import Any

import numpy as np
from support import make_settings

from trace_client import AsyncTraceClient
from trace_client.driver import StepResult
from trace_lab.sim import SimWorkload
from trace_lab.sim.workers import prompt_in
from trace_proto import AllocateRequest, TreeStatus
from trace_service.settings import Settings

_jobs = itertools.count()


def quiet_settings(**overrides: Any) -> Settings:
    """Settings for driver tests: a short instruction lease (an instruction whose answer was lost is
    claimable again within the test) and idle background loops (the driver needs neither training nor
    the sweeper, and a loop caught mid-call can hold up the service's shutdown)."""
    values: dict[str, Any] = {
        "lease_seconds": 0.5,
        "train_interval_seconds": 60.0,
        "sweep_interval_seconds": 60.0,
    }
    values.update(overrides)
    return make_settings(**values)


def step_request(workload: SimWorkload, *, pool: int = 12, budget: int = 36, **knobs: Any) -> AllocateRequest:
    """Step 0 of a fresh job on `pool` prompts of the workload, expansion 1 unless given."""
    prompts = [prompt_in(p) for p in workload.sample_pool(pool, np.random.default_rng(11))]
    values: dict[str, Any] = {"job": f"driver-{next(_jobs)}", "step": 0, "budget": budget, "expansion": 1.0}
    values.update(knobs)
    return AllocateRequest(prompts=prompts, **values)


async def assert_every_promise_kept(client: AsyncTraceClient, result: StepResult) -> None:
    """Every tree complete; every instruction started exactly `count` continuations, each scored; the
    service's books agree with the driver's."""
    assert not result.timed_out
    assert not result.rejected
    assert {tree.tree.status for tree in result.trees} == {TreeStatus.COMPLETE}
    ids = [instruction.instruction_id for instruction in result.instructions]
    assert len(ids) == len(set(ids)), "an instruction was run twice"
    promised = {instruction.instruction_id: instruction.count for instruction in result.instructions}
    for finished in result.trees:
        starts = collections.Counter(n.instruction_id for n in finished.tree.nodes if n.instruction_id)
        mine = {i.instruction_id: i.count for i in result.instructions if i.tree_id == finished.tree.tree_id}
        assert dict(starts) == mine
        leaves = [node for node in finished.tree.nodes if node.reward is not None]
        assert len(leaves) == finished.allocation.rollouts + sum(mine.values())
    (stats,) = (await client.job_stats(result.allocation.job)).steps
    assert stats.trees_complete == stats.active == len(result.trees)
    assert stats.rollouts_spent == stats.budget_promised == sum(t.rollouts for t in result.allocation.trees)
    assert stats.continuations_spent == stats.continuations_promised == sum(promised.values())
