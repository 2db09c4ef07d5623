"""What the store contract tests share: tree specs, events and the steps that drive a tree through its
life cycle, on the store the ``store`` fixture gives."""

from __future__ import annotations

from collections.abc import Sequence

from trace_proto import ExpandEvent
from trace_service.allocation.books import ClosedRound
from trace_service.lifecycle import EventStatus
from trace_service.store import AppliedBatch, NewTree, TreeMeta, TreeStore

JOB = "job"
THRESHOLD = 0.5
LEASE = 30.0


def new_tree(
    tree_id: str,
    *,
    rollouts: int = 2,
    budget: int = 0,
    rounds: int = 1,
    job: str = JOB,
    control: bool = False,
    predicted: float = 0.5,
) -> NewTree:
    return NewTree(
        tree_id=tree_id, allocation_id="alloc", job=job, step=3, prompt_id=f"p-{tree_id}",
        prompt_text="find the key", prompt_features=None, rollouts=rollouts, expansion_budget=budget,
        rounds=rounds, policy="trace", predicted_success=predicted, return_unspent=False,
        prior_outcomes=(1, 4), control=control,
    )  # fmt: skip


def turn(
    tree_id: str,
    node_id: str,
    parent_id: str | None = None,
    *,
    reward: float | None = None,
    instruction_id: str | None = None,
    event_id: str | None = None,
    text: str = "a turn",
) -> ExpandEvent:
    """A turn; one with a reward ends its rollout."""
    return ExpandEvent(
        event_id=event_id or f"e-{tree_id}-{node_id}",
        tree_id=tree_id,
        node_id=node_id,
        parent_id=parent_id,
        text=text,
        done=reward is not None,
        reward=reward,
        instruction_id=instruction_id,
    )


async def apply(
    store: TreeStore, tree_id: str, events: Sequence[ExpandEvent], now: float = 10.0
) -> AppliedBatch:
    [batch] = await store.apply_events(
        [(tree_id, events)], now=now, success_threshold=THRESHOLD, decision_lease=LEASE
    )
    assert isinstance(batch, AppliedBatch), batch
    return batch


async def meta_of(store: TreeStore, tree_id: str) -> TreeMeta:
    [meta] = await store.load_metas([tree_id])
    assert meta is not None
    return meta


def codes(batch: AppliedBatch) -> list[EventStatus]:
    return [outcome.code for outcome in batch.outcomes]


async def settle_bare(store: TreeStore, tree_id: str, now: float = 10.0) -> AppliedBatch:
    """Both bare rollouts of a two-rollout tree: a1 → a2 (a success), b1 (a failure)."""
    return await apply(
        store,
        tree_id,
        [turn(tree_id, "a1"), turn(tree_id, "a2", "a1", reward=1.0), turn(tree_id, "b1", reward=0.0)],
        now,
    )


async def round_books(store: TreeStore, tree_id: str, round_: int, placed: int) -> ClosedRound:
    """The tree's books once round ``round_`` placed ``placed`` continuations (the rest returned)."""
    return (await meta_of(store, tree_id)).books.open_round(round_).close(placed)
