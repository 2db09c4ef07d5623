"""POST /v1/allocate: idempotency, the predictions, and Stage 1 (bare rollouts per prompt, one tree
per active prompt)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trace_proto import AllocateRequest, AllocateResponse, Policy
from trace_service.allocation import (
    POLICIES,
    Reserve,
    RootInputs,
    bare_mixed_chance,
    continuation_budget,
    root_value,
)
from trace_service.allocation.control_share import RootPlan, plan_roots
from trace_service.allocation.gain import BRANCH_DEEP, BRANCH_FIRST
from trace_service.allocation.split import ANY_DEPTH, BranchShape, Split, draw_deep
from trace_service.allocation.trust import Trust
from trace_service.engine.budget import StoreBudget
from trace_service.engine.common import Clock, IdempotencyConflictError, fresh_ids
from trace_service.engine.evidence import JobEvidence, budget_split, trust_map
from trace_service.metrics import OTHER_JOBS, Metrics
from trace_service.offload import off_loop
from trace_service.predictor import OutcomeCounts, Query
from trace_service.predictor.job_predictors import PredictorRegistry
from trace_service.store import NewTree, PromptOutcomes, TreeStore


class Allocation:
    """Answers allocation requests: predicts each prompt's success, draws the control trees, runs the
    policy's Stage 1 rule on the predictions as the job's trust map reads them, and creates the trees,
    remembering the answer under the request's idempotency key."""

    def __init__(
        self,
        store: TreeStore,
        predictors: PredictorRegistry,
        evidence: JobEvidence,
        budget: StoreBudget,
        metrics: Metrics,
        clock: Clock,
    ) -> None:
        self.store = store
        self.predictors = predictors
        self.evidence = evidence
        self.budget = budget
        self.metrics = metrics
        self.clock = clock
        self._rng = np.random.default_rng()

    async def allocate(self, request: AllocateRequest, idempotency_key: str | None) -> AllocateResponse:
        """Stage 1, in at most four store round trips (docs/design.md): every read at once, the reserve
        and the trees, the answer remembered under the idempotency key, the trees listed.  Trees are
        created before the answer is remembered and listed after, so a retry after any failure gets
        trees that exist; listing is idempotent."""
        fingerprint = ""
        if idempotency_key:
            fingerprint = await off_loop(len(request.prompts), request_fingerprint, request)
        # A calibrated policy reads Ṽ through the job's trust map; with ε = 0 no random sample anchors
        # the fit, and Stage 1 reads the predictor as it is.
        calibrated = POLICIES[request.policy].calibrated and request.control_share > 0
        reads = await self.store.allocation_reads(
            request.job,
            [p.prompt_id for p in request.prompts],
            idempotency_key,
            groups=calibrated,
            totals_of=self.evidence.steps_read(request.step, request.control_share),
        )
        if idempotency_key and reads.remembered is not None:
            response = _remembered(idempotency_key, fingerprint, reads.remembered)
            await self._index(request, response)  # in case the first attempt stopped before it
            return response
        self.budget.check_new_work()  # an answer already given is not new work
        with self.metrics.allocate_duration.labels(request.policy.value).time():
            trust = (
                await self.evidence.fitted(reads.control_groups, reads.policy_groups) if calibrated else None
            )
            split = self.evidence.split(reads.step_totals, request.step, request.control_share)
            shape = (
                self.evidence.shape(reads.step_totals, request.step, request.control_share)
                if draws_shapes(request)
                else ANY_DEPTH
            )
            response, trees = await self._decide_roots(request, reads.history, split, shape, trust)
        await self.store.create_trees(trees, self.clock(), reserve=self._reserve(request, trees))
        if idempotency_key:
            body = response.model_dump_json()
            winner = await self.store.remember_response(request.job, idempotency_key, fingerprint, body)
            if winner[1] != body:
                # A concurrent twin answered first: its trees stand; ours, never listed nor answered,
                # go at once.
                await self.store.discard_allocation(
                    request.job, response.allocation_id, [tree.tree_id for tree in trees]
                )
                response = _remembered(idempotency_key, fingerprint, winner)
                await self._index(request, response)
                return response
        await self._index(request, response)
        self._count(request, response, trees)
        return response

    @staticmethod
    def _reserve(request: AllocateRequest, trees: list[NewTree]) -> Reserve | None:
        """The allocation's shared continuation reserve, for a sharing policy."""
        sharing = POLICIES[request.policy].sharing
        shared = [tree for tree in trees if not tree.control]
        if sharing is None or not any(t.expansion_budget for t in shared):
            return None
        return Reserve.of(
            [sharing.split(tree.expansion_budget)[1] for tree in shared],
            [tree.mixed_chance for tree in shared],
        )

    def _count(self, request: AllocateRequest, response: AllocateResponse, trees: list[NewTree]) -> None:
        job = self.metrics.job_label(request.job)
        self.metrics.allocate_prompts.labels(job, "active").inc(len(response.trees))
        self.metrics.allocate_prompts.labels(job, "skipped").inc(len(response.skipped))
        promised = self.metrics.budget_promised
        promised.labels(job, "bare").inc(sum(tree.rollouts for tree in trees))
        promised.labels(job, "continuation").inc(sum(tree.expansion_budget for tree in trees))
        if job != OTHER_JOBS:
            if response.trust is not None:
                self.metrics.trust_slope.labels(job).set(response.trust.slope)
            if response.split is not None:
                self.metrics.policy_share.labels(job).set(response.split.policy_share)
                self.metrics.deep_branch_share.labels(job).set(response.split.deep_branch_share)

    async def _index(self, request: AllocateRequest, response: AllocateResponse) -> None:
        await self.store.index_allocation(
            request.job,
            request.step,
            response.allocation_id,
            len(request.prompts),
            [tree.tree_id for tree in response.trees],
            sum(tree.rollouts for tree in response.trees),
            self.clock(),
            controls=sum(tree.control for tree in response.trees),
            policy_share=1.0 if response.split is None else response.split.policy_share,
        )

    async def _decide_roots(
        self,
        request: AllocateRequest,
        history: list[PromptOutcomes],
        split: Split,
        shape: BranchShape,
        trust: Trust | None,
    ) -> tuple[AllocateResponse, list[NewTree]]:
        prompts = request.prompts
        predictor = await self.predictors.get(request.job, warm_from=request.predictor_from)
        encoded = await off_loop(
            len(prompts),
            self.predictors.featurizer.encode_prompts,
            [(p.prompt_id, p.text or "", p.features) for p in prompts],
        )
        queries = [
            Query(root, OutcomeCounts(h.successes, h.trials))
            for root, h in zip(encoded, history, strict=True)
        ]
        version, v = await predictor.predict(queries)
        return await off_loop(
            len(prompts),
            self._plan_roots,
            request,
            history,
            version,
            v,
            _Evidence(predictor.freshness, split, shape, trust),
        )

    def _plan_roots(
        self,
        request: AllocateRequest,
        history: list[PromptOutcomes],
        version: int,
        v: npt.NDArray[np.float64],
        evidence: _Evidence,
    ) -> tuple[AllocateResponse, list[NewTree]]:
        """Stage 1 from the job's predictions and what its evidence says (the split of its budget, the
        shape of its Stage 2, its trust map and continuation freshness): the answer and the trees to
        create."""
        trust = evidence.trust
        read = v if trust is None else trust.apply(v)
        plan = self._stage1(request, history, read, evidence.freshness, evidence.split.control_share)
        expansion = continuation_budget(plan.counts, request.expansion)
        shapes = self._shapes(request, plan, expansion, evidence.shape)
        allocation_id, trees = _new_trees(request, history, plan, expansion, shapes, v, read)
        shown = (evidence.split, evidence.shape) if request.control_share > 0 else None
        return _response(request, allocation_id, trees, plan.counts, version, v, read, trust, shown), trees

    def _shapes(
        self, request: AllocateRequest, plan: RootPlan, expansion: npt.NDArray[np.int64], shape: BranchShape
    ) -> list[str | None]:
        """Each prompt's arm of the shape split: of the policy's trees that have continuations to place,
        ``BRANCH_DEEP`` may branch at any depth the request allows, ``BRANCH_FIRST`` from first turns
        only (``allocation.split.decide_shape``); None for the others, and for all when the request
        draws no shapes (:func:`draws_shapes`)."""
        if not draws_shapes(request):
            return [None] * plan.counts.size
        branches = ~plan.control & (expansion > 0)
        deep = draw_deep(branches, shape.deep_share, self._rng)
        return [
            (BRANCH_DEEP if d else BRANCH_FIRST) if b else None
            for d, b in zip(deep.tolist(), branches.tolist(), strict=True)
        ]

    def _stage1(
        self,
        request: AllocateRequest,
        history: list[PromptOutcomes],
        read: npt.NDArray[np.float64],
        freshness: float,
        control_share: float,
    ) -> RootPlan:
        """The control trees, then the policy's Stage 1 rule (allocation.POLICIES) over the rest, given
        every input a rule may read."""
        return plan_roots(
            POLICIES[request.policy].roots,
            RootInputs(
                n_prompts=len(request.prompts),
                budget=request.budget,
                min_rollouts=request.min_rollouts,
                max_rollouts=request.max_rollouts,
                max_prompts=request.max_prompts,
                expansion=request.expansion,
                predicted=read,
                freshness=freshness,
                zero_variance_streak=np.array([h.zero_variance_streak for h in history], dtype=np.int64),
                rng=self._rng,
            ),
            control_share,
            self._rng,
        )


