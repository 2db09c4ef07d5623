"""verl's sync replay buffer with TRACE's figures: `TraceReplayBuffer` (`trainer.v1.sampler.custom_sampler`).

verl's v1 trainer logs, per step, the `metrics` dict its `_step_once` fills; the one thing a trainer
configuration can plug into that dict is the replay buffer, whose `sample` returns `(batch, metrics)`
and whose metrics the trainer merges into the step's (verl 0.9.1, `PPOTrainer._step_once`). The
agent-loop manager returns nothing to the trainer in v1 (`generate_sequences` only dispatches), so the
manager leaves its allocation's figures here, per step, and the replay buffer adds them to the figures
of the trajectories it hands the trainer. Everything is logged under `trace/` (see `TRACE_METRICS`).

The replay buffer also names each sampled row: it writes the row's TransferQueue key into the row's
`uid` field. verl hands the rows' `uid` to the advantage estimator as `index`, and that is how the
`trace` estimator finds each row's tree advantages (the key still starts with the prompt's uid).
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

import transfer_queue as tq
from transfer_queue import KVBatchMeta
from verl.trainer.ppo.v1.replay_buffer import ReplayBuffer
from verl.utils import tensordict_utils as tu

from trace_proto import AllocateResponse, PredictorInfo

#: verl's TransferQueue partition of the training trajectories.
TRAIN_PARTITION: Final = "train"
#: `extra_fields` of a TRACE path (written by the agent loop, read here).
REWARD_FIELD: Final = "trace_reward"
TREE_ID_FIELD: Final = "trace_tree_id"
LEAF_ID_FIELD: Final = "trace_leaf_id"
TREE_MIXED_FIELD: Final = "trace_tree_mixed"
CONTINUATION_FIELD: Final = "trace_continuation"
TRUNCATED_FIELD: Final = "trace_truncated"
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

    @classmethod
    def of(cls, allocation: AllocateResponse, predictor: PredictorInfo | None = None) -> AllocationFigures:
        return cls(
            prompts=len(allocation.trees) + len(allocation.skipped),
            skipped_prompts=len(allocation.skipped),
            bare_rollouts=sum(tree.rollouts for tree in allocation.trees),
            continuations_promised=sum(tree.expansion_budget for tree in allocation.trees),
            expected_mixed=allocation.expected_mixed,
            predictor_version=allocation.predictor_version,
            predictor=predictor,
        )

    def plus(self, other: AllocationFigures) -> AllocationFigures:
        """Two allocations of one step (verl refills a failed group with a new prompt batch)."""
        return replace(
            other,
            prompts=self.prompts + other.prompts,
            skipped_prompts=self.skipped_prompts + other.skipped_prompts,
            bare_rollouts=self.bare_rollouts + other.bare_rollouts,
            continuations_promised=self.continuations_promised + other.continuations_promised,
            expected_mixed=self.expected_mixed + other.expected_mixed,
            predictor=other.predictor or self.predictor,
        )

    def metrics(self) -> dict[str, float]:
        figures: dict[str, float] = {
            "trace/prompts": self.prompts,
            "trace/skipped_prompts": self.skipped_prompts,
            "trace/bare_rollouts_promised": self.bare_rollouts,
            "trace/continuations_promised": self.continuations_promised,
            "trace/expected_mixed": self.expected_mixed,
            "trace/predictor/version": self.predictor_version,
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
    """The manager's figures per training step, until the replay buffer samples that step. Both live in
    verl's trainer process (`TaskRunnerV1` creates the manager and the trainer that owns the buffer)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._steps: dict[int, AllocationFigures] = {}

    def publish(self, step: int, figures: AllocationFigures) -> None:
        with self._lock:
            earlier = self._steps.get(step)
            self._steps[step] = figures if earlier is None else earlier.plus(figures)

    def take(self, step: int) -> AllocationFigures | None:
        """This step's figures, once; figures of earlier steps are dropped (their step is over)."""
        with self._lock:
            for old in [s for s in self._steps if s < step]:
                del self._steps[old]
            return self._steps.pop(step, None)


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


__all__ = [
    "ALLOCATIONS",
    "TRACE_METRICS",
    "AllocationFigures",
    "TraceReplayBuffer",
    "trained_figures",
]
