"""What the environment tests share: the driver's part played by hand (turn by turn, each turn given a
node id), random policies for the real packages' environments, and environments that misbehave."""

from __future__ import annotations

import itertools
import os
import random
from collections.abc import Callable

from trace_client.driver import History, TurnResult
from trace_client.envs import Environment, EnvironmentWorker, Episode, GemEnvironment, Step
from trace_proto import PromptIn

_NODES = itertools.count()


def prompt(prompt_id: str = "task", seed: int = 11) -> PromptIn:
    return PromptIn(prompt_id=prompt_id, metadata={"seed": seed})


async def turn(worker: EnvironmentWorker, history: History) -> History:
    """One turn as the driver runs it: `next_turn`, then the turn recorded under a fresh node id."""
    result: TurnResult = await worker.next_turn(history)
    worker.turn_recorded(history.tree_id, f"node-{next(_NODES)}", result)
    return history.then(result)


async def rollout(worker: EnvironmentWorker, start: History, max_turns: int = 64) -> History:
    """From `start` to the rollout's last turn."""
    history = start
    while history.depth < max_turns and not (history.last_turn is not None and history.last_turn.done):
        history = await turn(worker, history)
    return history


def scripted(actions: list[object]) -> Callable[[Episode], object]:
    """A policy that plays `actions[k]` at the episode's k-th step: a continuation that branches at a
    node and plays the recorded actions must see the recorded observations again."""
    return lambda episode: actions[len(episode.steps)]


def mastermind_guesses(count: int, seed: int) -> list[object]:
    rng = random.Random(seed)
    return ["\\boxed{" + " ".join(map(str, rng.sample(range(1, 7), 2))) + "}" for _ in range(count)]


def minesweeper_moves(count: int, seed: int) -> list[object]:
    rng = random.Random(seed)
    return [
        f"\\boxed{{{rng.choice(['reveal'] * 4 + ['flag'])} {rng.randrange(5)} {rng.randrange(5)}}}"
        for _ in range(count)
    ]


class UnseededGem(GemEnvironment):
    """A GEM game reset from the OS's entropy instead of its seed: each reset draws a new secret, so the
    same actions do not give the same answers (an environment that is not deterministic)."""

    def reset(self, seed: int) -> object:
        observation, _ = self.env.reset(seed=int.from_bytes(os.urandom(4), "big"))
        return observation


class FailingReplay:
    """Wraps an environment; when `fails`, its `reset` raises (a restore by replay resets a fresh
    instance, so the factory decides which restores fail)."""

    def __init__(self, env: Environment, fails: bool) -> None:
        self.env = env
        self.fails = fails

    def reset(self, seed: int) -> object:
        if self.fails:
            raise ConnectionError("the environment's backend went away")
        return self.env.reset(seed)

    def step(self, action: object) -> Step:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()


class Tally(dict[str, int]):
    """Counts shared by every copy of the environments that hold it (a deep copy keeps it)."""

    def __deepcopy__(self, memo: dict[int, object]) -> Tally:
        return self


class Counting:
    """Wraps an environment and counts the resets and steps of all instances (and copies) in `counts`."""

    def __init__(self, env: Environment, counts: Tally) -> None:
        self.env = env
        self.counts = counts

    def reset(self, seed: int) -> object:
        self.counts["resets"] = self.counts.get("resets", 0) + 1
        return self.env.reset(seed)

    def step(self, action: object) -> Step:
        self.counts["steps"] = self.counts.get("steps", 0) + 1
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()
