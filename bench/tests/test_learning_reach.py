"""Turns (or rollouts) to reach a target success, the success at a cost, and the equal-compute horizon."""

from __future__ import annotations

import argparse

import pytest

from bench.learning import HORIZONS, takes_step
from bench.learning_report import Curve, cost_to_reach, success_at

COSTS = [0, 100, 250, 400]


def test_interpolates_linearly_within_the_crossing_step() -> None:
    assert cost_to_reach(COSTS, [0.2, 0.3, 0.5, 0.6], 0.4) == pytest.approx(175.0)


def test_a_point_on_the_curve_is_reached_at_its_cost() -> None:
    assert cost_to_reach(COSTS, [0.2, 0.3, 0.5, 0.6], 0.5) == pytest.approx(250.0)


def test_the_first_crossing_counts_even_if_the_curve_falls_back() -> None:
    assert cost_to_reach(COSTS, [0.2, 0.6, 0.3, 0.7], 0.4) == pytest.approx(50.0)


def test_a_target_at_or_below_the_start_costs_nothing() -> None:
    assert cost_to_reach(COSTS, [0.5, 0.6, 0.7, 0.8], 0.5) == 0.0


def test_never_reached_is_none() -> None:
    assert cost_to_reach(COSTS, [0.2, 0.3, 0.35, 0.38], 0.4) is None


def test_success_at_a_cost_is_linear_between_steps_and_the_last_point_past_the_end() -> None:
    assert success_at(COSTS, [0.2, 0.3, 0.5, 0.6], 175.0) == pytest.approx(0.4)
    assert success_at(COSTS, [0.2, 0.3, 0.5, 0.6], 400.0) == pytest.approx(0.6)
    assert success_at(COSTS, [0.2, 0.3, 0.5, 0.6], 900.0) == pytest.approx(0.6)


def _curve(turns: list[int]) -> Curve:
    return Curve(turns=turns)


@pytest.mark.parametrize("horizon", HORIZONS)
def test_every_arm_takes_the_first_steps(horizon: str) -> None:
    args = argparse.Namespace(steps=3, horizon=horizon)
    uniform, short = _curve([0, 100, 200]), _curve([0, 50, 100])
    assert all(takes_step(curve, uniform, step, args) for curve in (uniform, short) for step in range(3))


def test_under_the_turns_horizon_an_arm_steps_on_until_it_has_uniforms_turns() -> None:
    args = argparse.Namespace(steps=2, horizon="turns")
    uniform = _curve([0, 100, 200])
    assert takes_step(_curve([0, 70, 140]), uniform, 2, args)
    assert takes_step(_curve([0, 70, 140, 199]), uniform, 3, args)
    assert not takes_step(_curve([0, 70, 140, 210]), uniform, 3, args)
    assert not takes_step(uniform, uniform, 2, args)
    assert not takes_step(_curve([0, 10, 20, 30, 40]), uniform, 4, args)  # at most twice the steps


def test_under_the_steps_horizon_every_arm_stops_after_the_steps() -> None:
    args = argparse.Namespace(steps=2, horizon="steps")
    assert not takes_step(_curve([0, 70, 140]), _curve([0, 100, 200]), 2, args)
