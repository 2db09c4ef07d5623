"""A synthetic load over service replicas, with failover, and the audit of what it left behind: what the
fault and cluster tests and `bench/load.py` drive a fleet with.

`LoadRun` drives one job step by step: it allocates each step (one idempotency key per step, the same on
every replica), starts every bare rollout the allocation asks for and every continuation the service
instructs, and reports their turns from `workers` async workers.  Rollouts are synthetic (a hidden
success rate per prompt, 2-5 turns, neutral texts): the load exercises the service's bookkeeping, not
its predictor.  A `fault` (a blocking call, run in a thread) can be injected halfway through a step's
bare turns; with `storm` every report goes as randomly split batches, three concurrent copies of each
over the replicas, children before their parents.  Trees still unfinished at a step's deadline are
closed.

`Replicas` sends a call to the caller's replica first and fails over to the next one on a refused
connection, a timeout or a 5xx; every call is safe to repeat (events carry their ids, allocations an
idempotency key).  The `Ledger` keeps everything the service told the workers, and `audit` checks it
against the exported trees and the job's stats.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import math
import random
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from trace_client import (
    AsyncTraceClient,
    TraceConnectionError,
    TraceServerError,
    TraceTimeoutError,
    TraceUnavailable,
)
from trace_proto import (
    AllocateRequest,
    ExpandEvent,
    ExpandResponse,
    Instruction,
    JobStats,
    PromptIn,
    RejectedEvent,
    TreeAllocation,
    TreeResponse,
    TreeStatus,
)
from trace_proto.v1.limits import MAX_CLAIM

T = TypeVar("T")

#: The environment of replicas under a load with faults: leases short enough that work a dead replica
#: held comes back within a step; one torch thread so that replicas, Redis and the load share a small
#: machine.
FAULT_TOLERANT_SETTINGS: Mapping[str, str] = {
    "TRACE_LEASE_SECONDS": "2",
    "TRACE_DECISION_LEASE_SECONDS": "2",
    "TRACE_SWEEP_INTERVAL_SECONDS": "0.25",
    "TRACE_TORCH_THREADS": "1",
    "TRACE_LOG_LEVEL": "WARNING",
}
#: The refusal that storms provoke on purpose: a child that overtook its parent is re-sent.
UNKNOWN_PARENT = "unknown parent"
_STORM_COPIES = 3
_STORM_ROUNDS = 10


# --- what the workers were told -----------------------------------------------------------------------


@dataclass
class Ledger:
    """Everything the service told the workers: acknowledged events, instructions, refusals, failures."""

    sent: dict[str, ExpandEvent] = field(default_factory=dict)
    acknowledged: set[str] = field(default_factory=set)
    #: Sum of `accepted` over every answer: equals len(acknowledged) when each event took effect once
    #: and no answer was lost on the way back.
    accepted: int = 0
    unexpected_rejections: list[RejectedEvent] = field(default_factory=list)
    instructions: dict[str, Instruction] = field(default_factory=dict)
    report_seconds: list[float] = field(default_factory=list)
    #: Failed attempts by kind: connection, timeout, unavailable (503), server_error (other 5xx).
    failures: Counter[str] = field(default_factory=Counter)
    unavailable_details: set[str] = field(default_factory=set)

    def note_sent(self, events: Iterable[ExpandEvent]) -> None:
        self.sent.update((event.event_id, event) for event in events)

    def record(self, events: Sequence[ExpandEvent], answer: ExpandResponse) -> set[str]:
        """Book one answer; returns the ids of the events it did not acknowledge."""
        refused = {item.event_id for item in answer.rejected}
        self.acknowledged.update(e.event_id for e in events if e.event_id not in refused)
        self.accepted += answer.accepted
        return refused


class ReplicasUnavailable(RuntimeError):
    """No replica took a call before the caller's patience ran out."""


