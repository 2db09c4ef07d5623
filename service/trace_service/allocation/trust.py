"""How far Stage 1 trusts the predictor on one job: a calibration map fitted to the job's recent bare
groups (pure numpy).

Control prompts are drawn at random from the pool (``allocation.control_share``), so their outcomes against
the prediction made for them at allocation are an unbiased sample of how the predictor does on this
job, the prompts the policy would skip included.  The policy's groups join them: it chose its prompts by
their predictions alone, so outcomes given predictions are the same among them (a regression on v stays
unbiased under selection on v).  With ``z = logit v`` the predictor's value at a
group's prompt and ``x = z − c`` (``c`` the groups' mean z, weighted by trials), the map is a
logistic recalibration

    v' = σ(a + b·x),

fitted to the groups' bare outcomes (``s`` successes of ``n``) by maximising

    (1/φ) Σ_g [s_g log μ_g + (n_g − s_g) log(1 − μ_g)] − b² / (2τ²) − a² / (2·A²),   μ_g = σ(a + b·x_g),

over a and b ≥ 0, where φ ≥ 1 is the groups' overdispersion (Pearson's χ² / (G − 2): the rollouts of
one prompt agree more than independent draws would, so they count for less), τ the prior scale of the
slope and A a loose scale for the level.  With no evidence, or a predictor with no skill on the job,
b → 0 and every prompt gets the same v' — Stage 1 then deals the budget as uniform does; with a
calibrated predictor of real skill, b → 1 and v' → v — Stage 1 is TRACE's.  An over-confident predictor
gets 0 < b < 1 (its predictions shrunk toward the pool's mean), an under-confident one b > 1.

Stage 1 acts on the slope's lower 90% bound, ``b₋ = max(b̂ − z·σ_b, 0)`` (``σ_b²`` the slope's entry of
the inverse negative Hessian of the objective at its maximum, ``z = 1.645``): Stage 1's objective ties
groups of 2 and 3 exactly (both ``v(1 − v)`` per rollout), so any spread of ``v'`` tips a plan from
uniform's to one that skips prompts, and a slope that noise alone could give must not do that.  Until
the evidence shows skill at 90%, every prompt gets the same ``v'``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trace_service.allocation._validate import FloatArray, probabilities
from trace_service.allocation.gain import Z_90

#: The prior scale τ of the slope: evidence must show skill before Stage 1 acts on it.
SLOPE_PRIOR_SCALE = 1.0
#: The loose prior scale A of the level a (logits).
LEVEL_PRIOR_SCALE = 10.0
#: Predictions are kept this far from 0 and 1 before their logit is taken.
_EDGE = 1e-4
_NEWTON_STEPS = 50
_DISPERSION_ROUNDS = 3


def _sigmoid(x: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float64)


def _logit(v: FloatArray) -> FloatArray:
    clipped = np.clip(v, _EDGE, 1.0 - _EDGE)
    return np.asarray(np.log(clipped / (1.0 - clipped)), dtype=np.float64)


@dataclass(frozen=True, slots=True)
class Trust:
    """The map ``v' = σ(intercept + slope·(logit v − center))`` Stage 1 applies, from ``groups`` bare
    groups of overdispersion ``dispersion``: ``slope`` is the lower bound of the fitted
    ``fitted_slope ± z·slope_error`` (the module's rule).  ``Trust()`` (no evidence) maps every
    prediction to one value."""

    intercept: float = 0.0
    slope: float = 0.0
    center: float = 0.0
    groups: int = 0
    dispersion: float = 1.0
    fitted_slope: float = 0.0
    slope_error: float = 0.0

    def apply(self, predicted: npt.ArrayLike) -> FloatArray:
        """The recalibrated predictions, in (0, 1)."""
        v = probabilities(predicted, "predicted")
        return _sigmoid(self.intercept + self.slope * (_logit(v) - self.center))


def trust_objective(
    intercept: float,
    slope: float,
    x: FloatArray,
    successes: FloatArray,
    trials: FloatArray,
    dispersion: float,
    slope_scale: float = SLOPE_PRIOR_SCALE,
) -> float:
    """The module's objective at (a, b) for centred logits ``x`` (what :func:`fit_trust` maximises)."""
    eta = intercept + slope * x
    # log σ(η) and log(1 − σ(η)) without overflow.
    log_mu, log_rest = -np.logaddexp(0.0, -eta), -np.logaddexp(0.0, eta)
    likelihood = float(np.sum(successes * log_mu + (trials - successes) * log_rest))
    prior = slope**2 / (2 * slope_scale**2) + intercept**2 / (2 * LEVEL_PRIOR_SCALE**2)
    return likelihood / dispersion - prior


def fit_trust(
    predicted: npt.ArrayLike,
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    *,
    slope_scale: float = SLOPE_PRIOR_SCALE,
) -> Trust:
    """The map of the module fitted to bare groups: the prediction each had at allocation, its bare
    successes and trials.  Newton's method on (a, b) (the objective is concave), restricted to b ≥ 0,
    with φ re-estimated from the fit a few times."""
    v = probabilities(predicted, "predicted")
    s = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    if not (v.shape == s.shape == n.shape) or np.any(n < 0) or np.any((s < 0) | (s > n)):
        raise ValueError(
            "predicted, successes and trials must be of one length, with 0 <= successes <= trials"
        )
    if not (math.isfinite(slope_scale) and slope_scale > 0):
        raise ValueError(f"slope_scale must be a positive number, got {slope_scale}")
    keep = n > 0
    v, s, n = v[keep], s[keep], n[keep]
    if n.size == 0:
        return Trust()
    z = _logit(v)
    center = float(np.average(z, weights=n))
    x = z - center
    dispersion = 1.0
    for _ in range(_DISPERSION_ROUNDS):
        intercept, slope = _maximise(x, s, n, dispersion, slope_scale)
        dispersion = _overdispersion(intercept + slope * x, s, n)
    intercept, slope = _maximise(x, s, n, dispersion, slope_scale)
    _, information = _derivatives(intercept, slope, x, s, n, dispersion, slope_scale)
    error = math.sqrt(float(np.linalg.inv(information)[1, 1]))
    bound = max(slope - Z_90 * error, 0.0)
    return Trust(intercept, bound, center, int(n.size), dispersion, fitted_slope=slope, slope_error=error)


def _maximise(
    x: FloatArray, s: FloatArray, n: FloatArray, dispersion: float, slope_scale: float
) -> tuple[float, float]:
    """argmax of :func:`trust_objective` over a and b ≥ 0: the unconstrained optimum, or, when its b is
    negative, the optimum on b = 0 (the objective is concave, so the constrained one lies there)."""
    a, b = _newton(x, s, n, dispersion, slope_scale, free_slope=True)
    if b < 0.0:
        a, b = _newton(x, s, n, dispersion, slope_scale, free_slope=False)
    return a, b


def _newton(
    x: FloatArray, s: FloatArray, n: FloatArray, dispersion: float, slope_scale: float, *, free_slope: bool
) -> tuple[float, float]:
    """Newton's method with step halving from (0, 0), over (a, b) or over a alone (b = 0)."""
    a, b = 0.0, 0.0
    for _ in range(_NEWTON_STEPS):
        gradient, hessian = _derivatives(a, b, x, s, n, dispersion, slope_scale)
        if not free_slope:
            gradient[1], hessian[0, 1], hessian[1, 0] = 0.0, 0.0, 0.0
        step = np.linalg.solve(hessian, gradient)
        before = trust_objective(a, b, x, s, n, dispersion, slope_scale)
        scale = 1.0
        while (
            scale > 1e-6
            and trust_objective(a + scale * step[0], b + scale * step[1], x, s, n, dispersion, slope_scale)
            < before - 1e-12
        ):
            scale /= 2
        a, b = a + scale * float(step[0]), b + scale * float(step[1])
        if abs(scale * step).max() < 1e-10:
            break
    return a, b


def _derivatives(
    a: float, b: float, x: FloatArray, s: FloatArray, n: FloatArray, dispersion: float, slope_scale: float
) -> tuple[FloatArray, FloatArray]:
    """The gradient of :func:`trust_objective` at (a, b) and its negative Hessian (the information)."""
    precision = np.array([1.0 / LEVEL_PRIOR_SCALE**2, 1.0 / slope_scale**2])
    mu = _sigmoid(a + b * x)
    residual = (s - n * mu) / dispersion
    weight = n * mu * (1.0 - mu) / dispersion
    gradient = np.array([residual.sum(), (residual * x).sum()]) - precision * np.array([a, b])
    cross = float((weight * x).sum())
    information = np.array([[weight.sum(), cross], [cross, (weight * x * x).sum()]]) + np.diag(precision)
    return gradient, information


def _overdispersion(eta: FloatArray, s: FloatArray, n: FloatArray) -> float:
    """Pearson's χ² of the groups over their degrees of freedom, at least 1 (and 1 with fewer than
    three groups)."""
    if s.size < 3:
        return 1.0
    mu = np.clip(_sigmoid(eta), 1e-9, 1.0 - 1e-9)
    chi2 = float(np.sum((s - n * mu) ** 2 / (n * mu * (1.0 - mu))))
    return max(1.0, chi2 / (s.size - 2))


@dataclass(frozen=True, slots=True)
class Calibration:
    """The predictor on control groups: the Brier score per bare rollout of the predictions, and of one
    constant (the groups' success rate), over ``groups`` groups of ``rollouts`` rollouts."""

    groups: int
    rollouts: int
    brier: float | None
    brier_constant: float | None

    @property
    def skill(self) -> float | None:
        """``1 − brier / brier_constant``: above 0 when the predictions tell prompts apart."""
        if self.brier is None or not self.brier_constant:
            return None
        return 1.0 - self.brier / self.brier_constant


def control_calibration(
    predicted: npt.ArrayLike, successes: npt.ArrayLike, trials: npt.ArrayLike
) -> Calibration:
    """``Σ_g [s_g(1 − v_g)² + (n_g − s_g)v_g²] / Σ n_g`` for the predictions and for the constant
    ``p̄ = Σs / Σn``, whose score is ``p̄(1 − p̄)``."""
    v = probabilities(predicted, "predicted")
    s = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    rollouts = float(n.sum())
    if rollouts <= 0:
        return Calibration(int(v.size), 0, None, None)
    brier = float(np.sum(s * (1.0 - v) ** 2 + (n - s) * v**2) / rollouts)
    mean = float(s.sum()) / rollouts
    return Calibration(int(v.size), int(rollouts), brier, mean * (1.0 - mean))
