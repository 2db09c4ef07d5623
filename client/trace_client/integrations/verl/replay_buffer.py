"""verl's replay buffers with TRACE's figures: `TraceReplayBuffer` for the sync trainer and
`TraceReplayBufferAsync` for the asynchronous ones (`trainer.v1.sampler.custom_sampler`).

verl's v1 trainer logs, per step, the `metrics` dict its `_step_once` fills; the one thing a trainer
configuration can plug into that dict is the replay buffer, whose `sample` returns `(batch, metrics)`
and whose metrics the trainer merges into the step's (verl 0.9.1, `PPOTrainer._step_once`). The
agent-loop manager returns nothing to the trainer in v1 (`generate_sequences` only dispatches), so the
manager leaves its allocations' figures here, by step, and the replay buffer adds them to the figures
of the trajectories it hands the trainer. Everything is logged under `trace/` (see `TRACE_METRICS`).
In the asynchronous modes the two describe different prompts: the allocations made since the last
sample, and the trees (allocated earlier, while older weights generated) that the step trains on.

The replay buffer also names each sampled row: it writes the row's TransferQueue key into the row's
`uid` field. verl hands the rows' `uid` to the advantage estimator as `index`, and that is how the
`trace` estimator finds each row's tree advantages (the key still starts with the prompt's uid).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer, ReplayBufferAsync
from verl.utils import tensordict_utils as tu

from trace_client.integrations.gain import GAIN_METRICS, gain_metrics
from trace_client.integrations.verl.names import (
    CONTINUATION_FIELD,
    TRAIN_PARTITION,
    TREE_ID_FIELD,
    TREE_MIXED_FIELD,
    TRUNCATED_FIELD,
)
from trace_proto import AllocateResponse, JobStats, PredictorInfo

#: Every metric this module can add to a training step, and what it counts.
TRACE_METRICS: Final = {
    "trace/prompts": "prompts in the step's allocation",
    "trace/skipped_prompts": "prompts TRACE gave no rollouts (Stage 1's 0)",
    "trace/bare_rollouts_promised": "bare rollouts allocated (Σ m_i)",
    "trace/continuations_promised": "Stage 2 continuations the trees could ask for (Σ expansion budgets)",
    "trace/expected_mixed": "mixed trees the allocation expected",
    "trace/trees": "trees trained on",
    "trace/mixed_trees": "trees trained on whose leaves hold both a success and a failure",
    "trace/effective_ratio": "mixed_trees / trees (absent when no tree was trained)",
    "trace/paths": "root-to-leaf paths trained on: bare_rollouts + continuations",
    "trace/bare_rollouts": "paths trained on that are a bare rollout's own",
    "trace/continuations": "paths trained on that end in a Stage 2 continuation",
    "trace/truncated_paths": "paths cut to rollout.response_length",
    "trace/predictor/version": "the predictor version that made the allocation (0: cold start)",
    "trace/predictor/examples_seen": "examples the predictor has trained on",
    "trace/predictor/brier": "held-out Brier score (absent until measured)",
    "trace/predictor/ece": "held-out expected calibration error (absent until measured)",
    "trace/predictor/spearman": "held-out rank correlation (absent until measured)",
    **GAIN_METRICS,
}


@dataclass(frozen=True)
class AllocationFigures:
    """What one step's allocation decided, as the manager saw it."""

    prompts: int
    skipped_prompts: int
    bare_rollouts: int
    continuations_promised: int
    expected_mixed: float
    predictor_version: int
    predictor: PredictorInfo | None = None
    #: The job's gain over uniform and trust in the predictor (`trace_client.integrations.gain`).
    gain: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def of(
        cls,
        allocation: AllocateResponse,
        predictor: PredictorInfo | None = None,
        stats: JobStats | None = None,
    ) -> AllocationFigures:
        return cls(
            prompts=len(allocation.trees) + len(allocation.skipped),
            skipped_prompts=len(allocation.skipped),
            bare_rollouts=sum(tree.rollouts for tree in allocation.trees),
            continuations_promised=sum(tree.expansion_budget for tree in allocation.trees),
            expected_mixed=allocation.expected_mixed,
            predictor_version=allocation.predictor_version,
            predictor=predictor,
            gain=gain_metrics(allocation, stats),
        )

    def plus(self, other: AllocationFigures) -> AllocationFigures:
        """Two allocations logged with one step (verl's refills and warm-up batches), `other` the later."""
        return replace(
            other,
            prompts=self.prompts + other.prompts,
            skipped_prompts=self.skipped_prompts + other.skipped_prompts,
            bare_rollouts=self.bare_rollouts + other.bare_rollouts,
            continuations_promised=self.continuations_promised + other.continuations_promised,
            expected_mixed=self.expected_mixed + other.expected_mixed,
            predictor=other.predictor or self.predictor,
            gain=other.gain or self.gain,
        )

    def metrics(self) -> dict[str, float]:
        figures: dict[str, float] = {
            "trace/prompts": self.prompts,
            "trace/skipped_prompts": self.skipped_prompts,
            "trace/bare_rollouts_promised": self.bare_rollouts,
            "trace/continuations_promised": self.continuations_promised,
            "trace/expected_mixed": self.expected_mixed,
            "trace/predictor/version": self.predictor_version,
            **self.gain,
        }
        if self.predictor is not None:
            figures["trace/predictor/examples_seen"] = self.predictor.examples_seen
            # verl's logger takes numbers only: a quality figure not measured yet is left out
            quality = {
                "brier": self.predictor.brier,
                "ece": self.predictor.ece,
                "spearman": self.predictor.spearman,
            }
            figures.update(
                {f"trace/predictor/{name}": value for name, value in quality.items() if value is not None}
            )
        return figures


