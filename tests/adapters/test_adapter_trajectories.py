"""Root-to-leaf paths and token rows from finished trees."""

from __future__ import annotations

import pytest
from adapter_trees import finished_tree
from hypothesis import given
from hypothesis import strategies as st

from trace_client.adapters import token_trajectories, tree_paths
from trace_client.driver import TurnTokens

# n0 ─┬─ n1 (leaf, 1.0)          n3 ── n4 (leaf, 0.0)        n5 (failure leaf)
#     └─ n2 (leaf, 0.0; a continuation branched from n0)
PARENTS = [-1, 0, 0, -1, 3, -1]
REWARDS = {1: 1.0, 2: 0.0, 4: 0.0, 5: 0.0}
TOKENS = {
    0: TurnTokens((10, 11, 12), mask=(1, 1, 0), logprobs=(-0.1, -0.2, 0.0)),
    1: TurnTokens((13,), logprobs=(-0.3,)),
    2: TurnTokens((14, 15), logprobs=(-0.4, -0.5)),
    3: TurnTokens((16,)),
    4: TurnTokens((17, 18), mask=(0, 1)),
}


def test_paths_run_from_the_prompt_to_each_scored_leaf_and_train_shared_turns_once() -> None:
    tree = finished_tree(PARENTS, REWARDS, failures=[5])
    paths = tree_paths(tree)
    assert [(p.leaf_id, p.reward) for p in paths] == [("n1", 1.0), ("n2", 0.0), ("n4", 0.0)]
    assert [[(s.node_id, s.trained) for s in p.segments] for p in paths] == [
        [("n0", True), ("n1", True)],
        [("n0", False), ("n2", True)],
        [("n3", True), ("n4", True)],
    ]
    assert [s.advantage for s in paths[1].segments] == [0.0, 0.2]
    assert all(s.trained for p in tree_paths(tree, train_shared_once=False) for s in p.segments)


def test_paths_through_turns_this_driver_did_not_run_are_left_out() -> None:
    tree = finished_tree(PARENTS, REWARDS, failures=[5], missing=[3])
    assert [p.leaf_id for p in tree_paths(tree)] == ["n1", "n2"]


def test_token_rows_carry_each_turns_advantage_on_each_of_its_tokens() -> None:
    tree = finished_tree(PARENTS, REWARDS, failures=[5], tokens=TOKENS)
    rows = token_trajectories([tree], {"prompt-t": [1, 2]})
    first, second, third = rows
    assert first.prompt_ids == (1, 2)
    assert first.response_ids == (10, 11, 12, 13)
    assert first.loss_mask == (1, 1, 0, 1)
    assert first.advantages == (0.0, 0.0, 0.0, 0.1)
    assert first.logprobs == (-0.1, -0.2, 0.0, -0.3)
    assert (second.response_ids, second.loss_mask) == ((10, 11, 12, 14, 15), (0, 0, 0, 1, 1))
    assert second.advantages == (0.0, 0.0, 0.0, 0.2, 0.2)
    assert third.logprobs is None  # n3 and n4 carry none
    assert (third.loss_mask, third.group, third.leaf_id, third.turns) == ((1, 0, 1), "t", "n4", 2)


def test_missing_tokens_or_prompt_ids_are_errors() -> None:
    without_tokens = finished_tree(PARENTS, REWARDS, failures=[5])
    with pytest.raises(ValueError, match="turn n0 carries no tokens"):
        token_trajectories([without_tokens], {"prompt-t": [1]})
    with_tokens = finished_tree(PARENTS, REWARDS, failures=[5], tokens=TOKENS)
    with pytest.raises(ValueError, match="no prompt token ids for prompt 'prompt-t'"):
        token_trajectories([with_tokens], {})
    assert token_trajectories([with_tokens], lambda prompt: [len(prompt.prompt_id)])[0].prompt_ids == (8,)


@st.composite
def random_trees(draw: st.DrawFn) -> tuple[list[int], set[int], set[int], set[int]]:
    """Parent lists (parents first), their leaves, and random failure and missing subsets."""
    size = draw(st.integers(1, 25))
    parents = [-1] + [draw(st.integers(-1, i - 1)) for i in range(1, size)]
    leaves = set(range(size)) - set(parents)
    failures = draw(st.sets(st.sampled_from(sorted(leaves)))) if leaves else set()
    missing = draw(st.sets(st.integers(0, size - 1))) - failures
    return parents, leaves, failures, missing


@given(random_trees(), st.booleans())
def test_every_kept_path_is_a_chain_and_every_turn_is_trained_once(
    case: tuple[list[int], set[int], set[int], set[int]], once: bool
) -> None:
    parents, leaves, failures, missing = case
    tree = finished_tree(
        parents, dict.fromkeys(leaves, 1.0), failures=sorted(failures), missing=sorted(missing)
    )

    def chain(node: int) -> list[int]:
        return [*chain(parents[node]), node] if node >= 0 else []

    kept = [leaf for leaf in sorted(leaves) if leaf not in failures and not set(chain(leaf)) & missing]
    paths = tree_paths(tree, train_shared_once=once)
    assert [p.leaf_id for p in paths] == [f"n{leaf}" for leaf in kept]
    for path, leaf in zip(paths, kept, strict=True):
        assert [s.node_id for s in path.segments] == [f"n{i}" for i in chain(leaf)]
    trained = [s.node_id for p in paths for s in p.segments if s.trained]
    on_paths = {s.node_id for p in paths for s in p.segments}
    if once:
        assert sorted(trained) == sorted(on_paths)
    else:
        assert len(trained) == sum(len(p.segments) for p in paths)
