"""Per-turn tree advantages the learner benchmark can train on instead of the service's (an ablation:
`python bench/learning.py --arms uniform,trace,trace@global,…`).

Every variant maps a tree (``parent``, parents first, and its `TreeTargets`) to one advantage per node,
NaN where no scored leaf lies below the node. Notation: V̂(y) the success rate of the n_y scored leaves
below y, p(y) its parent (the prompt for a first turn), V̂(root) the rate of all N leaves of the tree.

The policy gradient credits the turn ending at y, action a_y in the context c_{p(y)}, with
∇log π(a_y | c_{p(y)}) · (Q̂ − b): Q̂ = V̂(y) estimates Q(c_{p(y)}, a_y), and the baseline b must not
depend on a_y for the term to be unbiased. Each variant is one choice of b (and of a weight):

* ``service``  — what ``GET /v1/trees/{id}`` exports (`trace_service.allocation.tree.advantages`):
  (V̂(y) − V̂(p(y))) + (V̂(y) − V̂(root)).
* ``global``   — V̂(y) − V̂(root) = (1 − n_y/N)(V̂(y) − V̂(rest)), V̂(rest) the rate of the leaves not
  below y: GRPO's group baseline (the `uniform` arm's on flat groups), unbiased up to (1 − n_y/N).
* ``first-once`` — ``service`` without the local term of a first turn (whose parent is the prompt, so
  its local term equals its global one and ``service`` counts it twice).
* ``global-bare`` — V̂(y) − V̄ with V̄ the mean of V̂ over the first turns, each bare rollout's subtree
  counted once, so a bare rollout with many continuations does not pull the baseline towards itself.
* ``local``    — V̂(y) − V̂(p(y)): telescopes along a root-to-leaf path to r − V̂(root), so a turn
  whose parent never branched gets nothing.
* ``loo``      — V̂(y) − b(y), b(y) the rate of the leaves below the parent of the deepest branch point
  u on y's path (u = y or an ancestor whose parent holds leaves outside u) that are not below u: a
  leave-one-out baseline at the nearest state shared with other draws (RLOO on flat groups).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import numpy.typing as npt

from trace_proto import TreeResponse
from trace_service.allocation.tree import TreeTargets, advantages, tree_targets

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]
Advantage = Callable[[IntArray, TreeTargets], FloatArray]


def _parent_value(parent: IntArray, targets: TreeTargets) -> FloatArray:
    return np.where(parent >= 0, targets.value[np.maximum(parent, 0)], targets.root_value)


def global_only(parent: IntArray, targets: TreeTargets) -> FloatArray:  # noqa: ARG001 (one signature)
    return targets.value - targets.root_value


def first_turn_once(parent: IntArray, targets: TreeTargets) -> FloatArray:
    local = np.where(parent >= 0, targets.value - _parent_value(parent, targets), 0.0)
    return local + (targets.value - targets.root_value)


def global_bare(parent: IntArray, targets: TreeTargets) -> FloatArray:  # noqa: ARG001 (one signature)
    first = targets.value[(targets.depth == 1) & (targets.visits > 0)]
    return targets.value - (float(first.mean()) if first.size else np.nan)


def local_only(parent: IntArray, targets: TreeTargets) -> FloatArray:
    return targets.value - _parent_value(parent, targets)


def leave_one_out(parent: IntArray, targets: TreeTargets) -> FloatArray:
    """0 where every leaf of the tree lies below y (no other draw from a state on y's path), as GRPO's
    advantage in a group of one."""
    visits = targets.visits.astype(np.float64)
    successes = targets.successes.astype(np.float64)
    baseline = np.full(parent.size, np.nan)
    for i in range(parent.size):  # parents come first: a node inherits its parent's baseline
        p = int(parent[i])
        parent_visits = visits[p] if p >= 0 else float(targets.root_visits)
        parent_successes = successes[p] if p >= 0 else float(targets.root_successes)
        if parent_visits > visits[i]:
            baseline[i] = (parent_successes - successes[i]) / (parent_visits - visits[i])
        elif p >= 0:
            baseline[i] = baseline[p]
    return np.where(np.isnan(baseline) & ~np.isnan(targets.value), 0.0, targets.value - baseline)


ADVANTAGES: dict[str, Advantage] = {
    "service": advantages,
    "global": global_only,
    "first-once": first_turn_once,
    "global-bare": global_bare,
    "local": local_only,
    "loo": leave_one_out,
}


def exported_tree_advantages(tree: TreeResponse, name: str) -> FloatArray:
    """The variant ``name`` for each node of a tree the service exported (in ``tree.nodes`` order),
    computed from its rewards; NaN where no scored leaf lies below."""
    index = {node.node_id: i for i, node in enumerate(tree.nodes)}
    parent = np.array([-1 if n.parent_id is None else index[n.parent_id] for n in tree.nodes], np.int64)
    reward = np.array([np.nan if n.reward is None else n.reward for n in tree.nodes])
    return ADVANTAGES[name](parent, tree_targets(parent, reward))