class Replicas:
    """One client per replica.  A call goes to the caller's replica first and, on a refused connection, a
    timeout or a 5xx, to the next one after a short backoff, until `give_up_after` seconds have passed."""

    def __init__(self, urls: Sequence[str], ledger: Ledger, *, give_up_after: float = 30.0) -> None:
        if not urls:
            raise ValueError("need at least one replica URL")
        self.clients = [AsyncTraceClient(url, max_retries=0, timeout=10.0) for url in urls]
        self.ledger = ledger
        self.give_up_after = give_up_after

    async def call(self, first: int, request: Callable[[AsyncTraceClient], Awaitable[T]]) -> T:
        deadline = time.monotonic() + self.give_up_after
        for attempt in itertools.count():
            client = self.clients[(first + attempt) % len(self.clients)]
            try:
                return await request(client)
            except TraceUnavailable as error:
                self.ledger.failures["unavailable"] += 1
                self.ledger.unavailable_details.add(error.detail)
            except TraceServerError:
                self.ledger.failures["server_error"] += 1
            except TraceTimeoutError:
                self.ledger.failures["timeout"] += 1
            except TraceConnectionError:
                self.ledger.failures["connection"] += 1
            if time.monotonic() > deadline:
                break
            await asyncio.sleep(min(1.0, 0.05 * 2**attempt))
        raise ReplicasUnavailable(f"no replica answered within {self.give_up_after:.0f} s")

    async def aclose(self) -> None:
        await asyncio.gather(*(client.aclose() for client in self.clients))


# --- the load -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoadConfig:
    """One run: `steps` allocations of `prompts` prompts × `rollouts_per_prompt` bare rollouts each."""

    job: str = "load"
    steps: int = 3
    prompts: int = 32
    rollouts_per_prompt: int = 8
    expansion: float = 1.0
    turns: tuple[int, int] = (2, 5)
    workers: int = 16
    rollouts_per_worker: int = 4
    storm: bool = False
    step_timeout: float = 20.0
    poll_seconds: float = 0.2
    seed: int = 0

    def __post_init__(self) -> None:
        if min(self.steps, self.prompts, self.workers, self.rollouts_per_worker) < 1:
            raise ValueError("steps, prompts, workers and rollouts_per_worker must be >= 1")
        if self.rollouts_per_prompt < 2:
            raise ValueError("rollouts_per_prompt must be >= 2 (one rollout is never mixed)")
        if not 1 <= self.turns[0] <= self.turns[1]:
            raise ValueError(f"turns must be (low, high) with 1 <= low <= high; got {self.turns}")
        if self.step_timeout <= 0 or self.poll_seconds <= 0:
            raise ValueError("step_timeout and poll_seconds must be > 0")

    @property
    def bare_events_per_step(self) -> int:
        """Expected turns of one step's bare rollouts."""
        return int(self.prompts * self.rollouts_per_prompt * sum(self.turns) / 2)


@dataclass
class _Rollout:
    """A rollout in progress: where its next turn attaches, and how many turns it has left."""

    tree_id: str
    success_rate: float
    parent_id: str | None
    depth: int
    turns_left: int
    instruction_id: str | None = None  # set until the first turn of a continuation is made


#: A fault injected mid-run; it may block (it runs in a thread).
Fault = Callable[[], None]


