"""Turns (or rollouts) to reach a target success: the first crossing, linear between steps."""

from __future__ import annotations

import pytest

from bench.learning import cost_to_reach

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
