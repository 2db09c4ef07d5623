"""What follows a tree's completion, whoever finished it (its last event, a decision, a close, the
sweeper)."""

from __future__ import annotations

from trace_service.allocation.gain import CONTROL, POLICY
from trace_service.metrics import Metrics
from trace_service.store import TreeMeta, TreeStore


class Completion:
    def __init__(self, store: TreeStore, metrics: Metrics, evidence_window: int) -> None:
        self.store = store
        self.metrics = metrics
        self.evidence_window = evidence_window

    async def completed(self, tree_id: str, meta: TreeMeta | None = None) -> None:
        """Bookkeeping once a tree is finished: the prompt's outcome history (counted once per tree), a
        training example for the predictor, metrics; then it leaves the open list.  If this fails
        part-way the sweeper finds the finished tree still open and runs it again.  The example goes to
        the tree's own job's predictor.  ``meta`` is the
        tree's header when the caller has it (its counters no longer change)."""
        meta = meta or (await self.store.load_metas([tree_id]))[0]
        if meta is None:
            return
        # Two round trips: the bookkeeping, then (only once it stands) leaving the open list.
        counted = await self.store.record_completion(meta, self.evidence_window)
        if counted:
            job = self.metrics.job_label(meta.job)
            self.metrics.trees_completed.labels(job, "true" if meta.mixed else "false").inc()
            arm = CONTROL if meta.control else POLICY
            self.metrics.arm_trees.labels(job, arm).inc()
            self.metrics.arm_mixed.labels(job, arm).inc(int(meta.mixed))
            self.metrics.arm_bare_rollouts.labels(job, arm).inc(meta.bare_leaves)
            self.metrics.arm_turns.labels(job, arm).inc(meta.turns)
        await self.store.forget_open(meta.job, tree_id)
