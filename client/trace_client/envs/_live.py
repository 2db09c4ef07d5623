"""Live environments: each with its own stream of the process-global random generators, and the bounded
cache that keeps them between turns."""

from __future__ import annotations

import contextlib
import random
import sys
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, NamedTuple, TypeVar

from trace_client.envs.types import Environment, SnapshotEnvironment, Step

T = TypeVar("T")

#: One environment call at a time swaps the global generators (the swap is not thread-safe otherwise).
_SWAP = threading.Lock()


class GlobalRandom:
    """An environment's own state of Python's global `random` (and of numpy's, when numpy is installed).

    Some environments draw from the process-global generators (and reseed them in `reset`). Each call
    of such an environment runs with its own state swapped in, and the caller's put back after, so a
    replay draws exactly what the recorded run drew, whatever the policy or other rollouts did meanwhile.
    """

    def __init__(self, seed: int) -> None:
        # numpy loaded now, when installed: one loaded later (by the environment's own imports) would
        # leave this environment's first draws from it unseeded
        with contextlib.suppress(ImportError):
            import numpy  # noqa: F401
        with _SWAP:
            saved = _global_states()
            random.seed(seed)
            numpy_module = sys.modules.get("numpy")
            if numpy_module is not None:
                numpy_module.random.seed(seed % 2**32)
            self.states = _global_states()
            _set_global_states(saved)

    def run(self, function: Callable[..., T], *args: Any) -> T:
        """`function(*args)` with this state of the global generators swapped in."""
        with _SWAP:
            saved = _global_states()
            _set_global_states(self.states)
            try:
                return function(*args)
            finally:
                self.states = _global_states()
                _set_global_states(saved)


def _global_states() -> tuple[object, object]:
    numpy = sys.modules.get("numpy")
    return random.getstate(), None if numpy is None else numpy.random.get_state()


def _set_global_states(states: tuple[object, object]) -> None:
    python_state, numpy_state = states
    random.setstate(python_state)  # type: ignore[arg-type]
    numpy = sys.modules.get("numpy")
    if numpy is not None and numpy_state is not None:
        numpy.random.set_state(numpy_state)


class Snapshot(NamedTuple):
    """A snapshot environment's state after a turn, with its state of the global generators."""

    state: object
    random_states: tuple[object, object] | None


@dataclass(eq=False)
class Live:
    """An environment at one node, with its own global random state; `steps` counts its `step` calls
    since its rollout took it (replayed ones included), `start_depth` is where that rollout began."""

    env: Environment
    rng: GlobalRandom | None
    start_depth: int
    steps: int = 0
    replayed: int = 0

    def call(self, function: Callable[..., T], *args: Any) -> T:
        return function(*args) if self.rng is None else self.rng.run(function, *args)

    def reset(self, seed: int) -> object:
        return self.call(self.env.reset, seed)

    def step(self, action: object) -> Step:
        self.steps += 1
        step = self.call(self.env.step, action)
        if not isinstance(step, Step):
            raise TypeError(f"{type(self.env).__name__}.step returned {type(step).__name__}, not a Step")
        return step

    def snapshot(self) -> Snapshot | None:
        """The environment's snapshot with its random state, or None when it cannot snapshot."""
        if not isinstance(self.env, SnapshotEnvironment):
            return None
        return Snapshot(self.call(self.env.snapshot), None if self.rng is None else self.rng.states)

    def restore(self, snapshot: Snapshot) -> None:
        if not isinstance(self.env, SnapshotEnvironment):
            raise TypeError(f"{type(self.env).__name__} cannot restore a snapshot")
        if self.rng is not None and snapshot.random_states is not None:
            self.rng.states = snapshot.random_states
        self.call(self.env.restore, snapshot.state)

    def close(self) -> None:
        self.env.close()


@dataclass
class CacheStats:
    """The cache's counters: `size` now, and since it started the takes that found an environment
    (`hits`), those that did not (`misses`), and environments dropped to keep within the bound."""

    size: int = 0
    capacity: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0


class LiveCache:
    """Live environments between turns, keyed by (tree, turn), the least recently stored dropped (and
    closed) beyond `capacity`. A rollout takes its environment out for a turn and puts it back under
    the new turn, so a rollout's next turn never replays; what it holds is bounded by `capacity`."""

    def __init__(self, capacity: int) -> None:
        if capacity < 0:
            raise ValueError(f"capacity must be at least 0, got {capacity}")
        self._entries: OrderedDict[tuple[str, str], Live] = OrderedDict()
        self.stats = CacheStats(capacity=capacity)

    def __len__(self) -> int:
        return len(self._entries)

    def take(self, key: tuple[str, str]) -> Live | None:
        live = self._entries.pop(key, None)
        if live is None:
            self.stats.misses += 1
        else:
            self.stats.hits += 1
        self.stats.size = len(self._entries)
        return live

    def put(self, key: tuple[str, str], live: Live) -> None:
        self._entries[key] = live
        while len(self._entries) > self.stats.capacity:
            _, evicted = self._entries.popitem(last=False)
            self.stats.evictions += 1
            evicted.close()
        self.stats.size = len(self._entries)

    def drop_tree(self, tree_id: str) -> None:
        """Close the environments of a finished tree (its rollouts will not take them any more)."""
        for key in [key for key in self._entries if key[0] == tree_id]:
            self._entries.pop(key).close()
        self.stats.size = len(self._entries)

    def clear(self) -> None:
        while self._entries:
            self._entries.popitem()[1].close()
        self.stats.size = 0
