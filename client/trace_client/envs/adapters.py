"""Ready environments: Gymnasium's API, GEM's text games, and snapshots by deep copy for an environment
that copies cleanly. Gymnasium and GEM are imported when an adapter is made (the `envs` extra)."""

from __future__ import annotations

import copy
import logging
from typing import Any

from trace_client.envs.types import Environment, Step


def plain(value: object) -> object:
    """An observation as plain values that compare with `==` (numpy arrays become nested lists)."""
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, tuple | list):
        return type(value)(plain(item) for item in value)
    tolist = getattr(value, "tolist", None)
    return tolist() if callable(tolist) else value


class GymnasiumEnvironment:
    """A Gymnasium environment (`reset(seed=…)`, `step` → observation, reward, terminated, truncated,
    info), given made or by id (`gymnasium.make(env_id, **kwargs)`). Observations are kept as plain
    values; an episode ends when it terminates or is truncated."""

    def __init__(self, env: Any, **make_kwargs: Any) -> None:
        if isinstance(env, str):
            import gymnasium

            env = gymnasium.make(env, **make_kwargs)
        self.env = env

    def reset(self, seed: int) -> object:
        observation, _ = self.env.reset(seed=seed)
        return plain(observation)

    def step(self, action: object) -> Step:
        observation, reward, terminated, truncated, _ = self.env.step(action)
        return Step(plain(observation), float(reward), bool(terminated or truncated))

    def close(self) -> None:
        self.env.close()


class GemEnvironment:
    """A GEM (`gem-llm`) environment by id, `gem.make(env_id, **kwargs)`: text observations, the
    action a string (the LLM's reply). GEM's games draw from Python's global `random`; the worker gives
    each its own stream (`isolate_random`)."""

    def __init__(self, env_id: str, **kwargs: Any) -> None:
        self.env = _import_gem().make(env_id, **kwargs)

    def reset(self, seed: int) -> object:
        observation, _ = self.env.reset(seed=seed)
        return observation

    def step(self, action: object) -> Step:
        observation, reward, terminated, truncated, _ = self.env.step(str(action))
        return Step(observation, float(reward), bool(terminated or truncated))

    def close(self) -> None:
        close = getattr(self.env, "close", None)
        if callable(close):
            close()


def _import_gem() -> Any:
    """`gem`, imported without the root-logger set-up its import does (`logging.basicConfig` at INFO),
    which would change the logging of the whole worker process."""
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    import gem

    root.handlers[:] = handlers
    root.setLevel(level)
    return gem


class DeepCopySnapshots:
    """Makes an environment that deep-copies cleanly a `SnapshotEnvironment`: a snapshot is a deep copy
    of it, so continuations restore a node's state without replaying (at a copy's cost per turn)."""

    def __init__(self, env: Environment) -> None:
        self.env = env

    def reset(self, seed: int) -> object:
        return self.env.reset(seed)

    def step(self, action: object) -> Step:
        return self.env.step(action)

    def close(self) -> None:
        self.env.close()

    def snapshot(self) -> object:
        return copy.deepcopy(self.env)

    def restore(self, snapshot: object) -> None:
        self.env.close()
        self.env = copy.deepcopy(snapshot)  # type: ignore[assignment]
