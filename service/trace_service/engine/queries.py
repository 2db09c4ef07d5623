"""Trees as trainers read them (and closing one early), a job's statistics, and predictions on demand."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import numpy as np
from pydantic import TypeAdapter

from trace_proto import (
    ArmTotals,
    GainEstimate,
    GainRatio,
    HistoryIn,
    JobDeleted,
    JobStats,
    PredictResponse,
    StepStats,
    TreeNode,
    TreeResponse,
)
from trace_service.allocation.gain import (
    BRANCH_DEEP,
    BRANCH_FIRST,
    CONTROL,
    POLICY,
    ArmSums,
    Unit,
    gain_ratio,
)
from trace_service.allocation.tree import advantages
from trace_service.engine.common import Clock, NotFoundError
from trace_service.engine.completion import Completion
from trace_service.engine.evidence import JobEvidence
from trace_service.lifecycle import FINISHED
from trace_service.metrics import GAIN_BOUNDS, GAIN_UNITS, OTHER_JOBS, Metrics, gauge_value
from trace_service.offload import off_loop
from trace_service.predictor import OutcomeCounts, Query, Turn
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.settings import Settings
from trace_service.store import AllocationCounts, StoredTree, TreeMeta, TreeStore


class Trees:
    """GET /v1/trees/{id} and POST /v1/trees/{id}/close, answered as the JSON of a ``TreeResponse``."""

    def __init__(self, store: TreeStore, settings: Settings, completion: Completion, clock: Clock) -> None:
        self.store = store
        self.settings = settings
        self.completion = completion
        self.clock = clock

    async def tree(self, tree_id: str) -> bytes:
        threshold = self.settings.success_threshold
        read = await self.store.with_tree(
            tree_id, lambda tree: (export_tree(tree, threshold), tree.meta.status in FINISHED)
        )
        if read is None:
            raise NotFoundError(f"unknown tree {tree_id!r} (it may have expired)")
        exported, finished = read
        if finished:  # the trainer has what it needs of it (retention by need)
            await self.store.retain_tree(tree_id, "read")
        return exported

    async def close(self, tree_id: str) -> bytes:
        before = await self.store.close_tree(tree_id, self.clock())
        if before is None:
            raise NotFoundError(f"unknown tree {tree_id!r} (it may have expired)")
        threshold = self.settings.success_threshold

        def closing(tree: StoredTree) -> tuple[bytes, str, list[str]]:
            return export_tree(tree, threshold), tree.meta.job, list(tree.instructions)

        closed = await self.store.with_tree(tree_id, closing)
        if closed is None:
            raise NotFoundError(f"unknown tree {tree_id!r} (it may have expired)")
        exported, job, instructions = closed
        if before not in FINISHED:
            await self.store.dequeue_instructions(job, [(tree_id, i) for i in instructions])
            await self.completion.completed(tree_id)
        await self.store.retain_tree(tree_id, "read")
        return exported


class JobStatistics:
    """GET /v1/jobs/{job}/stats."""

    def __init__(self, store: TreeStore, settings: Settings, evidence: JobEvidence, metrics: Metrics) -> None:
        self.store = store
        self.settings = settings
        self.evidence = evidence
        self.metrics = metrics

    async def job_stats(self, job: str, from_step: int | None = None, to_step: int | None = None) -> JobStats:
        """The job's most recent steps (``stats_steps`` at most) within ``[from_step, to_step]``, and the
        gain over them."""
        if from_step is not None and to_step is not None and from_step > to_step:
            raise ValueError(f"from_step ({from_step}) exceeds to_step ({to_step}): no step lies between")
        steps = await self.store.steps(job, self.settings.stats_steps, from_step, to_step)
        if not steps:
            if await self.store.steps(job, 1):
                return JobStats(job=job, steps=[], calibration=await self.evidence.calibration(job))
            raise NotFoundError(f"unknown job {job!r}")
        # Each hash once for every step; the sums before any step's trees (see _step_stats).
        allocations = await self.store.step_allocations(job)
        totals = await self.store.step_totals(job)
        summaries = [
            await self._step_stats(job, step, allocations.get(step, []), totals.get(step, {}))
            for step in steps
        ]
        controls = sum(summary.control_trees for summary in summaries)
        gain = gain_estimate([totals.get(step, {}) for step in steps]) if controls else None
        stats = JobStats(
            job=job, steps=summaries, gain=gain, calibration=await self.evidence.calibration(job)
        )
        self._publish(job, stats)
        return stats

    def _publish(self, job: str, stats: JobStats) -> None:
        """The job's latest effective ratio, gain and skill on control prompts as gauges."""
        label = self.metrics.job_label(job)
        if label == OTHER_JOBS:
            return
        ratio = stats.steps[-1].effective_ratio
        if ratio is not None:
            self.metrics.effective_ratio.labels(label).set(ratio)
        gain = stats.gain
        estimates = (None, None) if gain is None else (gain.per_bare_rollout, gain.per_turn)
        for unit, estimate in zip(GAIN_UNITS, estimates, strict=True):
            bounds = (None,) * 3 if estimate is None else (estimate.ratio, estimate.low, estimate.high)
            for bound, value in zip(GAIN_BOUNDS, bounds, strict=True):
                self.metrics.gain_ratio.labels(label, unit, bound).set(gauge_value(value))
        skill = stats.calibration.skill if stats.calibration else None
        self.metrics.control_brier_skill.labels(label).set(gauge_value(skill))

    async def _step_stats(
        self, job: str, step: int, allocations: list[AllocationCounts], totals: dict[str, int]
    ) -> StepStats:
        """A step's figures: the sums kept for its counted trees (they outlive the trees) plus what its
        other trees hold now.  The sums were read first: a tree counted in between is missed by this
        answer (and counted in the next), never counted twice."""
        tree_ids = await self.store.step_tree_ids(job, step)
        budget = sum(allocation.bare_promised for allocation in allocations)
        share = (
            sum(allocation.policy_share * allocation.bare_promised for allocation in allocations) / budget
            if budget
            else 1.0
        )
        uncounted = await self.store.uncounted(job, tree_ids)
        live = [meta for meta in await self.store.load_metas(uncounted) if meta]
        active = sum(allocation.trees for allocation in allocations)
        controls = sum(allocation.controls for allocation in allocations)
        bare_promised = sum(allocation.bare_promised for allocation in allocations)
        prompts = sum(allocation.prompts for allocation in allocations)

        def total(figure: str, live_value: Callable[[TreeMeta], int]) -> int:
            return totals.get(figure, 0) + sum(live_value(meta) for meta in live)

        return StepStats(
            step=step,
            prompts=prompts,
            active=active,
            skipped=prompts - active,
            trees_complete=total("trees_complete", lambda meta: int(meta.finished)),
            mixed=total("mixed", lambda meta: int(meta.mixed)),
            budget_promised=bare_promised,
            rollouts_spent=total("rollouts_spent", lambda meta: meta.bare_leaves),
            continuations_promised=total("continuations_promised", lambda meta: meta.promised),
            continuations_spent=total("continuations_spent", lambda meta: meta.cont_leaves),
            fallback_units=total("fallback_units", lambda meta: meta.fallback),
            turns=total("turns", lambda meta: meta.turns),
            control_trees=controls,
            control_mixed=total(f"{CONTROL}_mixed", lambda meta: int(meta.control and meta.mixed)),
            policy_share=share,
            policy=arm_totals(ArmSums.from_figures(totals, POLICY)),
            control=arm_totals(ArmSums.from_figures(totals, CONTROL)),
            branch_deep=shape_totals(totals, BRANCH_DEEP),
            branch_first=shape_totals(totals, BRANCH_FIRST),
        )


