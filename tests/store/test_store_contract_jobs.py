"""The tree store's contract for what it keeps per job, on both stores (embedded fakeredis and a real
redis-server): the claim queue, trainer leases, accounting and expiry, job indexes, idempotency, the
predictor's keys and the shared continuation reserve."""

from __future__ import annotations

import asyncio
import dataclasses

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

from trace_service.allocation import Reserve
from trace_service.lifecycle import EventStatus
from trace_service.store import AppliedBatch, GroupOutcome, PromptOutcomes, TreeStore

# --- the claim queue ------------------------------------------------------------------------------


async def test_queued_instructions_are_leased_to_one_claimant_at_a_time(store: TreeStore) -> None:
    await store.queue_instructions(JOB, "t1", {"i1": 10.0, "i2": 100.0})
    assert await store.claim_instructions(JOB, max_items=10, lease=5.0, now=9.0) == []
    assert await store.claim_instructions(JOB, max_items=10, lease=5.0, now=10.0) == [("t1", "i1", 10.0)]
    assert await store.claim_instructions(JOB, max_items=10, lease=5.0, now=14.0) == []
    # the lease ran out: offered again, with the time its last lease ended
    assert await store.claim_instructions(JOB, max_items=10, lease=5.0, now=15.0) == [("t1", "i1", 15.0)]
    assert await store.queue_length(JOB) == 2
    await store.dequeue_instructions(JOB, [("t1", "i1"), ("t1", "i2")])
    assert await store.queue_length(JOB) == 0
    assert await store.claim_instructions(JOB, max_items=10, lease=5.0, now=1_000.0) == []


async def allocated(store: TreeStore, *jobs: str) -> None:
    """The jobs exist: each has allocated once (no trees)."""
    for job in jobs:
        await store.index_allocation(job, 0, f"alloc-{job}", 1, [], 0, now=1.0)


async def test_a_jobs_trainer_lease_has_one_holder(store: TreeStore) -> None:
    assert not await store.hold_trainer_lease(JOB, "a", ttl=30.0, now=1.0)  # no such job yet
    await allocated(store, JOB, "other")
    assert await store.hold_trainer_lease(JOB, "a", ttl=30.0, now=1.0)
    assert await store.hold_trainer_lease(JOB, "a", ttl=30.0, now=1.0)
    assert not await store.hold_trainer_lease(JOB, "b", ttl=30.0, now=1.0)
    assert await store.hold_trainer_lease("other", "b", ttl=30.0, now=1.0)  # one lease per job
    await store.release_trainer_lease(JOB, "b")  # not b's to give up
    assert not await store.hold_trainer_lease(JOB, "b", ttl=30.0, now=1.0)
    assert await store.trained_jobs(now=2.0) == [JOB, "other"]
    await store.release_trainer_lease(JOB, "a")
    assert await store.trained_jobs(now=2.0) == ["other"]
    assert await store.hold_trainer_lease(JOB, "b", ttl=30.0, now=1.0)
    assert await store.trained_jobs(now=40.0) == []  # lapsed at 31


async def test_trainers_are_counted_while_they_say_so(store: TreeStore) -> None:
    assert await store.trainers("a", now=100.0, ttl=60.0) == 1
    assert await store.trainers("b", now=110.0, ttl=60.0) == 2
    assert await store.trainers("a", now=150.0, ttl=60.0) == 2
    assert await store.trainers("a", now=175.0, ttl=60.0) == 1  # b last said so at 110


# --- accounting and expiry ------------------------------------------------------------------------


