"""The predictive distribution: Beta-Binomial likelihood, fitted concentration, conjugate update."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.predictor.calibration import (
    CONCENTRATION_RANGE,
    beta_binomial_log_likelihood,
    fit_concentration,
    posterior_mean,
)


def test_beta_binomial_matches_rising_factorials() -> None:
    # E[p^s (1 − p)^(n − s)] under Beta(a, b) = a^(s) b^(n − s) / (a + b)^(n), x^(k) rising factorials.
    def rising(x: float, k: int) -> float:
        return math.prod(x + i for i in range(k))

    for s, n, a, b in [
        (0, 4, 0.3, 2.0),
        (2, 4, 1.0, 1.0),
        (5, 7, 2.5, 0.7),
        (3, 3, 0.2, 0.2),
        (0, 0, 1.5, 1.5),
    ]:
        expected = math.comb(n, s) * rising(a, s) * rising(b, n - s) / rising(a + b, n)
        assert math.exp(beta_binomial_log_likelihood(s, n, a, b)) == pytest.approx(expected, rel=1e-9)


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 8), st.floats(0.05, 20), st.floats(0.05, 0.95))
def test_beta_binomial_sums_to_one(n: int, kappa: float, mean: float) -> None:
    s = np.arange(n + 1)
    total = np.exp(beta_binomial_log_likelihood(s, n, kappa * mean, kappa * (1 - mean))).sum()
    assert total == pytest.approx(1.0, rel=1e-9)


@pytest.mark.parametrize("true_kappa", [0.5, 3.0, 40.0])
def test_fitted_concentration_recovers_a_known_dispersion(true_kappa: float) -> None:
    rng = np.random.default_rng(int(true_kappa * 10))
    mu = rng.uniform(0.05, 0.95, 4000)
    p = rng.beta(true_kappa * mu, true_kappa * (1 - mu))
    trials = rng.integers(2, 9, mu.size)
    successes = rng.binomial(trials, p)
    fitted = fit_concentration(mu, successes, trials)
    assert math.log(fitted) == pytest.approx(math.log(true_kappa), abs=0.3)


def test_fitted_concentration_uses_each_prompts_earlier_outcomes() -> None:
    # Groups scored after earlier outcomes of the same prompt: the earlier evidence narrows the prior,
    # and the fit still finds the population's κ.
    rng = np.random.default_rng(5)
    true_kappa = 1.0
    mu = rng.uniform(0.1, 0.9, 4000)
    p = rng.beta(true_kappa * mu, true_kappa * (1 - mu))
    earlier_trials = rng.integers(0, 6, mu.size)
    earlier = rng.binomial(earlier_trials, p)
    trials = np.full(mu.size, 4)
    successes = rng.binomial(trials, p)
    fitted = fit_concentration(mu, successes, trials, earlier, earlier_trials)
    assert math.log(fitted) == pytest.approx(0.0, abs=0.3)


def test_posterior_mean_is_calibrated_on_data_with_known_dispersion() -> None:
    rng = np.random.default_rng(9)
    kappa = 2.0
    mu = rng.uniform(0.02, 0.98, 60_000)
    p = rng.beta(kappa * mu, kappa * (1 - mu))
    trials = rng.integers(0, 7, mu.size)
    successes = rng.binomial(trials, p)
    estimate = posterior_mean(
        mu, fit_concentration(mu[:5000], successes[:5000], trials[:5000]), successes, trials
    )
    bins = np.minimum((estimate * 10).astype(int), 9)
    for b in range(10):
        chosen = bins == b
        if chosen.sum() > 500:
            assert p[chosen].mean() == pytest.approx(estimate[chosen].mean(), abs=0.02)
    # Sharp where the evidence is: prompts that failed 6 of 6 are placed near 0, far below their prior.
    failed_all = (trials == 6) & (successes == 0)
    assert estimate[failed_all].mean() < 0.5 * mu[failed_all].mean()


def test_posterior_mean_formula() -> None:
    assert posterior_mean(0.5, 2.0, 0, 0) == pytest.approx(0.5)
    assert posterior_mean(0.3, 1.0, 2, 4) == pytest.approx((0.3 + 2) / 5)


def test_fit_concentration_stays_in_range_and_rejects_bad_counts() -> None:
    low, high = CONCENTRATION_RANGE
    # All groups agree within themselves but differ between: as dispersed as the range allows.
    assert fit_concentration([0.5] * 100, [0, 4] * 50, [4] * 100) == pytest.approx(low, rel=0.05)
    # Exactly binomial at the predicted mean: as concentrated as the range allows.
    assert fit_concentration([0.5] * 1000, [2] * 1000, [4] * 1000) > 0.5 * high
    with pytest.raises(ValueError, match="successes"):
        fit_concentration([0.5], [3], [2])
    with pytest.raises(ValueError, match="1-D"):
        fit_concentration([0.5, 0.5], [1], [2])