class LoadRun:
    """Drives a job over the replicas step by step and keeps the ledger that the audit checks."""

    def __init__(self, replicas: Replicas, config: LoadConfig) -> None:
        self.replicas = replicas
        self.ledger = replicas.ledger
        self.config = config
        self.allocations: list[TreeAllocation] = []
        self._rng = random.Random(config.seed)
        self._ids = itertools.count()
        self._prompt_success: dict[str, float] = {}  # hidden success rate of each prompt
        self._tree_success: dict[str, float] = {}
        self._node_depth: dict[str, int] = {}
        self._tasks: asyncio.Queue[_Rollout] = asyncio.Queue()
        self._pending = 0  # rollouts queued or running
        self._unfinished: set[str] = set()
        self._fault_at: int | None = None  # acknowledged events that make the pending fault due
        self._fault_due = asyncio.Event()

    async def run(self, fault: Fault | None = None, fault_step: int | None = None) -> float:
        """Run every step; `fault` fires in `fault_step` (default: the middle one) once half of that
        step's bare turns are acknowledged.  Returns the wall time of the load."""
        fault_step = self.config.steps // 2 if fault_step is None else fault_step
        start = time.perf_counter()
        for step in range(self.config.steps):
            await self._run_step(step, fault if step == fault_step else None)
        return time.perf_counter() - start

    async def _run_step(self, step: int, fault: Fault | None) -> None:
        config = self.config
        request = AllocateRequest(
            job=config.job,
            step=step,
            budget=config.prompts * config.rollouts_per_prompt,
            expansion=config.expansion,
            min_rollouts=2,
            max_rollouts=4 * config.rollouts_per_prompt,
            prompts=[
                PromptIn(prompt_id=f"prompt-{i}", text=f"task {i}: reach the goal state")
                for i in range(config.prompts)
            ],
        )
        key = f"{config.job}-step-{step}"  # the same on every replica: a retry never allocates twice
        allocation = await self.replicas.call(
            0, functools.partial(AsyncTraceClient.allocate, request=request, idempotency_key=key)
        )
        self.allocations.extend(allocation.trees)
        self._unfinished = {tree.tree_id for tree in allocation.trees}
        for tree in allocation.trees:
            rate = self._prompt_success.setdefault(tree.prompt_id, self._rng.betavariate(0.6, 0.6))
            self._tree_success[tree.tree_id] = rate
            for _ in range(tree.rollouts):
                turns = self._rng.randint(*config.turns)
                self._schedule(_Rollout(tree.tree_id, rate, parent_id=None, depth=0, turns_left=turns))
        workers = [asyncio.create_task(self._worker(i)) for i in range(config.workers)]
        injected = None
        if fault is not None:
            self._fault_at = len(self.ledger.acknowledged) + config.bare_events_per_step // 2
            self._fault_due.clear()
            injected = asyncio.create_task(self._inject(fault))
        try:
            await self._coordinate(time.monotonic() + config.step_timeout)
        finally:
            for task in workers:
                task.cancel()
            await asyncio.gather(*workers, return_exceptions=True)
        if injected is not None:
            self._fault_due.set()  # a fault that has not fired yet fires now: every scenario sees it
            await injected
            self._fault_at = None
        self._drain_tasks()

    async def _inject(self, fault: Fault) -> None:
        await self._fault_due.wait()
        await asyncio.to_thread(fault)

    async def _coordinate(self, deadline: float) -> None:
        """Claim instructions nobody has started and check trees when no work is left, until every tree
        is finished; at the deadline close the rest."""
        while self._unfinished and time.monotonic() < deadline:
            await asyncio.sleep(self.config.poll_seconds)
            try:
                claimed = await self.replicas.call(
                    1, lambda client: client.claim_instructions(self.config.job, MAX_CLAIM)
                )
                self._take_instructions(claimed.instructions)
                if self._pending == 0:
                    await self._check_trees()
            except ReplicasUnavailable:
                continue
        for tree_id in sorted(self._unfinished):
            await self.replicas.call(1, functools.partial(AsyncTraceClient.close_tree, tree_id=tree_id))
        self._unfinished.clear()

    async def _check_trees(self) -> None:
        trees = await asyncio.gather(
            *(
                self.replicas.call(1, functools.partial(AsyncTraceClient.get_tree, tree_id=tree_id))
                for tree_id in sorted(self._unfinished)
            )
        )
        self._unfinished -= {t.tree_id for t in trees if t.status in (TreeStatus.COMPLETE, TreeStatus.CLOSED)}

    def _schedule(self, rollout: _Rollout) -> None:
        self._pending += 1
        self._tasks.put_nowait(rollout)

    def _drain_tasks(self) -> None:
        while not self._tasks.empty():
            self._tasks.get_nowait()
        self._pending = 0

    def _take_instructions(self, instructions: Iterable[Instruction]) -> None:
        """Start continuations for instructions seen for the first time.  An instruction seen again (a
        lapsed lease offers it anew) is already scheduled: the workers never drop a rollout they took."""
        for instruction in instructions:
            if instruction.instruction_id in self.ledger.instructions:
                continue
            self.ledger.instructions[instruction.instruction_id] = instruction
            if instruction.tree_id not in self._unfinished:
                continue  # an earlier step's tree, closed at its deadline
            depth = self._node_depth[instruction.node_id]
            for _ in range(instruction.count):
                turns = self._rng.randint(1, max(1, self.config.turns[1] - depth))
                self._schedule(
                    _Rollout(
                        instruction.tree_id,
                        self._tree_success[instruction.tree_id],
                        parent_id=instruction.node_id,
                        depth=depth,
                        turns_left=turns,
                        instruction_id=instruction.instruction_id,
                    )
                )

    async def _worker(self, index: int) -> None:
        per_report = 2 if self.config.storm else 1
        active: list[_Rollout] = []
        while True:
            if not active:
                active.append(await self._tasks.get())
            while len(active) < self.config.rollouts_per_worker and not self._tasks.empty():
                active.append(self._tasks.get_nowait())
            owner: dict[str, _Rollout] = {}
            events: list[ExpandEvent] = []
            for rollout in active:
                for _ in range(min(per_report, rollout.turns_left)):
                    event = self._next_turn(rollout)
                    owner[event.event_id] = rollout
                    events.append(event)
            try:
                refused = await self._report(events, index)
            except ReplicasUnavailable:
                refused = set(owner)
            broken = {id(owner[event_id]) for event_id in refused}
            still = [r for r in active if r.turns_left > 0 and id(r) not in broken]
            self._pending -= len(active) - len(still)
            active = still

    def _next_turn(self, rollout: _Rollout) -> ExpandEvent:
        n = next(self._ids)
        node_id = f"n{n}"
        done = rollout.turns_left == 1
        reward = (1.0 if self._rng.random() < rollout.success_rate else 0.0) if done else None
        event = ExpandEvent(
            event_id=f"e{n}",
            tree_id=rollout.tree_id,
            node_id=node_id,
            parent_id=rollout.parent_id,
            text=f"thought {rollout.depth + 1}; action tool[{n % 7}]; observation {n % 11}",
            done=done,
            reward=reward,
            instruction_id=rollout.instruction_id,
        )
        rollout.parent_id, rollout.instruction_id = node_id, None
        rollout.depth += 1
        rollout.turns_left -= 1
        self._node_depth[node_id] = rollout.depth
        return event

    async def _report(self, events: list[ExpandEvent], index: int) -> set[str]:
        """Report turns; returns the ids of the events that were refused for good."""
        start = time.perf_counter()
        refused = await (self._storm(events, index) if self.config.storm else self._send(events, index))
        self.ledger.report_seconds.append(time.perf_counter() - start)
        return refused

    async def _send(self, events: list[ExpandEvent], replica: int) -> set[str]:
        self.ledger.note_sent(events)
        answer = await self.replicas.call(replica, lambda client: client.expand(events, on_rejected="ignore"))
        refused = self._book(events, answer)
        self.ledger.unexpected_rejections.extend(answer.rejected)
        return refused

    def _book(self, events: list[ExpandEvent], answer: ExpandResponse) -> set[str]:
        refused = self.ledger.record(events, answer)
        if self._fault_at is not None and len(self.ledger.acknowledged) >= self._fault_at:
            self._fault_due.set()
        self._take_instructions(answer.instructions)
        self._unfinished.difference_update(answer.completed)
        return refused

    async def _storm(self, events: list[ExpandEvent], index: int) -> set[str]:
        """Two random batches, three concurrent copies of each over the replicas, children first; a
        child refused because its parent had not arrived yet is sent again in the next round."""
        self.ledger.note_sent(events)
        remaining = events
        for _ in range(_STORM_ROUNDS):
            halves: list[list[ExpandEvent]] = [[], []]
            for event in remaining:
                halves[self._rng.randrange(2)].append(event)
            sends = [
                (batch, self._children_first(batch), index + copy)
                for batch in halves
                if batch
                for copy in range(_STORM_COPIES)
            ]
            answers = await asyncio.gather(
                *(
                    self.replicas.call(replica, functools.partial(AsyncTraceClient.expand, events=shuffled))
                    for _, shuffled, replica in sends
                )
            )
            acknowledged: set[str] = set()
            reasons: dict[str, RejectedEvent] = {}
            for (batch, shuffled, _), answer in zip(sends, answers, strict=True):
                refused = self._book(shuffled, answer)
                acknowledged.update(e.event_id for e in batch if e.event_id not in refused)
                reasons.update((item.event_id, item) for item in answer.rejected)
            refused_everywhere = [e for e in remaining if e.event_id not in acknowledged]
            retry = [e for e in refused_everywhere if UNKNOWN_PARENT in reasons[e.event_id].error]
            self.ledger.unexpected_rejections.extend(
                reasons[e.event_id]
                for e in refused_everywhere
                if UNKNOWN_PARENT not in reasons[e.event_id].error
            )
            if not retry:
                return {e.event_id for e in refused_everywhere}
            remaining = retry
        return {e.event_id for e in remaining}

    def _children_first(self, batch: list[ExpandEvent]) -> list[ExpandEvent]:
        shuffled = self._rng.sample(batch, len(batch))
        return sorted(shuffled, key=lambda e: -self._node_depth[e.node_id])


