"""What the worker driver takes and returns: a turn, a history, its configuration, a finished tree and
a step's result (`trace_client.driver`)."""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass

from trace_proto import (
    AllocateResponse,
    Instruction,
    PromptIn,
    RejectedEvent,
    TreeAllocation,
    TreeResponse,
    TreeStatus,
)
from trace_proto.v1.limits import MAX_EVENTS_PER_REQUEST


@dataclass(frozen=True, slots=True)
class TurnTokens:
    """Token ids of one turn, for trainer adapters.

    `mask[k]` is 1 for a token the policy generated (it enters the loss) and 0 for one it did not (a
    tool's or the environment's reply); None means every token is the policy's. `logprobs` are the
    sampler's log-probabilities of the tokens, when the trainer needs them.
    """

    ids: tuple[int, ...]
    mask: tuple[int, ...] | None = None
    logprobs: tuple[float, ...] | None = None

    def __post_init__(self) -> None:
        if self.mask is not None:
            if len(self.mask) != len(self.ids):
                raise ValueError(f"mask has {len(self.mask)} entries for {len(self.ids)} token ids")
            if any(bit not in (0, 1) for bit in self.mask):
                raise ValueError("mask entries must be 0 or 1")
        if self.logprobs is not None and len(self.logprobs) != len(self.ids):
            raise ValueError(f"logprobs has {len(self.logprobs)} entries for {len(self.ids)} token ids")

    @property
    def loss_mask(self) -> tuple[int, ...]:
        return self.mask if self.mask is not None else (1,) * len(self.ids)


@dataclass(frozen=True, slots=True)
class TurnResult:
    """What `next_turn` returns: one agent turn.

    `done` ends the rollout; its `reward` may be left None when a `score` callable is given. `features`
    (numbers, e.g. a pooled hidden state) reach the predictor; `tokens` reach the trainer adapters;
    `state` is opaque to the driver and handed back in every history that continues from this turn —
    whatever the agent needs to resume exactly here (an environment snapshot, a KV-cache handle, the
    simulator's state).
    """

    text: str | None = None
    done: bool = False
    reward: float | None = None
    features: Sequence[float] | None = None
    tokens: TurnTokens | None = None
    state: object = None

    def __post_init__(self) -> None:
        if self.reward is not None:
            if not self.done:
                raise ValueError("a reward belongs on the turn that ends the rollout (done=True)")
            if not math.isfinite(self.reward):
                raise ValueError(f"reward must be finite, got {self.reward}")


@dataclass(frozen=True, slots=True)
class History:
    """A prefix history H: the prompt and the turns so far (none at the start of a bare rollout)."""

    prompt: PromptIn
    tree_id: str
    turns: tuple[TurnResult, ...] = ()

    @property
    def depth(self) -> int:
        return len(self.turns)

    @property
    def last_turn(self) -> TurnResult | None:
        return self.turns[-1] if self.turns else None

    def then(self, turn: TurnResult) -> History:
        """This history followed by one more turn (the original is unchanged and shared)."""
        return History(self.prompt, self.tree_id, (*self.turns, turn))


NextTurn = Callable[[History], TurnResult | Awaitable[TurnResult]]
Score = Callable[[History], float | Awaitable[float]]
#: `on_turn(tree_id, node_id, turn)`: told the node id the driver gave each turn, when it is recorded.
TurnRecorded = Callable[[str, str, TurnResult], None]


@dataclass(frozen=True, slots=True)
class Progress:
    """Counts of one step so far; continuations count those this driver received instructions for."""

    step: int
    trees: int
    trees_finished: int
    bare_rollouts: int
    bare_finished: int
    continuations: int
    continuations_finished: int
    failed: int
    turns_reported: int
    elapsed: float

    def line(self) -> str:
        return (
            f"step {self.step} | trees {self.trees_finished}/{self.trees}"
            f" | bare {self.bare_finished}/{self.bare_rollouts}"
            f" | continuations {self.continuations_finished}/{self.continuations}"
            f" | failed {self.failed} | turns {self.turns_reported} | {self.elapsed:.1f}s"
        )


ProgressCallback = Callable[[Progress], None]


@dataclass(frozen=True)
class DriverConfig:
    """How the driver runs a step.

    Args:
        concurrency: Rollouts in flight at once (each holds its slot from first to last turn).
        batch_events: Most events in one `/v1/expand` request.
        batch_trees: Most trees one request touches. The service applies each tree's events of a request
            in one store call, so fewer trees with more events each cost it less.
        batch_latency: Longest an event waits for its batch to fill (seconds).
        poll_interval: While a tree waits on the service with no local work: seconds between claims of
            leased instructions and status checks.
        max_turns: A rollout that has not ended after this many turns (counted from the prompt) fails.
        turn_timeout: Seconds one call of a callable may take before its rollout fails (None: no limit;
            a synchronous callable can only be timed out with `threaded`).
        step_timeout: Overall deadline of `run_step`, and of each `run_tree` call, in seconds (None:
            none); past it the remaining trees are closed.
        failure_reward: Reward of the leaf that reports a failed rollout.
        threaded: Run synchronous callables in worker threads (for blocking ones).
        progress: Write a progress line to stderr every `progress_interval` seconds.
    """

    concurrency: int = 64
    batch_events: int = 512
    batch_trees: int = 64
    batch_latency: float = 0.05
    poll_interval: float = 0.5
    max_turns: int = 64
    turn_timeout: float | None = None
    step_timeout: float | None = 3600.0
    failure_reward: float = 0.0
    threaded: bool = False
    progress: bool = False
    progress_interval: float = 1.0

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ValueError(f"concurrency must be at least 1, got {self.concurrency}")
        if not 1 <= self.batch_events <= MAX_EVENTS_PER_REQUEST:
            raise ValueError(
                f"batch_events must lie in [1, {MAX_EVENTS_PER_REQUEST}], got {self.batch_events}"
            )
        if self.batch_trees < 1:
            raise ValueError(f"batch_trees must be at least 1, got {self.batch_trees}")
        if self.max_turns < 1:
            raise ValueError(f"max_turns must be at least 1, got {self.max_turns}")
        for name in ("batch_latency", "poll_interval", "progress_interval"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        for name in ("turn_timeout", "step_timeout"):
            value = getattr(self, name)
            if value is not None and not value > 0:
                raise ValueError(f"{name} must be positive or None, got {value}")
        if not math.isfinite(self.failure_reward):
            raise ValueError(f"failure_reward must be finite, got {self.failure_reward}")


@dataclass(frozen=True)
class FinishedTree:
    """One prompt's tree at the end of the step.

    `turns` maps each node this driver ran to its turn (failure leaves are absent from it); `failures`
    maps each failure leaf this driver reported to the error it stands for.
    """

    prompt: PromptIn
    allocation: TreeAllocation
    tree: TreeResponse
    turns: Mapping[str, TurnResult]
    failures: Mapping[str, str]

    @property
    def closed(self) -> bool:
        """The tree was closed before it completed (deadline, or nothing could finish it)."""
        return self.tree.status is TreeStatus.CLOSED


@dataclass(frozen=True)
class StepResult:
    """What `run_step` hands the trainer."""

    allocation: AllocateResponse
    trees: list[FinishedTree]
    instructions: list[Instruction]
    rejected: list[RejectedEvent]
    timed_out: bool
    progress: Progress