async def test_a_finished_tree_is_counted_once(store: TreeStore) -> None:
    await store.create_trees([new_tree("t1")], now=1.0)
    batch = await settle_bare(store, "t1")
    assert batch.meta is not None
    assert await store.uncounted(JOB, ["t1", "t2"]) == ["t1", "t2"]
    assert await store.record_prompt_outcome(batch.meta, 16)
    assert not await store.record_prompt_outcome(batch.meta, 16)
    assert await store.uncounted(JOB, ["t1", "t2"]) == ["t2"]
    [outcomes] = await store.prompt_outcomes(JOB, ["p-t1"])
    assert (outcomes.successes, outcomes.trials, outcomes.zero_variance_streak) == (1, 2, 0)
    totals = await store.step_totals(JOB)
    assert totals[3]["trees_complete"] == 1 and totals[3]["mixed"] == 1 and totals[3]["rollouts_spent"] == 2


async def test_each_arms_groups_are_kept_newest_first_and_capped(store: TreeStore) -> None:
    """A finished tree's group (its prediction at allocation, its bare outcomes) joins its arm's list
    once, a control tree's the controls', a policy tree's the policy's; each list keeps the newest
    ``groups_kept``."""
    for n in range(4):
        await store.create_trees([new_tree(f"c{n}", control=True, predicted=0.1 * (n + 1))], now=1.0)
        batch = await settle_bare(store, f"c{n}")
        assert batch.meta is not None and batch.meta.control
        assert await store.record_prompt_outcome(batch.meta, 3)
        assert not await store.record_prompt_outcome(batch.meta, 3)
    await store.create_trees([new_tree("t1", predicted=0.7)], now=1.0)
    batch = await settle_bare(store, "t1")
    assert batch.meta is not None
    await store.record_prompt_outcome(batch.meta, 3)
    kept = await store.group_outcomes(JOB, control=True)
    assert [o.predicted for o in kept] == pytest.approx([0.4, 0.3, 0.2])
    assert {(o.successes, o.trials) for o in kept} == {(1, 2)}
    assert await store.group_outcomes(JOB, control=False) == [GroupOutcome(0.7, 1, 2)]
    totals = (await store.step_totals(JOB))[3]
    assert totals["control_trees"] == 4 and totals["policy_trees"] == 1 and totals["turns"] == 5 * 3


async def test_every_key_the_store_writes_expires(store: TreeStore) -> None:
    """arq's rule: a whole life cycle through every kind of write leaves no key without an expiry."""
    await store.create_trees([new_tree("c1", control=True)], now=1.0)
    control = await settle_bare(store, "c1")
    assert control.meta is not None
    await store.record_prompt_outcome(control.meta, 16)
    await store.create_trees([new_tree("t1", budget=2)], now=1.0)
    await store.index_allocation(JOB, 3, "alloc", 2, ["t1"], 2, now=1.0)
    await store.remember_response(JOB, "idem", "fingerprint", "{}")
    batch = await settle_bare(store, "t1")
    await store.commit_decision(
        "t1", job=JOB, offered_from=10.0, round=1, token=batch.token, instructions=[("i1", "a1", 1)],
        predictions={"a1": 0.5}, books=await round_books(store, "t1", 1, 1), fallback=0,
        now=10.0,
    )  # fmt: skip
    await store.claim_instructions(JOB, max_items=10, lease=5.0, now=10.0)
    done = await apply(store, "t1", [turn("t1", "c1", "a1", instruction_id="i1", reward=1.0)], now=20.0)
    assert done.completed and done.meta is not None
    await store.record_prompt_outcome(done.meta, 16)
    await store.push_completed(JOB, "t1")
    await store.publish_weights(JOB, 1, b"weights")
    await store.save_predictor(JOB, b"whole")
    await store.hold_trainer_lease(JOB, "owner", ttl=30.0, now=1.0)
    await store.trainers("owner", now=1.0, ttl=30.0)
    keys = [key async for key in store.redis.scan_iter(match=f"{store.keys.prefix}:*")]
    tree_keys = store.keys.tree("t1")
    control_keys = store.keys.tree("c1")
    expected = {
        *tree_keys.all,
        control_keys.meta, control_keys.nodes, control_keys.events, store.keys.group_outcomes(JOB, True),
        store.keys.group_outcomes(JOB, False),
        store.keys.jobs, store.keys.steps(JOB), store.keys.steps_info(JOB), store.keys.step_trees(JOB, 3),
        store.keys.open_trees(JOB), store.keys.idempotency(JOB, "idem"), store.keys.instruction_queue(JOB),
        store.keys.prompt_outcomes(JOB), store.keys.counted_trees(JOB), store.keys.step_totals(JOB),
        store.keys.completed_trees(JOB), store.keys.weights(JOB), store.keys.trainer_lease(JOB),
        store.keys.predictor_state(JOB), store.keys.training_wanted, store.keys.trainers,
        store.keys.trained_jobs,
    }  # fmt: skip
    assert {key.decode() for key in keys} == expected
    ttls = {key.decode(): await store.redis.ttl(key) for key in keys}
    assert all(ttl > 0 for ttl in ttls.values()), ttls
    assert 0 < ttls[tree_keys.nodes] <= store.tree_ttl
    assert 0 < ttls[store.keys.jobs] <= store.job_ttl
    assert 0 < ttls[store.keys.idempotency(JOB, "idem")] <= store.idempotency_ttl


