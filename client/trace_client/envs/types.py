"""What the environment layer takes and records: the environment protocols, one step's outcome, what a
policy sees and returns, each turn's record and the error a diverging replay raises
(`trace_client.envs`)."""

from __future__ import annotations

import hashlib
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

from trace_client.driver import History, TurnTokens
from trace_proto import PromptIn


@dataclass(frozen=True, slots=True)
class Step:
    """What one `step` returns: the observation after the action, its reward, whether the episode ended."""

    observation: object
    reward: float = 0.0
    done: bool = False


@runtime_checkable
class Environment(Protocol):
    """A stateful environment, made by the worker's factory for one prompt.

    `reset(seed)` starts an episode and returns the first observation; `step(action)` acts. Replaying
    the same actions after the same `reset(seed)` must give the same observations (observations compare
    with `==`): that is what restores a node's state when the environment cannot snapshot.
    """

    def reset(self, seed: int) -> object: ...

    def step(self, action: object) -> Step: ...

    def close(self) -> None: ...


@runtime_checkable
class SnapshotEnvironment(Environment, Protocol):
    """An environment that can save its state and put it back: continuations restore it, never replay.

    `snapshot()` returns a value the environment no longer changes (a copy); `restore(snapshot)` on a
    fresh instance from the same factory makes it continue exactly as the snapshotted one would.
    """

    def snapshot(self) -> object: ...

    def restore(self, snapshot: object) -> None: ...


@dataclass(frozen=True, slots=True)
class Move:
    """What a policy may return instead of a bare action: the action with what the trainer needs of the
    turn (the LLM's text, its tokens, features for the predictor)."""

    action: object
    text: str | None = None
    tokens: TurnTokens | None = None
    features: Sequence[float] | None = None


@dataclass(frozen=True, slots=True)
class Episode:
    """What the policy sees: the prompt, the first observation and every (action, observation, reward)
    so far; `observation` is the latest one. `history` is the driver's history the episode continues
    (its turns' tokens are an LLM policy's context)."""

    prompt: PromptIn
    start: object
    steps: tuple[tuple[object, object, float], ...] = ()
    history: History | None = None

    @property
    def observation(self) -> object:
        return self.steps[-1][1] if self.steps else self.start

    @property
    def total_reward(self) -> float:
        return sum(reward for _, _, reward in self.steps)

    @classmethod
    def of(cls, history: History) -> Episode:
        """The episode a history of environment turns recorded (its first turn holds the start)."""
        records = [turn.state for turn in history.turns]
        if not records or not all(isinstance(record, EnvTurn) for record in records):
            raise TypeError("the history's turns were not all made by an EnvironmentWorker")
        turns = [record for record in records if isinstance(record, EnvTurn)]
        steps = tuple((turn.action, turn.observation, turn.reward) for turn in turns)
        return cls(history.prompt, turns[0].start, steps, history)


Policy = Callable[[Episode], "object | Move | Awaitable[object | Move]"]
Outcome = Callable[[Episode], float]


@dataclass(eq=False, slots=True)
class EnvTurn:
    """A turn's record, kept as the `TurnResult.state` the driver hands back in every history that
    continues from the turn: what replay needs (seed, action, what the step gave; the first turn also
    the observation `reset` gave) and, for a snapshot environment, the state after the turn. `node_id`
    is filled in when the driver records the turn.

    The rollout's cost so far rides along (the depth it branched at, its steps and replayed steps), so
    that a rollout whose live environment the cache dropped still counts as one; `followed` is set by
    the first turn after this one, which is the same rollout's (a continuation can only be instructed
    once the rollout is scored), so any later one starts a continuation.
    """

    key: str
    seed: int
    action: object
    observation: object
    reward: float
    done: bool
    start: object = None
    snapshot: object = None
    node_id: str | None = field(default=None)
    branch_depth: int = 0
    rollout_steps: int = 0
    rollout_replayed: int = 0
    followed: bool = False

    def step(self) -> Step:
        return Step(self.observation, self.reward, self.done)


class ReplayDivergence(RuntimeError):
    """Replaying a node's actions from its seed did not give the recorded outcome: the environment is
    not deterministic given its seed and actions, so no continuation can start from that node. `turn`
    is the replayed step that differed (0: the reset), `node` the node that recorded it."""

    def __init__(self, tree_id: str, node: str, turn: int, recorded: object, replayed: object) -> None:
        self.tree_id, self.node, self.turn = tree_id, node, turn
        what = "the reset" if turn == 0 else f"turn {turn}"
        super().__init__(
            f"replay diverged in tree {tree_id} at node {node} ({what}): {_difference(recorded, replayed)};"
            " the environment is not deterministic given its seed and actions"
        )


def stable_seed(prompt: PromptIn) -> int:
    """A prompt's episode seed: `metadata["seed"]` when it is a non-negative integer, else a hash of its
    id (the same on every machine and run)."""
    seed = (prompt.metadata or {}).get("seed")
    if isinstance(seed, int) and not isinstance(seed, bool) and seed >= 0:
        return seed
    return int.from_bytes(hashlib.sha256(prompt.prompt_id.encode()).digest()[:4], "big")


def _difference(recorded: object, replayed: object, context: int = 60) -> str:
    """Where the replayed outcome first differs from the recorded one (their texts around it)."""
    left, right = repr(recorded), repr(replayed)
    at = next(
        (k for k, (a, b) in enumerate(zip(left, right, strict=False)) if a != b), min(len(left), len(right))
    )
    start, end = max(0, at - context), at + context
    return f"recorded {left[start:end]}, replayed {right[start:end]} (from character {start})"
