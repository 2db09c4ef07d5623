"""The audit the fault tests rely on finds what it is meant to find: lost, invented and doubly applied
events, over-spent budgets, open trees."""

from __future__ import annotations

import dataclasses

import pytest

from trace_lab.load import Audit, Ledger, audit, percentile
from trace_proto import (
    ExpandEvent,
    ExpandResponse,
    Instruction,
    JobStats,
    StepStats,
    TreeAllocation,
    TreeNode,
    TreeResponse,
    TreeStatus,
)

TREE = "t"
ALLOCATION = TreeAllocation(
    prompt_id="p", tree_id=TREE, rollouts=2, expansion_budget=1, predicted_success=0.5
)
INSTRUCTION = Instruction(instruction_id="i", tree_id=TREE, node_id="a1", count=1)


def event(
    node: str, parent: str | None, reward: float | None = None, instruction: str | None = None
) -> ExpandEvent:
    return ExpandEvent(
        event_id=f"e-{node}",
        tree_id=TREE,
        node_id=node,
        parent_id=parent,
        done=reward is not None,
        reward=reward,
        instruction_id=instruction,
    )


#: Two bare rollouts (a1 → a2, b1) and the one continuation the instruction allows (c1 from a1).
EVENTS = [event("a1", None), event("a2", "a1", 1.0), event("b1", None, 0.0), event("c1", "a1", 0.0, "i")]


def exported(events: list[ExpandEvent], status: TreeStatus = TreeStatus.COMPLETE) -> TreeResponse:
    """The tree as the service would export these events (values are irrelevant to the audit)."""
    depth: dict[str, int] = {}
    nodes = []
    for e in events:
        depth[e.node_id] = 1 + (depth[e.parent_id] if e.parent_id else 0)
        nodes.append(
            TreeNode(
                node_id=e.node_id,
                parent_id=e.parent_id,
                depth=depth[e.node_id],
                visits=0,
                successes=0,
                reward=e.reward,
                instruction_id=e.instruction_id,
            )
        )
    return TreeResponse(
        tree_id=TREE,
        prompt_id="p",
        job="j",
        step=0,
        status=status,
        mixed=True,
        rollouts=ALLOCATION.rollouts,
        expansion_budget=ALLOCATION.expansion_budget,
        nodes=nodes,
    )


def stats(bare_spent: int = 2, continuations_spent: int = 1, promised: int = 1) -> JobStats:
    step = StepStats(
        step=0,
        prompts=1,
        active=1,
        skipped=0,
        trees_complete=1,
        mixed=1,
        budget_promised=ALLOCATION.rollouts,
        rollouts_spent=bare_spent,
        continuations_promised=promised,
        continuations_spent=continuations_spent,
        fallback_units=0,
    )
    return JobStats(job="j", steps=[step])


def ledger_of(events: list[ExpandEvent]) -> Ledger:
    """Workers that sent `events` in one batch, all accepted, and saw the instruction."""
    ledger = Ledger()
    ledger.note_sent(events)
    ledger.record(events, ExpandResponse(accepted=len(events), duplicates=0))
    ledger.instructions[INSTRUCTION.instruction_id] = INSTRUCTION
    return ledger


CLEAN = Audit(
    trees=1,
    complete=1,
    closed=0,
    open=0,
    events=4,
    lost=0,
    phantom=0,
    over_accepted=0,
    miscounted=0,
    overspent=0,
    unexpected_rejections=0,
)


def test_a_faithful_run_is_clean() -> None:
    result = audit(ledger_of(EVENTS), [ALLOCATION], [exported(EVENTS)], stats())
    assert result == CLEAN
    assert result.clean


def test_an_acknowledged_event_missing_from_the_tree_is_lost() -> None:
    result = audit(ledger_of(EVENTS), [ALLOCATION], [exported(EVENTS[:2] + EVENTS[3:])], stats())
    assert result == dataclasses.replace(CLEAN, lost=1, miscounted=1)  # b1 gone; stats still count it
    assert not result.clean


def test_a_node_nobody_sent_is_a_phantom() -> None:
    stranger = event("x1", None, 1.0)
    result = audit(ledger_of(EVENTS), [ALLOCATION], [exported([*EVENTS, stranger])], stats())
    assert (result.phantom, result.overspent) == (1, 1)  # also a third bare start of two promised


def test_budgets_over_spent_are_counted_per_formula() -> None:
    extra = event("c2", "a1", 1.0, "i")
    events = [*EVENTS, extra]
    result = audit(ledger_of(events), [ALLOCATION], [exported(events)], stats(continuations_spent=2))
    # instruction i started twice for count 1; two continuation starts for a budget of 1; stats spent
    # two continuations of one promised.
    assert result.overspent == 3
    assert result.miscounted == 0


def test_acceptances_beyond_the_distinct_events_are_doubly_applied() -> None:
    ledger = ledger_of(EVENTS)
    ledger.record(EVENTS[:1], ExpandResponse(accepted=1, duplicates=0))
    assert audit(ledger, [ALLOCATION], [exported(EVENTS)], stats()).over_accepted == 1


def test_an_unfinished_tree_is_open() -> None:
    result = audit(ledger_of(EVENTS), [ALLOCATION], [exported(EVENTS, TreeStatus.EXPANDING)], stats())
    assert (result.complete, result.open, result.clean) == (0, 1, False)


def test_the_audit_needs_the_export_of_every_allocated_tree() -> None:
    with pytest.raises(ValueError, match="allocated trees"):
        audit(ledger_of(EVENTS), [ALLOCATION], [], stats())


@pytest.mark.parametrize(
    ("q", "expected"), [(0.0, 1.0), (0.25, 1.0), (0.5, 2.0), (0.51, 3.0), (0.99, 4.0), (1.0, 4.0)]
)
def test_percentile_is_the_nearest_rank(q: float, expected: float) -> None:
    assert percentile([4.0, 1.0, 3.0, 2.0], q) == expected


def test_percentile_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 0.5)
    with pytest.raises(ValueError, match="q must be"):
        percentile([1.0], 1.5)


def test_a_tree_granted_more_than_the_steps_shares_is_over_spent() -> None:
    """Under a policy that shares continuations a tree may hold more than its own share, but the
    step's trees never more than their shares together."""
    granted = exported(EVENTS).model_copy(update={"expansion_budget": ALLOCATION.expansion_budget + 1})
    assert audit(ledger_of(EVENTS), [ALLOCATION], [granted], stats()).overspent == 1


def test_leaves_are_miscounted_step_by_step() -> None:
    """Each step of the stats is held to its own exported trees: a step that counts one continuation
    too many and a step whose trees were never exported both count."""
    (faithful,) = stats(continuations_spent=2).steps
    orphan = faithful.model_copy(update={"step": 1, "continuations_spent": 1})
    two_steps = JobStats(job="j", steps=[faithful, orphan])
    result = audit(ledger_of(EVENTS), [ALLOCATION], [exported(EVENTS)], two_steps)
    # step 0: one continuation leaf too many; step 1: two bare and one continuation leaf with no tree.
    assert result.miscounted == 1 + 3