async def test_scripts_run_again_after_redis_forgets_them(store: TreeStore) -> None:
    """A restarted Redis has no scripts: pipelined calls get NOSCRIPT and are run again on their own."""
    await store.create_trees([new_tree("t1"), new_tree("t2")], now=1.0)
    await store.redis.script_flush()
    batches = await store.apply_events(
        [("t1", [turn("t1", "a1")]), ("t2", [turn("t2", "a1")])],
        now=5.0,
        success_threshold=THRESHOLD,
        decision_lease=LEASE,
    )
    assert [codes(b) for b in batches if isinstance(b, AppliedBatch)] == [[EventStatus.ACCEPTED]] * 2
    assert (await meta_of(store, "t2")).bare_started == 1


# --- job indexes, idempotency, the predictor's keys -----------------------------------------------


async def test_an_allocation_is_listed_under_its_job_and_step(store: TreeStore) -> None:
    many = [f"t{i}" for i in range(5_000)]  # more members than one write_expire call passes on
    await store.create_trees([new_tree(tree_id) for tree_id in many[:600]], now=1.0)  # two create chunks
    assert all(await store.load_metas(many[:600]))
    await store.index_allocation(JOB, 3, "a1", 7_000, many, 40_000, now=1.0)
    await store.index_allocation(JOB, 5, "a2", 3, ["u1", "u2"], 4, now=2.0)
    await store.index_allocation(JOB, 5, "a2", 3, ["u1", "u2"], 4, now=2.0)  # a retry changes nothing
    assert await store.jobs() == [JOB]
    assert await store.steps(JOB, last=10) == [3, 5]
    assert await store.steps(JOB, last=1) == [5]
    assert await store.step_tree_ids(JOB, 5) == ["u1", "u2"]
    assert len(await store.step_tree_ids(JOB, 3)) == 5_000
    allocations = await store.step_allocations(JOB)
    assert [(a.prompts, a.trees, a.bare_promised) for a in allocations[3]] == [(7_000, 5_000, 40_000)]
    assert [(a.prompts, a.trees, a.bare_promised) for a in allocations[5]] == [(3, 2, 4)]
    seen: set[str] = set()
    cursor = None
    while cursor != 0:
        cursor, page = await store.open_trees(JOB, cursor or 0, count=1_000)
        seen.update(page)
    assert seen == {*many, "u1", "u2"}
    await store.forget_open(JOB, "u1")
    _, page = await store.open_trees(JOB, 0, count=10_000)
    assert "u1" not in page and "u2" in page


