"""Stage 1 — global root allocation.

Given predicted success probabilities ``v_i`` for a pool of prompts, choose integer rollout counts
``m_i ∈ {0} ∪ [m_min, m_max]`` that maximise the expected number of mixed groups

    Σ_i w_i · V_root(v_i, m_i),   V_root(v, m) = 1 − z₁^m − z₀^m  (m ≥ 1),  V_root(v, 0) = 0,

subject to ``Σ_i m_i ≤ M`` and at most ``max_prompts`` active prompts (``w_i = 1`` for TRACE; Knapsack RL
uses an information weight).  ``m_i = 0`` skips a prompt: filtering and count allocation are one decision.

``z₁`` and ``z₀`` are the chances that one bare rollout *and the continuations Stage 2 will branch from
it* all succeed, or all fail (:func:`repeat_odds`).  The paper values the bare rollouts alone
(``z₁ = v``, ``z₀ = 1 − v``: P(m Bernoulli(v) draws are mixed)).  The joint objective also counts the
contrast Stage 2 adds: with N continuations per bare rollout, each of which flips its source's outcome
with probability ρ·(chance of the other outcome),

    z₁ = v · (1 − ρ(1 − v))^N,    z₀ = (1 − v) · (1 − ρv)^N,

where the *freshness* ρ ∈ [0, 1] says how much a continuation behaves like a fresh rollout (1: branching
at the root; 0: it always repeats its source).  ρ = 0 or N = 0 is the paper's objective.

Two solvers share this objective:

* :func:`allocate_roots_exact` — grouped-knapsack dynamic programme, O(B·M·m_max).  The reference.
* :func:`allocate_roots` — the production solver, exact for the paper's unweighted objective
  (property-tested against the DP).  Why it is exact: the marginal gain ``Δ_m = z₁^m(1−z₁) + z₀^m(1−z₀)``
  decreases for m ≥ 1 and, in the paper's objective, ``V_root(·, 1) = 0``, so each prompt's value is an
  activation block of ``m_min`` units whose average gain is at least every later gain, followed by
  concave single units.  ``V_root(v, m)`` also
  falls as ``|v − ½|`` grows for every m, so with k active prompts the best k are the k closest to ½
  (exchange argument) and the rest of the budget goes to the best single units among them.  Writing
  ``F(k)`` for that value, the greedy on the concave envelope (blocks spread over their units) leaves at
  most one block half-filled, and the optimum is ``F(k_G)`` or ``F(k_G + 1)`` around the envelope's
  number of full blocks ``k_G``: dropping the half-filled block and spending its units on the next best
single units, or completing it with the least valuable single units taken.  Among allocations of equal
value the solver prefers the one with more active prompts (breadth first), then earlier prompts.
  With the joint objective (or a weight) the value curves of two prompts need not be ordered, so the
  repair is no longer provably optimal, but it stays within one block of the optimum: the envelope's
  greedy is an upper bound, and dropping the half-filled block loses at most its spread share,
  ``(m_min − 1)/m_min · max_i V(v_i, m_min)``.  Tests check that bound against the DP.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trace_service.allocation._kernels import geometric_powers, top_units
from trace_service.allocation._validate import FloatArray, IntArray, check_limits, probabilities

#: At equal gain (V(3) = 3·V(2)/2 always), activating one more prompt goes before another rollout for an
#: active one: the same expected mixed groups over more distinct prompts.  Values are never changed by
#: more than this factor, far inside the solver's exactness.
_BREADTH_FIRST = 1.0 - 1e-12

#: Extras columns materialised first by the production solver (doubled while the threshold needs more).
_FIRST_COLUMNS = 24


@dataclass(frozen=True)
class RootAllocation:
    """Rollout counts per prompt (input order), the objective value reached and the budget left."""

    counts: IntArray
    expected_mixed: float
    unspent: int


def repeat_odds(
    v: npt.ArrayLike, *, expansion: float = 0.0, freshness: float = 0.0
) -> tuple[FloatArray, FloatArray]:
    """``z₁ = v·(1 − ρ(1 − v))^N`` and ``z₀ = (1 − v)·(1 − ρv)^N``: the chances that one bare rollout and
    its N continuations all succeed, or all fail, when a continuation flips its source's outcome with
    probability ρ times the chance of the other outcome.  ``expansion`` N = 0 or ``freshness`` ρ = 0
    gives the paper's ``(v, 1 − v)``."""
    if not (np.isfinite(expansion) and expansion >= 0.0):
        raise ValueError(f"expansion must be a finite number >= 0, got {expansion}")
    if not 0.0 <= freshness <= 1.0:
        raise ValueError(f"freshness must lie in [0, 1], got {freshness}")
    v_arr = np.asarray(v, dtype=np.float64)
    if expansion == 0.0 or freshness == 0.0:
        return v_arr, 1.0 - v_arr
    z_success = v_arr * (1.0 - freshness * (1.0 - v_arr)) ** expansion
    z_failure = (1.0 - v_arr) * (1.0 - freshness * v_arr) ** expansion
    return z_success, z_failure