def gain_estimate(step_totals: Sequence[Mapping[str, int]]) -> GainEstimate:
    """The gain over uniform of the steps' complete trees, each step weighing alike
    (``allocation.gain``)."""
    policy = [(1.0, ArmSums.from_figures(totals, POLICY)) for totals in step_totals]
    control = [(1.0, ArmSums.from_figures(totals, CONTROL)) for totals in step_totals]

    def ratio(unit: Unit) -> GainRatio | None:
        estimate = gain_ratio(policy, control, unit)
        return (
            None
            if estimate is None
            else GainRatio(ratio=estimate.ratio, low=estimate.low, high=estimate.high)
        )

    return GainEstimate(
        policy=arm_totals(sum((sums for _, sums in policy), ArmSums())),
        control=arm_totals(sum((sums for _, sums in control), ArmSums())),
        per_bare_rollout=ratio("bare"),
        per_turn=ratio("turns"),
    )


def shape_totals(totals: Mapping[str, int], arm: str) -> ArmTotals | None:
    """The wire form of a step's sums of one shape of the policy's Stage 2; None when the step drew no
    shapes."""
    if not totals.get(f"{BRANCH_DEEP}_trees") and not totals.get(f"{BRANCH_FIRST}_trees"):
        return None
    return arm_totals(ArmSums.from_figures(totals, arm))


