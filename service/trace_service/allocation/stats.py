"""Statistics over finished trees, with their denominators stated."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt


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


def mixed_groups(successes: npt.ArrayLike, visits: npt.ArrayLike) -> npt.NDArray[np.bool_]:
    """Per group: at least one success and at least one failure among its scored leaves."""
    s = np.asarray(successes, dtype=np.int64)
    n = np.asarray(visits, dtype=np.int64)
    if s.shape != n.shape or np.any(s < 0) or np.any(s > n):
        raise ValueError("successes must be between 0 and visits, elementwise")
    return (s > 0) & (s < n)


def effective_ratio(successes: npt.ArrayLike, visits: npt.ArrayLike, *, skipped: int = 0) -> EffectiveRatio:
    """Effective ratio of a batch: one entry per active prompt's tree (its root successes and visits)."""
    mixed = mixed_groups(successes, visits)
    if skipped < 0:
        raise ValueError("skipped must be >= 0")
    return EffectiveRatio(active=int(mixed.size), mixed=int(mixed.sum()), skipped=skipped)