# --- the audit -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Audit:
    """The run checked against the exported trees and the job's stats."""

    trees: int
    complete: int
    closed: int
    open: int
    events: int  # distinct events acknowledged
    lost: int
    phantom: int  # exported nodes no worker ever sent
    over_accepted: int  # answers counted more acceptances than there were distinct events
    miscounted: int
    overspent: int
    unexpected_rejections: int

    @property
    def clean(self) -> bool:
        """Nothing lost, invented or counted twice, no budget over-spent, no event refused, no tree open."""
        faults = (self.lost, self.phantom, self.over_accepted, self.miscounted, self.overspent, self.open)
        return not any(faults) and not self.unexpected_rejections


def audit(
    ledger: Ledger, allocations: Sequence[TreeAllocation], trees: Sequence[TreeResponse], stats: JobStats
) -> Audit:
    """Compare what the workers were told with what the service exports.

    Over-spent units, summed over trees t and instructions I, where share_t is the tree's
    ``expansion_budget`` at allocation and budget_t the one its export holds (under a policy whose
    trees share their continuations, what it drew; else its share):
        max(0, bare starts_t − m_t) + max(0, continuation starts_t − budget_t)
      + max(0, Σ_{I ∈ t} count_I − budget_t) + Σ_I max(0, starts_I − count_I)
      + per step: max(0, rollouts spent − promised) + max(0, continuations spent − promised)
                  + max(0, continuations promised − Σ share_t) + max(0, Σ budget_t − Σ share_t)
    Miscounted leaves, per step of the job stats:
        |rollouts spent − bare leaves exported| + |continuations spent − continuation leaves exported|
    """
    if {a.tree_id for a in allocations} != {t.tree_id for t in trees}:
        raise ValueError("trees must be the exports of exactly the allocated trees")
    allocation = {a.tree_id: a for a in allocations}
    acknowledged_nodes = {ledger.sent[e].tree_id + "/" + ledger.sent[e].node_id for e in ledger.acknowledged}
    sent_nodes = {event.tree_id + "/" + event.node_id for event in ledger.sent.values()}
    exported_nodes = {tree.tree_id + "/" + node.node_id for tree in trees for node in tree.nodes}
    promised_by_tree: Counter[str] = Counter()
    for instruction in ledger.instructions.values():
        promised_by_tree[instruction.tree_id] += instruction.count
    overspent = 0
    starts_by_instruction: Counter[str] = Counter()
    leaves_by_step: dict[int, Counter[str]] = {}
    share_by_step: Counter[int] = Counter()
    granted_by_step: Counter[int] = Counter()
    for tree in trees:
        allocated = allocation[tree.tree_id]
        bare_starts = sum(node.parent_id is None for node in tree.nodes)
        continuation_starts = [node.instruction_id for node in tree.nodes if node.instruction_id is not None]
        starts_by_instruction.update(continuation_starts)
        overspent += max(0, bare_starts - allocated.rollouts)
        overspent += max(0, len(continuation_starts) - tree.expansion_budget)
        overspent += max(0, promised_by_tree[tree.tree_id] - tree.expansion_budget)
        leaves_by_step.setdefault(tree.step, Counter()).update(_leaf_origins(tree))
        share_by_step[tree.step] += allocated.expansion_budget
        granted_by_step[tree.step] += tree.expansion_budget
    for instruction_id, starts in starts_by_instruction.items():
        known = ledger.instructions.get(instruction_id)
        overspent += starts if known is None else max(0, starts - known.count)
    miscounted = 0
    for step in stats.steps:
        overspent += max(0, step.rollouts_spent - step.budget_promised)
        overspent += max(0, step.continuations_spent - step.continuations_promised)
        overspent += max(0, step.continuations_promised - share_by_step[step.step])
        leaves = leaves_by_step.get(step.step, Counter())
        miscounted += abs(step.rollouts_spent - leaves["bare"])
        miscounted += abs(step.continuations_spent - leaves["continuation"])
    for step_index, granted in granted_by_step.items():
        overspent += max(0, granted - share_by_step[step_index])
    status = Counter(tree.status for tree in trees)
    return Audit(
        trees=len(trees),
        complete=status[TreeStatus.COMPLETE],
        closed=status[TreeStatus.CLOSED],
        open=status[TreeStatus.COLLECTING] + status[TreeStatus.EXPANDING],
        events=len(ledger.acknowledged),
        lost=len(acknowledged_nodes - exported_nodes),
        phantom=len(exported_nodes - sent_nodes),
        over_accepted=max(0, ledger.accepted - len(ledger.acknowledged)),
        miscounted=miscounted,
        overspent=overspent,
        unexpected_rejections=len(ledger.unexpected_rejections),
    )


