"""Input checks shared by the allocation solvers: bad input is a ValueError, never a wrong answer."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]


def probabilities(values: npt.ArrayLike, name: str) -> FloatArray:
    """Return ``values`` as a 1-D float64 array of probabilities, or raise ValueError."""
    array = np.asarray(values, dtype=np.float64)
    if array.ndim != 1:
        raise ValueError(f"{name} must be a 1-D array, got shape {array.shape}")
    if not np.all(np.isfinite(array)):
        raise ValueError(f"{name} contains NaN or infinite values")
    if np.any((array < 0.0) | (array > 1.0)):
        raise ValueError(f"{name} must lie in [0, 1]")
    return array


def non_negative_int(value: int, name: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int | np.integer):
        raise ValueError(f"{name} must be an integer, got {value!r}")
    if value < 0:
        raise ValueError(f"{name} must be >= 0, got {value}")
    return int(value)


def check_limits(
    n_prompts: int, budget: int, min_rollouts: int, max_rollouts: int, max_prompts: int | None
) -> int:
    """Validate the caps; return the usable cap on active prompts."""
    non_negative_int(budget, "budget")
    non_negative_int(min_rollouts, "min_rollouts")
    non_negative_int(max_rollouts, "max_rollouts")
    if min_rollouts < 1:
        raise ValueError("min_rollouts must be >= 1")
    if max_rollouts < min_rollouts:
        raise ValueError(f"max_rollouts ({max_rollouts}) must be >= min_rollouts ({min_rollouts})")
    if max_prompts is None:
        return n_prompts
    return min(n_prompts, non_negative_int(max_prompts, "max_prompts"))