def draws_shapes(request: AllocateRequest) -> bool:
    """Whether the request's policy trees are drawn deep or first-turn: under a policy whose shape
    follows evidence, with controls to keep the evidence (ε > 0), and a request that allows more than
    first turns and has not fixed the shape."""
    shallow_only = request.max_branch_depth is not None and request.max_branch_depth <= 1
    return (
        POLICIES[request.policy].shaped
        and request.shape_from_evidence
        and request.control_share > 0
        and not shallow_only
    )


@dataclass(frozen=True)
class _Evidence:
    """What the job's earlier trees say, as Stage 1 reads it."""

    freshness: float
    split: Split
    shape: BranchShape
    trust: Trust | None


def _new_trees(
    request: AllocateRequest,
    history: list[PromptOutcomes],
    plan: RootPlan,
    continuations: npt.NDArray[np.int64],
    shapes: list[str | None],
    v: npt.NDArray[np.float64],
    read: npt.NDArray[np.float64],
) -> tuple[str, list[NewTree]]:
    """The allocation's id, and a tree for each prompt the plan gives bare rollouts, of its arm of the
    shape split (``Allocation._shapes``)."""
    prompts, counts = request.prompts, plan.counts
    expansion = continuations.tolist()
    rollouts, predicted, control = counts.tolist(), v.tolist(), plan.control.tolist()
    mixed_chance = bare_mixed_chance(read, counts).tolist()
    active = [i for i, count in enumerate(rollouts) if count > 0]
    allocation_id, *tree_ids = fresh_ids(1 + len(active))
    trees = [
        NewTree(
            tree_id=tree_id,
            allocation_id=allocation_id,
            job=request.job,
            step=request.step,
            prompt_id=prompts[i].prompt_id,
            prompt_text=prompts[i].text or "",
            prompt_features=prompts[i].features,
            rollouts=rollouts[i],
            expansion_budget=expansion[i],
            rounds=request.rounds,
            # A control tree follows uniform's Stage 2, whatever the policy.
            policy=(Policy.UNIFORM if control[i] else request.policy).value,
            predicted_success=predicted[i],
            return_unspent=request.return_unspent,
            max_branch_depth=request.max_branch_depth if shapes[i] != BRANCH_FIRST else 1,
            prior_outcomes=(history[i].successes, history[i].trials),
            control=control[i],
            mixed_chance=mixed_chance[i],
            shape=shapes[i],
        )
        for i, tree_id in zip(active, tree_ids, strict=True)
    ]
    return allocation_id, trees


