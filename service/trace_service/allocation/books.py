"""A tree's Stage 2 books: the one place its continuations are counted (pure, no I/O).

A tree may promise ``expansion_budget`` continuations over ``rounds`` Stage 2 rounds.  What it has
``left`` is the budget less what rounds promised and returned:

    left = expansion_budget − promised − returned.

Round r (from 1) may place its **share**, what is left less what the later rounds of
:func:`~trace_service.allocation.round_budgets` keep, ``max(left − Σ_{s > r} b_s, 0)``.  For a policy
whose trees share their continuations (``PolicyRules.sharing``), round 1 first sets the tree's budget
to the part of its share it keeps plus its draw from the allocation's reserve (``Reserve.draw``):
round 1 has promised and returned nothing, so that is all it has left.  What a round does not place
is returned, never promised and never spent twice.

A tree is **settled** when every bare rollout and every promised continuation has a scored leaf; the
store's scripts see that, and a settled tree becomes what its books said when they were last written
(:func:`settles_to`): ``expanding`` (one more round is due) while rounds remain, budget is left and
it has a bare leaf to branch from, else ``complete``.  A round that places nothing completes the tree
at once: it is as it was, so a later round would find no more to branch.

The service writes these books (``engine.stage2_rounds``) and the scripts only check the claim and
set what is computed here (``store/scripts/commit_decision.lua``).
"""

from __future__ import annotations

from dataclasses import dataclass

from trace_proto import TreeStatus
from trace_service.allocation.reserve import Sharing
from trace_service.allocation.stage2 import round_budgets


def continuations_left(expansion_budget: int, promised: int, returned: int) -> int:
    """Continuations neither promised by a Stage 2 round nor returned."""
    return expansion_budget - promised - returned


def round_share(left: int, expansion_budget: int, rounds: int, round_: int) -> int:
    """Continuations round ``round_`` (from 1) may place: what is ``left`` of the tree's budget less what
    the later rounds of :func:`~trace_service.allocation.round_budgets` keep, ``left − Σ_{r > round} b_r``,
    never negative."""
    later = sum(round_budgets(expansion_budget, rounds)[round_:])
    return max(left - later, 0)


def settles_to(round_: int, rounds: int, left: int, bare_rollouts: int) -> TreeStatus:
    """What a tree becomes once settled after round ``round_`` (0: none yet): ``expanding`` while a
    round remains, budget is left and it has a bare rollout to branch from, else ``complete``."""
    if round_ < rounds and left > 0 and bare_rollouts > 0:
        return TreeStatus.EXPANDING
    return TreeStatus.COMPLETE


@dataclass(frozen=True)
class TreeBooks:
    """A tree's Stage 2 books as the store holds them."""

    expansion_budget: int
    promised: int
    returned: int
    rounds: int
    bare_rollouts: int

    @property
    def left(self) -> int:
        return continuations_left(self.expansion_budget, self.promised, self.returned)

    def pooled(self, sharing: Sharing) -> tuple[int, int]:
        """``(kept, pooled)``: what a tree of a sharing policy keeps of its budget and what it offers
        to its allocation's reserve (``Sharing.split``)."""
        return sharing.split(self.expansion_budget)

    def open_round(self, round_: int, budget: int | None = None) -> OpenRound:
        """Round ``round_``'s books; ``budget`` (round 1 of a sharing policy: what the tree keeps plus
        its draw) replaces the tree's budget from now on."""
        books = self
        if budget is not None:
            books = TreeBooks(budget, self.promised, self.returned, self.rounds, self.bare_rollouts)
        share = round_share(books.left, books.expansion_budget, books.rounds, round_)
        return OpenRound(books, round_, share, drawn=budget is not None)


@dataclass(frozen=True)
class OpenRound:
    """A round being decided: the tree's books at its start and its ``share``."""

    books: TreeBooks
    round: int
    share: int
    drawn: bool  # the budget was set by this round's draw (it is written with the decision)

    def close(self, placed: int) -> ClosedRound:
        """The books once the round placed ``placed`` of its share: the rest returned, what is left,
        and the tree's status now and once it next settles."""
        if not 0 <= placed <= self.share:
            raise ValueError(f"a round places between 0 and its share {self.share}, got {placed}")
        returned = self.share - placed
        books = self.books
        left = continuations_left(books.expansion_budget, books.promised + placed, books.returned + returned)
        settles = settles_to(self.round, books.rounds, left, books.bare_rollouts)
        return ClosedRound(
            expansion_budget=books.expansion_budget if self.drawn else None,
            promised=placed,
            returned=returned,
            left=left,
            status=TreeStatus.EXPANDING if placed else TreeStatus.COMPLETE,
            settles_to=settles,
        )


@dataclass(frozen=True)
class ClosedRound:
    """What a decided round writes to the tree's books."""

    expansion_budget: int | None  # the tree's budget from now on, when this round's draw set it
    promised: int  # continuations this round promised
    returned: int  # of its share, what it did not place
    left: int
    status: TreeStatus  # complete when the round placed nothing, else still expanding
    settles_to: TreeStatus  # what the tree becomes when its promised continuations are all scored