@dataclass(frozen=True)
class _Odds:
    """Each prompt's repeat odds (:func:`repeat_odds`): the chances that one bare rollout and its
    continuations all succeed, or all fail."""

    z_success: FloatArray
    z_failure: FloatArray

    def rows(self, rows: IntArray | slice) -> _Odds:
        return _Odds(self.z_success[rows], self.z_failure[rows])


def _odds(v: FloatArray, *, expansion: float, freshness: float) -> _Odds:
    return _Odds(*repeat_odds(v, expansion=expansion, freshness=freshness))


def root_value(
    v: npt.ArrayLike,
    m: npt.ArrayLike,
    *,
    expansion: float = 0.0,
    freshness: float = 0.0,
) -> FloatArray:
    """``V_root(v, m) = 1 − z₁^m − z₀^m`` for m ≥ 1 and 0 for m = 0 (:func:`repeat_odds`); with the
    defaults, ``1 − v^m − (1 − v)^m``: P(m Bernoulli(v) draws are mixed)."""
    v_arr, m_arr = np.broadcast_arrays(np.asarray(v, dtype=np.float64), np.asarray(m, dtype=np.float64))
    return _curve(_odds(v_arr, expansion=expansion, freshness=freshness), m_arr)


def _smallest_group(min_rollouts: int) -> int:
    """Fewest bare rollouts of an active prompt: one alone is never mixed in the paper's objective and
    gives a GRPO trainer no baseline, so at least two.  From two on, a block's average gain V(lo)/lo is
    at least every later gain in the joint objective too, since Δ_m decreases for m ≥ 1 and

        V(2) − 2Δ₂ = 1 − 3z₁² + 2z₁³ − 3z₀² + 2z₀³ ≥ 0   whenever z₁ + z₀ ≤ 1

    (3x² − 2x³ increases on [0, 1], and equality holds on z₁ + z₀ = 1, the paper's case)."""
    return max(min_rollouts, 2)


def _weights(weight: npt.ArrayLike | None, n_prompts: int) -> FloatArray:
    if weight is None:
        return np.ones(n_prompts)
    w = np.asarray(weight, dtype=np.float64)
    if w.shape != (n_prompts,):
        raise ValueError(f"weight must have shape ({n_prompts},), got {w.shape}")
    if not np.all(np.isfinite(w)) or np.any(w < 0):
        raise ValueError("weight must be finite and >= 0")
    return w


