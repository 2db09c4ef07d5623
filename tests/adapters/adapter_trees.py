"""Hand-built finished trees for the adapter tests."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from trace_client.driver import FinishedTree, TurnResult, TurnTokens
from trace_proto import PromptIn, TreeAllocation, TreeNode, TreeResponse, TreeStatus


def finished_tree(
    parents: Sequence[int],
    rewards: Mapping[int, float],
    *,
    advantages: Sequence[float] | None = None,
    failures: Sequence[int] = (),
    missing: Sequence[int] = (),
    tokens: Mapping[int, TurnTokens] | None = None,
    tree_id: str = "t",
) -> FinishedTree:
    """A complete tree over nodes n0, n1, ...: `parents[i]` is node i's parent index (-1: the prompt),
    `rewards` holds the leaves'. Failure leaves are listed as the driver's failures; `missing` nodes have
    no turn (another worker ran them). Node i's advantage defaults to i / 10."""
    nodes = []
    for i, parent in enumerate(parents):
        depth = 1
        ancestor = parent
        while ancestor >= 0:
            depth += 1
            ancestor = parents[ancestor]
        nodes.append(
            TreeNode(
                node_id=f"n{i}",
                parent_id=None if parent < 0 else f"n{parent}",
                depth=depth,
                visits=1,
                successes=0,
                value=0.0,
                advantage=(advantages[i] if advantages is not None else i / 10),
                reward=rewards.get(i),
            )
        )
    prompt = PromptIn(prompt_id=f"prompt-{tree_id}", text="a task")
    tree = TreeResponse(
        tree_id=tree_id,
        prompt_id=prompt.prompt_id,
        job="j",
        step=0,
        status=TreeStatus.COMPLETE,
        mixed=len(set(rewards.values())) > 1,
        rollouts=sum(parent < 0 for parent in parents),
        expansion_budget=0,
        nodes=nodes,
    )
    turns = {
        f"n{i}": TurnResult(
            text=f"turn {i}",
            done=i in rewards,
            reward=rewards.get(i),
            tokens=None if tokens is None else tokens.get(i),
        )
        for i in range(len(parents))
        if i not in failures and i not in missing
    }
    allocation = TreeAllocation(
        prompt_id=prompt.prompt_id,
        tree_id=tree_id,
        rollouts=tree.rollouts,
        expansion_budget=0,
        predicted_success=0.5,
    )
    return FinishedTree(prompt, allocation, tree, turns, {f"n{i}": "RuntimeError: boom" for i in failures})
