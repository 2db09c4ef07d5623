"""A tree's Stage 2 books (``allocation.books``): a round never places more than is left, what it does not
place is returned, and the tree's next status follows from what is left."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trace_proto import TreeStatus
from trace_service.allocation import Sharing, round_budgets
from trace_service.allocation.books import TreeBooks, continuations_left, settles_to


@st.composite
def rounds_placed(draw: st.DrawFn) -> tuple[TreeBooks, list[float]]:
    budget = draw(st.integers(0, 60))
    rounds = draw(st.integers(1, 4))
    fractions = draw(st.lists(st.floats(0.0, 1.0), min_size=rounds, max_size=rounds))
    return TreeBooks(budget, 0, 0, rounds, draw(st.integers(0, 4))), fractions


@given(rounds_placed())
def test_every_round_keeps_the_books_whole(case: tuple[TreeBooks, list[float]]) -> None:
    """Σ promised + Σ returned + left = budget after every round; a round's share is what is left less
    the later rounds' budgets; nothing is promised beyond the budget."""
    books, fractions = case
    budgets = round_budgets(books.expansion_budget, books.rounds)
    for round_, fraction in enumerate(fractions, start=1):
        opened = books.open_round(round_)
        assert opened.share == max(books.left - sum(budgets[round_:]), 0)
        placed = int(fraction * opened.share)
        closed = opened.close(placed)
        books = TreeBooks(
            books.expansion_budget,
            books.promised + closed.promised,
            books.returned + closed.returned,
            books.rounds,
            books.bare_rollouts,
        )
        assert closed.left == books.left >= 0
        assert books.promised + books.returned + books.left == books.expansion_budget
        assert closed.status is (TreeStatus.EXPANDING if placed else TreeStatus.COMPLETE)
        assert closed.settles_to is settles_to(round_, books.rounds, books.left, books.bare_rollouts)


def test_a_drawn_budget_replaces_the_trees_own_in_its_first_round() -> None:
    books = TreeBooks(expansion_budget=4, promised=0, returned=0, rounds=1, bare_rollouts=2)
    assert books.pooled(Sharing(kept=0.5)) == (2, 2)
    opened = books.open_round(1, budget=7)
    assert opened.share == 7
    closed = opened.close(5)
    assert (closed.expansion_budget, closed.returned, closed.left) == (7, 2, 0)
    assert books.open_round(1).close(4).expansion_budget is None


@pytest.mark.parametrize(
    ("round_", "rounds", "left", "bare", "status"),
    [
        (0, 1, 3, 2, TreeStatus.EXPANDING),
        (1, 1, 3, 2, TreeStatus.COMPLETE),  # no round left
        (0, 2, 0, 2, TreeStatus.COMPLETE),  # no budget left
        (0, 2, 3, 0, TreeStatus.COMPLETE),  # nothing to branch from
    ],
)
def test_a_settled_tree_expands_only_with_a_round_budget_and_a_bare_leaf(
    round_: int, rounds: int, left: int, bare: int, status: TreeStatus
) -> None:
    assert settles_to(round_, rounds, left, bare) is status


def test_a_round_cannot_place_more_than_its_share() -> None:
    opened = TreeBooks(3, 0, 0, 1, 2).open_round(1)
    with pytest.raises(ValueError, match="share 3"):
        opened.close(4)
    assert continuations_left(5, 2, 1) == 2
