"""The learner's policy-gradient estimate is the gradient of the exact success (finite differences on a
tiny policy family), and it reads contexts, actions and advantages off the trees correctly."""

from __future__ import annotations

import numpy as np
import pytest
from tiny_policy_workload import TinyPolicyWorkload

from bench.estimators import FinishedTree as ForestTree
from bench.policy_gradient import SampledTurns, forest_tree_turns, policy_gradient, service_tree_turns
from trace_client.driver import FinishedTree, TurnResult
from trace_lab.sim import RolloutState
from trace_proto import PromptIn, TreeAllocation, TreeNode, TreeResponse, TreeStatus

# Task: success depends on both actions; θ away from uniform so every coordinate has its own gradient.
REWARDS = [[[0.9, 0.7], [0.1, 0.2]]]
THETA = np.array([[0.3, -0.2], [-0.4, 0.5]])
GROUP = 4
TURNS = 2


def exact_success(workload: TinyPolicyWorkload, theta: np.ndarray) -> float:
    workload.policy = theta
    return workload.true_success(workload.prompts[0].prompt_id)


def flat_group_tree(trajectories: list[tuple[RolloutState, ...]]) -> FinishedTree:
    """A group of bare rollouts as the service exports it: one chain per rollout, V̂ = its reward."""
    rewards = [trajectory[-1].reward or 0.0 for trajectory in trajectories]
    root_value = float(np.mean(rewards))
    nodes, turns = [], {}
    for index, trajectory in enumerate(trajectories):
        parent = None
        for depth, state in enumerate(trajectory, start=1):
            node_id = f"r{index}-t{depth}"
            turn = state.history[-1]
            nodes.append(
                TreeNode(
                    node_id=node_id,
                    parent_id=parent,
                    depth=depth,
                    visits=1,
                    successes=int(rewards[index]),
                    value=rewards[index],
                    reward=turn.reward,
                )
            )
            turns[node_id] = TurnResult(text=turn.text, done=turn.done, reward=turn.reward, state=state)
            parent = node_id
    prompt_id = trajectories[0][0].prompt_id
    tree = TreeResponse(
        tree_id="t",
        prompt_id=prompt_id,
        job="test",
        step=0,
        status=TreeStatus.COMPLETE,
        mixed=0 < sum(rewards) < len(rewards),
        rollouts=len(trajectories),
        expansion_budget=0,
        value=root_value,
        nodes=nodes,
    )
    allocation = TreeAllocation(
        prompt_id=prompt_id,
        tree_id="t",
        rollouts=len(trajectories),
        expansion_budget=0,
        predicted_success=0.5,
    )
    return FinishedTree(PromptIn(prompt_id=prompt_id), allocation, tree, turns, {})


def test_grpo_gradient_matches_finite_differences() -> None:
    """Per group, E[ĝ] = (n − 1)/(n·T) ∇J: the group mean baseline removes a 1/n share of each rollout's
    own term, and token-level averaging divides by the n·T turns of the group."""
    workload = TinyPolicyWorkload(REWARDS)
    prompt_id = workload.prompts[0].prompt_id
    epsilon = 1e-5
    finite_difference = np.zeros_like(THETA)
    for index in np.ndindex(THETA.shape):
        step = np.zeros_like(THETA)
        step[index] = epsilon
        finite_difference[index] = (
            exact_success(workload, THETA + step) - exact_success(workload, THETA - step)
        ) / (2 * epsilon)

    workload.policy = THETA
    rng = np.random.default_rng(0)
    groups = 3000
    trajectories = workload.run([workload.start(prompt_id) for _ in range(groups * GROUP)], rng)
    estimates = np.array(
        [
            policy_gradient(
                THETA,
                service_tree_turns(
                    workload, flat_group_tree(trajectories[g * GROUP : (g + 1) * GROUP]), flat=True
                ),
            )
            for g in range(groups)
        ]
    )
    scale = GROUP * TURNS / (GROUP - 1)
    mean = estimates.mean(axis=0) * scale
    standard_error = estimates.std(axis=0) * scale / np.sqrt(groups)
    assert np.all(np.abs(mean - finite_difference) < 4 * standard_error + 1e-3), (mean, finite_difference)
    # The check has teeth: the gradient is well away from zero in every coordinate.
    assert np.all(np.abs(finite_difference) > 5 * standard_error)


def test_policy_gradient_is_the_token_mean_of_score_times_advantage() -> None:
    theta = np.array([[0.0, np.log(3.0)], [0.0, 0.0]])  # π(·|0) = (1/4, 3/4), π(·|1) = (1/2, 1/2)
    turns = SampledTurns(np.array([0, 0, 1]), np.array([1, 0, 0]), np.array([2.0, -1.0, 0.5]))
    expected = np.zeros((2, 2))
    expected[0] += 2.0 * np.array([-0.25, 0.25]) - 1.0 * np.array([0.75, -0.75])
    expected[1] += 0.5 * np.array([0.5, -0.5])
    assert policy_gradient(theta, turns) == pytest.approx(expected / 3)
    empty = SampledTurns.concat([])
    assert np.all(policy_gradient(theta, empty) == 0.0)


def test_forest_turns_read_contexts_actions_and_tree_advantages() -> None:
    """A bare rollout and one continuation from its first turn: each node's context is its turn index
    (the tiny family's), its action the one its turn records, its advantage the service's."""
    workload = TinyPolicyWorkload(REWARDS)
    prompt = workload.prompts[0]
    rng = np.random.default_rng(3)
    (bare,) = workload.run([workload.start(prompt.prompt_id)], rng)
    (branch,) = workload.run([bare[0]], rng)
    states = [*bare, *branch]
    tree = ForestTree(
        prompt=prompt,
        states=states,
        parent=[-1, 0, 0],
        reward=[float("nan"), bare[-1].reward or 0.0, branch[-1].reward or 0.0],
        successes=0,
        trials=0,
        bare_successes=int(bare[-1].reward == 1.0),
        bare_trials=1,
    )
    turns = forest_tree_turns(workload, tree)
    assert turns.contexts.tolist() == [0, 1, 1]
    assert turns.actions.tolist() == [state.history[-1].action for state in states]
    first, second = tree.reward[1], tree.reward[2]
    root = (first + second) / 2
    # A(y) = (V̂(y) − V̂(parent)) + (V̂(y) − V̂(root)); the first turn's V̂ is the root's.
    assert turns.advantages.tolist() == pytest.approx([0.0, 2 * (first - root), 2 * (second - root)])
