"""A prompt's success as a distribution: a Beta prior from a predicted mean, its concentration fitted
to observed groups, and the exact conjugate update on the prompt's own outcomes (pure numpy).

Episodes of one task are strongly correlated: what decides the outcome is mostly the task, so a
prompt's success p is spread around any predicted mean μ. We model

    p ~ Beta(κμ, κ(1 − μ)),    s | p ~ Binomial(n, p),

so a group of n rollouts has the Beta-Binomial marginal likelihood

    P(s | n, a, b) = C(n, s) · B(s + a, n − s + b) / B(a, b),    a = κμ, b = κ(1 − μ),

and after the prompt's earlier outcomes (s₀ of n₀) the posterior is Beta(a + s₀, b + n₀ − s₀) with
mean (κμ + s₀) / (κ + n₀). A small κ (groups of one prompt agree, successes are near 0 or 1 per prompt)
lets a few outcomes move the estimate far; a large κ says the predicted mean already pins p down.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import numpy as np
import numpy.typing as npt

from trace_service.predictor.checkpoint import CheckpointError

if TYPE_CHECKING:
    from trace_service.predictor.examples import RootGroup

FloatArray = npt.NDArray[np.float64]

#: The concentrations :func:`fit_concentration` searches between (log-uniformly).
CONCENTRATION_RANGE = (0.05, 1000.0)
# Prior means are kept this far from 0 and 1, so that a and b stay positive.
_MEAN_EPSILON = 1e-4
# Probabilities are kept this far from 0 and 1 when read as log-odds.
_PROBABILITY_EPSILON = 1e-6
_GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0
_SEARCH_STEPS = 48

_lgamma = np.vectorize(math.lgamma, otypes=[np.float64])


def _log_beta(a: FloatArray, b: FloatArray) -> FloatArray:
    return np.asarray(_lgamma(a) + _lgamma(b) - _lgamma(a + b), dtype=np.float64)


def beta_binomial_log_likelihood(
    successes: npt.ArrayLike, trials: npt.ArrayLike, a: npt.ArrayLike, b: npt.ArrayLike
) -> FloatArray:
    """``log P(s | n, a, b)`` of the Beta-Binomial, elementwise (the binomial coefficient included)."""
    s = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    a_arr, b_arr = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    choose = _lgamma(n + 1) - _lgamma(s + 1) - _lgamma(n - s + 1)
    return np.asarray(
        choose + _log_beta(s + a_arr, n - s + b_arr) - _log_beta(a_arr, b_arr), dtype=np.float64
    )


def posterior_mean(
    prior_mean: npt.ArrayLike, concentration: float, successes: npt.ArrayLike, trials: npt.ArrayLike
) -> FloatArray:
    """``(κμ + s) / (κ + n)``: the mean of Beta(κμ, κ(1 − μ)) after s successes in n trials."""
    mu = np.clip(np.asarray(prior_mean, dtype=np.float64), _MEAN_EPSILON, 1.0 - _MEAN_EPSILON)
    s = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    return np.asarray((concentration * mu + s) / (concentration + n), dtype=np.float64)


def shift_log_odds(value: FloatArray, before: FloatArray, after: FloatArray) -> FloatArray:
    """``σ(logit value − logit before + logit after)``: ``value`` moved as far in log-odds as ``before``
    moved to ``after`` (how a prefix inherits the move its prompt's outcomes gave its root)."""
    return _sigmoid(_logit(value) - _logit(before) + _logit(after))


def _logit(p: FloatArray) -> FloatArray:
    clipped = np.clip(p, _PROBABILITY_EPSILON, 1.0 - _PROBABILITY_EPSILON)
    return np.asarray(np.log(clipped) - np.log1p(-clipped), dtype=np.float64)


def _sigmoid(x: FloatArray) -> FloatArray:
    return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float64)


def group_log_likelihood(
    prior_mean: npt.ArrayLike,
    concentration: float,
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    earlier_successes: npt.ArrayLike,
    earlier_trials: npt.ArrayLike,
) -> FloatArray:
    """Each group's ``log P(s | n, κμ + s₀, κ(1 − μ) + n₀ − s₀)``: its likelihood under the posterior of
    its prompt's earlier outcomes."""
    mu = np.clip(np.asarray(prior_mean, dtype=np.float64), _MEAN_EPSILON, 1.0 - _MEAN_EPSILON)
    s0 = np.asarray(earlier_successes, dtype=np.float64)
    n0 = np.asarray(earlier_trials, dtype=np.float64)
    a = concentration * mu + s0
    b = concentration * (1.0 - mu) + n0 - s0
    return beta_binomial_log_likelihood(successes, trials, a, b)


