"""The verl integration's replay buffers against verl 0.9.1's: the step's trace/ figures and the
asynchronous buffer's quotas of bare rollouts."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from verl_support import tree_sessions

from trace_client.integrations import verl as integration
from trace_client.integrations.verl import replay_buffer as trace_replay_buffer
from trace_proto import PredictorInfo

pytestmark = pytest.mark.framework

# --- the step's trace/ figures ----------------------------------------------------------------------------


def test_the_trained_figures_count_trees_mixed_trees_and_paths() -> None:
    first, second = tree_sessions(response_length=4)
    fields = [output.extra_fields for output in [*first, *second]]
    unmixed = {**fields[0], "trace_tree_id": "t2", "trace_tree_mixed": False}
    not_trace: dict[str, Any] = {"reward_extra_info": {}}  # a row of another agent loop is not counted
    assert trace_replay_buffer.trained_figures([*fields, unmixed, not_trace]) == {
        "trace/trees": 2,
        "trace/mixed_trees": 1,
        "trace/effective_ratio": 0.5,
        "trace/paths": 4,
        "trace/bare_rollouts": 3,
        "trace/continuations": 1,
        "trace/truncated_paths": 1,
    }
    assert "trace/effective_ratio" not in trace_replay_buffer.trained_figures([])


def allocation_figures(prompts: int, skipped: int, version: int, brier: float | None = None) -> Any:
    predictor = PredictorInfo(version=version, examples_seen=10 * version, brier=brier, device="cpu")
    return trace_replay_buffer.AllocationFigures(
        prompts=prompts,
        skipped_prompts=skipped,
        bare_rollouts=2 * (prompts - skipped),
        continuations_promised=prompts - skipped,
        expected_mixed=0.5,
        predictor_version=version,
        predictor=predictor,
    )


def test_a_step_keeps_its_allocation_figures_until_the_replay_buffer_takes_them() -> None:
    board = trace_replay_buffer._AllocationBoard()
    board.publish(1, allocation_figures(8, 2, version=1), groups=8)
    board.publish(2, allocation_figures(8, 4, version=2), groups=8)
    board.publish(2, allocation_figures(1, 0, version=3, brier=0.2), groups=1)  # a refill in the same step
    board.publish(3, allocation_figures(8, 4, version=3), groups=8)  # dispatched ahead (asynchronous)
    taken = board.take(2)
    assert taken is not None and board.take(1) is None  # an earlier step not taken yet goes with it
    assert board.take(2) is None  # once
    metrics = taken.metrics()
    assert {name: metrics[name] for name in ("trace/prompts", "trace/skipped_prompts")} == {
        "trace/prompts": 17,
        "trace/skipped_prompts": 6,
    }
    assert (metrics["trace/bare_rollouts_promised"], metrics["trace/expected_mixed"]) == (22, 1.5)
    assert (metrics["trace/predictor/version"], metrics["trace/predictor/brier"]) == (3, 0.2)
    # quality figures not measured yet are left out: verl's logger takes numbers only
    assert "trace/predictor/ece" not in metrics
    assert set(metrics) <= set(integration.TRACE_METRICS)
    # what an asynchronous sample's quota is made of: every allocation so far, taken or not
    assert board.rollouts_per_group() == pytest.approx((12 + 8 + 2 + 8) / 25)


@given(
    groups=st.lists(st.tuples(st.integers(0, 3), st.integers(0, 4)), min_size=0, max_size=12),
    quota=st.floats(0.5, 30.0),
)
def test_a_sample_takes_the_oldest_groups_until_their_bare_rollouts_reach_its_quota(
    groups: list[tuple[int, int]], quota: float
) -> None:
    steps = {f"g{k}": step for k, (step, _) in enumerate(groups)}
    rollouts = {f"g{k}": n for k, (_, n) in enumerate(groups) if n}
    chosen = trace_replay_buffer.groups_for_quota(set(steps), steps, rollouts, quota)
    ordered = sorted(steps, key=lambda uid: (steps[uid], uid))
    assert chosen == ordered[: len(chosen)]  # oldest first, as verl orders them
    taken = sum(rollouts.get(uid, 0) for uid in chosen)
    if sum(rollouts.values()) < quota:
        assert chosen == ordered  # not enough yet: everything (the buffer waits instead)
    else:
        assert taken >= quota  # enough, and no group more than needed
        assert sum(rollouts.get(uid, 0) for uid in chosen[:-1]) < quota


def async_buffer(**overrides: Any) -> trace_replay_buffer.TraceReplayBufferAsync:
    """The buffer as verl's trainer builds it for an asynchronous mode (no TransferQueue is touched)."""
    arguments: dict[str, Any] = {
        "trainer_mode": "colocate_async",
        "trainer_config": {},
        "max_off_policy_threshold": 8,
        "max_off_policy_strategy": "drop",
        "sampler_kwargs": {},
        "refill_fn": lambda prompts: prompts,
        **overrides,
    }
    return trace_replay_buffer.TraceReplayBufferAsync(**arguments)


