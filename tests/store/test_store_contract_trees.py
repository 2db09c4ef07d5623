"""The tree store's contract for trees, on both stores (embedded fakeredis and a real redis-server):
creating them, applying events, and the tree life cycle as the store scripts make it."""

from __future__ import annotations

import dataclasses
import itertools

import pytest
from store_support import (
    JOB,
    LEASE,
    THRESHOLD,
    apply,
    codes,
    meta_of,
    new_tree,
    round_books,
    settle_bare,
    turn,
)

from trace_service.lifecycle import TRANSITIONS, EventStatus, TreeStatus
from trace_service.store import AppliedBatch, TreeStore

# --- creating trees -------------------------------------------------------------------------------


async def test_a_created_tree_starts_collecting_and_a_repeated_create_changes_nothing(
    store: TreeStore,
) -> None:
    await store.create_trees([new_tree("t1", rollouts=2, budget=4)], now=1.0)
    await store.create_trees([new_tree("t1", rollouts=7, budget=0)], now=2.0)
    meta = await meta_of(store, "t1")
    assert (meta.status, meta.rollouts, meta.expansion_budget) == (TreeStatus.COLLECTING, 2, 4)
    assert (meta.job, meta.step, meta.prompt_id, meta.prior_outcomes) == (JOB, 3, "p-t1", (1, 4))
    assert (meta.bare_leaves, meta.promised, meta.round) == (0, 0, 0)
    tree = await store.load_tree("t1")
    assert tree is not None and tree.prompt_text == "find the key" and tree.nodes == []
    assert await store.load_metas(["missing"]) == [None]
    assert await store.load_tree("missing") is None


async def test_a_tree_keeps_its_depth_limit(store: TreeStore) -> None:
    limited = dataclasses.replace(new_tree("t1"), max_branch_depth=1)
    await store.create_trees([limited, new_tree("t2")], now=1.0)
    assert (await meta_of(store, "t1")).max_branch_depth == 1
    assert (await meta_of(store, "t2")).max_branch_depth is None


# --- applying events ------------------------------------------------------------------------------


