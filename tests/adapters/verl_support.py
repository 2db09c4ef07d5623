"""What the verl integration's test files share: a small finished tree as verl outputs, verl's config
with TRACE's overrides, and service settings that stay idle through a test."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from adapter_trees import finished_tree
from hydra import compose, initialize_config_dir
from omegaconf import DictConfig
from support import make_settings

from trace_client.driver import TurnTokens
from trace_client.integrations import verl as integration

# n0 ─┬─ n1 (leaf 1.0)      n3 ── n4 (leaf 0.0)
#     └─ n2 (leaf 0.0, a continuation branched from n0)
PARENTS = [-1, 0, 0, -1, 3]
REWARDS = {1: 1.0, 2: 0.0, 4: 0.0}
ADVANTAGES = [0.5, 0.25, -0.75, -0.5, -0.125]
TOKENS = {
    0: TurnTokens((10, 11, 12), mask=(1, 1, 0)),
    1: TurnTokens((13,)),
    2: TurnTokens((14, 15)),
    3: TurnTokens((16, 17)),
    4: TurnTokens((18,)),
}


def tree_sessions(response_length: int = 64) -> list[list[integration.TraceAgentLoopOutput]]:
    finished = finished_tree(PARENTS, REWARDS, advantages=ADVANTAGES, tokens=TOKENS)
    # n2 is the continuation: an instruction of the service started it
    nodes = [
        node.model_copy(update={"instruction_id": "i2"}) if node.node_id == "n2" else node
        for node in finished.tree.nodes
    ]
    finished = dataclasses.replace(finished, tree=finished.tree.model_copy(update={"nodes": nodes}))
    return integration.session_outputs(finished, [1, 2], response_length, weights_versions=(4, 5))


def compose_config(url: str, *extra: str, model_dir: Path | None = None, mode: str = "sync") -> DictConfig:
    import verl

    overrides = [*integration.trace_overrides(url, mode=mode, expansion=1.0), *extra]
    if model_dir is not None:
        overrides += [f"actor_rollout_ref.model.path={model_dir}", "actor_rollout_ref.rollout.name=vllm"]
    with initialize_config_dir(
        config_dir=str(Path(verl.__file__).parent / "trainer/config"), version_base=None
    ):
        return compose("ppo_trainer", overrides=overrides)


def idle_settings() -> Any:
    """Service settings whose background loops stay idle for the length of a test."""
    return make_settings(train_interval_seconds=60.0, sweep_interval_seconds=60.0)
