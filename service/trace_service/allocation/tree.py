"""Rollout trees as arrays, and the quantities TRACE derives from them (pure, no I/O).

A tree of one prompt is given by two arrays over its turn nodes, parents before children:

* ``parent[i]`` — index of node i's parent, or ``-1`` when the turn starts from the prompt (the root);
* ``reward[i]`` — the terminal reward of a leaf, NaN for a node that is not (yet) a scored leaf.

Targets are recursive and bottom-up: a leaf's target is its binarised reward and an internal node's is
the visit-weighted mean of its children, ``V̂(y) = (1/n_y) Σ_{c ∈ children(y)} n_c V̂(c)``, which equals
the success rate of the scored leaves below y.  Unscored branches have no visits yet and no value.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

from trace_service.allocation._validate import FloatArray, IntArray
from trace_service.lifecycle import DEFAULT_SUCCESS_THRESHOLD, is_mixed, is_success

ROOT = -1


@dataclass(frozen=True)
class TreeTargets:
    """Per-node depth, visits n_y, successes and V̂(y) (NaN without visits), plus the root's."""

    depth: IntArray
    visits: IntArray
    successes: IntArray
    value: FloatArray
    has_children: npt.NDArray[np.bool_]
    root_visits: int
    root_successes: int

    @property
    def root_value(self) -> float:
        return self.root_successes / self.root_visits if self.root_visits else float("nan")

    @property
    def mixed(self) -> bool:
        """The tree holds both a success leaf and a failure leaf: a contrastive group."""
        return is_mixed(self.root_successes, self.root_visits)


def tree_targets(
    parent: npt.ArrayLike, reward: npt.ArrayLike, *, success_threshold: float = DEFAULT_SUCCESS_THRESHOLD
) -> TreeTargets:
    """Compute depths, visit and success counts and recursive targets ``V̂`` for every node.

    A reward counts as a success when ``reward ≥ success_threshold``
    (:func:`~trace_service.lifecycle.is_success`).  Iterates over depth levels,
    never recursion, so deep trees (depth 50 and more) are fine.
    """
    parents = np.asarray(parent, dtype=np.int64)
    rewards = np.asarray(reward, dtype=np.float64)
    n_nodes = parents.size
    if parents.ndim != 1 or rewards.shape != parents.shape:
        raise ValueError("parent and reward must be 1-D arrays of the same length")
    if np.any(parents < ROOT) or np.any(parents >= np.arange(n_nodes)):
        raise ValueError("every parent must be -1 or the index of an earlier node")
    if np.any(np.isinf(rewards)):
        raise ValueError("rewards must be finite (NaN marks an unscored node)")

    is_leaf = ~np.isnan(rewards)
    has_children = np.zeros(n_nodes, dtype=bool)
    has_children[parents[parents >= 0]] = True
    if np.any(is_leaf & has_children):
        raise ValueError("a scored leaf cannot have children")

    depth = np.ones(n_nodes, dtype=np.int64)
    for i in np.flatnonzero(parents >= 0).tolist():  # parents come first, so one forward pass suffices
        depth[i] = depth[parents[i]] + 1

    visits = is_leaf.astype(np.int64)
    successes = (is_leaf & is_success(np.nan_to_num(rewards, nan=-np.inf), success_threshold)).astype(
        np.int64
    )
    for level in range(int(depth.max(initial=0)), 1, -1):
        nodes = np.flatnonzero(depth == level)
        np.add.at(visits, parents[nodes], visits[nodes])
        np.add.at(successes, parents[nodes], successes[nodes])
    top = depth == 1
    with np.errstate(invalid="ignore", divide="ignore"):
        value = np.where(visits > 0, successes / np.maximum(visits, 1), np.nan)
    return TreeTargets(
        depth=depth,
        visits=visits,
        successes=successes,
        value=value,
        has_children=has_children,
        root_visits=int(visits[top].sum()),
        root_successes=int(successes[top].sum()),
    )


def advantages(parent: npt.ArrayLike, targets: TreeTargets) -> FloatArray:
    """Per-node advantage of the turn segment ending at node y (a Tree-GRPO / TreeRL-style choice):

        A(y) = (V̂(y) − V̂(parent(y)))  +  (V̂(y) − V̂(root)),

    the local term credits the turn for how it moved the success rate; the global term is the mean over
    the leaves below y of ``r_leaf − V̂(root)``.  NaN where y has no scored leaf below it.

    As a policy-gradient credit for the turn's action a_y in the context c_{p(y)}, ∇log π · (Q̂ − b)
    with Q̂ = V̂(y): with n_y of the tree's N leaves below y and p = p(y),

        V̂(y) − V̂(root) = (1 − n_y/N) (V̂(y) − V̂(rest)),   V̂(y) − V̂(p) = (1 − n_y/n_p) (V̂(y) − V̂(siblings)),

    rest the leaves not below y, siblings those below p but not y: each term a baseline drawn apart from
    y's own leaves (GRPO's group baseline; the siblings' from the same state c_p), shrunk by the share
    of y's leaves.  The local term is zero unless p branched, and a first turn's parent is the prompt, so
    a first turn and a branch's children get both terms, every other turn one: a reweighting of turns,
    not a biased baseline.  `bench/advantages.py` holds the alternatives (GRPO's term alone, the
    first turn counted once, a baseline of the bare rollouts, the telescoping local term, leave-one-out
    at the deepest branch point); none learns faster on the held-out families (bench/README.md,
    "Learning"), so this stays.
    """
    parents = np.asarray(parent, dtype=np.int64)
    parent_value = np.where(parents >= 0, targets.value[np.maximum(parents, 0)], targets.root_value)
    return (targets.value - parent_value) + (targets.value - targets.root_value)


