"""verl and SkyRL batches from token rows: the shapes their documented interfaces take (verl 0.9.1,
SkyRL 0.3.0), verl's real classes (installed with the project's `verl` extra), and SkyRL's where it is
installed (it imports only on Python ≥ 3.12; the project's environment is 3.11)."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
import torch
from adapter_trees import finished_tree

from trace_client.adapters import TokenTrajectory, token_trajectories
from trace_client.adapters import skyrl as skyrl_adapter
from trace_client.adapters import verl as verl_adapter
from trace_client.driver import TurnTokens

#: verl 0.9.1 `AgentLoopOutput` fields and SkyRL 0.3.0 `GeneratorOutput` keys, from their sources.
VERL_AGENT_LOOP_FIELDS = {
    "prompt_ids", "response_ids", "response_mask", "response_logprobs", "routed_experts", "multi_modal_data",
    "reward_score", "num_turns", "metrics", "extra_fields", "mm_processor_kwargs", "mm_processor_output",
}  # fmt: skip
SKYRL_GENERATOR_OUTPUT_KEYS = {
    "prompt_token_ids", "response_ids", "rewards", "loss_masks", "stop_reasons", "rollout_metrics",
    "rollout_logprobs", "trajectory_ids", "trajectory_generation_times", "rollout_expert_indices",
    "is_last_step", "env_metrics", "pixel_values", "image_grid_thw",
}  # fmt: skip


def rows(with_logprobs: bool = True) -> list[TokenTrajectory]:
    """Two trees: t (n0 branched into leaves n1 and n2) and u (one rollout of two turns)."""
    logprobs = (-0.5,) if with_logprobs else None
    t = finished_tree(
        [-1, 0, 0],
        {1: 1.0, 2: 0.0},
        advantages=[0.25, 0.5, -0.5],
        tokens={
            0: TurnTokens((5, 6), mask=(1, 0), logprobs=(-0.1, 0.0)),
            1: TurnTokens((7,), logprobs=(-0.2,)),
            2: TurnTokens((8,), logprobs=logprobs),
        },
    )
    u = finished_tree(
        [-1, 0],
        {1: 0.0},
        advantages=[-0.25, -0.75],
        tokens={0: TurnTokens((9,)), 1: TurnTokens((4,))},
        tree_id="u",
    )
    return token_trajectories([t, u], {"prompt-t": [1, 2, 3], "prompt-u": [1]})


def test_agent_loop_fields_are_verl_agent_loop_output_fields() -> None:
    first = verl_adapter.agent_loop_fields(rows()[0])
    assert set(first) | {"metrics"} <= VERL_AGENT_LOOP_FIELDS
    assert first["response_ids"] == [5, 6, 7]
    assert first["response_mask"] == [1, 0, 1]
    assert first["reward_score"] == 1.0
    assert first["extra_fields"] == {"uid": "t", "trace_advantages": [0.25, 0.25, 0.5], "trace_leaf_id": "n1"}
    assert len(first["response_logprobs"]) == len(first["response_ids"])


def test_verl_batch_pads_prompts_left_and_responses_right() -> None:
    batch = verl_adapter.padded_batch(rows(), pad_token_id=0)
    assert batch["prompts"].tolist() == [[1, 2, 3], [1, 2, 3], [0, 0, 1]]
    assert batch["responses"].tolist() == [[5, 6, 7], [5, 6, 8], [9, 4, 0]]
    assert batch["attention_mask"].tolist() == [[1] * 6, [1] * 6, [0, 0, 1, 1, 1, 0]]
    assert batch["position_ids"].tolist() == [[0, 1, 2, 3, 4, 5], [0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 2, 2]]
    assert batch["input_ids"].shape == (3, 6)
    # n0 is trained on the first path only; its tool token (mask 0) never is
    assert batch["response_mask"].tolist() == [[1, 0, 1], [0, 0, 1], [1, 1, 0]]
    assert batch["advantages"].tolist() == [[0.25, 0.0, 0.5], [0.0, 0.0, -0.5], [-0.25, -0.75, 0.0]]
    assert torch.equal(batch["returns"], batch["advantages"])
    assert batch["token_level_rewards"].tolist() == [[0.0, 0.0, 1.0], [0.0, 0.0, 0.0], [0.0, 0.0, 0.0]]
    assert "rollout_log_probs" not in batch  # tree u carries no logprobs


def test_verl_batch_keeps_logprobs_when_every_path_has_them_and_checks_lengths() -> None:
    with_logprobs = [row for row in rows() if row.logprobs is not None]
    batch = verl_adapter.padded_batch(with_logprobs, pad_token_id=0, prompt_length=4, response_length=5)
    assert batch["rollout_log_probs"][0].tolist() == pytest.approx([-0.1, 0.0, -0.2, 0.0, 0.0])
    assert batch["prompts"].shape == (2, 4) and batch["responses"].shape == (2, 5)
    with pytest.raises(ValueError, match="more than 2 / 5"):
        verl_adapter.padded_batch(with_logprobs, pad_token_id=0, prompt_length=2, response_length=5)
    with pytest.raises(ValueError, match="no trajectories"):
        verl_adapter.padded_batch([], pad_token_id=0)


@dataclass(frozen=True)
class TrajectoryIdStandIn:
    """SkyRL's `TrajectoryID` fields (instance_id, repetition_id)."""

    instance_id: str
    repetition_id: int


def test_skyrl_generator_output_groups_each_trees_paths() -> None:
    output = skyrl_adapter.generator_output(rows(), trajectory_id=TrajectoryIdStandIn)
    assert set(output) <= SKYRL_GENERATOR_OUTPUT_KEYS
    assert output["trajectory_ids"] == [
        TrajectoryIdStandIn("t", 0),
        TrajectoryIdStandIn("t", 1),
        TrajectoryIdStandIn("u", 0),
    ]
    assert output["rewards"] == [[0.25, 0.25, 0.5], [0.25, 0.25, -0.5], [-0.25, -0.75]]
    assert output["loss_masks"] == [[1, 0, 1], [0, 0, 1], [1, 1]]
    assert output["prompt_token_ids"][2] == [1]
    assert output["rollout_logprobs"] is None
    assert output["rollout_metrics"] == {
        "trace/paths": 3,
        "trace/trees": 2,
        "trace/mean_leaf_reward": pytest.approx(1 / 3),
    }


def test_skyrl_estimator_passes_the_advantages_through_the_mask() -> None:
    rewards = torch.tensor([[0.5, -1.0, 2.0]])
    mask = torch.tensor([[1.0, 0.0, 1.0]])
    advantages, returns = skyrl_adapter.trace_advantages(
        token_level_rewards=rewards, response_mask=mask, index=None
    )
    assert advantages.tolist() == [[0.5, 0.0, 2.0]]
    assert torch.equal(returns, advantages)


@pytest.mark.framework
def test_real_verl_classes_take_the_outputs() -> None:
    (output, *_) = verl_adapter.agent_loop_outputs(rows())
    assert output.response_mask == [1, 0, 1]
    proto = verl_adapter.data_proto(rows(), pad_token_id=0)
    assert list(proto.non_tensor_batch["uid"]) == ["t", "t", "u"]


@pytest.mark.framework
def test_real_skyrl_classes_take_the_output() -> None:
    base = pytest.importorskip("skyrl.train.generators.base", reason="SkyRL imports only on Python >= 3.12")
    output = skyrl_adapter.generator_output(rows())
    assert output["trajectory_ids"][1] == base.TrajectoryID(instance_id="t", repetition_id=1)
    skyrl_adapter.register_trace_estimator("trace-test")
