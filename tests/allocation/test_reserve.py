"""The shared continuation reserve (trace_service.allocation.reserve): never over-drawn, every taker
gets its own share, nothing is left when the last tree takes, and with foresight it is the proportional
deal of the leavers' shares over the takers."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.allocation import Reserve

trees = st.lists(
    st.tuples(
        st.integers(0, 40),  # share b
        st.floats(0.0, 1.0, allow_nan=False),  # mixed chance q
        st.booleans(),  # takes
    ),
    min_size=1,
    max_size=30,
)


def _run(rows: list[tuple[int, float, bool]]) -> tuple[list[int], Reserve]:
    reserve = Reserve.of([b for b, _, _ in rows], [q for _, q, _ in rows])
    draws = []
    for share, chance, takes in rows:
        drawn, reserve = reserve.draw(share, chance, takes=takes)
        assert reserve.left >= reserve.pending  # every undecided tree's share stays covered
        draws.append(drawn)
    return draws, reserve


@settings(max_examples=300, deadline=None)
@given(trees)
def test_never_over_drawn_and_every_taker_gets_its_share(rows: list[tuple[int, float, bool]]) -> None:
    draws, reserve = _run(rows)
    total = sum(b for b, _, _ in rows)
    assert sum(draws) <= total
    assert reserve.left == total - sum(draws)
    assert reserve.pending == 0
    for (share, _, takes), drawn in zip(rows, draws, strict=True):
        assert drawn >= share if takes else drawn == 0


@settings(max_examples=300, deadline=None)
@given(trees)
def test_the_last_tree_takes_what_is_left(rows: list[tuple[int, float, bool]]) -> None:
    share, chance, _ = rows[-1]
    draws, reserve = _run([*rows[:-1], (share, chance, True)])
    assert reserve.left == 0
    assert sum(draws) == sum(b for b, _, _ in rows)


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
    rows = [(b, 1.0, False) for b in leavers] + [(b, 0.0, True) for b in takers]
    draws, reserve = _run(rows)
    assert draws[: len(leavers)] == [0] * len(leavers)
    assert draws[len(leavers) :] == _proportional_deal(leavers, takers)
    assert reserve.left == 0


def test_a_taker_never_draws_what_is_not_yet_free() -> None:
    # The first tree expects the second to leave its 10, but nothing has been left yet.
    reserve = Reserve.of([4, 10], [0.0, 1.0])
    drawn, reserve = reserve.draw(4, 0.0, takes=True)
    assert drawn == 4
    drawn, reserve = reserve.draw(10, 1.0, takes=False)
    assert (drawn, reserve.left) == (0, 10)  # left over: nobody is left to take it


def test_expected_leavers_are_shared_before_they_leave() -> None:
    # Two takers of 4 and a leaver of 8 that decides first: each taker gets 4 of its 8.
    reserve = Reserve.of([8, 4, 4], [0.9, 0.1, 0.1])
    draws = []
    for share, chance, takes in [(8, 0.9, False), (4, 0.1, True), (4, 0.1, True)]:
        drawn, reserve = reserve.draw(share, chance, takes=takes)
        draws.append(drawn)
    assert draws == [0, 8, 8]


def test_bad_input_is_refused() -> None:
    reserve = Reserve.of([3], [0.5])
    with pytest.raises(ValueError, match="mixed chance"):
        reserve.draw(3, 1.5, takes=True)
    with pytest.raises(ValueError, match="still pending"):
        reserve.draw(4, 0.5, takes=True)
    with pytest.raises(ValueError, match="share"):
        reserve.draw(-1, 0.5, takes=True)
    with pytest.raises(ValueError, match="mixed chances"):
        Reserve.of([1, 2], [0.5])
    with pytest.raises(ValueError, match="mixed chance"):
        Reserve.of([1], [float("nan")])
