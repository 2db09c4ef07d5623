"""Stage 2 — local prefix expansion for one prompt.

Candidates are the non-leaf turn nodes (depth ≥ 1) of a prompt's scored rollouts.  For candidate c with
predicted success ``p_c = Ṽ(H_c)`` and observed outcome ``r_c`` below it, one fresh continuation repeats
the observed outcome with probability ``q_c = r_c·p_c + (1 − r_c)(1 − p_c)``, and k continuations flip it
at least once with probability

    V_pref(k) = 1 − q^k,     marginal gain of the (k+1)-th continuation: q^k (1 − q).

Choose ``K_c ≥ 0`` maximising ``Σ_c V_pref(K_c)`` with ``Σ_c K_c = budget``.  Each term is concave, so the
unit-by-unit greedy (here: the ``budget`` largest marginal gains, each row a prefix) is exactly optimal.
Nodes whose subtree is already mixed are blocked: flipping their outcome adds no new contrast.
Units whose best marginal gain is below ``min_gain`` have nowhere useful to go: they are spread evenly
over the unblocked candidates (the TreePO-style fallback) and counted, or left unspent on request.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import overload

import numpy as np
import numpy.typing as npt

from trace_service.allocation._kernels import geometric_powers, top_units
from trace_service.allocation._validate import FloatArray, IntArray, non_negative_int, probabilities

#: Marginal gains at or below this are treated as zero (a flip probability of one in a million).
DEFAULT_MIN_GAIN = 1e-6


@dataclass(frozen=True)
class PrefixExpansion:
    """Continuations per candidate, the expected number of flipped outcomes, and how the budget went."""

    counts: IntArray
    expected_flips: float
    fallback_units: int
    unspent: int


def repeat_probability(p: npt.ArrayLike, outcome: npt.ArrayLike) -> FloatArray:
    """``q = r·p + (1 − r)(1 − p)``: the chance one continuation repeats the observed outcome ``r``."""
    p_arr = probabilities(p, "p")
    r_arr = probabilities(outcome, "outcome")
    if p_arr.shape != r_arr.shape:
        raise ValueError(f"p and outcome must have the same shape, got {p_arr.shape} and {r_arr.shape}")
    return r_arr * p_arr + (1.0 - r_arr) * (1.0 - p_arr)


def prefix_value(q: npt.ArrayLike, k: npt.ArrayLike) -> FloatArray:
    """``V_pref(k) = 1 − q^k``: probability that at least one of k continuations flips the outcome."""
    return 1.0 - np.asarray(q, dtype=np.float64) ** np.asarray(k, dtype=np.float64)


def spread_evenly(eligible: npt.NDArray[np.bool_], units: int) -> IntArray:
    """Deal ``units`` round-robin over the eligible entries in index order."""
    counts = np.zeros(eligible.size, dtype=np.int64)
    slots = np.flatnonzero(eligible)
    if slots.size and units:
        counts[slots] = units // slots.size
        counts[slots[: units % slots.size]] += 1
    return counts


def expand_prefixes(
    p: npt.ArrayLike,
    outcome: npt.ArrayLike,
    budget: int,
    *,
    blocked: npt.ArrayLike | None = None,
    fallback: bool = True,
    min_gain: float = DEFAULT_MIN_GAIN,
) -> PrefixExpansion:
    """Spend ``budget`` continuations over candidate prefixes (module docstring: objective and greedy).

    ``p`` are predicted successes at the candidates, ``outcome`` the observed (0/1, or a majority
    fraction) outcome below each, ``blocked`` marks candidates whose subtree is already mixed.  Ties go
    to the earlier candidate.  The returned counts always sum to ``budget − unspent``.
    """
    q = repeat_probability(p, outcome)
    budget = non_negative_int(budget, "budget")
    if not (np.isfinite(min_gain) and min_gain >= 0.0):
        raise ValueError("min_gain must be a finite number >= 0")
    is_blocked = np.zeros(q.size, dtype=bool) if blocked is None else np.asarray(blocked, dtype=bool)
    if is_blocked.shape != q.shape:
        raise ValueError(f"blocked must have shape {q.shape}, got {is_blocked.shape}")

    gains = _unit_gains(q, is_blocked, min_gain, most=budget)
    chosen = top_units(gains, budget)
    counts = chosen.sum(axis=1).astype(np.int64)

    leftover = budget - int(counts.sum())
    fallback_units = 0
    if leftover and fallback and np.any(~is_blocked):
        fallback_units = leftover
        counts += spread_evenly(~is_blocked, leftover)
    expected_flips = float(prefix_value(q[~is_blocked], counts[~is_blocked]).sum())
    return PrefixExpansion(counts, expected_flips, fallback_units, budget - int(counts.sum()))


def _unit_gains(q: FloatArray, blocked: npt.NDArray[np.bool_], min_gain: float, *, most: int) -> FloatArray:
    """``gains[c, k] = q_c^k (1 − q_c)``, the value of the (k+1)-th continuation from candidate c, zero
    where c is blocked or the gain is at most ``min_gain``.  At most ``most`` columns, and none past
    where no candidate's gain can still exceed ``min_gain``, which bounds the matrix."""
    columns = min(most, _useful_continuations(q, min_gain))
    gains = geometric_powers(q, 0, np.empty((q.size, columns))) * (1.0 - q)[:, None]
    gains[blocked] = 0.0
    gains[gains <= min_gain] = 0.0
    return gains


def _useful_continuations(q: FloatArray, min_gain: float) -> int:
    """The largest k for which some ``q^(k−1)(1 − q) > min_gain``: more columns can only hold zeros."""
    if q.size == 0:
        return 0
    interior = q[(q > 0.0) & (q < 1.0)]
    most = 1 if np.any(q == 0.0) else 0
    if interior.size and min_gain > 0.0:
        ratio = np.log(min_gain / (1.0 - interior)) / np.log(interior)
        most = max(most, int(np.ceil(np.max(np.maximum(ratio, 0.0)))) + 1)
    elif interior.size:
        return np.iinfo(np.int32).max
    return most


#: m·N that is an integer in exact arithmetic (m = 45, N = 1.4) must not floor one below it.
_FLOOR_TOLERANCE = 1e-9


@overload
def continuation_budget(rollouts: int, expansion: float) -> int: ...
@overload
def continuation_budget(rollouts: IntArray, expansion: float) -> IntArray: ...
def continuation_budget(rollouts: int | IntArray, expansion: float) -> int | IntArray:
    """``⌊m·N⌋``: the continuations a tree of ``m`` bare rollouts is promised at expansion ``N`` (the
    one rule for it: the service's allocations and the benchmarks' budgets)."""
    if not (math.isfinite(expansion) and expansion >= 0.0):
        raise ValueError(f"expansion must be a finite number >= 0, got {expansion}")
    floored = np.floor(np.asarray(rollouts, dtype=np.float64) * expansion + _FLOOR_TOLERANCE).astype(np.int64)
    return int(floored) if np.ndim(floored) == 0 else floored


def round_budgets(total: int, rounds: int) -> list[int]:
    """Split a prompt's continuation budget over ``rounds`` expansion rounds, earlier rounds first."""
    total = non_negative_int(total, "total")
    if isinstance(rounds, bool) or not isinstance(rounds, int) or rounds < 1:
        raise ValueError(f"rounds must be an integer >= 1, got {rounds!r}")
    base, extra = divmod(total, rounds)
    return [base + (1 if r < extra else 0) for r in range(rounds)]