def arm_totals(sums: ArmSums) -> ArmTotals:
    """The wire form of an arm's sums."""
    return ArmTotals(trees=sums.trees, mixed=sums.mixed, bare_rollouts=sums.bare, turns=sums.turns)


class Jobs:
    """DELETE /v1/jobs/{job}: everything of a job, its predictor included."""

    def __init__(self, store: TreeStore, predictors: PredictorRegistry) -> None:
        self.store = store
        self.predictors = predictors

    async def delete(self, job: str) -> JobDeleted:
        """Remove the job's keys, then its predictor from this replica (the others drop it at their
        next refresh).  Trees of the job still in flight are gone: their events are refused as unknown."""
        deleted = await self.store.delete_job(job)
        await self.predictors.forget(job)
        return JobDeleted(job=job, keys_deleted=deleted)


class Predictions:
    """POST /v1/predict: Ṽ for histories a client sends (debugging and offline evaluation)."""

    def __init__(self, store: TreeStore, predictors: PredictorRegistry) -> None:
        self.store = store
        self.predictors = predictors

    async def predict(self, job: str, histories: Sequence[HistoryIn]) -> PredictResponse:
        history = await self.store.prompt_outcomes(job, [h.prompt_id for h in histories])
        featurizer = self.predictors.featurizer

        def encode() -> list[Query]:
            return [
                Query(
                    featurizer.encode(
                        h.prompt_id,
                        h.prompt_text or "",
                        h.prompt_features,
                        [Turn(turn.text or "", turn.features) for turn in h.turns],
                    ),
                    OutcomeCounts(outcomes.successes, outcomes.trials),
                )
                for h, outcomes in zip(histories, history, strict=True)
            ]

        turns = sum(len(h.turns) for h in histories) + len(histories)
        predictor = await self.predictors.get(job)
        version, values = await predictor.predict(await off_loop(turns, encode))
        return PredictResponse(predictor_version=version, predictions=[float(x) for x in values])


#: Nodes built and serialised per call: none of their objects outlives the call (a large tree's would
#: otherwise cost the garbage collector full collections), and no call holds the interpreter for long.
_NODES_PER_PART = 2048
_NODE_LIST = TypeAdapter(list[TreeNode])


def export_tree(tree: StoredTree, success_threshold: float) -> bytes:
    """The tree as trainers consume it, as the JSON of a ``TreeResponse``: per node visits, successes,
    V̂, Ṽ at decision time, advantage.  The nodes are built and serialised a slice at a time."""
    meta = tree.meta
    targets = tree.targets(success_threshold)
    advantage = advantages(tree.parent_indices(), targets)

    def defined(value: float) -> float | None:
        return None if np.isnan(value) else float(value)

    def part(start: int) -> bytes:
        nodes = [
            TreeNode(
                node_id=node.node_id,
                parent_id=node.parent_id,
                depth=int(targets.depth[i]),
                visits=int(targets.visits[i]),
                successes=int(targets.successes[i]),
                value=defined(targets.value[i]),
                predicted=tree.predictions.get(node.node_id),
                advantage=defined(advantage[i]),
                reward=node.reward,
                instruction_id=node.instruction_id,
            )
            for i, node in enumerate(tree.nodes[start : start + _NODES_PER_PART], start)
        ]
        return _NODE_LIST.dump_json(nodes)[1:-1]

    head = TreeResponse(
        tree_id=meta.tree_id,
        prompt_id=meta.prompt_id,
        job=meta.job,
        step=meta.step,
        status=meta.status,
        mixed=targets.mixed,
        rollouts=meta.rollouts,
        expansion_budget=meta.expansion_budget,
        control=meta.control,
        value=defined(targets.root_value),
        nodes=[],
    )
    parts = [part(start) for start in range(0, len(tree.nodes), _NODES_PER_PART)]
    # nodes is the response's last field: its members, then the nodes.
    return head.model_dump_json(exclude={"nodes"}).encode()[:-1] + b',"nodes":[' + b",".join(parts) + b"]}"