class _AllocationBoard:
    """The manager's figures per training step, until the replay buffer samples. Both live in verl's
    trainer process (`TaskRunnerV1` creates the manager and the trainer that owns the buffer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[int, AllocationFigures] = {}
        self._groups = 0  # verl's prompt groups (batch rows) allocated so far
        self._bare_rollouts = 0  # and their bare rollouts

    def publish(self, step: int, figures: AllocationFigures, groups: int) -> None:
        """An allocation of `groups` batch rows (a prompt the batch repeats is a row of its own)."""
        with self._lock:
            earlier = self._steps.get(step)
            self._steps[step] = figures if earlier is None else earlier.plus(figures)
            self._groups += groups
            self._bare_rollouts += figures.bare_rollouts

    def rollouts_per_group(self) -> float:
        """Bare rollouts allocated per dispatched group so far: the step's budget over its batch size."""
        with self._lock:
            return self._bare_rollouts / self._groups if self._groups else 0.0

    def take(self, step: int) -> AllocationFigures | None:
        """The figures published for this step and any earlier one not taken yet, once: an allocation
        made after its step's sample (an asynchronous trainer's refill) is logged with the next."""
        with self._lock:
            taken = None
            for due in sorted(s for s in self._steps if s <= step):
                figures = self._steps.pop(due)
                taken = figures if taken is None else taken.plus(figures)
            return taken


ALLOCATIONS: Final = _AllocationBoard()


