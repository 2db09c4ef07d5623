"""The ablation's tree advantages against brute-force enumeration of the leaves below every node, and
`weighted_turns`' per-rollout weighting."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench.advantages import ADVANTAGES
from bench.policy_gradient import SampledTurns, weighted_turns
from trace_service.allocation.tree import tree_targets


@st.composite
def trees(draw: st.DrawFn, outcomes: tuple[float, ...] = (0.0, 1.0)) -> tuple[np.ndarray, np.ndarray]:
    n = draw(st.integers(1, 30))
    parent = np.array([-1] + [draw(st.integers(-1, i - 1)) for i in range(1, n)])
    has_children = np.zeros(n, dtype=bool)
    has_children[parent[parent >= 0]] = True
    reward = np.full(n, np.nan)
    for leaf in np.flatnonzero(~has_children):
        reward[leaf] = draw(st.sampled_from([*outcomes, np.nan]))  # NaN: still running
    return parent, reward


def path_to_root(parent: np.ndarray, node: int) -> list[int]:
    path = [node]
    while parent[path[-1]] >= 0:
        path.append(int(parent[path[-1]]))
    return path


def leaves_below(parent: np.ndarray, reward: np.ndarray, node: int) -> list[float]:
    return [float(reward[leaf]) for leaf in range(parent.size) if node in path_to_root(parent, leaf)]


def scored(values: list[float]) -> list[float]:
    return [value for value in values if not np.isnan(value)]


@settings(max_examples=150, deadline=None)
@given(trees())
def test_each_variant_equals_its_definition_by_enumeration(tree: tuple[np.ndarray, np.ndarray]) -> None:
    parent, reward = tree
    targets = tree_targets(parent, reward)
    all_leaves = scored(list(reward))
    first_turns = [
        np.mean(below)
        for below in (scored(leaves_below(parent, reward, y)) for y in np.flatnonzero(parent < 0))
        if below
    ]
    result = {name: variant(parent, targets) for name, variant in ADVANTAGES.items()}
    for y in range(parent.size):
        below = scored(leaves_below(parent, reward, y))
        if not below:
            assert all(np.isnan(values[y]) for values in result.values())
            continue
        value, root = float(np.mean(below)), float(np.mean(all_leaves))
        up = int(parent[y])
        parent_value = root if up < 0 else float(np.mean(scored(leaves_below(parent, reward, up))))
        assert result["global"][y] == pytest.approx(value - root)
        assert result["service"][y] == pytest.approx((value - parent_value) + (value - root))
        assert result["first-once"][y] == pytest.approx(
            (0 if up < 0 else value - parent_value) + value - root
        )
        assert result["global-bare"][y] == pytest.approx(value - np.mean(first_turns))
        assert result["local"][y] == pytest.approx(value - parent_value)
        # loo: the leaves under the parent of the deepest ancestor-or-self u that has others beside it.
        baseline = 0.0  # every leaf lies below y: no other draw from a state on its path
        for u in path_to_root(parent, y):
            pool = all_leaves if parent[u] < 0 else scored(leaves_below(parent, reward, int(parent[u])))
            if len(pool) > len(scored(leaves_below(parent, reward, u))):
                others = list(pool)
                for leaf in scored(leaves_below(parent, reward, u)):
                    others.remove(leaf)
                baseline = value - float(np.mean(others))
                break
        assert result["loo"][y] == pytest.approx(baseline)


@settings(max_examples=100, deadline=None)
@given(trees())
def test_local_advantages_telescope_to_the_path_return(tree: tuple[np.ndarray, np.ndarray]) -> None:
    """Along every root-to-leaf path, Σ (V̂(y) − V̂(p(y))) = r − V̂(root)."""
    parent, reward = tree
    targets = tree_targets(parent, reward)
    local = ADVANTAGES["local"](parent, targets)
    for leaf in np.flatnonzero(~np.isnan(reward)):
        path = path_to_root(parent, int(leaf))
        assert local[path].sum() == pytest.approx(float(reward[leaf] >= 0.5) - targets.root_value)


@settings(max_examples=100, deadline=None)
@given(trees(outcomes=(1.0,)), st.sampled_from(sorted(ADVANTAGES)))
def test_a_tree_whose_leaves_agree_has_no_advantage(tree: tuple[np.ndarray, np.ndarray], name: str) -> None:
    parent, reward = tree
    advantage = ADVANTAGES[name](parent, tree_targets(parent, reward))
    defined = ~np.isnan(advantage)
    assert np.array_equal(defined, tree_targets(parent, reward).visits > 0)
    assert np.all(advantage[defined] == 0)


def turns(advantages: list[float]) -> SampledTurns:
    size = len(advantages)
    return SampledTurns(np.zeros(size, np.int64), np.zeros(size, np.int64), np.asarray(advantages))


def test_rollout_weighting_makes_every_rollout_count_alike() -> None:
    """A tree of 1 leaf and 4 turns and one of 3 leaves and 2 turns: per turn, the first weighs 4 of 6
    turns; per rollout, 1 of 4 leaves, each tree's turns sharing its weight alike."""
    trees_of_step = [(turns([1.0, 1.0, 1.0, 1.0]), 1), (turns([2.0, 2.0]), 3)]
    assert weighted_turns(trees_of_step, "turn").advantages.mean() == pytest.approx((4 * 1 + 2 * 2) / 6)
    assert weighted_turns(trees_of_step, "rollout").advantages.mean() == pytest.approx((1 * 1 + 3 * 2) / 4)
    assert weighted_turns([], "rollout").size == 0
