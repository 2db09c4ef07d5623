"""verl adapter: finished trees as verl's agent-loop outputs and as a ready-to-update `DataProto`.

Written against verl 0.9.1 (`verl.experimental.agent_loop.agent_loop.AgentLoopOutput`,
`verl.protocol.DataProto`) and tested against it; the verl classes are imported only inside the
functions that build them, so the base install can import this module. To train with verl's own v1
trainer loop, use `trace_client.integrations.verl`; these converters are for a trainer step of your own.

Two ways in (docs/adapters.md shows both):

- `agent_loop_outputs`: one `AgentLoopOutput` per root-to-leaf path. `response_mask` is the loss mask
  (policy tokens of the turns this path trains), `reward_score` the leaf's reward, and `extra_fields`
  carries `uid` (the tree: one GRPO group), `trace_advantages` (one advantage per response token) and
  `trace_leaf_id`. verl copies `extra_fields` into the batch's `non_tensor_batch`.
- `data_proto`: the whole step as a padded `DataProto` with the fields verl's actor update reads
  (`prompts`, `responses`, `response_mask`, `input_ids`, `attention_mask`, `position_ids`,
  `advantages`, `returns`, `token_level_scores`, `token_level_rewards`, and `rollout_log_probs` when
  every path has them) and `uid` per row. Its `advantages` are TRACE's, so the trainer step skips
  `compute_advantage` for it.

A tree gives more rows than prompts, and a different number per prompt: verl's v1 trainer takes that
(per-prompt `__rollout_n__`, several outputs per session), which is what `trace_client.integrations.verl`
uses; the deprecated `RayPPOTrainer.fit` repeats each prompt `rollout.n` times and cannot.
"""

from __future__ import annotations

import importlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from trace_client.adapters.trajectories import TokenTrajectory

if TYPE_CHECKING:
    import torch


def path_fields(trajectory: TokenTrajectory, response_length: int | None = None) -> dict[str, Any]:
    """The keyword arguments of verl's `AgentLoopOutput` that one path gives, whoever builds it (without
    `metrics` and `extra_fields`), cut to `response_length` response tokens when given."""
    keep = len(trajectory.response_ids) if response_length is None else response_length
    return {
        "prompt_ids": list(trajectory.prompt_ids),
        "response_ids": list(trajectory.response_ids[:keep]),
        "response_mask": list(trajectory.loss_mask[:keep]),
        "response_logprobs": None if trajectory.logprobs is None else list(trajectory.logprobs[:keep]),
        # set, so that verl's reward workers do not score the path again
        "reward_score": trajectory.reward,
        "num_turns": trajectory.turns,
    }


def agent_loop_fields(trajectory: TokenTrajectory) -> dict[str, Any]:
    """The keyword arguments of verl's `AgentLoopOutput` for one path (without `metrics`)."""
    return {
        **path_fields(trajectory),
        "extra_fields": {
            "uid": trajectory.group,
            "trace_advantages": list(trajectory.advantages),
            "trace_leaf_id": trajectory.leaf_id,
        },
    }


def agent_loop_outputs(trajectories: Sequence[TokenTrajectory]) -> list[Any]:
    """verl `AgentLoopOutput` objects, one per path (needs verl installed)."""
    agent_loop = importlib.import_module("verl.experimental.agent_loop.agent_loop")
    return [
        agent_loop.AgentLoopOutput(**agent_loop_fields(trajectory), metrics=agent_loop.AgentLoopMetrics())
        for trajectory in trajectories
    ]


def padded_batch(
    trajectories: Sequence[TokenTrajectory],
    pad_token_id: int,
    *,
    prompt_length: int | None = None,
    response_length: int | None = None,
) -> dict[str, torch.Tensor]:
    """verl's batch tensors for the paths, prompts left-padded and responses right-padded.

    Lengths default to the longest prompt and response; a path longer than a given length is an error
    (cut it before, where the truncation is visible). `position_ids` count real tokens only;
    `token_level_scores` / `token_level_rewards` hold the reward at the last response token;
    `advantages` and `returns` hold the per-token advantages on loss-mask tokens and 0 elsewhere.
    """
    import torch

    if not trajectories:
        raise ValueError("no trajectories to batch")
    prompt_width = max(len(t.prompt_ids) for t in trajectories) if prompt_length is None else prompt_length
    response_width = (
        max(len(t.response_ids) for t in trajectories) if response_length is None else response_length
    )
    for t in trajectories:
        if len(t.prompt_ids) > prompt_width or len(t.response_ids) > response_width:
            raise ValueError(
                f"path to leaf {t.leaf_id} of tree {t.group} has a prompt of {len(t.prompt_ids)} and a "
                f"response of {len(t.response_ids)} tokens: more than {prompt_width} / {response_width}"
            )
        if not t.response_ids:
            raise ValueError(f"path to leaf {t.leaf_id} of tree {t.group} has an empty response")
    rows = len(trajectories)
    prompts = torch.full((rows, prompt_width), pad_token_id, dtype=torch.long)
    responses = torch.full((rows, response_width), pad_token_id, dtype=torch.long)
    prompt_attention = torch.zeros((rows, prompt_width), dtype=torch.long)
    response_attention = torch.zeros((rows, response_width), dtype=torch.long)
    response_mask = torch.zeros((rows, response_width), dtype=torch.long)
    advantages = torch.zeros((rows, response_width), dtype=torch.float32)
    scores = torch.zeros((rows, response_width), dtype=torch.float32)
    logprobs = torch.zeros((rows, response_width), dtype=torch.float32)
    for row, t in enumerate(trajectories):
        p, r = len(t.prompt_ids), len(t.response_ids)
        if p:
            prompts[row, prompt_width - p :] = torch.tensor(t.prompt_ids)
            prompt_attention[row, prompt_width - p :] = 1
        responses[row, :r] = torch.tensor(t.response_ids)
        response_attention[row, :r] = 1
        response_mask[row, :r] = torch.tensor(t.loss_mask)
        advantages[row, :r] = torch.tensor(t.advantages) * response_mask[row, :r]
        scores[row, r - 1] = t.reward
        if t.logprobs is not None:
            logprobs[row, :r] = torch.tensor(t.logprobs)
    attention = torch.cat([prompt_attention, response_attention], dim=1)
    batch = {
        "prompts": prompts,
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention,
        "position_ids": torch.clamp(torch.cumsum(attention, dim=1) - 1, min=0),
        "advantages": advantages,
        "returns": advantages.clone(),
        "token_level_scores": scores,
        "token_level_rewards": scores.clone(),
    }
    if all(t.logprobs is not None for t in trajectories):
        batch["rollout_log_probs"] = logprobs
    return batch


def data_proto(
    trajectories: Sequence[TokenTrajectory],
    pad_token_id: int,
    *,
    prompt_length: int | None = None,
    response_length: int | None = None,
) -> Any:
    """The paths as one verl `DataProto` (needs verl installed): `padded_batch` plus `uid` and
    `trace_leaf_id` per row in `non_tensor_batch`."""
    import numpy as np

    protocol = importlib.import_module("verl.protocol")
    tensors = padded_batch(
        trajectories, pad_token_id, prompt_length=prompt_length, response_length=response_length
    )
    non_tensors = {
        "uid": np.array([t.group for t in trajectories], dtype=object),
        "trace_leaf_id": np.array([t.leaf_id for t in trajectories], dtype=object),
    }
    return protocol.DataProto.from_dict(tensors=tensors, non_tensors=non_tensors)
