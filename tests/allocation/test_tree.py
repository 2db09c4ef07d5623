"""Trees: recursive targets equal the empirical success rate below every node; advantages; candidates."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation.tree import (
    FreshnessEstimate,
    advantages,
    continuation_flips,
    prefix_candidates,
    tree_targets,
)
from trace_service.lifecycle import is_mixed, is_success

nan = float("nan")


@st.composite
def trees(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 40))
    parent = [-1]
    for i in range(1, n):
        parent.append(draw(st.integers(-1, i - 1)))
    parents = np.array(parent)
    has_children = np.zeros(n, dtype=bool)
    has_children[parents[parents >= 0]] = True
    reward = np.full(n, np.nan)
    for leaf in np.flatnonzero(~has_children):
        reward[leaf] = draw(st.sampled_from([0.0, 1.0, 0.3, 0.8, np.nan]))  # NaN: still running
    return parents, reward


def leaves_below(parent: np.ndarray, node: int) -> list[int]:
    below = []
    for leaf in range(parent.size):
        walk = leaf
        while walk != -1 and walk != node:
            walk = parent[walk]
        if walk == node:
            below.append(leaf)
    return below


@settings(max_examples=200, deadline=None)
@given(trees())
def test_targets_are_the_success_rate_of_the_leaves_below(tree: tuple[np.ndarray, np.ndarray]) -> None:
    parent, reward = tree
    targets = tree_targets(parent, reward)
    for node in range(parent.size):
        scored = [r for r in reward[leaves_below(parent, node)] if not np.isnan(r)]
        assert targets.visits[node] == len(scored)
        assert targets.successes[node] == sum(r >= 0.5 for r in scored)
        if scored:
            assert targets.value[node] == pytest.approx(np.mean([r >= 0.5 for r in scored]))
        else:
            assert np.isnan(targets.value[node])
    all_scored = reward[~np.isnan(reward)]
    assert targets.root_visits == all_scored.size
    assert targets.mixed == (0 < np.sum(all_scored >= 0.5) < all_scored.size)


@settings(max_examples=200, deadline=None)
@given(trees(), st.sampled_from([0.0, 0.3, 0.5, 0.8, 1.0]))
def test_a_tree_is_mixed_exactly_when_its_leaf_counts_are(
    tree: tuple[np.ndarray, np.ndarray], threshold: float
) -> None:
    """The export's "mixed" (recomputed from the nodes) and the store's (from the counters it keeps as
    leaves arrive, one is_success per leaf) are one definition."""
    parent, reward = tree
    scored = [float(r) for r in reward if not np.isnan(r)]
    counted = is_mixed(sum(is_success(r, threshold) for r in scored), len(scored))
    assert tree_targets(parent, reward, success_threshold=threshold).mixed is counted


@settings(max_examples=100, deadline=None)
@given(trees())
def test_targets_are_the_visit_weighted_mean_of_children(tree: tuple[np.ndarray, np.ndarray]) -> None:
    parent, reward = tree
    t = tree_targets(parent, reward)
    for node in np.flatnonzero(t.has_children & (t.visits > 0)):
        children = np.flatnonzero(parent == node)
        n = t.visits[children]
        weighted = np.nansum(n * np.nan_to_num(t.value[children])) / n.sum()
        assert t.value[node] == pytest.approx(weighted)


def test_deep_and_wide_trees_need_no_recursion() -> None:
    depth = 60
    chain = np.arange(-1, depth - 1)  # one rollout of 60 turns
    rng = np.random.default_rng(0)
    branches = rng.integers(0, depth - 1, size=3000)  # 3000 one-turn continuations off the chain
    parent = np.concatenate([chain, branches])
    reward = np.concatenate([np.full(depth - 1, np.nan), [1.0], rng.integers(0, 2, 3000).astype(float)])
    targets = tree_targets(parent, reward)
    assert targets.depth.max() == depth
    assert targets.root_visits == 3001


def test_advantages_combine_local_and_global_terms() -> None:
    # prompt -> a -> (b: success, c: failure); prompt -> d: failure
    parent = np.array([-1, 0, 0, -1])
    reward = np.array([np.nan, 1.0, 0.0, 0.0])
    t = tree_targets(parent, reward)
    adv = advantages(parent, t)
    root = 1 / 3
    assert adv[0] == pytest.approx((0.5 - root) + (0.5 - root))
    assert adv[1] == pytest.approx((1.0 - 0.5) + (1.0 - root))
    assert adv[3] == pytest.approx((0.0 - root) + (0.0 - root))


@settings(max_examples=150, deadline=None)
@given(trees())
def test_advantages_are_their_definition_by_enumeration(tree: tuple[np.ndarray, np.ndarray]) -> None:
    """Against the leaves below each node, enumerated: A(y) = (V̂(y) − V̂(p(y))) + (V̂(y) − V̂(root)),
    and the global term is (1 − n_y/N)(V̂(y) − V̂(rest)), rest the leaves not below y (the docstring's
    reading of it as GRPO's baseline); NaN without a scored leaf below."""
    parent, reward = tree
    targets = tree_targets(parent, reward)
    adv = advantages(parent, targets)
    outcome = np.where(np.isnan(reward), np.nan, (reward >= 0.5).astype(float))
    everything = outcome[~np.isnan(outcome)]
    for node in range(parent.size):
        below = outcome[leaves_below(parent, node)]
        below = below[~np.isnan(below)]
        if below.size == 0:
            assert np.isnan(adv[node])
            continue
        up = parent[node]
        above = everything if up < 0 else outcome[leaves_below(parent, up)]
        above = above[~np.isnan(above)]
        value, root = below.mean(), everything.mean()
        assert adv[node] == pytest.approx((value - above.mean()) + (value - root))
        if below.size < everything.size:
            rest = (everything.sum() - below.sum()) / (everything.size - below.size)
            assert value - root == pytest.approx((1 - below.size / everything.size) * (value - rest))


@settings(max_examples=100, deadline=None)
@given(trees(), st.sampled_from([0.0, 1.0]))
def test_a_tree_whose_leaves_agree_has_zero_advantage(
    tree: tuple[np.ndarray, np.ndarray], outcome: float
) -> None:
    parent, reward = tree
    reward = np.where(np.isnan(reward), np.nan, outcome)
    targets = tree_targets(parent, reward)
    adv = advantages(parent, targets)
    assert np.array_equal(np.isnan(adv), targets.visits == 0)
    assert np.all(adv[targets.visits > 0] == 0)


def test_an_unbranched_rollout_credits_its_first_turn_twice() -> None:
    """The documented double credit: on a chain the local term is zero below the first turn, whose
    parent is the prompt, so the first turn gets 2(r − V̂(root)) and every later turn r − V̂(root)."""
    parent = np.array([-1, 0, 1, -1])  # a 3-turn success and a 1-turn failure
    reward = np.array([np.nan, np.nan, 1.0, 0.0])
    adv = advantages(parent, tree_targets(parent, reward))
    assert adv.tolist() == pytest.approx([1.0, 0.5, 0.5, -1.0])


def test_prefix_candidates_use_the_majority_outcome_and_block_mixed_subtrees() -> None:
    # rollout 1: 0 -> 1 -> 2 (success); rollout 2: 3 -> 4 (failure); continuation off 0: 5 (failure)
    parent = np.array([-1, 0, 1, -1, 3, 0])
    reward = np.array([np.nan, np.nan, 1.0, np.nan, 0.0, 0.0])
    cands = prefix_candidates(tree_targets(parent, reward))
    assert cands.nodes.tolist() == [0, 1, 3]
    assert cands.outcome.tolist() == [0.0, 1.0, 0.0]  # node 0 is tied 1:1 and mixed
    assert cands.blocked.tolist() == [True, False, False]


def test_prefix_candidates_keep_only_prefixes_within_the_depth_limit() -> None:
    # rollout 1: 0 -> 1 -> 2 -> 3 (success); rollout 2: 4 -> 5 (failure); 1 and 4 are first turns' children
    parent = np.array([-1, 0, 1, 2, -1, 4])
    reward = np.array([np.nan, np.nan, np.nan, 1.0, np.nan, 0.0])
    targets = tree_targets(parent, reward)
    assert prefix_candidates(targets).nodes.tolist() == [0, 1, 2, 4]
    assert prefix_candidates(targets, max_depth=1).nodes.tolist() == [0, 4]
    assert prefix_candidates(targets, max_depth=2).nodes.tolist() == [0, 1, 4]
    assert prefix_candidates(targets, max_depth=9).nodes.tolist() == [0, 1, 2, 4]
    with pytest.raises(ValueError, match="at least 1"):
        prefix_candidates(targets, max_depth=0)


@pytest.mark.parametrize(
    ("parent", "reward", "message"),
    [
        ([0], [1.0], "earlier node"),
        ([-1, 2, -1], [np.nan, 1.0, 1.0], "earlier node"),
        ([-1, 0], [1.0, 1.0], "scored leaf cannot have children"),
        ([-1], [np.inf], "finite"),
        ([-1, -1], [1.0], "same length"),
    ],
)
def test_malformed_trees_raise(parent: list[int], reward: list[float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        tree_targets(parent, reward)


def test_continuation_flips_against_the_outcome_they_branched_from() -> None:
    # Two bare rollouts (nodes 0-1 and 2-3), both failed.  A two-turn continuation from node 0 (nodes
    # 4-6) succeeds: a flip.  A one-turn continuation from node 2 (node 5) fails again.
    parent = [-1, 0, -1, 2, 0, 2, 4]
    reward = [nan, 0.0, nan, 0.0, nan, 0.0, 1.0]
    bare = [True, True, True, True, False, False, False]
    flips, fresh = continuation_flips(parent, reward, bare, predicted_root=0.2)
    assert flips == 1
    assert fresh == pytest.approx(2 * 0.2)


def test_continuation_flips_leave_out_sources_that_already_disagree() -> None:
    # Node 0 is shared by a success and a failure: Stage 2 would not branch there.
    parent = [-1, 0, 0, 0]
    reward = [nan, 1.0, 0.0, 1.0]
    bare = [True, True, True, False]
    assert continuation_flips(parent, reward, bare, predicted_root=0.5) == (0, 0.0)


def test_freshness_estimate_moves_from_its_prior_to_the_data() -> None:
    estimate = FreshnessEstimate()
    assert estimate.value == 0.5
    for _ in range(200):
        estimate = estimate.add(flips=3, fresh_flips=10.0)
    assert estimate.value == pytest.approx(0.3, abs=0.01)
    assert FreshnessEstimate().add(flips=50, fresh_flips=10.0).value == 1.0
