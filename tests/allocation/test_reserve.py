"""The shared continuation reserve (trace_service.allocation.reserve): never over-drawn, every taker
gets its own share, nothing is left when the last tree can branch, and with foresight it is the
proportional deal of the leavers' shares over the takers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation import Reserve, Sharing

Row = tuple[int, float, bool, bool]  # share b, mixed chance q, agrees, can branch

trees = st.lists(
    st.tuples(st.integers(0, 40), st.floats(0.0, 1.0, allow_nan=False), st.booleans(), st.booleans()),
    min_size=1,
    max_size=30,
)


def _run(rows: list[Row]) -> tuple[list[int], Reserve]:
    reserve = Reserve.of([row[0] for row in rows], [row[1] for row in rows])
    draws = []
    for share, chance, agrees, can_branch in rows:
        drawn, reserve = reserve.draw(share, chance, agrees=agrees, can_branch=can_branch)
        assert reserve.left >= reserve.pending  # every undecided tree's share stays covered
        draws.append(drawn)
    return draws, reserve


@settings(max_examples=300, deadline=None)
@given(trees)
def test_never_over_drawn_and_every_taker_gets_its_share(rows: list[Row]) -> None:
    draws, reserve = _run(rows)
    total = sum(row[0] for row in rows)
    assert sum(draws) <= total
    assert reserve.left == total - sum(draws)
    assert reserve.pending == 0
    for index, ((share, _, agrees, can_branch), drawn) in enumerate(zip(rows, draws, strict=True)):
        last = not any(row[0] for row in rows[index + 1 :])
        if not can_branch:
            assert drawn == 0
        elif agrees:
            assert drawn >= share
        elif not last:
            assert drawn == 0  # a mixed tree leaves its share, unless nobody else could spend it


@settings(max_examples=300, deadline=None)
@given(trees, st.booleans())
def test_the_last_tree_that_can_branch_takes_what_is_left(rows: list[Row], agrees: bool) -> None:
    share, chance, _, _ = rows[-1]
    draws, reserve = _run([*rows[:-1], (share, chance, agrees, True)])
    assert reserve.left == 0
    assert sum(draws) == sum(row[0] for row in rows)


def _proportional_deal(leavers: list[int], takers: list[int]) -> list[int]:
    """Reference: the leavers' shares dealt over the takers in order, each taking ⌊its part of what
    remains in proportion to its share among the takers still to come⌋, the last taking the rest."""
    remaining = sum(leavers)
    draws = []
    for index, share in enumerate(takers):
        to_come = sum(takers[index:])
        extra = remaining if index == len(takers) - 1 else (remaining * share) // to_come if to_come else 0
        draws.append(share + extra)
        remaining -= extra
    return draws


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=15), st.lists(st.integers(1, 40), min_size=1, max_size=15))
def test_with_foresight_it_is_the_proportional_deal(leavers: list[int], takers: list[int]) -> None:
    rows = [(b, 1.0, False, True) for b in leavers] + [(b, 0.0, True, True) for b in takers]
    draws, reserve = _run(rows)
    assert draws[: len(leavers)] == [0] * len(leavers)
    assert draws[len(leavers) :] == _proportional_deal(leavers, takers)
    assert reserve.left == 0


def test_a_taker_never_draws_what_is_not_yet_free() -> None:
    # The first tree expects the second to leave its 10, but nothing has been left yet.
    reserve = Reserve.of([4, 10], [0.0, 1.0])
    drawn, reserve = reserve.draw(4, 0.0, agrees=True, can_branch=True)
    assert drawn == 4
    drawn, reserve = reserve.draw(10, 1.0, agrees=False, can_branch=False)
    assert (drawn, reserve.left) == (0, 10)  # left over: nobody is left who could spend it


def test_a_mixed_tree_deciding_last_spends_what_nobody_else_could() -> None:
    reserve = Reserve.of([4, 10, 6], [0.0, 1.0, 1.0])
    drawn, reserve = reserve.draw(4, 0.0, agrees=True, can_branch=True)
    assert drawn == 4
    drawn, reserve = reserve.draw(10, 1.0, agrees=False, can_branch=True)
    assert drawn == 0  # a tree is still to come
    drawn, reserve = reserve.draw(6, 1.0, agrees=False, can_branch=True)
    assert (drawn, reserve.left) == (16, 0)


def test_expected_leavers_are_shared_before_they_leave() -> None:
    # Two takers of 4 and a leaver of 8 that decides first: each taker gets 4 of its 8.
    reserve = Reserve.of([8, 4, 4], [0.9, 0.1, 0.1])
    draws = []
    for share, chance, agrees in [(8, 0.9, False), (4, 0.1, True), (4, 0.1, True)]:
        drawn, reserve = reserve.draw(share, chance, agrees=agrees, can_branch=True)
        draws.append(drawn)
    assert draws == [0, 8, 8]


def test_bad_input_is_refused_and_a_share_is_at_most_what_is_pending() -> None:
    reserve = Reserve.of([3], [0.5])
    with pytest.raises(ValueError, match="mixed chance"):
        reserve.draw(3, 1.5, agrees=True, can_branch=True)
    assert reserve.draw(4, 0.5, agrees=True, can_branch=True) == reserve.draw(
        3, 0.5, agrees=True, can_branch=True
    )
    with pytest.raises(ValueError, match="share"):
        reserve.draw(-1, 0.5, agrees=True, can_branch=True)
    with pytest.raises(ValueError, match="mixed chances"):
        Reserve.of([1, 2], [0.5])
    with pytest.raises(ValueError, match="mixed chance"):
        Reserve.of([1], [float("nan")])


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10_000), st.floats(0.0, 1.0, allow_nan=False))
def test_a_share_splits_into_the_kept_floor_and_the_pooled_rest(share: int, kept_fraction: float) -> None:
    kept, pooled = Sharing(kept=kept_fraction).split(share)
    assert kept + pooled == share
    assert kept == int(kept_fraction * share // 1)
    assert 0 <= kept <= share


def test_half_kept_rounds_down_so_an_odd_share_pools_the_odd_continuation() -> None:
    assert Sharing(kept=0.5).split(5) == (2, 3)
    assert Sharing(kept=0.5).split(1) == (0, 1)
    assert Sharing().split(7) == (0, 7)
    assert Sharing(kept=1.0).split(7) == (7, 0)


@pytest.mark.parametrize(
    ("agrees", "requested", "expected"),
    [(True, None, 1), (True, 3, 1), (False, None, None), (False, 3, 3)],
)
def test_only_a_tree_whose_bare_rollouts_agree_is_held_to_the_agreeing_depth(
    agrees: bool, requested: int | None, expected: int | None
) -> None:
    sharing = Sharing(kept=0.5, agreeing_depth=1)
    assert sharing.branch_depth(agrees=agrees, requested=requested) == expected
    assert Sharing().branch_depth(agrees=agrees, requested=requested) == requested
    assert Sharing(agreeing_depth=4).branch_depth(agrees=True, requested=2) == 2


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"kept": -0.1}, "kept fraction"),
        ({"kept": 1.5}, "kept fraction"),
        ({"kept": float("nan")}, "kept fraction"),
        ({"agreeing_depth": 0}, "agreeing_depth"),
    ],
)
def test_a_sharing_rejects_what_it_cannot_mean(arguments: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Sharing(**arguments)  # type: ignore[arg-type]
