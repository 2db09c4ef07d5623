"""Quality measures of success predictions (pure numpy).

``predicted`` are probabilities Ṽ in [0, 1]; ``target`` are observed success rates V̂ in [0, 1] (a
leaf's reward, or the empirical success rate of the leaves below a node); ``weights`` are optional
non-negative weights, normally the visit counts n behind each target. With binary targets and unit
weights the Brier score and ECE below are the textbook ones; with V̂ targets weighted by n the Brier
score equals the leaf-level Brier score minus the within-node variance, which no predictor of a prefix
can remove.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

ArrayLike = npt.ArrayLike
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class PredictorDiagnostics:
    """Quality of the published predictor on its held-out trees.

    A figure is ``None`` when it is undefined: no held-out data, or (Spearman) fewer than two points or
    a constant input.
    """

    version: int
    examples_seen: int
    holdout_examples: int
    brier: float | None
    ece: float | None
    spearman: float | None
    spearman_by_depth: Mapping[int, float | None] = field(default_factory=dict)
    brier_by_depth: Mapping[int, float | None] = field(default_factory=dict)


def _validated(
    predicted: ArrayLike, target: ArrayLike, weights: ArrayLike | None
) -> tuple[FloatArray, FloatArray, FloatArray]:
    p = np.asarray(predicted, dtype=np.float64)
    t = np.asarray(target, dtype=np.float64)
    w = np.ones_like(p) if weights is None else np.asarray(weights, dtype=np.float64)
    if p.ndim != 1 or p.shape != t.shape or p.shape != w.shape:
        raise ValueError(
            f"predicted, target and weights must be 1-D of one length, got {p.shape}, {t.shape}, {w.shape}"
        )
    if not (np.all(np.isfinite(p)) and np.all(np.isfinite(t)) and np.all(np.isfinite(w))):
        raise ValueError("predicted, target and weights must be finite")
    if np.any(w < 0):
        raise ValueError("weights must be non-negative")
    if np.any((p < 0) | (p > 1)):
        raise ValueError("predicted probabilities must lie in [0, 1]")
    return p, t, w


def brier_score(predicted: ArrayLike, target: ArrayLike, weights: ArrayLike | None = None) -> float | None:
    """Weighted mean squared error Σ wᵢ (pᵢ − tᵢ)² / Σ wᵢ; ``None`` when the total weight is 0."""
    p, t, w = _validated(predicted, target, weights)
    total = w.sum()
    if total <= 0:
        return None
    return float(np.dot(w, (p - t) ** 2) / total)


def expected_calibration_error(
    predicted: ArrayLike, target: ArrayLike, weights: ArrayLike | None = None, num_bins: int = 10
) -> float | None:
    """ECE over ``num_bins`` equal-width bins of the predicted probability.

    Bin b holds the predictions in [b/B, (b+1)/B) (the last bin also holds 1.0). With Wᵦ the weight in
    bin b and W the total, ECE = Σᵦ (Wᵦ/W) · |mean_w(p in b) − mean_w(t in b)|. ``None`` when W = 0.
    """
    if num_bins < 1:
        raise ValueError(f"num_bins must be at least 1, got {num_bins}")
    p, t, w = _validated(predicted, target, weights)
    total = w.sum()
    if total <= 0:
        return None
    bins = np.minimum((p * num_bins).astype(np.int64), num_bins - 1)
    bin_weight = np.bincount(bins, weights=w, minlength=num_bins)
    gap = np.bincount(bins, weights=w * p, minlength=num_bins) - np.bincount(
        bins, weights=w * t, minlength=num_bins
    )
    # Σᵦ (Wᵦ/W)·|Σ w(p−t)/Wᵦ| = Σᵦ |Σ w(p−t)| / W
    return float(np.abs(gap[bin_weight > 0]).sum() / total)


def average_ranks(values: ArrayLike) -> FloatArray:
    """Ranks 1..n, ties sharing the mean of the ranks they span."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 1:
        raise ValueError(f"values must be 1-D, got shape {x.shape}")
    if not np.all(np.isfinite(x)):
        raise ValueError("values must be finite")
    order = np.argsort(x, kind="stable")
    sorted_x = x[order]
    # Start index of each run of equal values, and the run each sorted element belongs to.
    starts = np.flatnonzero(np.r_[True, sorted_x[1:] != sorted_x[:-1]])
    ends = np.r_[starts[1:], len(x)]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.empty(len(x), dtype=np.float64)
    ranks[order] = np.repeat(run_rank, ends - starts)
    return ranks


def spearman(x: ArrayLike, y: ArrayLike) -> float | None:
    """Spearman's ρ: the Pearson correlation of average ranks. ``None`` for fewer than two points or
    when either input is constant (ρ is undefined)."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    if a.ndim != 1 or a.shape != b.shape:
        raise ValueError(f"x and y must be 1-D of one length, got {a.shape} and {b.shape}")
    if not (np.all(np.isfinite(a)) and np.all(np.isfinite(b))):
        raise ValueError("x and y must be finite")
    if len(a) < 2:
        return None
    rank_a = average_ranks(a) - (len(a) + 1) / 2.0
    rank_b = average_ranks(b) - (len(b) + 1) / 2.0
    norm = np.sqrt(np.dot(rank_a, rank_a) * np.dot(rank_b, rank_b))
    if norm == 0:
        return None
    return float(np.clip(np.dot(rank_a, rank_b) / norm, -1.0, 1.0))


def spearman_by_group(x: ArrayLike, y: ArrayLike, groups: ArrayLike) -> dict[int, float | None]:
    """:func:`spearman` within each integer group (for example prefix depth), keyed by group."""
    a = np.asarray(x, dtype=np.float64)
    b = np.asarray(y, dtype=np.float64)
    g = np.asarray(groups, dtype=np.int64)
    if g.shape != a.shape:
        raise ValueError(f"groups must match x in shape, got {g.shape} and {a.shape}")
    return {int(group): spearman(a[g == group], b[g == group]) for group in np.unique(g)}


def brier_by_group(
    predicted: ArrayLike, target: ArrayLike, groups: ArrayLike, weights: ArrayLike | None = None
) -> dict[int, float | None]:
    """:func:`brier_score` within each integer group, keyed by group."""
    p, t, w = _validated(predicted, target, weights)
    g = np.asarray(groups, dtype=np.int64)
    if g.shape != p.shape:
        raise ValueError(f"groups must match predicted in shape, got {g.shape} and {p.shape}")
    return {int(group): brier_score(p[g == group], t[g == group], w[g == group]) for group in np.unique(g)}
