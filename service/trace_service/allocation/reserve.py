"""One allocation's continuation budget, shared by its trees (TRACE Stage 2).

Tree i of an allocation is promised ``b_i = ⌊m_i·N⌋`` continuations.  A tree whose bare rollouts already
hold both outcomes is a mixed group whatever its continuations do, so most of its share is worth more to
a tree whose bare rollouts agree; some of it still buys contrast inside the mixed tree (prefixes whose
subtree holds both outcomes), which a trainer crediting each turn learns from.  A policy's
:class:`Sharing` splits each share into a part the tree keeps whatever its bare rollouts show,
``k_i = ⌊f·b_i⌋``, and a pooled part ``b_i − k_i``.  Under the reserve of the pooled parts, trees decide
one at a time, in the order their bare rollouts finish: a tree that *takes* (its bare group agrees and
it has a prefix to branch from) draws at least its own pooled part, and one that does not draws nothing
and leaves its pooled part to the others — unless it is the last tree to decide and can branch: then it
draws what is left, which nobody else could spend.  Below, ``b_i`` is the pooled part.

The reserve holds

    L  continuations not yet drawn,            P  Σ b_j over the trees not yet decided,
    F  Σ b_j·q_j over them,                    W  Σ b_j·(1 − q_j) over them,

where ``q_j`` is the chance, at allocation, that tree j's bare group is mixed (``1 − v^m − (1 − v)^m``
at its predicted success v): F is what the undecided trees are expected to leave, W the shares of those
expected to take.  Every undecided tree's share stays covered (``L ≥ P``); the surplus is ``S = L − P``.
Tree i leaves the undecided set (P, F and W lose its terms) and draws

    d_i = b_i + min(S, ⌊(S + F)·b_i / (b_i + W)⌋)              if it takes,
    d_i = L                                                    if it does not, but can branch and is
                                                               the last undecided tree (P = b_i),
    d_i = 0                                                    otherwise,

its share of the surplus available now and expected later, in proportion to its own share among the
takers still to come, but never more than is free now.  So the reserve is never over-drawn, every
taker gets at least ``b_i``, and the last tree, if it can branch, draws all that is left.  With foresight
(``q`` = 1 for the trees that will not take, 0 for those that will) the draws are the proportional deal
of the leavers' shares over the takers, up to rounding.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy.typing as npt

from trace_service.allocation._validate import FloatArray, non_negative_int
from trace_service.allocation.stage1 import root_value


@dataclass(frozen=True, slots=True)
class Sharing:
    """How a policy's trees share their continuations: each keeps ``⌊kept·b⌋`` of its share ``b`` and
    pools the rest (``split``); a tree whose bare rollouts agree, drawing from the pool to flip its
    group's outcome, branches from prefixes at most ``agreeing_depth`` turns deep (``branch_depth``):
    a continuation from a first turn is nearly a fresh rollout of the prompt."""

    kept: float = 0.0
    agreeing_depth: int | None = None

    def __post_init__(self) -> None:
        if not (math.isfinite(self.kept) and 0.0 <= self.kept <= 1.0):
            raise ValueError(f"the kept fraction must lie in [0, 1], got {self.kept}")
        if self.agreeing_depth is not None and self.agreeing_depth < 1:
            raise ValueError(f"agreeing_depth must be >= 1 or None, got {self.agreeing_depth}")

    def split(self, share: int) -> tuple[int, int]:
        """``(k, b − k)`` with ``k = ⌊kept·b⌋``: what a tree keeps and what it pools."""
        non_negative_int(share, "share")
        kept = math.floor(self.kept * share)
        return kept, share - kept

    def branch_depth(self, *, agrees: bool, requested: int | None) -> int | None:
        """The deepest prefix a tree may branch from: the request's ``max_branch_depth`` (None: any),
        and for a tree whose bare rollouts agree no deeper than ``agreeing_depth``."""
        if not agrees or self.agreeing_depth is None:
            return requested
        return self.agreeing_depth if requested is None else min(requested, self.agreeing_depth)


def bare_mixed_chance(predicted: npt.ArrayLike, rollouts: npt.ArrayLike) -> FloatArray:
    """``q = 1 − v^m − (1 − v)^m``: the chance, at allocation, that a tree's m bare rollouts at predicted
    success v are mixed (what the reserve expects of it)."""
    return root_value(predicted, rollouts)


@dataclass(frozen=True, slots=True)
class Reserve:
    """The shared state above: ``left`` (L), ``pending`` (P), ``expected_left`` (F), ``expected_taken``
    (W)."""

    left: int
    pending: int
    expected_left: float
    expected_taken: float

    @classmethod
    def of(cls, shares: Sequence[int], mixed_chances: Sequence[float]) -> Reserve:
        """The reserve of an allocation whose trees have these shares ``b`` and chances ``q``."""
        if len(shares) != len(mixed_chances):
            raise ValueError(f"{len(shares)} shares but {len(mixed_chances)} mixed chances")
        for share in shares:
            non_negative_int(share, "share")
        chances = [_chance(q) for q in mixed_chances]
        total = sum(shares)
        return cls(
            left=total,
            pending=total,
            expected_left=sum(b * q for b, q in zip(shares, chances, strict=True)),
            expected_taken=sum(b * (1.0 - q) for b, q in zip(shares, chances, strict=True)),
        )

    def draw(self, share: int, mixed_chance: float, *, agrees: bool, can_branch: bool) -> tuple[int, Reserve]:
        """The continuations a tree with share ``b``, chance ``q`` draws (the module's rule, its one
        implementation: the store records a draw by compare-and-set), and the reserve after it: it
        takes when its bare group ``agrees`` and it ``can_branch`` (has a prefix to branch from).  A
        share above what is pending counts as what is pending."""
        # Never more than is still reserved for the undecided trees (a reserve made again, say).
        share = min(non_negative_int(share, "share"), self.pending)
        q = _chance(mixed_chance)
        surplus = self.left - self.pending
        pending = self.pending - share
        expected_left = expected_taken = 0.0
        if pending:  # (with nothing pending, nothing is expected: no rounding drift survives the last tree)
            expected_left = max(self.expected_left - share * q, 0.0)
            expected_taken = max(self.expected_taken - share * (1.0 - q), 0.0)
        drawn = 0
        if agrees and can_branch:
            weight = share + expected_taken
            fair = math.floor((surplus + expected_left) * share / weight) if weight > 0 else surplus
            drawn = share + min(surplus, fair)
        elif can_branch and pending == 0:
            drawn = self.left
        return drawn, Reserve(self.left - drawn, pending, expected_left, expected_taken)


def _chance(value: float) -> float:
    if not (math.isfinite(value) and 0.0 <= value <= 1.0):
        raise ValueError(f"a mixed chance must lie in [0, 1], got {value}")
    return float(value)
