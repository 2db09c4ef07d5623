"""The tree store's domain operations: all tree state, on Redis (production) or on an in-process Redis
(embedded default).

Operations that must be atomic — inserting a node with its parent and idempotency checks, counting
leaves, the budget and instruction bookkeeping, claims on Stage 2 decisions, leases — are Lua scripts
(``scripts/``, run by :class:`~trace_service.store.runner.ScriptRunner`) over keys that share one hash
tag, so they run unchanged on Redis Cluster.  The embedded store is the same code over ``fakeredis``
(with its Lua engine): one implementation, one contract.  What it keeps for each job's predictor is in
``predictors`` (:class:`~trace_service.store.predictors.PredictorOperations`).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeVar

import orjson
from redis.exceptions import DataError

from trace_proto import ExpandEvent
from trace_proto.v1.limits import MAX_TURNS_PER_HISTORY
from trace_service.allocation import Reserve
from trace_service.allocation.books import ClosedRound
from trace_service.allocation.gain import CONTROL, POLICY, STEP_TOTAL_ARMS, ArmSums
from trace_service.lifecycle import TreeStatus, is_success
from trace_service.offload import off_loop
from trace_service.store.keys import KeySpace
from trace_service.store.memory import MemoryOperations
from trace_service.store.predictors import PredictorOperations
from trace_service.store.records import (
    AllocationCounts,
    AllocationReads,
    AppliedBatch,
    CommittedDecision,
    GroupOutcome,
    NewTree,
    PromptOutcomes,
    StoredTree,
    TreeMeta,
    TreeProgress,
)
from trace_service.store.runner import RedisClient, ScriptCall, ScriptRunner, text

_R = TypeVar("_R")

#: Trees one create_trees.lua call makes on a single Redis node (bounds the script's run time).
_TREES_PER_CREATE = 512
#: Keys one DEL removes (bounds the command's run time).
_KEYS_PER_DELETE = 1_000


def _event_row(event: ExpandEvent, success_threshold: float) -> list[Any]:
    """The compact form apply_events.lua reads, with whether the reward is a success; "" stands for an
    absent value."""
    success = event.reward is not None and is_success(event.reward, success_threshold)
    return [
        event.event_id,
        event.node_id,
        event.parent_id or "",
        event.text or "",
        orjson.dumps(event.features).decode() if event.features is not None else "",
        1 if event.done else 0,
        repr(event.reward) if event.reward is not None else "",
        event.instruction_id or "",
        1 if success else 0,
    ]


class TreeStore(PredictorOperations, MemoryOperations):
    """Async access to tree state.  Every key expires: trees ``tree_ttl`` after their last update, or
    ``retention`` once finished, read by their trainer and learned from (:meth:`retain_tree`); job
    indexes and prompt histories ``job_ttl`` after theirs."""

    def __init__(
        self,
        redis: RedisClient,
        *,
        prefix: str = "trace",
        tree_ttl: int = 7 * 24 * 3600,
        job_ttl: int = 30 * 24 * 3600,
        idempotency_ttl: int = 24 * 3600,
        retention: int = 3600,
    ) -> None:
        self.redis = redis
        self.scripts = ScriptRunner(redis)
        self.keys = KeySpace(prefix)
        self.tree_ttl = tree_ttl
        self.job_ttl = job_ttl
        self.idempotency_ttl = idempotency_ttl
        self.retention = retention

    async def ping(self) -> bool:
        return bool(await self.redis.ping())

    async def aclose(self) -> None:
        await self.redis.aclose()

    # --- allocation ---------------------------------------------------------------------------------

    async def create_trees(
        self, trees: Sequence[NewTree], now: float, *, reserve: Reserve | None = None
    ) -> None:
        """Create the trees (each atomically with its expiry; creating an existing tree changes nothing)
        and their allocation's shared continuation ``reserve``, in one round trip on one Redis node.
        They are not listed anywhere until :meth:`index_allocation`, and no event can reach them before
        the answer that names them, so nothing depends on the order.  On one Redis node a chunk of trees
        is one script call (thousands of small calls cost most of /v1/allocate); a Cluster gets one call
        per tree, since a script's keys must share a slot there."""
        rows = [(self.keys.tree(tree.tree_id).meta, tree.hash_fields(now)) for tree in trees]
        chunk = _TREES_PER_CREATE if self.scripts.single_node else 1
        calls = []
        if reserve is not None and trees:
            calls.append(self._reserve_call(trees[0].job, trees[0].allocation_id, reserve))
        for start in range(0, len(rows), chunk):
            part = rows[start : start + chunk]
            calls.append(
                ScriptCall(
                    "create_trees",
                    [key for key, _ in part],
                    [self.tree_ttl, orjson.dumps([fields for _, fields in part])],
                )
            )
        await self.scripts.run_all(calls)

    async def index_allocation(
        self,
        job: str,
        step: int,
        allocation_id: str,
        prompts: int,
        tree_ids: Sequence[str],
        bare_promised: int,
        now: float,
        *,
        controls: int = 0,
        policy_share: float = 1.0,
    ) -> None:
        """List an allocation's trees under its job and step, and as open for the sweeper (idempotent),
        with its counts (``prompts`` offered, trees, ``bare_promised`` rollouts, ``controls`` of the
        trees control trees, the ``policy_share`` of its budget) for job stats.  The trees first, in
        bounded chunks; the step, which makes job stats count them, only once every tree is listed
        (:meth:`ScriptRunner.run_in_order`: one round trip on one Redis node), so a failure part-way
        leaves nothing that stats count (a retry completes it)."""
        ttl, step_info = self.job_ttl, f"{step}:{allocation_id}"
        counts = AllocationCounts(prompts, len(tree_ids), bare_promised, controls, policy_share)
        writes = ScriptRunner.writes
        await self.scripts.run_in_order(
            writes(self.keys.step_trees(job, step), ttl, "SADD", tree_ids)
            + writes(self.keys.open_trees(job), ttl, "SADD", tree_ids),
            writes(self.keys.steps(job), ttl, "ZADD", [step, step])
            + writes(self.keys.steps_info(job), ttl, "HSET", [step_info, str(counts)])
            + writes(self.keys.jobs, ttl, "ZADD", [now, job]),
        )

    async def discard_allocation(self, job: str, allocation_id: str, tree_ids: Sequence[str]) -> None:
        """Delete the trees and reserve of an allocation that was never answered nor listed (the loser of
        an idempotency race): nobody holds their ids, so nothing could ever finish them."""
        keys = [self.keys.tree(tree_id).meta for tree_id in tree_ids]
        keys.append(self.keys.continuation_reserve(job, allocation_id))
        for start in range(0, len(keys), _KEYS_PER_DELETE):
            await self.redis.delete(*keys[start : start + _KEYS_PER_DELETE])

    def _reserve_call(self, job: str, allocation_id: str, reserve: Reserve) -> ScriptCall:
        return ScriptCall(
            "create_reserve",
            [self.keys.continuation_reserve(job, allocation_id)],
            [
                reserve.left,
                reserve.pending,
                repr(reserve.expected_left),
                repr(reserve.expected_taken),
                self.job_ttl,
            ],
        )

    async def draw_continuations(
        self,
        job: str,
        allocation_id: str,
        tree_id: str,
        *,
        share: int,
        mixed_chance: float,
        agrees: bool,
        can_branch: bool,
    ) -> int:
        """Tree ``tree_id``'s draw from its allocation's reserve, by the rule ``Reserve.draw`` on the
        state read here, recorded only if no other draw changed that state in between (read again and
        retry when one did); the same draw on a retry of the tree's decision, and its own ``share`` when
        the reserve is gone."""
        key = self.keys.continuation_reserve(job, allocation_id)
        field = f"d:{tree_id}"
        while True:
            raw = await self.redis.hmget(
                key, ["left", "pending", "expected_left", "expected_taken", "version", field]
            )
            left, pending, expected_left, expected_taken, version, before = (
                None if value is None else text(value) for value in raw
            )
            if left is None or pending is None or expected_left is None or expected_taken is None:
                return share  # expired with the job's keys: the tree spends its own share
            if before is not None:
                return int(before)
            reserve = Reserve(int(left), int(pending), float(expected_left), float(expected_taken))
            drawn, after = reserve.draw(share, mixed_chance, agrees=agrees, can_branch=can_branch)
            state = [after.left, after.pending, repr(after.expected_left), repr(after.expected_taken)]
            read = int(version or 0)
            call = ScriptCall("commit_draw", [key], [tree_id, read, drawn, *state, self.job_ttl])
            status, recorded = (int(value) for value in await self.scripts.run(call))
            if status == -1:
                return share
            if status >= 0:
                return recorded
            # status -2: another tree's draw came first; read the reserve again

    async def allocation_reads(
        self,
        job: str,
        prompt_ids: Sequence[str],
        idempotency_key: str | None,
        *,
        groups: bool,
        totals_of: Sequence[int] = (),
    ) -> AllocationReads:
        """Everything /v1/allocate reads, in one pipeline: the answer remembered under
        ``idempotency_key`` (if any), the prompts' histories (:meth:`prompt_outcomes`), with ``groups``
        the job's recent groups of each arm (:meth:`group_outcomes`), and every arm's totals of the steps
        ``totals_of`` (as :meth:`step_totals` reads every step's)."""
        figures = [f"{step}:{name}" for step in totals_of for arm in STEP_TOTAL_ARMS
                   for name in ArmSums.figure_names(arm)]  # fmt: skip
        async with self.redis.pipeline(transaction=False) as pipe:
            if idempotency_key:
                pipe.get(self.keys.idempotency(job, idempotency_key))
            if prompt_ids:
                pipe.hmget(self.keys.prompt_outcomes(job), list(prompt_ids))
            if figures:
                pipe.hmget(self.keys.step_totals(job), figures)
            if groups:
                pipe.lrange(self.keys.group_outcomes(job, True), 0, -1)
                pipe.lrange(self.keys.group_outcomes(job, False), 0, -1)
            replies = list(await pipe.execute())
        remembered = replies.pop(0) if idempotency_key else None
        history = replies.pop(0) if prompt_ids else []
        read = replies.pop(0) if figures else []
        step_totals = _step_totals({f: v for f, v in zip(figures, read, strict=True) if v is not None})
        arms = [[GroupOutcome.parse(text(value)) for value in reply] for reply in replies] or [[], []]
        return AllocationReads(
            remembered=None if remembered is None else _remembered(text(remembered)),
            history=[PromptOutcomes.parse(text(value)) if value else PromptOutcomes() for value in history],
            control_groups=arms[0],
            policy_groups=arms[1],
            step_totals=step_totals,
        )

    async def remember_response(self, job: str, key: str, fingerprint: str, body: str) -> tuple[str, str]:
        """Store a response and the fingerprint of its request under an idempotency key; if another
        request got there first, return its (fingerprint, response)."""
        redis_key = self.keys.idempotency(job, key)
        if await self.redis.set(redis_key, f"{fingerprint} {body}", nx=True, ex=self.idempotency_ttl):
            return fingerprint, body
        winner = await self.redis.get(redis_key)
        return (fingerprint, body) if winner is None else _remembered(text(winner))

    async def prompt_outcomes(self, job: str, prompt_ids: Sequence[str]) -> list[PromptOutcomes]:
        """Each prompt's bare-rollout outcomes over earlier steps of the job."""
        if not prompt_ids:
            return []
        raw = await self.redis.hmget(self.keys.prompt_outcomes(job), list(prompt_ids))
        return [PromptOutcomes.parse(text(value)) if value else PromptOutcomes() for value in raw]

    async def record_prompt_outcome(self, meta: TreeMeta, groups_kept: int) -> bool:
        """Count a finished tree once (a repeat is a no-op): its bare-rollout group joins its prompt's
        history, its figures its step's totals (the gain's sums under its arm), and its group with its
        prediction the job's last ``groups_kept`` of its arm.  Returns whether it was counted now."""
        return bool(await self.scripts.run(self._outcome_call(meta, groups_kept)))

    async def record_completion(self, meta: TreeMeta, groups_kept: int) -> bool:
        """A finished tree's bookkeeping in one round trip: :meth:`record_prompt_outcome` and
        :meth:`push_completed` (independent writes).  Returns whether it was counted now."""
        results = await self.scripts.run_all(
            [self._outcome_call(meta, groups_kept), *self._push_calls(meta.job, meta.tree_id)]
        )
        return bool(results[0])

    def _outcome_call(self, meta: TreeMeta, groups_kept: int) -> ScriptCall:
        """The record_outcome.lua call that counts a finished tree."""
        job = meta.job
        keys = [
            self.keys.prompt_outcomes(job),
            self.keys.counted_trees(job),
            self.keys.step_totals(job),
            self.keys.group_outcomes(job, meta.control),
        ]
        arm = ArmSums.of_tree(mixed=meta.mixed, bare=meta.bare_leaves, turns=meta.turns)
        figures = {
            "trees_complete": 1,
            "mixed": int(meta.mixed),
            "rollouts_spent": meta.bare_leaves,
            "continuations_promised": meta.promised,
            "continuations_spent": meta.cont_leaves,
            "fallback_units": meta.fallback,
            "turns": meta.turns,
            **arm.figures(CONTROL if meta.control else POLICY),
            **(arm.figures(meta.shape) if meta.shape else {}),
        }
        group = GroupOutcome(meta.predicted_success, meta.bare_successes, meta.bare_leaves)
        args = [meta.prompt_id, meta.bare_successes, meta.bare_leaves, self.job_ttl, meta.tree_id, meta.step]
        figure_args = [x for figure in figures.items() for x in figure]
        return ScriptCall("record_outcome", keys, [*args, str(group), groups_kept, *figure_args])

    async def group_outcomes(self, job: str, *, control: bool) -> list[GroupOutcome]:
        """The job's most recent groups of its control trees (``control``) or its policy's, newest first."""
        raw = await self.redis.lrange(self.keys.group_outcomes(job, control), 0, -1)
        return [GroupOutcome.parse(text(value)) for value in raw]

    async def arm_groups(self, job: str) -> tuple[list[GroupOutcome], list[GroupOutcome]]:
        """The job's recent groups of its control trees and of its policy's, in one round trip."""
        reads = await self.allocation_reads(job, [], None, groups=True)
        return reads.control_groups, reads.policy_groups

    async def step_allocations(self, job: str) -> dict[int, list[AllocationCounts]]:
        """The counts of each allocation made, by step."""
        raw = _decoded(await self.redis.hgetall(self.keys.steps_info(job)))
        by_step: dict[int, list[AllocationCounts]] = {}
        for field, value in raw.items():
            by_step.setdefault(int(field.split(":", 1)[0]), []).append(AllocationCounts.parse(value))
        return by_step

    async def step_totals(self, job: str) -> dict[int, dict[str, int]]:
        """The sums over each step's counted trees, by step and figure (absent: 0)."""
        return _step_totals(await self.redis.hgetall(self.keys.step_totals(job)))

    async def uncounted(self, job: str, tree_ids: Sequence[str]) -> list[str]:
        """The trees among ``tree_ids`` not yet counted (see :meth:`record_prompt_outcome`)."""
        if not tree_ids:
            return []
        counted = await self.redis.smismember(self.keys.counted_trees(job), list(tree_ids))
        return [tree_id for tree_id, done in zip(tree_ids, counted, strict=True) if not done]

    # --- events and decisions -------------------------------------------------------------------

    async def apply_events(
        self,
        batches: Sequence[tuple[str, Sequence[ExpandEvent]]],
        *,
        now: float,
        success_threshold: float,
        decision_lease: float,
    ) -> list[AppliedBatch | Exception]:
        """Apply each tree's batch of events atomically (``apply_events.lua``); all trees in one round
        trip on a single Redis.  A tree whose call failed gets its exception (the others still stand)."""
        calls = []
        for tree_id, events in batches:
            keys = self.keys.tree(tree_id)
            calls.append(
                ScriptCall(
                    "apply_events",
                    [keys.meta, keys.nodes, keys.events, keys.instructions, keys.predictions],
                    [
                        orjson.dumps([_event_row(event, success_threshold) for event in events]),
                        now,
                        self.tree_ttl,
                        decision_lease,
                        uuid.uuid4().hex,
                        MAX_TURNS_PER_HISTORY,
                    ],
                )
            )
        results = await self.scripts.run_each(calls)
        # A reply that hands over a tree for a decision carries its nodes: parsed beside the loop.
        size = sum(len(reply[2]) // 2 for reply in results if isinstance(reply, list) and len(reply) == 5)
        return await off_loop(
            size,
            lambda: [_applied(tree_id, reply) for (tree_id, _), reply in zip(batches, results, strict=True)],
        )

    async def commit_decision(
        self,
        tree_id: str,
        *,
        job: str,
        offered_from: float,
        round: int,
        token: str,
        instructions: Sequence[tuple[str, str, int]],
        predictions: Mapping[str, float],
        books: ClosedRound,
        fallback: int,
        now: float,
    ) -> CommittedDecision:
        """Offer the instructions ``(instruction_id, node_id, count)`` in the job's claim queue from
        ``offered_from`` on, then record the decision and the tree's ``books`` after it if the claim
        still holds.  Offered before recorded, so that no failure in between can strand them (an offer
        whose record never happened is dropped when claimed)."""
        keys = self.keys.tree(tree_id)
        offer = self._offer_calls(job, tree_id, {item[0]: offered_from for item in instructions})
        commit = ScriptCall(
            "commit_decision",
            [keys.meta, keys.instructions, keys.predictions],
            [
                round,
                token,
                orjson.dumps([list(item) for item in instructions]),
                orjson.dumps(dict(predictions)) if predictions else "{}",
                books.returned,
                fallback,
                now,
                self.tree_ttl,
                -1 if books.expansion_budget is None else books.expansion_budget,
                books.status.value,
                books.settles_to.value,
            ],
        )
        results = await self.scripts.run_all([*offer, commit], ordered=True)
        return CommittedDecision.from_reply(results[-1])

    async def take_over_decision(self, tree_id: str, *, now: float, lease: float) -> tuple[int, str]:
        """Claim a Stage 2 decision whose claim lapsed: (the round now this caller's, or 0; its token)."""
        token = uuid.uuid4().hex
        call = ScriptCall("take_over_decision", [self.keys.tree(tree_id).meta], [now, lease, token])
        return int(await self.scripts.run(call)), token

    async def close_tree(self, tree_id: str, now: float) -> TreeStatus | None:
        """Close an unfinished tree; returns its status before (None: no such tree)."""
        call = ScriptCall("close_tree", [self.keys.tree(tree_id).meta], [now, self.tree_ttl])
        before = text(await self.scripts.run(call))
        return TreeStatus(before) if before else None

    async def retain_tree(self, tree_id: str, why: Literal["read", "learned"]) -> bool:
        """Say that a finished tree was read by its trainer, or learned from by its job's predictor;
        once both are said, its keys expire within ``retention`` seconds (``retain_tree.lua``).  True
        when the tree now does; a tree in flight is never shortened."""
        keys = self.keys.tree(tree_id)
        call = ScriptCall("retain_tree", [keys.meta, *keys.all[1:]], [why, self.retention])
        return bool(await self.scripts.run(call))

    # --- reading trees -----------------------------------------------------------------------------

    async def load_metas(self, tree_ids: Sequence[str]) -> list[TreeMeta | None]:
        rows = await self.scripts.read_fields([self.keys.tree(t).meta for t in tree_ids], TreeMeta.FIELDS)
        return [
            TreeMeta.from_hash(tree_id, dict(zip(TreeMeta.FIELDS, row, strict=True))) if row[0] else None
            for tree_id, row in zip(tree_ids, rows, strict=True)
        ]

    async def progress(self, tree_ids: Sequence[str]) -> list[TreeProgress | None]:
        """Where each tree stands (three fields): what the sweeper checks every open tree for.  One
        script call on a single Redis; a pipeline on a Cluster, whose scripts cannot span trees."""
        metas = [self.keys.tree(tree_id).meta for tree_id in tree_ids]
        if self.scripts.single_node:
            flat = await self.scripts.run(ScriptCall("tree_progress", metas, []))
            rows = [[text(value) or None for value in flat[i : i + 3]] for i in range(0, len(flat), 3)]
        else:
            rows = await self.scripts.read_fields(metas, ("status", "decision_round", "decision_until"))
        return [
            TreeProgress(TreeStatus(status), int(round_ or 0), float(until or 0)) if status else None
            for status, round_, until in rows
        ]

    async def load_tree(self, tree_id: str) -> StoredTree | None:
        """The whole tree, or None when it does not exist (:meth:`with_tree` keeps a large one off the
        loop from start to end)."""
        return await self.with_tree(tree_id, lambda tree: tree)

    async def with_tree(self, tree_id: str, work: Callable[[StoredTree], _R]) -> _R | None:
        """``work(tree)`` on the tree as stored, or None when it does not exist.  A large tree is parsed,
        worked on and freed in a worker thread: it never reaches the loop (parsing takes a second per
        hundred thousand nodes, freeing a quarter)."""
        keys = self.keys.tree(tree_id)
        call = ScriptCall("load_tree", [keys.meta, keys.nodes, keys.instructions, keys.predictions], [])
        reply = [await self.scripts.run(call)]
        size = len(reply[0][1]) // 2
        return await off_loop(size, _parsed_then, tree_id, reply, work)

    async def jobs(self) -> list[str]:
        return [text(job) for job in await self.redis.zrange(self.keys.jobs, 0, -1)]

    async def steps(
        self, job: str, last: int, first_step: int | None = None, last_step: int | None = None
    ) -> list[int]:
        """The job's ``last`` most recent steps within ``[first_step, last_step]`` (either end open)."""
        low = "-inf" if first_step is None else first_step
        high = "+inf" if last_step is None else last_step
        raw = await self.redis.zrevrangebyscore(self.keys.steps(job), high, low, start=0, num=last)
        return [int(text(step)) for step in reversed(raw)]

    async def step_tree_ids(self, job: str, step: int) -> list[str]:
        return sorted(text(tree_id) for tree_id in await self.redis.smembers(self.keys.step_trees(job, step)))

    # --- open trees (the sweeper's work list) ------------------------------------------------------

    async def open_trees(self, job: str, cursor: int = 0, count: int = 1000) -> tuple[int, list[str]]:
        """One page of the job's open trees (``SSCAN``): the cursor to continue from (0 once the
        whole set has been seen) and about ``count`` tree ids."""
        cursor, members = await self.redis.sscan(self.keys.open_trees(job), cursor, count=count)
        return int(cursor), [text(tree_id) for tree_id in members]

    async def forget_open(self, job: str, tree_id: str) -> None:
        await self.redis.srem(self.keys.open_trees(job), tree_id)

    # --- instruction queue -------------------------------------------------------------------------

    async def queue_instructions(self, job: str, tree_id: str, free_at: Mapping[str, float]) -> None:
        """Offer instructions for claiming, each from the given time on."""
        await self.scripts.run_all(self._offer_calls(job, tree_id, free_at))

    def _offer_calls(self, job: str, tree_id: str, free_at: Mapping[str, float]) -> list[ScriptCall]:
        members = [item for instruction, at in free_at.items() for item in (at, f"{tree_id}|{instruction}")]
        return ScriptRunner.writes(self.keys.instruction_queue(job), self.job_ttl, "ZADD", members, stride=2)

    async def dequeue_instructions(self, job: str, entries: Sequence[tuple[str, str]]) -> None:
        if entries:
            await self.redis.zrem(self.keys.instruction_queue(job), *[f"{t}|{i}" for t, i in entries])

    async def claim_instructions(
        self, job: str, *, max_items: int, lease: float, now: float
    ) -> list[tuple[str, str, float]]:
        """Lease queued instructions: (tree_id, instruction_id, when the previous offer or lease ended)."""
        queue = self.keys.instruction_queue(job)
        raw = await self.scripts.run(
            ScriptCall("claim_instructions", [queue], [now, lease, max_items, self.job_ttl])
        )
        claimed = []
        for member, score in zip(raw[::2], raw[1::2], strict=True):
            tree_id, instruction_id = text(member).split("|", 1)
            claimed.append((tree_id, instruction_id, float(score)))
        return claimed

    async def queue_length(self, job: str) -> int:
        return int(await self.redis.zcard(self.keys.instruction_queue(job)))

    # --- jobs --------------------------------------------------------------------------------------

    async def job_exists(self, job: str) -> bool:
        """Whether the job has allocated within its expiry (it is in the jobs index)."""
        return await self.redis.zscore(self.keys.jobs, job) is not None

    async def delete_job(self, job: str) -> int:
        """Delete everything of ``job``: its trees, every key of its own (its predictor's included) and
        its place in the indexes; the number of keys removed."""
        tree_ids: set[str] = set()
        for step in await self.redis.zrange(self.keys.steps(job), 0, -1):
            tree_ids.update(await self.step_tree_ids(job, int(text(step))))
        cursor, open_ids = 0, []
        while True:
            cursor, page = await self.open_trees(job, cursor)
            open_ids.extend(page)
            if not cursor:
                break
        tree_ids.update(open_ids)
        keys = [key for tree_id in sorted(tree_ids) for key in self.keys.tree(tree_id).all]
        keys += [
            text(key) async for key in self.redis.scan_iter(match=self.keys.job_pattern(job), count=1_000)
        ]
        removed = 0
        for start in range(0, len(keys), _KEYS_PER_DELETE):
            removed += int(await self.redis.delete(*keys[start : start + _KEYS_PER_DELETE]))
        await self.redis.zrem(self.keys.jobs, job)
        await self.redis.srem(self.keys.training_wanted, job)
        await self.redis.zrem(self.keys.trained_jobs, job)
        return removed


def _parsed_then(tree_id: str, reply: list[list[Any]], work: Callable[[StoredTree], _R]) -> _R | None:
    """``work`` on the tree parsed from the one load_tree.lua reply in ``reply``, which it empties: the
    tree and the reply are freed in this thread, unless ``work`` returns them."""
    tree = StoredTree.from_hashes(tree_id, *reply.pop())
    return None if tree is None else work(tree)


def _applied(tree_id: str, reply: list[Any] | Exception) -> AppliedBatch | Exception:
    """What apply_events.lua returned for one tree, or why that failed."""
    if isinstance(reply, Exception):
        return reply
    try:
        return AppliedBatch.from_reply(tree_id, reply)
    except (KeyError, ValueError, TypeError, IndexError) as error:  # a damaged tree fails alone
        return DataError(f"tree {tree_id!r}: unreadable store reply: {error!r}")


def _remembered(value: str) -> tuple[str, str]:
    """A remembered (fingerprint, response), stored as the fingerprint, a space and the response."""
    fingerprint, _, body = value.partition(" ")
    return fingerprint, body


def _decoded(row: Mapping[Any, Any]) -> dict[str, str]:
    return {text(key): text(value) for key, value in row.items()}


def _step_totals(raw: Mapping[bytes | str, bytes | str]) -> dict[int, dict[str, int]]:
    """The step totals hash (``<step>:<figure>`` → count) by step and figure."""
    by_step: dict[int, dict[str, int]] = {}
    for field, value in _decoded(raw).items():
        step, _, figure = field.partition(":")
        by_step.setdefault(int(step), {})[figure] = int(value)
    return by_step