def _leaf_origins(tree: TreeResponse) -> Counter[str]:
    """Leaves of bare rollouts and of continuations (a leaf below an instruction-started turn)."""
    by_id = {node.node_id: node for node in tree.nodes}
    origins: Counter[str] = Counter()
    for node in tree.nodes:
        if node.reward is None:
            continue
        cursor: str | None = node.node_id
        continued = False
        while cursor is not None and not continued:
            continued = by_id[cursor].instruction_id is not None
            cursor = by_id[cursor].parent_id
        origins["continuation" if continued else "bare"] += 1
    return origins


async def export_run(replicas: Replicas, run: LoadRun) -> Audit:
    """Fetch every allocated tree and the job's stats (through any live replica) and audit them."""
    trees = [
        await replicas.call(0, functools.partial(AsyncTraceClient.get_tree, tree_id=tree.tree_id))
        for tree in run.allocations
    ]
    stats = await replicas.call(0, lambda client: client.job_stats(run.config.job))
    return audit(run.ledger, run.allocations, trees, stats)


def percentile(values: Sequence[float], q: float) -> float:
    """The q-quantile by the nearest-rank rule: the ⌈q·n⌉-th smallest value."""
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 1:
        raise ValueError(f"q must be in [0, 1]; got {q}")
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]
