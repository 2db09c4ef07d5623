"""Intake, Stage 2 and instruction leases on the components directly."""

from __future__ import annotations

from engine_support import Wired
from support import rollout, turn

from trace_proto import AllocateRequest, Policy, PromptIn, TreeAllocation, TreeResponse


async def one_tree(wired: Wired, budget: int = 2, expansion: float = 1.0) -> TreeAllocation:
    request = AllocateRequest(
        step=0, budget=budget, expansion=expansion, policy=Policy.UNIFORM, prompts=[PromptIn(prompt_id="p")]
    )
    (tree,) = (await wired.engine.allocation.allocate(request, None)).trees
    return tree


async def test_one_bad_event_is_refused_and_the_good_ones_around_it_are_recorded(wired: Wired) -> None:
    tree = await one_tree(wired)
    good = rollout(tree.tree_id, None, 2, 1.0)
    bad = turn(tree.tree_id, None).model_copy(update={"features": [0.5]})  # this server takes none
    unknown = turn("no-such-tree", None)
    answer = await wired.engine.intake.expand([good[0], bad, good[1], unknown])
    assert (answer.accepted, answer.duplicates) == (2, 0)
    assert [(r.event_id, r.status) for r in answer.rejected] == [(bad.event_id, 422), (unknown.event_id, 404)]
    assert "feature_dim=0" in answer.rejected[0].error
    exported = TreeResponse.model_validate_json(await wired.engine.trees.tree(tree.tree_id))
    assert [node.node_id for node in exported.nodes] == [good[0].node_id, good[1].node_id]
    assert wired.sample("trace_expand_events_total", {"outcome": "rejected"}) == 2
    # The same events again are acknowledged as duplicates, not recorded twice.
    again = await wired.engine.intake.expand(good)
    assert (again.accepted, again.duplicates) == (0, 2)


async def test_stage2_comes_due_with_the_last_bare_leaf_and_its_instructions_are_leased(wired: Wired) -> None:
    tree = await one_tree(wired, budget=2, expansion=2.0)
    assert (tree.rollouts, tree.expansion_budget) == (2, 4)
    first = await wired.engine.intake.expand(rollout(tree.tree_id, None, 2, 1.0))
    assert first.instructions == []  # one bare leaf of two: not due yet
    answer = await wired.engine.intake.expand(rollout(tree.tree_id, None, 2, 0.0))
    issued = answer.instructions
    assert sum(i.count for i in issued) == 4 and {i.tree_id for i in issued} == {tree.tree_id}
    instructions = wired.engine.instructions
    # Leased to the worker whose events made them due; offered to anyone once that lease runs out.
    assert (await instructions.claim("default", 10)).instructions == []
    wired.clock.advance(wired.settings.lease_seconds + 1)
    offered = (await instructions.claim("default", 10)).instructions
    assert {(i.instruction_id, i.count) for i in offered} == {(i.instruction_id, i.count) for i in issued}
    assert (await instructions.claim("default", 10)).instructions == []  # leased again, to the claimer
    # Starting every continuation takes the instruction off the queue for good.
    started = [
        turn(tree.tree_id, i.node_id, instruction=i.instruction_id) for i in issued for _ in range(i.count)
    ]
    assert (await wired.engine.intake.expand(started)).accepted == 4
    wired.clock.advance(wired.settings.lease_seconds + 1)
    assert (await instructions.claim("default", 10)).instructions == []


async def test_a_resent_rollout_end_gets_the_unstarted_instructions_again(wired: Wired) -> None:
    tree = await one_tree(wired, budget=2, expansion=1.0)
    events = rollout(tree.tree_id, None, 2, 1.0) + rollout(tree.tree_id, None, 2, 0.0)
    issued = (await wired.engine.intake.expand(events)).instructions
    assert sum(i.count for i in issued) == 2
    resent = await wired.engine.intake.expand(events)  # the worker lost the answer
    assert resent.duplicates == len(events)
    assert {(i.instruction_id, i.count) for i in resent.instructions} == {
        (i.instruction_id, i.count) for i in issued
    }
