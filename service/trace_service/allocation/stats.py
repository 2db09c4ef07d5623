"""Statistics over finished trees, with their denominators stated."""

from __future__ import annotations

from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from trace_service.allocation._validate import IntArray


@dataclass(frozen=True)
class EffectiveRatio:
    """Share of active prompts whose tree holds both a success and a failure leaf.

    The denominator is ``active`` (prompts given at least one rollout); ``skipped`` prompts are reported
    beside it, and ``pool_ratio`` divides by the whole pool instead.
    """

    active: int
    mixed: int
    skipped: int

    @property
    def ratio(self) -> float:
        return self.mixed / self.active if self.active else 0.0

    @property
    def pool_ratio(self) -> float:
        pool = self.active + self.skipped
        return self.mixed / pool if pool else 0.0


@overload
def is_mixed(successes: int, leaves: int) -> bool: ...
@overload
def is_mixed(successes: IntArray, leaves: IntArray) -> npt.NDArray[np.bool_]: ...
def is_mixed(successes: int | IntArray, leaves: int | IntArray) -> bool | npt.NDArray[np.bool_]:
    """The one definition of a mixed (contrastive) group of scored leaves: it holds a success and a
    failure, ``0 < successes < leaves`` (elementwise on arrays)."""
    return (successes > 0) & (successes < leaves)


def mixed_groups(successes: npt.ArrayLike, visits: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """:func:`is_mixed` per group, after checking that ``0 ≤ successes ≤ visits`` elementwise."""
    s = np.asarray(successes, dtype=np.int64)
    n = np.asarray(visits, dtype=np.int64)
    if s.shape != n.shape or np.any(s < 0) or np.any(s > n):
        raise ValueError("successes must be between 0 and visits, elementwise")
    return is_mixed(s, n)


def effective_ratio(successes: npt.ArrayLike, visits: npt.ArrayLike, *, skipped: int = 0) -> EffectiveRatio:
    """Effective ratio of a batch: one entry per active prompt's tree (its root successes and visits)."""
    mixed = mixed_groups(successes, visits)
    if skipped < 0:
        raise ValueError("skipped must be >= 0")
    return EffectiveRatio(active=int(mixed.size), mixed=int(mixed.sum()), skipped=skipped)