def trained_figures(extra_fields: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The figures of the paths a step trains on, from their `extra_fields` (other rows are ignored)."""
    paths = [fields for fields in extra_fields if TREE_ID_FIELD in fields]
    mixed_by_tree = {str(fields[TREE_ID_FIELD]): bool(fields.get(TREE_MIXED_FIELD)) for fields in paths}
    mixed = sum(mixed_by_tree.values())
    continuations = sum(bool(fields.get(CONTINUATION_FIELD)) for fields in paths)
    figures: dict[str, float] = {
        "trace/trees": len(mixed_by_tree),
        "trace/mixed_trees": mixed,
        "trace/paths": len(paths),
        "trace/bare_rollouts": len(paths) - continuations,
        "trace/continuations": continuations,
        "trace/truncated_paths": sum(int(fields.get(TRUNCATED_FIELD) or 0) > 0 for fields in paths),
    }
    if mixed_by_tree:
        figures["trace/effective_ratio"] = mixed / len(mixed_by_tree)
    return figures


def name_rows_by_key(keys: Sequence[str], partition_id: str) -> None:
    """Write each row's TransferQueue key into its `uid`: the `trace` estimator's `index`."""
    tq.kv_batch_put(keys=list(keys), partition_id=partition_id, fields=tu.get_tensordict({"uid": list(keys)}))


class TraceReplayBuffer(ReplayBuffer):
    """verl's sync `ReplayBuffer`, sampling as it does, plus TRACE's step figures in the returned metrics
    and each training row's key in its `uid` (see the module doc). Validation batches pass unchanged."""

    def sample(
        self, global_steps: int, partition_id: str, batch_size: int
    ) -> tuple[KVBatchMeta, dict[str, Any]]:
        batch, metrics = super().sample(
            global_steps=global_steps, partition_id=partition_id, batch_size=batch_size
        )
        if partition_id != TRAIN_PARTITION:
            return batch, metrics
        figures: dict[str, float] = {}
        allocation = ALLOCATIONS.take(global_steps)
        if allocation is not None:
            figures.update(allocation.metrics())
        if batch.keys:
            data = tq.kv_batch_get(keys=batch.keys, partition_id=partition_id, select_fields=["extra_fields"])
            figures.update(trained_figures([getattr(item, "data", item) for item in data["extra_fields"]]))
            name_rows_by_key(batch.keys, partition_id)
        return batch, {**metrics, **figures}


class TraceReplayBufferAsync(TraceReplayBuffer, ReplayBufferAsync):
    """verl's `ReplayBufferAsync` (the `colocate_async` and `separate_async` trainers) with what
    `TraceReplayBuffer` adds. Staleness control, refills of evicted groups and the order (oldest
    dispatch first) are verl's; what fills a sample is TRACE's.

    verl fills a sample with `batch_size` groups, each of `rollout.n` rollouts. TRACE's groups differ
    in size, and a prompt TRACE skipped is a group without trajectories that finishes at once, so
    counting groups would fill early samples with empty ones. A sample instead takes finished groups,
    oldest first, until the bare rollouts taken by all samples so far reach the sum of their shares
    (`batch_size` × the bare rollouts allocated per dispatched group): skipped prompts go with the
    groups around them, and a sample that overshoots its share makes the next one smaller by as much.
    When nothing is in flight any more the groups at hand are taken, short or not, and the shortfall is
    not carried: verl's evictions and TRACE's refills need not return every rollout they drop, and
    nothing else would end the wait.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._due = 0.0  # the shares of the samples so far, in bare rollouts
        self._taken = 0.0  # the bare rollouts they took, shortfalls forgiven

    def _has_enough_samples(
        self, global_steps: int, partition_id: str, batch_size: int, sampleable_keys: set[str]
    ) -> bool:
        if partition_id != TRAIN_PARTITION:
            return super()._has_enough_samples(global_steps, partition_id, batch_size, sampleable_keys)
        # verl's own check with no group count: what is left is its wait for stale prompts in flight
        if not super()._has_enough_samples(global_steps, partition_id, 0, sampleable_keys):
            return False
        at_hand = self._bare_rollouts_in(partition_id, sampleable_keys)
        if at_hand >= self._quota(batch_size):
            return True
        if self.pending_keys[partition_id] or self.running_keys[partition_id]:
            return False
        if at_hand == 0:
            raise RuntimeError(
                "every prompt dispatched so far was skipped or failed and nothing is in flight: the "
                "step has nothing to train on (is trace.budget at least trace.min_rollouts?)"
            )
        return True

    def _select_prompt_uids(
        self, partition_id: str, sampleable_keys: set[str], batch_size: int
    ) -> tuple[list[str], dict[str, dict[Any, Any]], dict[str, int]]:
        selected, partition, steps = super()._select_prompt_uids(partition_id, sampleable_keys, batch_size)
        if partition_id != TRAIN_PARTITION:
            return selected, partition, steps
        rollouts = self._bare_rollouts(partition_id)
        selected = groups_for_quota(sampleable_keys, steps, rollouts, self._quota(batch_size))
        self._due += self._share(batch_size)
        # an overshoot is carried to the next sample; a shortfall (nothing was left in flight) is not
        self._taken = max(self._taken + sum(rollouts.get(uid, 0) for uid in selected), self._due)
        return selected, partition, steps

    def get_sampleable_count(self, global_steps: int, partition_id: str) -> int:
        """The finished groups' bare rollouts in groups of the allocation's size (verl's hybrid rollout
        switch weighs this against its group thresholds; a skipped prompt's empty group is not ready)."""
        if partition_id != TRAIN_PARTITION:
            return super().get_sampleable_count(global_steps, partition_id)
        self._sync_metadata_from_transfer_queue()
        reasons = self._terminal_eviction_reasons(global_steps, partition_id)
        at_hand = self._bare_rollouts_in(partition_id, self._sampleable_terminal_keys(partition_id, reasons))
        per_group = ALLOCATIONS.rollouts_per_group()
        return math.floor(at_hand / per_group) if per_group > 0 else 0

    def _share(self, batch_size: int) -> float:
        """A sample's share of the budget: `batch_size` groups at the bare rollouts allocated per group."""
        return batch_size * ALLOCATIONS.rollouts_per_group()

    def _quota(self, batch_size: int) -> float:
        """This sample's bare rollouts: its share, less what earlier samples took beyond theirs, at
        least one, so that a sample never trains on nothing."""
        return max(1.0, self._due + self._share(batch_size) - self._taken)

    def _bare_rollouts(self, partition_id: str) -> Counter[str]:
        """Per group with trajectories, its bare rollouts: the sessions among its keys
        `{uid}_{session}_{index}` (a Stage 2 continuation is a further index of its session)."""
        return Counter(uid for uid, _ in {tuple(key.split("_")[:2]) for key in self.partitions[partition_id]})

    def _bare_rollouts_in(self, partition_id: str, uids: Iterable[str]) -> int:
        rollouts = self._bare_rollouts(partition_id)
        return sum(rollouts.get(uid, 0) for uid in uids)


def groups_for_quota(
    sampleable: set[str], steps: Mapping[str, int], bare_rollouts: Mapping[str, int], quota: float
) -> list[str]:
    """The oldest groups (by the step that dispatched them, as verl orders them) whose bare rollouts
    reach `quota`, the groups without trajectories among them included; all when they do not reach it."""
    chosen: list[str] = []
    total = 0
    for uid in sorted(sampleable, key=lambda uid: (steps.get(uid, 0), uid)):
        if total >= quota:
            break
        chosen.append(uid)
        total += bare_rollouts.get(uid, 0)
    return chosen


__all__ = [
    "ALLOCATIONS",
    "TRACE_METRICS",
    "AllocationFigures",
    "TraceReplayBuffer",
    "TraceReplayBufferAsync",
    "groups_for_quota",
    "trained_figures",
]