async def test_a_bad_event_fails_alone_among_good_ones(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", rollouts=3)], now=1.0)
    batch = await apply(
        store,
        "t1",
        [
            turn("t1", "a1"),
            turn("t1", "x2", "nowhere"),  # parent never reported
            turn("t1", "a2", "a1", reward=1.0),
            turn("t1", "c1", instruction_id="i9"),  # a continuation must start from its node
        ],
    )
    assert codes(batch) == [
        EventStatus.ACCEPTED,
        EventStatus.CONFLICT,
        EventStatus.ACCEPTED,
        EventStatus.INVALID,
    ]
    assert "unknown parent nowhere" in batch.outcomes[1].message
    assert (batch.job, batch.status, batch.new_bare_leaves) == (JOB, TreeStatus.COLLECTING, 1)
    tree = await store.load_tree("t1")
    assert tree is not None
    assert [node.node_id for node in tree.nodes] == ["a1", "a2"]
    assert tree.nodes[1].parent_id == "a1" and tree.nodes[1].reward == 1.0


async def test_duplicates_are_acknowledged_and_a_reused_node_id_is_a_conflict(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", rollouts=3)], now=1.0)
    await apply(store, "t1", [turn("t1", "a1")])
    batch = await apply(
        store,
        "t1",
        [
            turn("t1", "a1"),  # the same event again
            turn("t1", "a1", event_id="other-event"),  # the same node under a new event id
            turn("t1", "a1", event_id="third-event", text="other text"),
        ],
    )
    assert codes(batch) == [EventStatus.DUPLICATE, EventStatus.DUPLICATE, EventStatus.CONFLICT]
    meta = await meta_of(store, "t1")
    assert meta.bare_started == 1


async def test_events_that_do_not_fit_the_tree_are_refused_with_their_reason(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", rollouts=1)], now=1.0)
    batch = await apply(
        store,
        "t1",
        [
            turn("t1", "a1"),
            turn("t1", "b1"),  # the only bare rollout has started
            turn("t1", "a2", "a1", reward=0.0),
            turn("t1", "a3", "a2"),  # a2 ended its rollout
            turn("t1", "c1", "a1", instruction_id="unknown"),
        ],
    )
    assert codes(batch) == [
        EventStatus.ACCEPTED,
        EventStatus.CONFLICT,
        EventStatus.ACCEPTED,
        EventStatus.INVALID,
        EventStatus.INVALID,
    ]


async def test_events_for_an_unknown_tree_are_all_refused(store: TreeStore) -> None:
    batch = await apply(store, "missing", [turn("missing", "a1"), turn("missing", "b1")])
    assert codes(batch) == [EventStatus.UNKNOWN_TREE, EventStatus.UNKNOWN_TREE]
    assert (batch.job, batch.status, batch.decision_round, batch.completed) == ("", None, 0, False)


async def test_one_round_trip_applies_each_tree_apart(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1"), new_tree("t2")], now=1.0)
    batches = await store.apply_events(
        [("t1", [turn("t1", "a1")]), ("t2", [turn("t2", "a1"), turn("t2", "z", "nowhere")])],
        now=5.0,
        success_threshold=THRESHOLD,
        decision_lease=LEASE,
    )
    assert [codes(b) for b in batches if isinstance(b, AppliedBatch)] == [
        [EventStatus.ACCEPTED],
        [EventStatus.ACCEPTED, EventStatus.CONFLICT],
    ]


async def test_the_success_threshold_counts_a_reward_at_it_as_a_success(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", rollouts=3)], now=1.0)
    await apply(
        store,
        "t1",
        [turn("t1", "a1", reward=THRESHOLD), turn("t1", "b1", reward=0.49), turn("t1", "c1", reward=0.0)],
    )
    meta = await meta_of(store, "t1")
    assert (meta.bare_leaves, meta.bare_successes, meta.successes) == (3, 1, 1)
    tree = await store.load_tree("t1")
    assert tree is not None
    targets = tree.targets(THRESHOLD)
    assert targets.root_successes == meta.successes and targets.root_visits == meta.leaves
    # one definition of "mixed": the stored counters and the recomputed tree agree
    assert meta.mixed and targets.mixed


# --- the life cycle -------------------------------------------------------------------------------


async def test_a_tree_without_budget_completes_when_its_bare_rollouts_are_scored(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", budget=0)], now=1.0)
    first = await apply(store, "t1", [turn("t1", "a1"), turn("t1", "a2", "a1", reward=1.0)])
    assert (first.status, first.completed, first.meta) == (TreeStatus.COLLECTING, False, None)
    last = await apply(store, "t1", [turn("t1", "b1", reward=0.0)], now=12.0)
    assert (last.status, last.completed, last.decision_round) == (TreeStatus.COMPLETE, True, 0)
    assert last.meta is not None and last.meta.status is TreeStatus.COMPLETE
    assert last.meta.finished_at == 12.0 and last.meta.mixed
    late = await apply(store, "t1", [turn("t1", "c1", reward=1.0)])
    assert codes(late) == [EventStatus.TREE_FINISHED]
    # a repeat of the completing batch is a duplicate and completes nothing twice
    again = await apply(store, "t1", [turn("t1", "b1", reward=0.0)])
    assert codes(again) == [EventStatus.DUPLICATE] and not again.completed


async def test_stage2_is_due_once_every_bare_rollout_is_scored_and_one_caller_claims_it(
    store: TreeStore,
) -> None:
    await store.create_trees([new_tree("t1", budget=4, rounds=2)], now=1.0)
    batch = await settle_bare(store, "t1")
    assert (batch.status, batch.decision_round, batch.completed) == (TreeStatus.EXPANDING, 1, False)
    assert batch.token
    assert batch.tree is not None and {node.node_id for node in batch.tree.nodes} == {"a1", "a2", "b1"}
    assert batch.tree.meta.status is TreeStatus.EXPANDING
    # a resend while the claim is live hands no second caller the decision
    resent = await apply(store, "t1", [turn("t1", "b1", reward=0.0)], now=11.0)
    assert codes(resent) == [EventStatus.DUPLICATE] and resent.decision_round == 0 and resent.tree is None
    [progress] = await store.progress(["t1"])
    assert progress is not None and progress.decision_round == 1 and progress.decision_until == 10.0 + LEASE
    assert not progress.claim_lapsed(10.0 + LEASE - 1) and progress.claim_lapsed(10.0 + LEASE)


async def test_a_resend_after_the_claim_lapsed_claims_the_same_round_again(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", budget=2)], now=1.0)
    first = await settle_bare(store, "t1", now=10.0)
    resent = await apply(store, "t1", [turn("t1", "b1", reward=0.0)], now=10.0 + LEASE)
    assert codes(resent) == [EventStatus.DUPLICATE]
    assert resent.decision_round == 1 and resent.token not in ("", first.token) and resent.tree is not None
    stale = await store.commit_decision(
        "t1", job=JOB, offered_from=50.0, round=1, token=first.token, instructions=[], predictions={},
        books=await round_books(store, "t1", 1, 0), fallback=0, now=50.0,
    )  # fmt: skip
    assert not stale.recorded


async def test_a_decision_is_recorded_under_its_claim_and_its_continuations_complete_the_tree(
    store: TreeStore,
) -> None:
    await store.create_trees([new_tree("t1", budget=2, rounds=1)], now=1.0)
    batch = await settle_bare(store, "t1")
    stale = await store.commit_decision(
        "t1", job=JOB, offered_from=10.0, round=1, token="not-the-claim", instructions=[("i1", "a1", 2)],
        predictions={"a1": 0.25}, books=await round_books(store, "t1", 1, 2), fallback=0,
        now=10.0,
    )  # fmt: skip
    assert not stale.recorded
    assert (await meta_of(store, "t1")).promised == 0
    committed = await store.commit_decision(
        "t1", job=JOB, offered_from=10.0, round=1, token=batch.token, instructions=[("i1", "a1", 2)],
        predictions={"a1": 0.25}, books=await round_books(store, "t1", 1, 2), fallback=1,
        now=10.0,
    )  # fmt: skip
    assert committed.recorded and not committed.completed
    tree = await store.load_tree("t1")
    assert tree is not None
    assert (tree.meta.status, tree.meta.round, tree.meta.promised, tree.meta.fallback) == (
        TreeStatus.EXPANDING,
        1,
        2,
        1,
    )
    assert tree.predictions == {"a1": 0.25}
    instruction = tree.instructions["i1"]
    assert (instruction.node_id, instruction.count, instruction.started, instruction.round) == ("a1", 2, 0, 1)
    assert await store.queue_length(JOB) == 1

    first = await apply(store, "t1", [turn("t1", "c1", "a1", instruction_id="i1")], now=20.0)
    assert codes(first) == [EventStatus.ACCEPTED] and first.fully_started == []
    rest = await apply(
        store,
        "t1",
        [
            turn("t1", "d1", "a1", instruction_id="i1", reward=1.0),
            turn("t1", "e1", "a1", instruction_id="i1", reward=1.0),  # both continuations have started
            turn("t1", "c2", "c1", reward=0.0),
        ],
        now=21.0,
    )
    assert codes(rest) == [EventStatus.ACCEPTED, EventStatus.CONFLICT, EventStatus.ACCEPTED]
    assert rest.fully_started == ["i1"]
    assert (rest.status, rest.completed, rest.new_continuation_leaves) == (TreeStatus.COMPLETE, True, 2)
    assert rest.meta is not None and (rest.meta.cont_leaves, rest.meta.leaves) == (2, 4)


@pytest.mark.parametrize(
    ("rounds", "status", "next_round"),
    [(2, TreeStatus.EXPANDING, 2), (1, TreeStatus.COMPLETE, 0)],
    ids=["a further round is due", "none after the last, even with budget left"],
)
async def test_a_round_follows_once_the_promised_continuations_are_scored(
    store: TreeStore, rounds: int, status: TreeStatus, next_round: int
) -> None:
    await store.create_trees([new_tree("t1", budget=2, rounds=rounds)], now=1.0)
    batch = await settle_bare(store, "t1")
    await store.commit_decision(
        "t1", job=JOB, offered_from=10.0, round=1, token=batch.token, instructions=[("i1", "a1", 1)],
        predictions={}, books=await round_books(store, "t1", 1, 1), fallback=0,
        now=10.0,
    )  # fmt: skip
    after = await apply(store, "t1", [turn("t1", "c1", "a1", instruction_id="i1", reward=0.0)], now=20.0)
    assert (after.status, after.decision_round, after.completed) == (status, next_round, rounds == 1)
    if rounds > 1:
        assert after.token and after.token != batch.token


async def test_a_round_that_places_nothing_completes_the_tree(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", budget=4, rounds=2)], now=1.0)
    batch = await settle_bare(store, "t1")
    committed = await store.commit_decision(
        "t1", job=JOB, offered_from=10.0, round=1, token=batch.token, instructions=[], predictions={},
        books=await round_books(store, "t1", 1, 0), fallback=0, now=15.0,
    )  # fmt: skip
    assert committed.recorded and committed.completed
    meta = await meta_of(store, "t1")
    assert (meta.status, meta.returned, meta.finished_at) == (TreeStatus.COMPLETE, 2, 15.0)


async def test_a_lapsed_claim_is_taken_over_and_the_old_claim_can_no_longer_commit(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", budget=2)], now=1.0)
    batch = await settle_bare(store, "t1", now=10.0)
    round_live, _ = await store.take_over_decision("t1", now=10.0 + LEASE - 1, lease=LEASE)
    assert round_live == 0
    round_, token = await store.take_over_decision("t1", now=10.0 + LEASE, lease=LEASE)
    assert round_ == 1 and token != batch.token
    late = await store.commit_decision(
        "t1", job=JOB, offered_from=50.0, round=1, token=batch.token, instructions=[("i1", "a1", 1)],
        predictions={}, books=await round_books(store, "t1", 1, 1), fallback=0,
        now=50.0,
    )  # fmt: skip
    assert not late.recorded
    won = await store.commit_decision(
        "t1", job=JOB, offered_from=50.0, round=1, token=token, instructions=[("i2", "a1", 2)],
        predictions={}, books=await round_books(store, "t1", 1, 2), fallback=0,
        now=50.0,
    )  # fmt: skip
    assert won.recorded
    tree = await store.load_tree("t1")
    assert tree is not None and set(tree.instructions) == {"i2"} and tree.meta.promised == 2


async def test_closing_ends_any_unfinished_tree_and_drops_its_claim(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1", budget=2), new_tree("t2")], now=1.0)
    batch = await settle_bare(store, "t1")
    assert await store.close_tree("t1", now=12.0) is TreeStatus.EXPANDING
    assert await store.close_tree("t1", now=13.0) is TreeStatus.CLOSED
    assert await store.close_tree("t2", now=13.0) is TreeStatus.COLLECTING
    assert await store.close_tree("missing", now=13.0) is None
    meta = await meta_of(store, "t1")
    assert (meta.status, meta.finished_at) == (TreeStatus.CLOSED, 12.0)
    round_, _ = await store.take_over_decision("t1", now=1_000.0, lease=LEASE)
    assert round_ == 0
    late = await store.commit_decision(
        "t1", job=JOB, offered_from=14.0, round=1, token=batch.token, instructions=[("i1", "a1", 1)],
        predictions={}, books=await round_books(store, "t1", 1, 1), fallback=0,
        now=14.0,
    )  # fmt: skip
    assert not late.recorded
    refused = await apply(store, "t2", [turn("t2", "a1")])
    assert codes(refused) == [EventStatus.TREE_FINISHED]
    progress = await store.progress(["t1", "t2", "missing"])
    assert [p.status if p else None for p in progress] == [TreeStatus.CLOSED, TreeStatus.CLOSED, None]
    assert all(p.finished for p in progress if p)


async def test_every_status_change_is_a_transition_of_the_life_cycle(store: TreeStore) -> None:
    """Walk a two-round tree to completion and a second tree to closing, recording each status seen."""
    await store.create_trees([new_tree("t1", budget=2, rounds=2), new_tree("t2")], now=1.0)
    seen = [(await meta_of(store, "t1")).status]
    batch = await settle_bare(store, "t1")
    seen.append(batch.status)
    await store.commit_decision(
        "t1", job=JOB, offered_from=10.0, round=1, token=batch.token, instructions=[("i1", "a1", 1)],
        predictions={}, books=await round_books(store, "t1", 1, 1), fallback=0,
        now=10.0,
    )  # fmt: skip
    seen.append((await meta_of(store, "t1")).status)
    second = await apply(store, "t1", [turn("t1", "c1", "a1", instruction_id="i1", reward=0.0)], now=20.0)
    seen.append(second.status)
    done = await store.commit_decision(
        "t1", job=JOB, offered_from=20.0, round=2, token=second.token, instructions=[], predictions={},
        books=await round_books(store, "t1", 2, 0), fallback=0, now=20.0,
    )  # fmt: skip
    assert done.completed
    seen.append((await meta_of(store, "t1")).status)
    assert seen == [
        TreeStatus.COLLECTING,
        TreeStatus.EXPANDING,
        TreeStatus.EXPANDING,
        TreeStatus.EXPANDING,
        TreeStatus.COMPLETE,
    ]
    await store.close_tree("t2", now=30.0)
    closed = [TreeStatus.COLLECTING, (await meta_of(store, "t2")).status]
    for path in (seen, closed):
        for before, after in itertools.pairwise(path):
            assert before == after or after in TRANSITIONS[before], (before, after)


# --- retention by need ----------------------------------------------------------------------------


async def ttls(store: TreeStore, tree_id: str) -> list[int]:
    """The expiry of each key the tree has (-2: a key never written, such as an unused predictions)."""
    return [ttl for key in store.keys.tree(tree_id).all if (ttl := await store.redis.ttl(key)) != -2]


async def test_a_finished_tree_read_and_learned_from_expires_within_the_retention_window(
    store: TreeStore,
) -> None:
    store.retention = 90  # the fixture's trees live 600 s
    await store.create_trees([new_tree("t1")], now=1.0)
    await settle_bare(store, "t1")
    assert not await store.retain_tree("t1", "read")  # read, not yet learned from
    assert min(await ttls(store, "t1")) > 90
    assert await store.retain_tree("t1", "learned")
    assert all(0 < ttl <= 90 for ttl in await ttls(store, "t1"))
    assert await store.load_tree("t1") is not None  # still readable within the window


async def test_a_tree_in_flight_is_never_shortened_by_retention(store: TreeStore) -> None:
    store.retention = 90
    await store.create_trees([new_tree("t1")], now=1.0)
    await apply(store, "t1", [turn("t1", "a1")])  # one turn; no rollout has ended
    assert not await store.retain_tree("t1", "read")
    assert not await store.retain_tree("t1", "learned")
    assert min(await ttls(store, "t1")) > 90
    assert not await store.retain_tree("gone", "read")  # an unknown tree: nothing to mark
