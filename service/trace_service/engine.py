"""What the API does, independent of HTTP: allocation, event intake with Stage 2 decisions, instruction
leases, tree export and statistics.  Routers translate requests to these calls; the algorithms are the
pure functions of ``trace_service.allocation`` and ``trace_service.tree``.
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import os
import time
from collections.abc import Callable, Sequence
from typing import ParamSpec, TypeVar

import numpy as np
import numpy.typing as npt
from redis.exceptions import RedisError

from trace_proto import (
    AllocateRequest,
    AllocateResponse,
    ExpandEvent,
    ExpandResponse,
    HistoryIn,
    Instruction,
    InstructionsResponse,
    JobStats,
    Policy,
    PredictResponse,
    RejectedEvent,
    StepStats,
    TreeNode,
    TreeResponse,
    TreeStatus,
)
from trace_service.allocation import (
    allocate_roots,
    allocate_roots_exact,
    dapo_keep,
    expand_prefixes,
    greso_keep,
    knapsack_weight,
    pcl_roots,
    random_branching,
    root_value,
    round_budgets,
    spread_evenly,
    uniform_roots,
)
from trace_service.metrics import OTHER_JOBS, Metrics
from trace_service.predictor import OutcomeCounts, Query, Turn
from trace_service.runtime import PredictorRuntime
from trace_service.settings import Settings
from trace_service.store import (
    AllocationCounts,
    AppliedBatch,
    NewTree,
    PromptOutcomes,
    StoredTree,
    TreeMeta,
    TreeProgress,
    TreeStore,
)
from trace_service.tree import advantages, prefix_candidates

logger = logging.getLogger(__name__)

IntArray = npt.NDArray[np.int64]
#: A Stage 2 round's placement: continuations per candidate node, the candidates' ids, Ṽ at them, the
#: fallback units among the continuations, and the round's budget share.
Placement = tuple[IntArray, list[str], dict[str, float], int, int]

#: Stage 1 of each policy: TRACE's solver, or a baseline's rule.
_TRACE_ROOTS = {Policy.TRACE, Policy.TRACE_ROOT, Policy.TRACE_PAPER}
#: Stage 2 of each policy: TRACE's greedy, random prefixes (TreePO), or an even spread (uniform family).
_TRACE_PREFIXES = {Policy.TRACE, Policy.TRACE_PREFIX, Policy.TRACE_PAPER}
_RANDOM_PREFIXES = {Policy.TREEPO, Policy.TRACE_ROOT}
#: Trees whose follow-ups (decisions, completions) run concurrently, over all requests of this process.
_CONCURRENT_TREES = 32
#: Open trees the sweeper checks per store round trip (small: Redis runs one script at a time, and
#: requests wait behind it), and round trips per job and sweep.
_SWEEP_PAGE = 200
_SWEEP_PAGES = 50
#: Largest B·M·m_max for which Knapsack RL runs its exact DP; beyond it the envelope solver.
_KNAPSACK_DP_CELLS = 20_000_000


class NotFoundError(LookupError):
    """An unknown tree or job."""


class IdempotencyConflictError(ValueError):
    """An idempotency key reused for a different request (answered 422, as payment APIs do)."""


class Engine:
    def __init__(
        self,
        store: TreeStore,
        predictor: PredictorRuntime,
        settings: Settings,
        metrics: Metrics,
        *,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.predictor = predictor
        self.settings = settings
        self.metrics = metrics
        self.clock = clock
        self._rng = np.random.default_rng()
        # Trees of all requests followed up at once: bounds store connections (the embedded store's pool
        # holds 100) and keeps one huge batch from starving the others.
        self._tree_slots = asyncio.Semaphore(_CONCURRENT_TREES)
        # Where each job's sweep resumes (an SSCAN cursor) when its open list is longer than one sweep.
        self._sweep_cursors: dict[str, int] = {}

    # --- POST /v1/allocate -------------------------------------------------------------------------

    async def allocate(self, request: AllocateRequest, idempotency_key: str | None) -> AllocateResponse:
        """Stage 1.  Trees are created before the answer is remembered under the idempotency key and
        listed after, so a retry after any failure gets trees that exist; listing is idempotent."""
        fingerprint = ""
        if idempotency_key:
            fingerprint = await _off_loop(len(request.prompts), request_fingerprint, request)
            remembered = await self.store.recall_response(request.job, idempotency_key)
            if remembered is not None:
                response = self._remembered(idempotency_key, fingerprint, remembered)
                await self._index(request, response)  # in case the first attempt stopped before it
                return response
        with self.metrics.allocate_duration.labels(request.policy.value).time():
            response, trees = await self._decide_roots(request)
        now = self.clock()
        await self.store.create_trees(trees, now)
        if idempotency_key:
            body = response.model_dump_json()
            winner = await self.store.remember_response(request.job, idempotency_key, fingerprint, body)
            if winner[1] != body:
                # A concurrent twin answered first: its trees stand; ours stay unlisted and expire.
                response = self._remembered(idempotency_key, fingerprint, winner)
                await self._index(request, response)
                return response
        await self._index(request, response)
        job = self.metrics.job_label(request.job)
        self.metrics.allocate_prompts.labels(job, "active").inc(len(response.trees))
        self.metrics.allocate_prompts.labels(job, "skipped").inc(len(response.skipped))
        promised = self.metrics.budget_promised
        promised.labels(job, "bare").inc(sum(tree.rollouts for tree in trees))
        promised.labels(job, "continuation").inc(sum(tree.expansion_budget for tree in trees))
        return response

    @staticmethod
    def _remembered(key: str, fingerprint: str, remembered: tuple[str, str]) -> AllocateResponse:
        """The answer remembered under an idempotency key, if it answered this same request."""
        first, body = remembered
        if first and first != fingerprint:
            raise IdempotencyConflictError(
                f"Idempotency-Key {key!r} was used for a different request; use a new key for a new request"
            )
        return AllocateResponse.model_validate_json(body)

    async def _index(self, request: AllocateRequest, response: AllocateResponse) -> None:
        await self.store.index_allocation(
            request.job,
            request.step,
            response.allocation_id,
            len(request.prompts),
            [tree.tree_id for tree in response.trees],
            sum(tree.rollouts for tree in response.trees),
            self.clock(),
        )

    async def _decide_roots(self, request: AllocateRequest) -> tuple[AllocateResponse, list[NewTree]]:
        prompts = request.prompts
        history = await self.store.prompt_outcomes(request.job, [p.prompt_id for p in prompts])
        encoded = await _off_loop(
            len(prompts),
            self.predictor.featurizer.encode_prompts,
            [(p.prompt_id, p.text or "", p.features) for p in prompts],
        )
        queries = [
            Query(root, OutcomeCounts(h.successes, h.trials))
            for root, h in zip(encoded, history, strict=True)
        ]
        version, v = await self.predictor.predict(queries)
        return await _off_loop(len(prompts), self._plan_roots, request, history, version, v)

    def _plan_roots(
        self,
        request: AllocateRequest,
        history: list[PromptOutcomes],
        version: int,
        v: npt.NDArray[np.float64],
    ) -> tuple[AllocateResponse, list[NewTree]]:
        """Stage 1 from the predictions: the answer and the trees to create."""
        prompts = request.prompts
        counts = self._root_counts(request, v, np.array([h.zero_variance_streak for h in history]))
        expansion = np.floor(counts * request.expansion + 1e-9).astype(np.int64).tolist()
        rollouts, predicted = counts.tolist(), v.tolist()
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
                policy=request.policy.value,
                predicted_success=predicted[i],
                return_unspent=request.return_unspent,
                prior_outcomes=(history[i].successes, history[i].trials),
            )
            for i, tree_id in zip(active, tree_ids, strict=True)
        ]
        # Validated in one pass from plain data: a thousand model constructors cost ~10 ms.
        response = AllocateResponse.model_validate(
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
                    }
                    for t in trees
                ],
                "skipped": [
                    {"prompt_id": p.prompt_id, "predicted_success": predicted[i]}
                    for i, p in enumerate(prompts)
                    if rollouts[i] == 0
                ],
                "expected_mixed": float(root_value(v, counts).sum()),
                "budget": request.budget,
            }
        )
        return response, trees

    def _root_counts(
        self, request: AllocateRequest, v: npt.NDArray[np.float64], streak: IntArray
    ) -> IntArray:
        policy, budget, n = request.policy, request.budget, len(request.prompts)
        lo, hi, cap = request.min_rollouts, request.max_rollouts, request.max_prompts
        if policy in _TRACE_ROOTS:
            # The joint objective counts the contrast Stage 2 will add; the paper's values bare rollouts only.
            freshness = 0.0 if policy is Policy.TRACE_PAPER else self.predictor.freshness
            return allocate_roots(
                v,
                budget,
                min_rollouts=lo,
                max_rollouts=hi,
                max_prompts=cap,
                expansion=request.expansion,
                freshness=freshness,
            ).counts
        if policy is Policy.KNAPSACK:
            solver = allocate_roots_exact if n * budget * hi <= _KNAPSACK_DP_CELLS else allocate_roots
            weight = knapsack_weight(v)
            return solver(v, budget, min_rollouts=lo, max_rollouts=hi, max_prompts=cap, weight=weight).counts
        if policy is Policy.PCL:
            batch = min(n, request.max_prompts or n)
            per_prompt = int(np.clip(budget // max(batch, 1), request.min_rollouts, request.max_rollouts))
            return pcl_roots(v, budget, rollouts_per_prompt=per_prompt, max_prompts=cap)
        keep = greso_keep(streak, self._rng) if policy is Policy.GRESO else None
        return uniform_roots(n, budget, min_rollouts=lo, max_rollouts=hi, max_prompts=cap, keep=keep)

    # --- POST /v1/expand ---------------------------------------------------------------------------

    async def expand(self, events: Sequence[ExpandEvent]) -> ExpandResponse:
        """Record events tree by tree (each tree's batch atomically, trees concurrently), run the Stage 2
        decisions they make due, and report per event."""
        with self.metrics.expand_duration.time():
            # An event this server cannot use is refused before anything is recorded: once stored, a
            # bad feature vector would fail every Stage 2 decision of its tree.
            refused: list[RejectedEvent] = []
            by_tree: dict[str, list[int]] = {}
            feature_dim = self.predictor.featurizer.config.feature_dim
            for index, event in enumerate(events):
                problem = feature_problem(event.features, feature_dim)
                if problem is None:
                    by_tree.setdefault(event.tree_id, []).append(index)
                else:
                    refused.append(RejectedEvent(event_id=event.event_id, status=422, error=problem))
            by_tree = {tree_id: parents_first(events, indices) for tree_id, indices in by_tree.items()}
            tree_events = [(tree_id, [events[i] for i in idx]) for tree_id, idx in by_tree.items()]
            # Every tree's events in one store round trip; what they make due, tree by tree.
            batches = await self.store.apply_events(
                tree_events,
                now=self.clock(),
                success_threshold=self.settings.success_threshold,
                decision_lease=self.settings.decision_lease_seconds,
            )
            # Instructions whose continuations have all started leave the claim queue: one call per job.
            started: dict[str, list[tuple[str, str]]] = {}
            for (tree_id, _), batch in zip(tree_events, batches, strict=True):
                if not isinstance(batch, Exception) and batch.fully_started:
                    started.setdefault(batch.job, []).extend((tree_id, i) for i in batch.fully_started)
            for job, entries in started.items():
                await self.store.dequeue_instructions(job, entries)
            # A tree whose events failed to apply does not stop the others' follow-ups; the request
            # then fails, and its retry finds the others' events already recorded (208).
            outcomes = await asyncio.gather(
                *(
                    self._follow_up(tree_id, tree_batch, batch)
                    for (tree_id, tree_batch), batch in zip(tree_events, batches, strict=True)
                    if not isinstance(batch, Exception)
                )
            )
            failures = [batch for batch in batches if isinstance(batch, Exception)]
            if failures:
                raise failures[0]
        accepted = duplicates = 0
        rejected = refused
        instructions: list[Instruction] = []
        completed: list[str] = []
        for (tree_id, indices), (codes, tree_instructions, done) in zip(
            by_tree.items(), outcomes, strict=True
        ):
            for index, (code, message) in zip(indices, codes, strict=True):
                if code == 200:
                    accepted += 1
                elif code == 208:
                    duplicates += 1
                else:
                    rejected.append(
                        RejectedEvent(event_id=events[index].event_id, status=code, error=message)
                    )
            instructions.extend(tree_instructions)
            if done:
                completed.append(tree_id)
        self.metrics.expand_events.labels("accepted").inc(accepted)
        self.metrics.expand_events.labels("duplicate").inc(duplicates)
        self.metrics.expand_events.labels("rejected").inc(len(rejected))
        return ExpandResponse(
            accepted=accepted,
            duplicates=duplicates,
            rejected=rejected,
            instructions=instructions,
            completed=completed,
        )

    async def _follow_up(
        self, tree_id: str, events: list[ExpandEvent], batch: AppliedBatch
    ) -> tuple[list[tuple[int, str]], list[Instruction], bool]:
        """What one tree's applied events make due: a Stage 2 decision, the tree's completion, or the
        instructions again for a worker that resent its rollout ends."""
        codes = [(outcome.code, outcome.message) for outcome in batch.outcomes]
        job = batch.job
        if not job:  # unknown tree: every event was rejected
            return codes, [], False
        async with self._tree_slots:
            spent, label = self.metrics.budget_spent, self.metrics.job_label(job)
            spent.labels(label, "bare").inc(batch.new_bare_leaves)
            spent.labels(label, "continuation").inc(batch.new_continuation_leaves)
            instructions: list[Instruction] = []
            completed = batch.completed
            if batch.decision_round:
                instructions, completed = await self.decide(
                    tree_id, batch.decision_round, batch.token, inline=True, tree=batch.tree
                )
            elif batch.completed:
                await self._on_completed(tree_id, batch.meta)
            elif batch.status == "expanding" and _resent_rollout_ends(events, codes):
                instructions = await self._reoffer(job, tree_id)
            return codes, instructions, completed

    async def _reoffer(self, job: str, tree_id: str) -> list[Instruction]:
        """A worker resending rollout ends it already reported most likely lost the answer that carried
        the tree's instructions: give it the unstarted ones again, leased to it.  The store still caps
        each instruction's continuations, so a second taker can never over-spend."""
        tree = await self.store.load_tree(tree_id)
        if tree is None:
            return []
        unstarted = [i for i in tree.instructions.values() if i.unstarted > 0 and i.round == tree.meta.round]
        lease_until = self.clock() + self.settings.lease_seconds
        await self.store.queue_instructions(job, tree_id, {i.instruction_id: lease_until for i in unstarted})
        return [
            Instruction(
                instruction_id=i.instruction_id, tree_id=tree_id, node_id=i.node_id, count=i.unstarted
            )
            for i in unstarted
        ]

    async def decide(
        self, tree_id: str, round_: int, token: str, *, inline: bool, tree: StoredTree | None = None
    ) -> tuple[list[Instruction], bool]:
        """Run Stage 2 round ``round_`` for one tree under the claim ``token``; record its instructions.

        ``tree`` is the tree as the claim saw it, when the caller has it (else it is loaded).
        ``inline`` instructions go back to the worker whose events triggered them, so they start leased
        to it; others are free to claim at once.  A failure here loses nothing: the claim lapses and
        the sweeper decides the round again.
        """
        with self.metrics.stage2_duration.time():
            tree = tree or await self.store.load_tree(tree_id)
            if tree is None:
                return [], False
            meta = tree.meta
            try:
                counts, node_ids, predictions, fallback, share = await self._prefix_counts(tree, round_)
            except (RedisError, OSError):
                raise  # the store is down: the claim lapses and the sweeper decides again
            except Exception:
                # A decision that cannot be made must not leave the tree waiting for it forever.
                logger.exception("Stage 2 of tree %s failed; its continuations are spread evenly", tree_id)
                counts, node_ids, predictions, fallback, share = self._fallback_counts(tree, round_)
            placed = [(node_ids[i], count) for i, count in enumerate(counts.tolist()) if count > 0]
            instructions = [
                Instruction(instruction_id=instruction_id, tree_id=tree_id, node_id=node_id, count=count)
                for (node_id, count), instruction_id in zip(placed, fresh_ids(len(placed)), strict=True)
            ]
            # What this round does not place (no candidate, the caller asked for it back, or every
            # candidate already mixed) is returned: never promised, never spent twice.
            returned = share - int(counts.sum())
            now = self.clock()
            recorded, completed = await self.store.commit_decision(
                tree_id,
                job=meta.job,
                offered_from=now + self.settings.lease_seconds if inline else now,
                round=round_,
                token=token,
                instructions=[(i.instruction_id, i.node_id, i.count) for i in instructions],
                predictions=predictions,
                returned=returned,
                fallback=fallback,
                now=now,
            )
        if not recorded:  # another replica took the decision over; its instructions stand
            await self.store.dequeue_instructions(
                meta.job, [(tree_id, i.instruction_id) for i in instructions]
            )
            return [], False
        label = self.metrics.job_label(meta.job)
        self.metrics.instructions_issued.labels(label).inc(len(instructions))
        self.metrics.budget_fallback.labels(label).inc(fallback)
        self.metrics.budget_unspent.labels(label).inc(returned)
        if completed:
            await self._on_completed(tree_id, meta)
        return instructions, completed

    def _round_share(self, meta: TreeMeta, round_: int) -> int:
        """Continuations round ``round_`` may place: its share of the budget, less what is decided."""
        shares = round_budgets(meta.expansion_budget, meta.rounds)
        return max(sum(shares[:round_]) - meta.promised - meta.returned, 0)

    def _fallback_counts(self, tree: StoredTree, round_: int) -> Placement:
        """What :meth:`_prefix_counts` returns when its rule failed: the share spread evenly over the
        candidates and counted as fallback, or returned (the caller asked for that, or not even the
        candidates are known)."""
        share = self._round_share(tree.meta, round_)
        nothing: Placement = np.zeros(0, dtype=np.int64), [], {}, 0, share
        if tree.meta.return_unspent:
            return nothing
        try:
            candidates = prefix_candidates(tree.targets(self.settings.success_threshold))
        except Exception:
            logger.exception("tree %s has no readable prefixes; its share is returned", tree.meta.tree_id)
            return nothing
        node_ids = [tree.nodes[i].node_id for i in candidates.nodes]
        counts = spread_evenly(np.ones(len(node_ids), dtype=bool), share)
        return counts, node_ids, {}, int(counts.sum()), share

    async def _prefix_counts(self, tree: StoredTree, round_: int) -> Placement:
        """Stage 2 for one round of ``tree``, by its policy's rule."""
        meta = tree.meta
        share = self._round_share(meta, round_)
        size = len(tree.nodes)
        threshold = self.settings.success_threshold
        candidates = await _off_loop(size, lambda: prefix_candidates(tree.targets(threshold)))
        node_ids = [tree.nodes[i].node_id for i in candidates.nodes]
        if not node_ids or share == 0:
            return np.zeros(len(node_ids), dtype=np.int64), node_ids, {}, 0, share
        policy = Policy(meta.policy)
        if policy in _TRACE_PREFIXES:
            _, encoded = await _off_loop(size, self.predictor.encode_tree, tree, candidates.nodes.tolist())
            outcomes = OutcomeCounts(*meta.prior_outcomes)
            _, p = await self.predictor.predict([Query(encoded[node_id], outcomes) for node_id in node_ids])
            expansion = expand_prefixes(
                p, candidates.outcome, share, blocked=candidates.blocked, fallback=not meta.return_unspent
            )
            predictions = {node_id: float(value) for node_id, value in zip(node_ids, p, strict=True)}
            return expansion.counts, node_ids, predictions, expansion.fallback_units, share
        if policy in _RANDOM_PREFIXES:
            return random_branching(len(node_ids), share, self._rng), node_ids, {}, 0, share
        if policy is Policy.DAPO and not dapo_keep(meta.bare_successes, meta.bare_leaves):
            # DAPO filters a group whose rewards all agree out of the batch: no continuations for it,
            # its share is returned.
            return np.zeros(len(node_ids), dtype=np.int64), node_ids, {}, 0, share
        return spread_evenly(np.ones(len(node_ids), dtype=bool), share), node_ids, {}, 0, share

    async def _on_completed(self, tree_id: str, meta: TreeMeta | None = None) -> None:
        """Bookkeeping once a tree is finished: the prompt's outcome history (counted once per tree), a
        training example for the predictor, metrics; then it leaves the open list.  If this fails
        part-way the sweeper finds the finished tree still open and runs it again.  ``meta`` is the
        tree's header when the caller has it (its counters no longer change)."""
        meta = meta or (await self.store.load_metas([tree_id]))[0]
        if meta is None:
            return
        counted = await self.store.record_prompt_outcome(meta)
        await self.store.push_completed(tree_id)
        if counted:
            mixed = "true" if meta.mixed else "false"
            self.metrics.trees_completed.labels(self.metrics.job_label(meta.job), mixed).inc()
        await self.store.forget_open(meta.job, tree_id)

    # --- GET /v1/instructions ----------------------------------------------------------------------

    async def claim_instructions(self, job: str, max_items: int) -> InstructionsResponse:
        now = self.clock()
        lease = self.settings.lease_seconds
        claimed = await self.store.claim_instructions(job, max_items=max_items, lease=lease, now=now)
        instructions: list[Instruction] = []
        finished: list[tuple[str, str]] = []
        trees: dict[str, StoredTree | None] = {}
        for tree_id, instruction_id, offered_until in claimed:
            if tree_id not in trees:
                trees[tree_id] = await self.store.load_tree(tree_id)
            tree = trees[tree_id]
            stored = tree.instructions.get(instruction_id) if tree else None
            if tree is None or stored is None or stored.unstarted <= 0 or tree.meta.finished:
                finished.append((tree_id, instruction_id))
                continue
            if offered_until > stored.created_at + 1e-6:
                self.metrics.instruction_lease_expiries.labels(self.metrics.job_label(job)).inc()
            instructions.append(
                Instruction(
                    instruction_id=instruction_id,
                    tree_id=tree_id,
                    node_id=stored.node_id,
                    count=stored.unstarted,
                )
            )
        await self.store.dequeue_instructions(job, finished)
        backlog = await self.store.queue_length(job)
        if (label := self.metrics.job_label(job)) != OTHER_JOBS:  # a gauge shared by jobs would mean nothing
            self.metrics.instruction_backlog.labels(label).set(backlog)
        return InstructionsResponse(instructions=instructions, lease_seconds=lease)

    async def sweep(self) -> int:
        """Finish what failed part-way on any replica: decide Stage 2 rounds whose claims lapsed (their
        replica died mid-decision) and account for finished trees that are still listed as open.
        Returns the number of trees acted on.

        Reads three fields per open tree, a page at a time, and at most ``_SWEEP_PAGES`` pages per job
        and call, resuming where the previous call stopped: a long open list (abandoned steps stay
        open until they expire) costs a bounded slice of each interval, never a stall.
        """
        acted = 0
        for job in await self.store.jobs():
            cursor = self._sweep_cursors.get(job, 0)
            for _ in range(_SWEEP_PAGES):
                cursor, page = await self.store.open_trees(job, cursor, _SWEEP_PAGE)
                if cursor:  # resume after this page next time, even if something below fails
                    self._sweep_cursors[job] = cursor
                else:
                    self._sweep_cursors.pop(job, None)
                acted += await self._sweep_page(job, page)
                if cursor == 0:
                    break
        return acted

    async def _sweep_page(self, job: str, tree_ids: list[str]) -> int:
        if not tree_ids:
            return 0
        acted = 0
        now = self.clock()
        for tree_id, progress in zip(tree_ids, await self.store.progress(tree_ids), strict=True):
            try:
                acted += await self._sweep_tree(job, tree_id, progress, now)
            except (RedisError, OSError):
                raise  # the store is down: the whole sweep waits for the next interval
            except Exception:  # one damaged tree must not keep the sweeper from the others
                logger.exception("sweeper: tree %s of job %s failed", tree_id, job)
        return acted

    async def _sweep_tree(self, job: str, tree_id: str, progress: TreeProgress | None, now: float) -> int:
        if progress is None:  # expired
            await self.store.forget_open(job, tree_id)
            return 0
        if progress.finished:
            await self._on_completed(tree_id)
            return 1
        if progress.claim_lapsed(now):
            round_, token = await self.store.take_over_decision(
                tree_id, now=now, lease=self.settings.decision_lease_seconds
            )
            if round_:
                await self.decide(tree_id, round_, token, inline=False)
                return 1
        return 0

    # --- trees -------------------------------------------------------------------------------------

    async def tree(self, tree_id: str) -> TreeResponse:
        tree = await self.store.load_tree(tree_id)
        if tree is None:
            raise NotFoundError(f"unknown tree {tree_id!r} (it may have expired)")
        return await _off_loop(len(tree.nodes), export_tree, tree, self.settings.success_threshold)

    async def close_tree(self, tree_id: str) -> TreeResponse:
        before = await self.store.close_tree(tree_id, self.clock())
        if not before:
            raise NotFoundError(f"unknown tree {tree_id!r} (it may have expired)")
        tree = await self.store.load_tree(tree_id)
        if tree is None:
            raise NotFoundError(f"unknown tree {tree_id!r} (it may have expired)")
        if before not in ("complete", "closed"):
            await self.store.dequeue_instructions(tree.meta.job, [(tree_id, i) for i in tree.instructions])
            await self._on_completed(tree_id)
        return await _off_loop(len(tree.nodes), export_tree, tree, self.settings.success_threshold)

    # --- GET /v1/jobs/{job}/stats and POST /v1/predict ------------------------------------------------

    async def job_stats(self, job: str) -> JobStats:
        steps = await self.store.steps(job, self.settings.stats_steps)
        if not steps:
            raise NotFoundError(f"unknown job {job!r}")
        # Each hash once for every step; the sums before any step's trees (see _step_stats).
        allocations = await self.store.step_allocations(job)
        totals = await self.store.step_totals(job)
        summaries = [
            await self._step_stats(job, step, allocations.get(step, []), totals.get(step, {}))
            for step in steps
        ]
        ratio = summaries[-1].effective_ratio
        if ratio is not None and (label := self.metrics.job_label(job)) != OTHER_JOBS:
            self.metrics.effective_ratio.labels(label).set(ratio)
        return JobStats(job=job, steps=summaries)

    async def _step_stats(
        self, job: str, step: int, allocations: list[AllocationCounts], totals: dict[str, int]
    ) -> StepStats:
        """A step's figures: the sums kept for its counted trees (they outlive the trees) plus what its
        other trees hold now.  The sums were read first: a tree counted in between is missed by this
        answer (and counted in the next), never counted twice."""
        tree_ids = await self.store.step_tree_ids(job, step)
        # A step allocated before the service kept per-step figures: what its trees still hold.
        legacy = any(allocation.trees is None for allocation in allocations)
        if legacy:
            totals = {}
        uncounted = tree_ids if legacy else await self.store.uncounted(job, tree_ids)
        live = [meta for meta in await self.store.load_metas(uncounted) if meta]
        if legacy:
            active, bare_promised = len(live), sum(meta.rollouts for meta in live)
        else:
            active = sum(allocation.trees or 0 for allocation in allocations)
            bare_promised = sum(allocation.bare_promised or 0 for allocation in allocations)
        prompts = max(sum(allocation.prompts for allocation in allocations), active)

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
        )

    async def predict(self, job: str, histories: Sequence[HistoryIn]) -> PredictResponse:
        history = await self.store.prompt_outcomes(job, [h.prompt_id for h in histories])
        featurizer = self.predictor.featurizer

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
        version, values = await self.predictor.predict(await _off_loop(turns, encode))
        return PredictResponse(predictor_version=version, predictions=[float(x) for x in values])