def allocate_roots(
    v: npt.ArrayLike,
    budget: int,
    *,
    min_rollouts: int = 2,
    max_rollouts: int = 64,
    max_prompts: int | None = None,
    weight: npt.ArrayLike | None = None,
    expansion: float = 0.0,
    freshness: float = 0.0,
) -> RootAllocation:
    """Production Stage 1 solver (see the module docstring for the objective and why it is exact).

    Never spends more than ``budget`` and never spends a unit whose marginal value is zero (budget that
    cannot buy any expected mixed group is returned as ``unspent``).  Ties between equal prompts go to the
    earlier prompt.  With ``weight`` (Knapsack RL), the joint objective (``expansion`` and
    ``freshness``, see :func:`repeat_odds`) the same search runs over those values;
    it is then within one block of the optimum and :func:`allocate_roots_exact` is the exact answer.
    """
    probs = probabilities(v, "v")
    n_prompts = probs.size
    prompt_cap = check_limits(n_prompts, budget, min_rollouts, max_rollouts, max_prompts)
    w = _weights(weight, n_prompts)
    odds = _odds(probs, expansion=expansion, freshness=freshness)
    lo = _smallest_group(min_rollouts)
    n_extras = max(max_rollouts - lo, 0)
    if max_rollouts < lo:
        return RootAllocation(np.zeros(n_prompts, dtype=np.int64), 0.0, budget)

    def value_of(rows: IntArray | slice, counts: IntArray) -> float:
        return float((w[rows] * _curve(odds.rows(rows), counts)).sum())

    block_value = w * _curve(odds, np.full(n_prompts, lo))
    rank = np.lexsort((np.arange(n_prompts), -block_value))
    eligible = rank[block_value[rank] > 0.0][: min(prompt_cap, budget // lo)]
    counts = np.zeros(n_prompts, dtype=np.int64)
    if eligible.size == 0:
        return RootAllocation(counts, 0.0, budget)

    block = block_value[eligible]
    # The envelope greedy only needs the extras above its threshold; grow the columns until no row's
    # last one could reach it (at B = 4096 materialising all m_max columns costs more than the solve).
    columns = min(n_extras, _FIRST_COLUMNS)
    while True:
        envelope = _envelope(odds.rows(eligible), w[eligible], block, lo, columns)
        chosen = top_units(envelope, budget)
        threshold = float(envelope[chosen].min()) if chosen.any() else np.inf
        if int(chosen.sum()) < budget:
            threshold = 0.0  # every positive unit is taken: all of them must be in view
        last = envelope[:, -1] if columns else np.zeros(0)
        if columns == n_extras or not np.any(last >= max(threshold, np.finfo(float).tiny)):
            break
        columns = min(n_extras, 2 * columns)
    extras = envelope[:, lo:]
    units = chosen.sum(axis=1)
    k_full = int(np.count_nonzero(units >= lo))
    taken = units[:k_full] - lo
    partial = int(units[k_full]) if k_full < units.size else 0

    # F(k_full): drop the partial block and give its units to the best next extras.
    counts_a = lo + _add_best_extras(extras[:k_full], taken.copy(), partial)
    best = counts_a
    if partial:
        # F(k_full + 1): complete the partial block with the worst extras already taken.
        counts_b = _drop_worst_extras(extras[:k_full], taken.copy(), lo - partial)
        if counts_b is not None:
            counts_b = np.append(lo + counts_b, lo)
            gain_a = value_of(eligible[:k_full], counts_a)
            gain_b = value_of(eligible[: k_full + 1], counts_b)
            if gain_b >= gain_a * _BREADTH_FIRST:
                best = counts_b
    counts[eligible[: best.size]] = best
    return RootAllocation(counts, value_of(slice(None), counts), budget - int(counts.sum()))


def _curve(odds: _Odds, m: npt.NDArray[np.float64 | np.int64]) -> FloatArray:
    """``1 − z₁^m − z₀^m`` for m ≥ 1, 0 for m = 0 (the root value in terms of the repeat odds; ``m`` has
    the shape of the prompts, or broadcasts against them)."""
    value = np.maximum(1.0 - odds.z_success**m - odds.z_failure**m, 0.0)
    return np.where(m > 0, value, 0.0)


def _envelope(odds: _Odds, w: FloatArray, block: FloatArray, lo: int, columns: int) -> FloatArray:
    """Concave envelope of each prompt's value: its block spread over lo units at the average gain,
    then its first ``columns`` single-rollout gains

        extras[r, j] = w·Δ_m = w·(z₁^m·(1 − z₁) + z₀^m·(1 − z₀)),   m = lo + j

    (for the paper's z₁ = v, z₀ = 1 − v this is w·v(1−v)·(v^(m−1) + (1−v)^(m−1))).  Each row is
    non-increasing, so the envelope's greedy fills whole rows except at most one block.
    """
    rows = block.size
    envelope = np.empty((rows, lo + columns))
    envelope[:, :lo] = (block / lo)[:, None]
    extras = envelope[:, lo:]
    z_success, z_failure = odds.z_success, odds.z_failure
    geometric_powers(z_success, lo, extras)
    extras *= (1.0 - z_success)[:, None]
    extras += geometric_powers(z_failure, lo, np.empty((rows, columns))) * (1.0 - z_failure)[:, None]
    extras *= w[:, None]
    # Mathematically Δ_lo ≤ V(lo)/lo; clamp float noise so a block always precedes its extras.
    np.minimum(extras, envelope[:, :1], out=extras)
    extras *= _BREADTH_FIRST
    return envelope


def _add_best_extras(extras: FloatArray, taken: IntArray, units: int) -> IntArray:
    """Give ``units`` more rollouts, one at a time, to the rows whose next extra gains most (if > 0)."""
    rows = np.arange(taken.size)
    for _ in range(units):
        room = taken < extras.shape[1]
        next_gain = np.where(room, extras[rows, np.minimum(taken, extras.shape[1] - 1)], 0.0)
        row = int(np.argmax(next_gain)) if rows.size else 0
        if not rows.size or next_gain[row] <= 0.0:
            break
        taken[row] += 1
    return taken


def _drop_worst_extras(extras: FloatArray, taken: IntArray, units: int) -> IntArray | None:
    """Take back ``units`` extras, one at a time, from the rows whose last extra gains least."""
    rows = np.arange(taken.size)
    for _ in range(units):
        last_gain = np.where(taken > 0, extras[rows, np.maximum(taken - 1, 0)], np.inf)
        if not rows.size or np.all(np.isinf(last_gain)):
            return None
        taken[int(np.argmin(last_gain))] -= 1
    return taken


def allocate_roots_exact(
    v: npt.ArrayLike,
    budget: int,
    *,
    min_rollouts: int = 2,
    max_rollouts: int = 64,
    max_prompts: int | None = None,
    weight: npt.ArrayLike | None = None,
    expansion: float = 0.0,
    freshness: float = 0.0,
) -> RootAllocation:
    """Exact Stage 1 by dynamic programming over prompts (the reference solver).

    ``best[c, b]`` = the largest ``Σ w_i V_root(v_i, m_i)`` over the prompts seen so far using at most b
    units and at most c active prompts; each prompt either stays at 0 or takes m ∈ [m_min, m_max].
    O(B·C·M·(m_max − m_min + 1)) time with C = 1 without a prompt cap — for tests and benchmarks.
    """
    probs = probabilities(v, "v")
    n_prompts = probs.size
    prompt_cap = check_limits(n_prompts, budget, min_rollouts, max_rollouts, max_prompts)
    w = _weights(weight, n_prompts)
    sizes = np.arange(_smallest_group(min_rollouts), min(max_rollouts, budget) + 1)
    capped = max_prompts is not None
    n_layers = prompt_cap + 1 if capped else 1
    best = np.zeros((n_layers, budget + 1))
    choice = np.zeros((n_prompts, n_layers, budget + 1), dtype=np.int32)
    odds = _odds(probs, expansion=expansion, freshness=freshness)
    for i in range(n_prompts):
        gains = w[i] * _curve(odds.rows(slice(i, i + 1)), sizes)
        new = best.copy()
        for size, gain in zip(sizes.tolist(), gains.tolist(), strict=True):
            if gain <= 0.0:
                continue
            # With a cap, activating prompt i moves from layer c−1 to c; without one, layer 0 to 0.
            source = best[:-1, :-size] if capped else best[:, :-size]
            candidate = source + gain
            target = new[1:, size:] if capped else new[:, size:]
            better = candidate > target
            target[better] = candidate[better]
            (choice[i, 1:, size:] if capped else choice[i, :, size:])[better] = size
        best = new
    counts = np.zeros(n_prompts, dtype=np.int64)
    layer, units = n_layers - 1, budget
    for i in range(n_prompts - 1, -1, -1):
        size = int(choice[i, layer, units])
        counts[i] = size
        units -= size
        if size and capped:
            layer -= 1
    value = float((w * _curve(odds, counts)).sum())
    return RootAllocation(counts, value, budget - int(counts.sum()))
