"""The tabular learner's update (`bench/learning.py`): the sampled turns of a step's trees with their
advantages, the policy gradient over them, and the optimisers that step θ along it."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from bench.advantages import ADVANTAGES, exported_tree_advantages
from bench.estimators import FinishedTree as ForestTree
from trace_client.driver import FinishedTree
from trace_lab.sim import RolloutState
from trace_lab.sim.base import PolicyWorkload
from trace_lab.sim.tabular import softmax_rows as softmax  # π_θ(· | c) row by row
from trace_service.allocation.tree import tree_targets

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


@dataclass(frozen=True)
class SampledTurns:
    """The sampled turns of a batch: the context each action was chosen in, the action, its advantage."""

    contexts: IntArray
    actions: IntArray
    advantages: FloatArray

    @property
    def size(self) -> int:
        return int(self.contexts.size)

    @staticmethod
    def concat(parts: Sequence[SampledTurns]) -> SampledTurns:
        if not parts:
            return SampledTurns(np.zeros(0, np.int64), np.zeros(0, np.int64), np.zeros(0))
        return SampledTurns(
            np.concatenate([part.contexts for part in parts]),
            np.concatenate([part.actions for part in parts]),
            np.concatenate([part.advantages for part in parts]),
        )


#: How the turns of a step are weighted in the gradient's mean: every sampled turn alike (token-level),
#: or every rollout alike (a tree weighs its leaves' count, shared among its turns).
TURN_WEIGHTS = ("turn", "rollout")


def weighted_turns(trees: Sequence[tuple[SampledTurns, int]], weighting: str) -> SampledTurns:
    """The step's turns from (turns of a tree, its scored leaves) pairs; under "rollout" a tree's turns
    are scaled by (leaves / turns of the tree) · (turns / leaves of the step), so the mean over turns
    that `policy_gradient` takes is a mean over rollouts of each tree's per-turn mean."""
    parts = [part for part, _ in trees]
    if weighting == "turn" or not parts:
        return SampledTurns.concat(parts)
    total_turns = sum(part.size for part in parts)
    total_leaves = sum(leaves for part, leaves in trees if part.size)
    scaled = [
        replace(part, advantages=part.advantages * (leaves / part.size) * (total_turns / total_leaves))
        for part, leaves in trees
        if part.size
    ]
    return SampledTurns.concat(scaled)


def policy_gradient(theta: FloatArray, turns: SampledTurns) -> FloatArray:
    """(1/T) Σ_t A_t ∇_θ log π_θ(a_t | c_t) over the T sampled turns; ∇_θ[c] log softmax(θ[c])_a is
    e_a − π_θ(· | c), and zero in every other row."""
    gradient = np.zeros_like(theta)
    if turns.size == 0:
        return gradient
    np.add.at(gradient, (turns.contexts, turns.actions), turns.advantages)
    per_context = np.bincount(turns.contexts, weights=turns.advantages, minlength=theta.shape[0])
    gradient -= per_context[:, None] * softmax(theta)
    return gradient / turns.size


def _sampled_turns(
    workload: PolicyWorkload, prompt_id: str, turns: Iterable[tuple[RolloutState, RolloutState | None, float]]
) -> SampledTurns:
    """(state after the turn, state before it or None at the prompt, advantage) → sampled turns.  A first
    turn's context is its own task's start (the state knows its task, whatever the tree was labelled)."""
    contexts, actions, values = [], [], []
    for after, before, advantage in turns:
        action = after.history[-1].action
        if action is None:
            raise ValueError(f"a turn of {prompt_id!r} records no action: not a policy family's turn")
        start = workload.start(after.prompt_id) if before is None else before
        contexts.append(workload.context_of(start))
        actions.append(action)
        values.append(advantage)
    return SampledTurns(
        np.asarray(contexts, dtype=np.int64), np.asarray(actions, dtype=np.int64), np.asarray(values)
    )


def service_tree_turns(
    workload: PolicyWorkload, finished: FinishedTree, *, flat: bool, advantage: str = "service"
) -> SampledTurns:
    """A tree the service exported: per node the service's advantage (or the `bench.advantages`
    variant named, computed from the tree's rewards), or on a flat group (bare rollouts only) the GRPO
    baseline V̂(node) − V̂(root) = r − mean(group), each node lying on exactly one rollout. Failure
    leaves (not policy turns) and nodes without a scored leaf are left out."""
    tree = finished.tree
    variant = exported_tree_advantages(tree, advantage)

    def state_of(node_id: str) -> RolloutState:
        state = finished.turns[node_id].state
        if not isinstance(state, RolloutState):
            raise TypeError(f"node {node_id!r} carries no simulator state: it was not made by SimAgent")
        return state

    rows = []
    for i, node in enumerate(tree.nodes):
        if node.node_id not in finished.turns or node.value is None or tree.value is None:
            continue
        node_advantage = node.value - tree.value if flat else float(variant[i])
        before = None if node.parent_id is None else state_of(node.parent_id)
        rows.append((state_of(node.node_id), before, node_advantage))
    return _sampled_turns(workload, tree.prompt_id, rows)


def forest_tree_turns(workload: PolicyWorkload, tree: ForestTree, advantage: str = "service") -> SampledTurns:
    """A tree of the in-process oracle, with the service's advantage or the variant named."""
    parent = np.asarray(tree.parent, dtype=np.int64)
    advantage_of = ADVANTAGES[advantage](parent, tree_targets(parent, tree.reward))
    rows = [
        (state, None if up < 0 else tree.states[up], float(advantage_of[i]))
        for i, (state, up) in enumerate(zip(tree.states, tree.parent, strict=True))
    ]
    return _sampled_turns(workload, tree.prompt.prompt_id, rows)


class Adam:
    """Adam (Kingma & Ba) ascending the objective."""

    def __init__(self, lr: float, beta1: float = 0.9, beta2: float = 0.999) -> None:
        self.lr, self.beta1, self.beta2 = lr, beta1, beta2
        self.mean: FloatArray | float = 0.0
        self.square: FloatArray | float = 0.0
        self.steps = 0

    def step(self, gradient: FloatArray) -> FloatArray:
        """The change of θ for one ascent step along `gradient`."""
        self.steps += 1
        self.mean = self.beta1 * self.mean + (1 - self.beta1) * gradient
        self.square = self.beta2 * self.square + (1 - self.beta2) * gradient**2
        mean = self.mean / (1 - self.beta1**self.steps)
        square = self.square / (1 - self.beta2**self.steps)
        return np.asarray(self.lr * mean / (np.sqrt(square) + 1e-8), dtype=np.float64)


class SGD:
    """Plain gradient ascent."""

    def __init__(self, lr: float) -> None:
        self.lr = lr

    def step(self, gradient: FloatArray) -> FloatArray:
        return self.lr * gradient


OPTIMIZERS = {"adam": Adam, "sgd": SGD}