_FLOAT32_MAX = float(np.finfo(np.float32).max)
_P = ParamSpec("_P")
_R = TypeVar("_R")
#: Items (nodes, turns, prompts) from which CPU work leaves the event loop for a worker thread; below
#: it the hand-off costs more than the work, and the loop is free again within a millisecond or two.
_INLINE_ITEMS = 256


async def _off_loop(size: int, work: Callable[_P, _R], *args: _P.args, **kwargs: _P.kwargs) -> _R:
    """``work(*args)``: in a worker thread when ``size`` items make it long enough to stall the loop."""
    if size <= _INLINE_ITEMS:
        return work(*args, **kwargs)
    return await asyncio.to_thread(work, *args, **kwargs)


def feature_problem(features: Sequence[float] | None, feature_dim: int) -> str | None:
    """Why the predictor could not use a client feature vector, or None if it can."""
    if features is None:
        return None
    if feature_dim == 0:
        return "this server takes no features (feature_dim=0); leave features out"
    if len(features) != feature_dim:
        return f"features must have exactly feature_dim={feature_dim} numbers, got {len(features)}"
    if max(map(abs, features)) > _FLOAT32_MAX:  # one C-level pass: this runs for every event
        return "features exceed the float32 range"
    return None


def request_fingerprint(request: AllocateRequest) -> str:
    """What identifies a request behind an idempotency key: a digest of its canonical JSON."""
    return hashlib.sha256(request.model_dump_json().encode()).hexdigest()


