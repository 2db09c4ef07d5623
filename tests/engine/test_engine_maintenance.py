"""The sweeper, closing a tree and job statistics on the components directly."""

from __future__ import annotations

import pytest
from engine_support import Wired
from support import rollout

from trace_proto import AllocateRequest, Policy, PromptIn, TreeResponse, TreeStatus
from trace_service.engine import NotFoundError


async def allocate(wired: Wired, prompts: int, expansion: float) -> list[str]:
    request = AllocateRequest(
        step=0,
        budget=2 * prompts,
        expansion=expansion,
        min_rollouts=2,
        policy=Policy.UNIFORM,
        prompts=[PromptIn(prompt_id=f"p{i}") for i in range(prompts)],
    )
    return [tree.tree_id for tree in (await wired.engine.allocation.allocate(request, None)).trees]


async def open_trees(wired: Wired) -> set[str]:
    cursor, found = 0, set()
    while True:
        cursor, page = await wired.store.open_trees("default", cursor)
        found.update(page)
        if cursor == 0:
            return found


async def test_the_sweeper_decides_a_round_whose_claim_lapsed(wired: Wired) -> None:
    (tree_id,) = await allocate(wired, 1, expansion=1.0)
    # A replica records the last bare leaves and dies before deciding: its claim just lapses.
    events = rollout(tree_id, None, 2, 1.0) + rollout(tree_id, None, 2, 0.0)
    (batch,) = await wired.store.apply_events(
        [(tree_id, events)],
        now=wired.clock(),
        success_threshold=wired.settings.success_threshold,
        decision_lease=wired.settings.decision_lease_seconds,
    )
    assert not isinstance(batch, Exception) and batch.decision_round == 1
    sweeper = wired.engine.sweeper
    assert await sweeper.sweep() == 0  # still claimed
    wired.clock.advance(wired.settings.decision_lease_seconds + 1)
    assert await sweeper.sweep() == 1
    # Decided by the sweeper, not for a reporting worker: free to claim at once.
    offered = (await wired.engine.instructions.claim("default", 10)).instructions
    assert sum(i.count for i in offered) == 2
    assert await sweeper.sweep() == 0  # decided once


async def test_the_sweeper_accounts_for_finished_trees_and_forgets_expired_ones(wired: Wired) -> None:
    finished, expired, waiting = await allocate(wired, 3, expansion=0.0)
    # Finished, but its replica died before the completion's bookkeeping.
    events = rollout(finished, None, 1, 1.0) + rollout(finished, None, 1, 0.0)
    await wired.store.apply_events(
        [(finished, events)], now=wired.clock(), success_threshold=0.5, decision_lease=30.0
    )
    await wired.store.redis.delete(*wired.store.keys.tree(expired).all)  # as its TTL would
    assert await open_trees(wired) == {finished, expired, waiting}
    assert await wired.engine.sweeper.sweep() == 1
    assert await open_trees(wired) == {waiting}
    assert wired.sample("trace_trees_completed_total", {"training_job": "default", "mixed": "true"}) == 1


async def test_closing_a_tree_withdraws_its_instructions_and_finishes_it(wired: Wired) -> None:
    tree_id, other = await allocate(wired, 2, expansion=1.0)
    events = rollout(tree_id, None, 2, 1.0) + rollout(tree_id, None, 2, 0.0)
    issued = (await wired.engine.intake.expand(events)).instructions
    assert issued
    closed = TreeResponse.model_validate_json(await wired.engine.trees.close(tree_id))
    assert closed.status is TreeStatus.CLOSED and len(closed.nodes) == 4
    wired.clock.advance(wired.settings.lease_seconds + 1)
    assert (await wired.engine.instructions.claim("default", 10)).instructions == []
    assert (
        TreeResponse.model_validate_json(await wired.engine.trees.close(tree_id)).status is TreeStatus.CLOSED
    )  # closing again
    assert await open_trees(wired) == {other}
    with pytest.raises(NotFoundError, match="no-such-tree"):
        await wired.engine.trees.close("no-such-tree")


async def test_job_stats_count_what_each_step_promised_and_spent(wired: Wired) -> None:
    mixed, agreed = await allocate(wired, 2, expansion=0.0)
    await wired.engine.intake.expand(rollout(mixed, None, 2, 1.0) + rollout(mixed, None, 2, 0.0))
    await wired.engine.intake.expand(rollout(agreed, None, 1, 1.0))
    (step,) = (await wired.engine.stats.job_stats("default")).steps
    assert (step.prompts, step.active, step.skipped) == (2, 2, 0)
    assert (step.trees_complete, step.mixed) == (1, 1)
    assert (step.budget_promised, step.rollouts_spent) == (4, 3)
    assert (step.continuations_promised, step.continuations_spent) == (0, 0)
    assert step.effective_ratio == pytest.approx(0.5)
    with pytest.raises(NotFoundError, match="other"):
        await wired.engine.stats.job_stats("other")