async def test_the_first_answer_under_an_idempotency_key_wins(store: TreeStore) -> None:
    assert (await store.allocation_reads(JOB, [], "k", groups=False)).remembered is None
    assert await store.remember_response(JOB, "k", "f1", '{"first": 1}') == ("f1", '{"first": 1}')
    assert await store.remember_response(JOB, "k", "f2", '{"second": 2}') == ("f1", '{"first": 1}')
    reads = await store.allocation_reads(JOB, [], "k", groups=False)
    assert reads.remembered == ("f1", '{"first": 1}')


async def test_prompt_histories_keep_the_streak_of_groups_with_one_outcome(store: TreeStore) -> None:
    """Three steps of one prompt: all-success, all-success, mixed."""
    for step, rewards in enumerate(([1.0, 1.0], [1.0, 1.0], [1.0, 0.0])):
        tree_id = f"s{step}"
        spec = new_tree(tree_id)
        await store.create_trees([dataclasses.replace(spec, prompt_id="p", step=step)], now=1.0)
        done = await apply(store, tree_id, [turn(tree_id, f"n{i}", reward=r) for i, r in enumerate(rewards)])
        assert done.meta is not None
        assert await store.record_prompt_outcome(done.meta, 16)
        [history] = await store.prompt_outcomes(JOB, ["p"])
        expected_successes, expected_streak = [(2, 1), (4, 2), (5, 0)][step]
        assert (history.successes, history.trials) == (expected_successes, 2 * step + 2)
        assert history.zero_variance_streak == expected_streak
    assert await store.prompt_outcomes(JOB, ["unseen"]) == [PromptOutcomes()]
    assert await store.prompt_outcomes(JOB, []) == []


async def test_each_jobs_training_queue_keeps_its_newest_trees_and_weights_carry_their_version(
    store: TreeStore,
) -> None:
    for tree_id in ("t1", "t2", "t3"):
        await store.push_completed(JOB, tree_id, cap=2)
    await store.push_completed("other", "u1")
    await allocated(store, JOB)
    assert await store.training_wanted() == [JOB, "other"]
    assert await store.pop_completed(JOB, 1) == ["t2"]  # oldest first; t1 fell off the cap
    assert await store.training_wanted() == [JOB, "other"]
    assert await store.pop_completed(JOB, 10) == ["t3"]
    assert await store.training_wanted() == ["other"]  # nothing left: it no longer wants training
    assert await store.pop_completed("other", 10) == ["u1"]
    assert await store.weights_version(JOB) == 0 and await store.load_weights(JOB) is None
    await store.publish_weights(JOB, 3, b"\x00weights")
    assert await store.weights_version(JOB) == 3
    assert await store.load_weights(JOB) == (3, b"\x00weights")
    assert await store.load_weights("other") is None
    assert await store.load_predictor(JOB) is None
    assert await store.save_predictor(JOB, b"\x00whole")
    assert await store.load_predictor(JOB) == b"\x00whole"
    # A job deleted meanwhile is never written back: no weights, no predictor, no lease.
    await store.delete_job(JOB)
    await store.publish_weights(JOB, 4, b"late")
    assert not await store.save_predictor(JOB, b"late")
    assert not await store.hold_trainer_lease(JOB, "a", ttl=30.0, now=2.0)
    assert [key async for key in store.redis.scan_iter(match=store.keys.job_pattern(JOB))] == []
    await store.publish_weights("new", 1, b"copied", new_job=True)  # a warm start, before its first index
    assert await store.load_weights("new") == (1, b"copied")