def fit_concentration(
    prior_mean: npt.ArrayLike,
    successes: npt.ArrayLike,
    trials: npt.ArrayLike,
    earlier_successes: npt.ArrayLike | None = None,
    earlier_trials: npt.ArrayLike | None = None,
) -> float:
    """The κ in :data:`CONCENTRATION_RANGE` that maximises the groups' marginal likelihood

        Σ_g log P(s_g | n_g, κμ_g + s₀_g, κ(1 − μ_g) + n₀_g − s₀_g),

    each group scored under the posterior of its prompt's earlier outcomes (s₀ of n₀; none by
    default), by golden-section search on log κ (the likelihood is smooth and, in practice, unimodal
    in log κ).  Groups of one rollout say nothing about dispersion but are harmless.
    """
    mu = np.clip(np.asarray(prior_mean, dtype=np.float64), _MEAN_EPSILON, 1.0 - _MEAN_EPSILON)
    s = np.asarray(successes, dtype=np.float64)
    n = np.asarray(trials, dtype=np.float64)
    s0 = np.zeros_like(s) if earlier_successes is None else np.asarray(earlier_successes, dtype=np.float64)
    n0 = np.zeros_like(n) if earlier_trials is None else np.asarray(earlier_trials, dtype=np.float64)
    if not (mu.shape == s.shape == n.shape == s0.shape == n0.shape) or mu.ndim != 1:
        raise ValueError("prior_mean, successes, trials and the earlier counts must be 1-D of one length")
    if np.any((s < 0) | (s > n)) or np.any((s0 < 0) | (s0 > n0)):
        raise ValueError("need 0 <= successes <= trials")
    low, high = (math.log(bound) for bound in CONCENTRATION_RANGE)
    if mu.size == 0:
        return math.exp((low + high) / 2.0)

    def log_likelihood(log_kappa: float) -> float:
        return float(group_log_likelihood(mu, math.exp(log_kappa), s, n, s0, n0).sum())

    left, right = high - _GOLDEN * (high - low), low + _GOLDEN * (high - low)
    left_value, right_value = log_likelihood(left), log_likelihood(right)
    for _ in range(_SEARCH_STEPS):
        if left_value >= right_value:
            high, right, right_value = right, left, left_value
            left = high - _GOLDEN * (high - low)
            left_value = log_likelihood(left)
        else:
            low, left, left_value = left, right, right_value
            right = low + _GOLDEN * (high - low)
            right_value = log_likelihood(right)
    return math.exp((low + high) / 2.0)


PriorSource = Literal["network", "history"]


@dataclass(frozen=True, slots=True)
class Calibration:
    """How a prompt's outcome history is combined with the prior (the module docstring has the rule).

    ``prior`` is the source of the root prior mean: the network's μ(x), or one constant
    ``history_mean`` for every prompt (the history-only posterior); ``concentration`` is its κ.
    ``log_likelihood`` holds each source's mean log marginal likelihood per scored group, measured on
    ``groups`` groups (held-out ones when there are enough).
    """

    concentration: float
    prior: PriorSource = "network"
    history_mean: float = 0.5
    log_likelihood: dict[str, float] = field(default_factory=dict)
    groups: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, value: Any) -> Calibration:
        try:
            calibration = cls(
                concentration=float(value["concentration"]),
                prior=value["prior"],
                history_mean=float(value["history_mean"]),
                log_likelihood={str(k): float(v) for k, v in value["log_likelihood"].items()},
                groups=int(value["groups"]),
            )
        except (KeyError, TypeError, ValueError, AttributeError) as error:
            raise CheckpointError(f"checkpoint has a malformed calibration: {error}") from None
        valid = (
            calibration.prior in ("network", "history")
            and math.isfinite(calibration.concentration)
            and calibration.concentration > 0
            and 0.0 < calibration.history_mean < 1.0
        )
        if not valid:
            raise CheckpointError(f"checkpoint has an invalid calibration {value!r}")
        return calibration


def fit_calibration(
    groups: Sequence[RootGroup],
    pooled: Sequence[RootGroup],
    network_mean: FloatArray,
    prior_successes: float,
    prior_failures: float,
) -> Calibration:
    """Fit κ for each prior source by marginal likelihood to ``groups`` and keep the better source: the
    network's μ(x) of each group's prompt (``network_mean``), or one constant for every prompt, the bare
    success rate of the ``pooled`` groups under the configured Beta(α, β) prior."""
    successes = np.array([group.successes for group in groups], dtype=np.float64)
    trials = np.array([group.trials for group in groups], dtype=np.float64)
    earlier = np.array([group.outcomes.successes for group in groups], dtype=np.float64)
    earlier_trials = np.array([group.outcomes.trials for group in groups], dtype=np.float64)
    history_mean = (sum(g.successes for g in pooled) + prior_successes) / (
        sum(g.trials for g in pooled) + prior_successes + prior_failures
    )
    means: dict[PriorSource, FloatArray] = {
        "network": network_mean,
        "history": np.full(len(groups), history_mean),
    }
    fitted: dict[PriorSource, tuple[float, float]] = {}
    for source, mean in means.items():
        kappa = fit_concentration(mean, successes, trials, earlier, earlier_trials)
        scores = group_log_likelihood(mean, kappa, successes, trials, earlier, earlier_trials)
        fitted[source] = (kappa, float(scores.mean()))
    best: PriorSource = "network" if fitted["network"][1] >= fitted["history"][1] else "history"
    return Calibration(
        concentration=fitted[best][0],
        prior=best,
        history_mean=history_mean,
        log_likelihood={source: value for source, (_, value) in fitted.items()},
        groups=len(groups),
    )