@dataclass(frozen=True)
class PrefixCandidates:
    """Branching candidates of a tree: node indices, observed majority outcome, already-mixed flag."""

    nodes: IntArray
    outcome: FloatArray
    blocked: npt.NDArray[np.bool_]


def prefix_candidates(targets: TreeTargets, max_depth: int | None = None) -> PrefixCandidates:
    """Non-leaf nodes at depth ≥ 1 (at most ``max_depth`` turns deep, when given) with at least one
    scored leaf below them.

    The observed outcome below a node shared by several rollouts is the majority one; a node whose
    subtree already holds both outcomes is blocked (nothing left to gain by branching there).
    """
    eligible = targets.has_children & (targets.visits > 0)
    if max_depth is not None:
        if max_depth < 1:
            raise ValueError(f"max_depth must be at least 1 (a first turn), got {max_depth}")
        eligible &= targets.depth <= max_depth
    nodes = np.flatnonzero(eligible)
    visits, successes = targets.visits[nodes], targets.successes[nodes]
    outcome = (2 * successes > visits).astype(np.float64)
    return PrefixCandidates(nodes, outcome, blocked=is_mixed(successes, visits))


def continuation_flips(
    parent: npt.ArrayLike,
    reward: npt.ArrayLike,
    bare: npt.ArrayLike,
    predicted_root: float,
    *,
    success_threshold: float = DEFAULT_SUCCESS_THRESHOLD,
) -> tuple[int, float]:
    """How often one tree's continuations flipped the outcome they branched from, and how often fresh
    rollouts from the root would have: ``(flips, fresh_flips)``.

    Each scored leaf of a continuation (``bare[i]`` false) is compared with the observed outcome r below
    the bare node it branched from (the majority of that node's bare leaves; a node whose bare leaves
    already disagree is left out, as Stage 2 leaves it out).  With v the root's predicted success,

        flips = Σ [leaf outcome ≠ r],    fresh_flips = Σ [r·(1 − v) + (1 − r)·v],

    so ``flips / fresh_flips`` over many trees estimates the freshness ρ of Stage 1's joint objective
    (:func:`~trace_service.allocation.stage1.repeat_odds`).
    """
    parents = np.asarray(parent, dtype=np.int64)
    rewards = np.asarray(reward, dtype=np.float64)
    is_bare = np.asarray(bare, dtype=bool)
    if is_bare.shape != parents.shape:
        raise ValueError("bare must have one flag per node")
    if not 0.0 <= predicted_root <= 1.0:
        raise ValueError(f"predicted_root must lie in [0, 1], got {predicted_root}")
    bare_targets = tree_targets(
        parents, np.where(is_bare, rewards, np.nan), success_threshold=success_threshold
    )
    # The bare node each continuation node hangs from (parents come first: one forward pass).
    anchor = np.full(parents.size, ROOT, dtype=np.int64)
    for i in range(parents.size):
        if is_bare[i]:
            anchor[i] = i
        elif parents[i] >= 0:
            anchor[i] = anchor[parents[i]]
    leaves = np.flatnonzero(~is_bare & ~np.isnan(rewards) & (anchor >= 0))
    sources = anchor[leaves]
    visits, successes = bare_targets.visits[sources], bare_targets.successes[sources]
    agreed = (visits > 0) & ((successes == 0) | (successes == visits))
    leaves, sources = leaves[agreed], sources[agreed]
    observed = bare_targets.successes[sources] > 0
    outcome = is_success(rewards[leaves], success_threshold)
    fresh = np.where(observed, 1.0 - predicted_root, predicted_root)
    return int(np.count_nonzero(outcome != observed)), float(fresh.sum())


@dataclass(frozen=True)
class FreshnessEstimate:
    """A running estimate of the freshness ρ: continuations' flips over the flips fresh rollouts would
    have made (:func:`continuation_flips`), shrunk towards ``prior`` by ``prior_weight`` fresh flips
    and clipped to [0, 1].  ``decay`` < 1 forgets old trees, so the estimate follows a changing
    policy."""

    flips: float = 0.0
    fresh_flips: float = 0.0
    prior: float = 0.5
    prior_weight: float = 8.0
    decay: float = 0.999

    @property
    def value(self) -> float:
        ratio = (self.flips + self.prior * self.prior_weight) / (self.fresh_flips + self.prior_weight)
        return min(max(ratio, 0.0), 1.0)

    def add(self, flips: float, fresh_flips: float) -> FreshnessEstimate:
        return replace(
            self,
            flips=self.flips * self.decay + flips,
            fresh_flips=self.fresh_flips * self.decay + fresh_flips,
        )
