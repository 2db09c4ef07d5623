"""Stateful environments under the worker driver: a continuation starts from its node's environment
state, restored by snapshot or by a checked replay (docs/workers.md, "Stateful environments").

    from trace_client.envs import DeepCopySnapshots, EnvironmentWorker, GemEnvironment

    worker = EnvironmentWorker(
        lambda prompt: DeepCopySnapshots(GemEnvironment("game:Mastermind-v0-easy")),
        policy,  # policy(episode) -> action: where an LLM's next turn goes
    )
    async with AsyncTraceClient(url) as client:
        result = await worker.driver(client).run_step(request)

* `Environment`: `reset(seed) -> observation`, `step(action) -> Step(observation, reward, done)`,
  `close()`; a `SnapshotEnvironment` adds `snapshot()` and `restore(snapshot)`.
* `EnvironmentWorker`: the driver's `next_turn` (and `on_turn`) for a policy on such environments. A
  rollout keeps its live environment between turns in a bounded cache; a continuation's first turn
  restores the node: from the snapshot its turn recorded, else by `reset(seed)` and the prefix's actions,
  every replayed step compared with the recorded one (`ReplayDivergence` fails that continuation).
* Adapters: `GymnasiumEnvironment` (Gymnasium's API), `GemEnvironment` (GEM's text games),
  `DeepCopySnapshots` (snapshots by deep copy). Gymnasium and GEM come with the `envs` extra and are
  imported only when an adapter is made.
"""

from trace_client.envs._live import CacheStats
from trace_client.envs.adapters import DeepCopySnapshots, GemEnvironment, GymnasiumEnvironment, plain
from trace_client.envs.types import (
    Environment,
    EnvTurn,
    Episode,
    Move,
    Outcome,
    Policy,
    ReplayDivergence,
    SnapshotEnvironment,
    Step,
    stable_seed,
)
from trace_client.envs.worker import ContinuationCost, EnvironmentWorker, ReplayStats

__all__ = [
    "CacheStats",
    "ContinuationCost",
    "DeepCopySnapshots",
    "EnvTurn",
    "Environment",
    "EnvironmentWorker",
    "Episode",
    "GemEnvironment",
    "GymnasiumEnvironment",
    "Move",
    "Outcome",
    "Policy",
    "ReplayDivergence",
    "ReplayStats",
    "SnapshotEnvironment",
    "Step",
    "plain",
    "stable_seed",
]
