"""From finished trees to trainer rows: one row per root-to-leaf path, with per-turn advantages.

What every trainer adapter shares. A tree's path from the prompt to a scored leaf is one trajectory; its
response is the concatenation of the path's turns, and every token of turn y carries the service's
advantage of that turn segment (docs/allocation.md, "What a tree gives the trainer"):

    A(y) = (V̂(y) − V̂(parent(y))) + (V̂(y) − V̂(root)).

A turn shared by several paths (a prefix that was branched from) is trained once: on the first path
through it, in the tree's node order, and on the others it is context only (loss mask 0), so a shared
prefix is not weighted by the number of continuations branched from it. Pass `train_shared_once=False`
to train it on every path instead.

Left out: paths to a driver failure leaf (the agent crashed; the leaf is not the policy's doing) and
paths through turns this driver did not run (another worker's; their tokens are not here).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from trace_client.driver import FinishedTree, TurnResult
from trace_proto import PromptIn, TreeNode

#: The prompt's token ids, by prompt (a mapping by prompt_id or a function of the prompt).
PromptTokens = Mapping[str, Sequence[int]] | Callable[[PromptIn], Sequence[int]]


@dataclass(frozen=True, slots=True)
class Segment:
    """One turn on a path: its node, the turn, its advantage, and whether this path trains it."""

    node_id: str
    turn: TurnResult
    advantage: float
    trained: bool


@dataclass(frozen=True, slots=True)
class TreePath:
    """A root-to-leaf path of one tree: one trajectory for the trainer; `group` is the tree's id."""

    group: str
    prompt: PromptIn
    leaf_id: str
    reward: float
    segments: tuple[Segment, ...]


@dataclass(frozen=True, slots=True)
class TokenTrajectory:
    """A path as tokens: every response token carries its turn's advantage and a loss-mask bit; `root_id`
    is the path's first turn (the bare rollout it starts from)."""

    group: str
    root_id: str
    leaf_id: str
    prompt_ids: tuple[int, ...]
    response_ids: tuple[int, ...]
    loss_mask: tuple[int, ...]
    advantages: tuple[float, ...]
    logprobs: tuple[float, ...] | None
    reward: float
    turns: int


def tree_paths(finished: FinishedTree, *, train_shared_once: bool = True) -> list[TreePath]:
    """The tree's root-to-leaf paths in node order (see the module doc for what is left out)."""
    nodes = {node.node_id: node for node in finished.tree.nodes}
    leaves = [
        node
        for node in finished.tree.nodes
        if node.reward is not None and node.node_id not in finished.failures
    ]
    paths: list[TreePath] = []
    trained: set[str] = set()
    for leaf in leaves:
        chain = _chain(leaf, nodes)
        if any(node.node_id not in finished.turns for node in chain):
            continue
        segments = []
        for node in chain:
            if node.advantage is None:
                raise ValueError(
                    f"tree {finished.tree.tree_id}: node {node.node_id} on a scored path has no advantage"
                )
            first = node.node_id not in trained
            trained.add(node.node_id)
            segments.append(
                Segment(
                    node.node_id, finished.turns[node.node_id], node.advantage, first or not train_shared_once
                )
            )
        assert leaf.reward is not None  # leaves were selected by their reward
        paths.append(
            TreePath(finished.tree.tree_id, finished.prompt, leaf.node_id, leaf.reward, tuple(segments))
        )
    return paths


def _chain(leaf: TreeNode, nodes: Mapping[str, TreeNode]) -> list[TreeNode]:
    """The nodes from the prompt's first turn down to `leaf`."""
    chain = [leaf]
    while chain[-1].parent_id is not None:
        chain.append(nodes[chain[-1].parent_id])
    chain.reverse()
    return chain


def token_trajectories(
    trees: Iterable[FinishedTree], prompt_tokens: PromptTokens, *, train_shared_once: bool = True
) -> list[TokenTrajectory]:
    """Every kept path of every tree as tokens; each turn on a path must carry `TurnResult.tokens`.

    Logprobs are kept when every turn on the path has them, else None for that path.
    """
    trajectories = []
    for finished in trees:
        prompt_ids = tuple(_prompt_ids(prompt_tokens, finished.prompt))
        for path in tree_paths(finished, train_shared_once=train_shared_once):
            response: list[int] = []
            mask: list[int] = []
            advantages: list[float] = []
            logprobs: list[float] | None = []
            for segment in path.segments:
                tokens = segment.turn.tokens
                if tokens is None:
                    raise ValueError(
                        f"tree {path.group}: turn {segment.node_id} carries no tokens; "
                        "next_turn must fill TurnResult.tokens for a trainer adapter"
                    )
                response.extend(tokens.ids)
                mask.extend(tokens.loss_mask if segment.trained else (0,) * len(tokens.ids))
                advantages.extend((segment.advantage,) * len(tokens.ids))
                if logprobs is not None and tokens.logprobs is not None:
                    logprobs.extend(tokens.logprobs)
                else:
                    logprobs = None
            trajectories.append(
                TokenTrajectory(
                    group=path.group,
                    root_id=path.segments[0].node_id,
                    leaf_id=path.leaf_id,
                    prompt_ids=prompt_ids,
                    response_ids=tuple(response),
                    loss_mask=tuple(mask),
                    advantages=tuple(advantages),
                    logprobs=None if logprobs is None else tuple(logprobs),
                    reward=path.reward,
                    turns=len(path.segments),
                )
            )
    return trajectories


def _prompt_ids(prompt_tokens: PromptTokens, prompt: PromptIn) -> Sequence[int]:
    if callable(prompt_tokens):
        return prompt_tokens(prompt)
    try:
        return prompt_tokens[prompt.prompt_id]
    except KeyError:
        raise ValueError(f"no prompt token ids for prompt {prompt.prompt_id!r}") from None