async def test_deleting_a_job_removes_its_trees_and_keys_and_nothing_else(store: TreeStore) -> None:
    other = "other"
    for job, tree_id in ((JOB, "t1"), (other, "u1")):
        await store.create_trees([new_tree(tree_id, job=job)], now=1.0)
        await store.index_allocation(job, 3, f"alloc-{job}", 2, [tree_id], 2, now=1.0)
        await store.remember_response(job, "idem", "fingerprint", "{}")
        await store.push_completed(job, tree_id)
        await store.publish_weights(job, 1, b"weights")
        await store.save_predictor(job, b"whole")
        await store.hold_trainer_lease(job, "owner", ttl=30.0, now=1.0)
    before = {key async for key in store.redis.scan_iter(match=f"{store.keys.prefix}:*")}
    assert await store.delete_job(JOB) > 0
    after = {key async for key in store.redis.scan_iter(match=f"{store.keys.prefix}:*")}
    gone = {key.decode() for key in before - after}
    assert not any(other in key or "u1" in key for key in gone)
    assert store.keys.tree("t1").meta in gone
    assert store.keys.weights(JOB) in gone and store.keys.predictor_state(JOB) in gone
    assert not [key for key in after if f"{{j:{JOB}}}" in key.decode() or "{t:t1}" in key.decode()]
    assert await store.jobs() == [other] and await store.training_wanted() == [other]
    assert not await store.job_exists(JOB) and await store.job_exists(other)
    assert await store.load_tree("u1") is not None and await store.load_weights(other) == (1, b"weights")
    assert await store.delete_job(JOB) == 0  # nothing left to delete


# --- the shared continuation reserve ----------------------------------------------------------------


async def test_reserve_draws_follow_the_rule_and_are_made_once(store: TreeStore) -> None:
    """The store's draws are Reserve.draw's, and a repeated draw (a decision taken over) is the first
    one; a second create never resets a reserve that has been drawn from."""
    rows = [  # tree, share, mixed chance, agrees, can branch
        ("t1", 4, 0.75, False, True),
        ("t2", 2, 0.25, True, True),
        ("t3", 6, 0.5, True, False),
        ("t4", 3, 0.5, True, True),
        ("t5", 4, 0.5, False, False),
    ]
    reserve = Reserve.of([row[1] for row in rows], [row[2] for row in rows])
    await store.create_trees([new_tree("t0")], now=1.0, reserve=reserve)
    for tree_id, share, chance, agrees, can_branch in rows:
        expected, reserve = reserve.draw(share, chance, agrees=agrees, can_branch=can_branch)
        drawn = await store.draw_continuations(
            JOB, "alloc", tree_id, share=share, mixed_chance=chance, agrees=agrees, can_branch=can_branch
        )
        assert drawn == expected
        again = await store.draw_continuations(
            JOB, "alloc", tree_id, share=share, mixed_chance=chance, agrees=not agrees, can_branch=True
        )
        assert again == drawn
        await store.create_trees([new_tree("t0")], now=1.0, reserve=Reserve.of([100], [0.0]))  # no change
    assert reserve.left == 6  # t5 left its share after the last taker, and cannot branch itself
    assert await store.redis.ttl(store.keys.continuation_reserve(JOB, "alloc")) > 0


async def test_concurrent_draws_never_draw_more_than_the_reserve(store: TreeStore) -> None:
    """Trees drawing at once (replicas deciding side by side) each draw once, by the rule on the
    state left by the draws recorded before theirs: every draw in some order, never more in all."""
    shares = [3, 5, 2, 4, 6, 1, 3, 4]
    await store.create_trees([new_tree("t0")], now=1.0, reserve=Reserve.of(shares, [0.25] * len(shares)))
    drawn = await asyncio.gather(
        *(
            store.draw_continuations(
                JOB, "alloc", f"t{i}", share=share, mixed_chance=0.25, agrees=True, can_branch=True
            )
            for i, share in enumerate(shares)
        )
    )
    assert sum(drawn) <= sum(shares)
    assert all(d >= share for d, share in zip(drawn, shares, strict=True))  # every taker its own share
    left = await store.redis.hget(store.keys.continuation_reserve(JOB, "alloc"), "left")
    assert int(left) == sum(shares) - sum(drawn)


async def test_without_a_reserve_a_tree_draws_its_own_share(store: TreeStore) -> None:
    drawn = await store.draw_continuations(
        JOB, "gone", "t1", share=5, mixed_chance=0.5, agrees=False, can_branch=True
    )
    assert drawn == 5
