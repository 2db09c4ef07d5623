"""SkyRL adapter: finished trees as a SkyRL `GeneratorOutput`, with TRACE's advantages per token.

Written against SkyRL 0.3.0 (`skyrl.train.generators.base.GeneratorOutput`, `TrajectoryID`, and the
advantage-estimator registry in `skyrl.backends.skyrl_train.utils.ppo_utils`), read from its source;
SkyRL's stack (ray, vLLM, CUDA torch) does not install on the machines this project is tested on, so
the tests check the documented shapes and SkyRL is imported only inside the functions that need it.

`GeneratorOutput` is a TypedDict, so `generator_output` returns a plain dict with its keys. SkyRL takes
per-token `rewards` and hands them to the configured advantage estimator as `token_level_rewards`; this
adapter puts each token's TRACE advantage there, and `register_trace_estimator()` registers an estimator
that passes them through (`trainer.algorithm.advantage_estimator: trace`). The leaf rewards go to
`rollout_metrics` (SkyRL's own reward metrics would average the advantages instead).

Each path is one row: `trajectory_ids[k] = TrajectoryID(instance_id=tree_id, repetition_id=k-th path
of that tree)`, so SkyRL groups a tree's paths together. A tree gives a different number of rows per
prompt, so the generator that runs the driver must also hand SkyRL these `instance_id`s as the batch's
uids (see docs/adapters.md).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from trace_client.adapters.trajectories import TokenTrajectory

if TYPE_CHECKING:
    import torch

#: Builds a trajectory id from (instance_id, repetition_id); SkyRL's `TrajectoryID` by default.
TrajectoryIdFactory = Callable[[str, int], Any]


def generator_output(
    trajectories: Sequence[TokenTrajectory], *, trajectory_id: TrajectoryIdFactory | None = None
) -> dict[str, Any]:
    """The paths as SkyRL's `GeneratorOutput`: rewards per token are the advantages (see the module doc).

    `trajectory_id` builds each row's id; by default SkyRL's `TrajectoryID` (needs SkyRL installed).
    """
    if trajectory_id is None:
        trajectory_id = importlib.import_module("skyrl.train.generators.base").TrajectoryID
    repetitions: dict[str, int] = {}
    ids = []
    for t in trajectories:
        ids.append(trajectory_id(t.group, repetitions.get(t.group, 0)))
        repetitions[t.group] = repetitions.get(t.group, 0) + 1
    with_logprobs = bool(trajectories) and all(t.logprobs is not None for t in trajectories)
    rewards = [t.reward for t in trajectories]
    return {
        "prompt_token_ids": [list(t.prompt_ids) for t in trajectories],
        "response_ids": [list(t.response_ids) for t in trajectories],
        "rewards": [list(t.advantages) for t in trajectories],
        "loss_masks": [list(t.loss_mask) for t in trajectories],
        "stop_reasons": None,
        "rollout_metrics": {
            "trace/paths": len(trajectories),
            "trace/trees": len(repetitions),
            "trace/mean_leaf_reward": sum(rewards) / len(rewards) if rewards else 0.0,
        },
        "rollout_logprobs": [list(t.logprobs or ()) for t in trajectories] if with_logprobs else None,
        "trajectory_ids": ids,
    }


def trace_advantages(
    token_level_rewards: torch.Tensor, response_mask: torch.Tensor, **_: Any
) -> tuple[torch.Tensor, torch.Tensor]:
    """SkyRL advantage estimator for batches from `generator_output`: the per-token rewards already are
    TRACE's advantages, `A = token_level_rewards · response_mask`, and the returns equal them."""
    advantages = token_level_rewards * response_mask
    return advantages, advantages.clone()


def register_trace_estimator(name: str = "trace") -> None:
    """Register `trace_advantages` with SkyRL under `name` (needs SkyRL installed)."""
    ppo_utils = importlib.import_module("skyrl.backends.skyrl_train.utils.ppo_utils")
    ppo_utils.register_advantage_estimator(name)(trace_advantages)
