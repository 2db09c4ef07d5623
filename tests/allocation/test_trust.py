"""The trust map: its fit against a brute-force maximum of the same objective, and what it says of a
predictor with skill, without skill, and before any evidence."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_proto import Policy
from trace_service.allocation import POLICIES, RootInputs, uniform_roots
from trace_service.allocation.gain import Z_90
from trace_service.allocation.trust import Trust, control_calibration, fit_trust, trust_objective


def _logit(v: np.ndarray) -> np.ndarray:
    v = np.clip(v, 1e-4, 1 - 1e-4)
    return np.log(v / (1 - v))


@st.composite
def control_groups(draw: st.DrawFn) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    size = draw(st.integers(1, 30))
    v = np.array(draw(st.lists(st.floats(0.01, 0.99), min_size=size, max_size=size)))
    trials = np.array(draw(st.lists(st.integers(1, 6), min_size=size, max_size=size)))
    successes = np.array([draw(st.integers(0, int(n))) for n in trials])
    return v, successes, trials


@settings(max_examples=150, deadline=None)
@given(control_groups())
def test_the_fit_is_the_objectives_maximum(groups: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
    """No point of a fine grid over (a, b ≥ 0) beats the fitted map, at the dispersion it settled on."""
    v, s, n = groups
    trust = fit_trust(v, s, n)
    x = _logit(v) - trust.center
    best = trust_objective(trust.intercept, trust.fitted_slope, x, s, n, trust.dispersion)
    for a in np.linspace(trust.intercept - 2, trust.intercept + 2, 41):
        for b in np.linspace(0.0, trust.fitted_slope + 2, 41):
            assert trust_objective(a, b, x, s, n, trust.dispersion) <= best + 1e-7
    assert trust.dispersion >= 1.0 and trust.groups == v.size
    assert trust.slope == max(trust.fitted_slope - Z_90 * trust.slope_error, 0.0)


@settings(max_examples=60, deadline=None)
@given(control_groups())
def test_the_slope_error_is_the_curvature_of_the_objective(
    groups: tuple[np.ndarray, np.ndarray, np.ndarray],
) -> None:
    """σ_b² is the slope's entry of the inverse negative Hessian: checked by finite differences."""
    v, s, n = groups
    trust = fit_trust(v, s, n)
    x = _logit(v) - trust.center
    a, b, h = trust.intercept, trust.fitted_slope, 1e-4

    def f(da: float, db: float) -> float:
        return trust_objective(a + da, b + db, x, s, n, trust.dispersion)

    aa = (f(h, 0) - 2 * f(0, 0) + f(-h, 0)) / h**2
    bb = (f(0, h) - 2 * f(0, 0) + f(0, -h)) / h**2
    ab = (f(h, h) - f(h, -h) - f(-h, h) + f(-h, -h)) / (4 * h**2)
    variance = np.linalg.inv(-np.array([[aa, ab], [ab, bb]]))[1, 1]
    assert trust.slope_error == pytest.approx(np.sqrt(variance), rel=1e-3)


def _groups(rng: np.random.Generator, truth: np.ndarray, predicted: np.ndarray) -> Trust:
    trials = np.full(truth.size, 2)
    return fit_trust(predicted, rng.binomial(trials, truth), trials)


def test_skill_is_trusted_and_its_absence_is_not() -> None:
    rng = np.random.default_rng(0)
    logits = rng.normal(0.0, 2.0, 600)
    truth = 1 / (1 + np.exp(-logits))
    skilled = _groups(rng, truth, truth)
    assert skilled.fitted_slope == pytest.approx(1.0, abs=0.2) and 0.6 < skilled.slope < skilled.fitted_slope
    assert _groups(rng, truth, rng.permutation(truth)).fitted_slope < 0.2
    overconfident = 1 / (1 + np.exp(-2.5 * logits))  # predictions 2.5× as far out as the truth
    assert _groups(rng, truth, overconfident).fitted_slope == pytest.approx(0.4, abs=0.12)


def test_a_predictor_without_skill_gives_uniforms_counts_on_most_jobs() -> None:
    """Stage 1 ties groups of 2 and 3, so the slightest spread of v' would skip prompts: the bound keeps
    a predictor whose predictions say nothing of the outcomes at uniform's allocation, whatever the
    noise of its few control groups, on at least 8 of 10 jobs (the bound is 90%, one-sided: 95%)."""
    uniform = 0
    for seed in range(10):
        rng = np.random.default_rng(seed)
        groups = int(rng.integers(10, 200))
        truth = 1 / (1 + np.exp(-rng.normal(0.3, 1.5, groups)))
        predicted = 1 / (1 + np.exp(-rng.normal(0.0, 1.5, groups)))
        trust = _groups(rng, truth, predicted)
        read = trust.apply(1 / (1 + np.exp(-rng.normal(0.0, 1.5, 64))))
        counts = POLICIES[Policy.TRACE].roots.counts(RootInputs(n_prompts=64, budget=128, predicted=read))
        uniform += bool(np.array_equal(counts, uniform_roots(64, 128)))
    assert uniform >= 8


def test_no_evidence_makes_every_prompt_alike_and_stage1_uniform() -> None:
    """Before any control group the map is flat: TRACE's Stage 1 then gives uniform's counts."""
    trust = fit_trust([], [], [])
    v = np.random.default_rng(1).random(40)
    read = trust.apply(v)
    assert np.ptp(read) == 0.0
    counts = POLICIES[Policy.TRACE].roots.counts(RootInputs(n_prompts=40, budget=120, predicted=read))
    np.testing.assert_array_equal(counts, uniform_roots(40, 120))


def test_the_map_keeps_order_and_bounds() -> None:
    trust = Trust(intercept=0.3, slope=0.5, center=-0.2, groups=10)
    v = np.linspace(0.0, 1.0, 11)
    read = trust.apply(v)
    assert np.all(np.diff(read) > 0) and np.all((read > 0) & (read < 1))


def test_bad_groups_are_refused() -> None:
    with pytest.raises(ValueError, match="successes"):
        fit_trust([0.5], [3], [2])
    with pytest.raises(ValueError, match="one length"):
        fit_trust([0.5, 0.2], [1], [2])


def test_calibration_on_control_groups() -> None:
    measured = control_calibration([0.9, 0.1], [2, 0], [2, 2])
    assert measured.brier == pytest.approx(0.01)
    assert measured.brier_constant == pytest.approx(0.25)
    assert measured.skill == pytest.approx(0.96)
    assert control_calibration([], [], []).brier is None