def fresh_ids(count: int) -> list[str]:
    """``count`` random 128-bit ids in hex, from one draw of the OS's randomness (uuid4 per id cost a
    noticeable share of allocating a thousand trees)."""
    raw = os.urandom(16 * count).hex()
    return [raw[32 * i : 32 * (i + 1)] for i in range(count)]


def _resent_rollout_ends(events: Sequence[ExpandEvent], codes: Sequence[tuple[int, str]]) -> bool:
    """Every event was a duplicate and at least one ended a rollout: a retry of an answered request."""
    return all(code == 208 for code, _ in codes) and any(event.done for event in events)


def parents_first(events: Sequence[ExpandEvent], indices: list[int]) -> list[int]:
    """Order one tree's events so that a parent reported in the same request precedes its children
    (the contract allows any order within a request); otherwise keep the order they came in."""
    position = {events[i].node_id: i for i in indices}
    ordered: list[int] = []
    placed: set[int] = set()
    for start in indices:
        chain = []
        index: int | None = start
        while index is not None and index not in placed and index not in chain:
            chain.append(index)
            parent = events[index].parent_id
            index = position.get(parent) if parent is not None else None
        for i in reversed(chain):
            placed.add(i)
            ordered.append(i)
    return ordered


def export_tree(tree: StoredTree, success_threshold: float) -> TreeResponse:
    """The tree as trainers consume it: per node visits, successes, V̂, Ṽ at decision time, advantage."""
    meta = tree.meta
    targets = tree.targets(success_threshold)
    advantage = advantages(tree.parent_indices(), targets)

    def defined(value: float) -> float | None:
        return None if np.isnan(value) else float(value)

    return TreeResponse(
        tree_id=meta.tree_id,
        prompt_id=meta.prompt_id,
        job=meta.job,
        step=meta.step,
        status=TreeStatus(meta.status),
        mixed=targets.mixed,
        rollouts=meta.rollouts,
        expansion_budget=meta.expansion_budget,
        value=defined(targets.root_value),
        nodes=[
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
            for i, node in enumerate(tree.nodes)
        ],
    )