def finished_groups(buffer: Any, sessions: dict[str, int], step: int = 1) -> set[str]:
    """Finished prompt groups with these bare rollouts (0: a prompt TRACE skipped), each session with a
    bare path and a continuation, in the buffer's view of TransferQueue."""
    for uid, count in sessions.items():
        buffer.prompt_global_steps["train"][uid] = step
        buffer.finished_keys["train"].add(uid)
        for session in range(count):
            for index in range(2):
                buffer.partitions["train"][f"{uid}_{session}_{index}"] = {"global_steps": step}
    return set(sessions)


@pytest.fixture
def one_rollout_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    """A board on which the allocations so far gave one bare rollout per dispatched group."""
    board = trace_replay_buffer._AllocationBoard()
    monkeypatch.setattr(trace_replay_buffer, "ALLOCATIONS", board)
    board.publish(1, allocation_figures(4, 2, version=1), groups=4)  # 4 bare rollouts over 4 groups


def consume(buffer: Any, uids: Sequence[str]) -> None:
    """What verl's `_materialize_batch` does to the sampled groups: they leave TransferQueue."""
    for uid in uids:
        buffer.finished_keys["train"].discard(uid)
        buffer.prompt_global_steps["train"].pop(uid, None)
        for key in [key for key in buffer.partitions["train"] if key.split("_")[0] == uid]:
            del buffer.partitions["train"][key]


@pytest.mark.usefixtures("one_rollout_per_group")
def test_an_async_sample_waits_for_its_share_of_bare_rollouts_not_for_a_count_of_groups() -> None:
    buffer = async_buffer()
    buffer.running_keys["train"].add("in-flight")
    skipped = finished_groups(buffer, {"a-skipped": 0, "b-skipped": 0})
    assert not buffer._has_enough_samples(1, "train", 2, skipped)  # two groups, but nothing to train on
    sampleable = skipped | finished_groups(buffer, {"c": 1})
    assert not buffer._has_enough_samples(1, "train", 2, sampleable)  # 1 of the 2 bare rollouts due
    sampleable |= finished_groups(buffer, {"d": 3})
    assert buffer._has_enough_samples(1, "train", 2, sampleable)
    chosen, _, _ = buffer._select_prompt_uids("train", sampleable, 2)
    assert chosen == ["a-skipped", "b-skipped", "c", "d"]  # 4 bare rollouts where 2 were due
    # validation batches are verl's, group for group
    assert buffer._has_enough_samples(1, "val", 2, {"x", "y"})


@pytest.mark.usefixtures("one_rollout_per_group")
def test_async_samples_take_what_they_are_due_however_groups_overshoot_a_share() -> None:
    buffer = async_buffer()
    buffer.running_keys["train"].add("in-flight")
    taken = 0
    for sample in range(1, 9):
        finished_groups(buffer, {f"s{sample}g{k}": 3 for k in range(3)}, step=sample)
        sampleable = set(buffer.finished_keys["train"])
        assert buffer._has_enough_samples(sample, "train", 4, sampleable)
        chosen, _, _ = buffer._select_prompt_uids("train", sampleable, 4)
        taken += 3 * len(chosen)
        consume(buffer, chosen)
        # a share of 4 a sample in groups of 3: never more than one group ahead, never behind
        assert 0 <= taken - 4 * sample < 3


@pytest.mark.usefixtures("one_rollout_per_group")
def test_an_async_sample_takes_what_is_left_when_nothing_is_in_flight() -> None:
    buffer = async_buffer()
    short = finished_groups(buffer, {"a": 1, "b-skipped": 0})
    buffer.running_keys["train"].add("in-flight")
    assert not buffer._has_enough_samples(1, "train", 4, short)  # more may come
    buffer.running_keys["train"].clear()
    assert buffer._has_enough_samples(1, "train", 4, short)  # nothing will: train on what is here
    assert sorted(buffer._select_prompt_uids("train", short, 4)[0]) == ["a", "b-skipped"]
    consume(buffer, ["a", "b-skipped"])
    assert buffer._quota(4) == 4  # the shortfall is not carried into the next sample
    empty = finished_groups(buffer, {"c-skipped": 0})
    with pytest.raises(RuntimeError, match="nothing to train on"):
        buffer._has_enough_samples(2, "train", 4, empty)


@pytest.mark.usefixtures("one_rollout_per_group")
def test_the_hybrid_switch_counts_finished_bare_rollouts_in_groups_not_empty_groups() -> None:
    buffer = async_buffer(trainer_mode="separate_async")
    finished_groups(buffer, {"a": 3, "b-skipped": 0, "c-skipped": 0, "d": 2})
    buffer._sync_metadata_from_transfer_queue = lambda: None  # the view above is TransferQueue's
    assert buffer.get_sampleable_count(1, "train") == 5  # one bare rollout a group: 5 groups' worth