def _response(
    request: AllocateRequest,
    allocation_id: str,
    trees: list[NewTree],
    counts: npt.NDArray[np.int64],
    version: int,
    v: npt.NDArray[np.float64],
    read: npt.NDArray[np.float64],
    trust: Trust | None,
    split: tuple[Split, BranchShape] | None,
) -> AllocateResponse:
    """The answer: the trees, the prompts given no rollouts, and what the plan expects."""
    rollouts, predicted = counts.tolist(), v.tolist()
    # Validated in one pass from plain data: a thousand model constructors cost ~10 ms.
    return AllocateResponse.model_validate(
        {
            "allocation_id": allocation_id,
            "job": request.job,
            "step": request.step,
            "policy": request.policy,
            "predictor_version": version,
            "trees": [
                {
                    "prompt_id": t.prompt_id,
                    "tree_id": t.tree_id,
                    "rollouts": t.rollouts,
                    "expansion_budget": t.expansion_budget,
                    "predicted_success": t.predicted_success,
                    "control": t.control,
                }
                for t in trees
            ],
            "skipped": [
                {"prompt_id": p.prompt_id, "predicted_success": predicted[i]}
                for i, p in enumerate(request.prompts)
                if rollouts[i] == 0
            ],
            "expected_mixed": float(root_value(read, counts).sum()),
            "budget": request.budget,
            "trust": None if trust is None else trust_map(trust),
            "split": None if split is None else budget_split(*split),
        }
    )


def request_fingerprint(request: AllocateRequest) -> str:
    """What identifies a request behind an idempotency key: a digest of its canonical JSON."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def _remembered(key: str, fingerprint: str, remembered: tuple[str, str]) -> AllocateResponse:
    """The answer remembered under an idempotency key, if it answered this same request."""
    first, body = remembered
    if first != fingerprint:
        raise IdempotencyConflictError(
            f"Idempotency-Key {key!r} was used for a different request; use a new key for a new request"
        )
    return AllocateResponse.model_validate_json(body)
