"""The ablation arms bench/learning.py builds from a name: another tree advantage, a pilot wave, the
shape's draw off."""

from __future__ import annotations

import pytest

from bench.learning import parse_args
from bench.learning_arms import (
    FIXED_SHAPE_SUFFIX,
    ORACLE,
    PILOT_SUFFIX,
    UNIFORM,
    Arm,
    build_arms,
    variant_arm,
)
from trace_proto import Policy


@pytest.fixture
def known() -> dict[str, Arm]:
    return {arm.name: arm for arm in build_arms(256, 1.0)}


def test_an_advantage_variant_keeps_the_arms_rules(known: dict[str, Arm]) -> None:
    arm = variant_arm("trace@global", known, 0.5)
    assert arm is not None
    assert (arm.policy, arm.budget, arm.expansion, arm.advantage, arm.pilot) == (
        Policy.TRACE,
        256,
        1.0,
        "global",
        0.0,
    )


def test_a_pilot_arm_spends_its_share_first_and_may_name_an_advantage(known: dict[str, Arm]) -> None:
    piloted = variant_arm(f"trace{PILOT_SUFFIX}", known, 0.25)
    both = variant_arm(f"trace@local{PILOT_SUFFIX}", known, 0.5)
    assert piloted is not None and (piloted.pilot, piloted.advantage) == (0.25, "service")
    assert both is not None and (both.pilot, both.advantage) == (0.5, "local")


def test_a_fixed_shape_arm_keeps_its_other_marks(known: dict[str, Arm]) -> None:
    fixed = variant_arm(f"trace{FIXED_SHAPE_SUFFIX}", known, 0.5)
    all_marks = variant_arm(f"trace@local{PILOT_SUFFIX}{FIXED_SHAPE_SUFFIX}~0.2", known, 0.5)
    assert fixed is not None and not fixed.shape_from_evidence and fixed.control_share == Arm.control_share
    assert all_marks is not None and not all_marks.shape_from_evidence
    assert (all_marks.advantage, all_marks.pilot, all_marks.control_share) == ("local", 0.5, 0.2)
    assert known["trace"].shape_from_evidence


@pytest.mark.parametrize(
    "name",
    [
        "nope",
        f"{ORACLE}{FIXED_SHAPE_SUFFIX}",
        f"trace{FIXED_SHAPE_SUFFIX}{PILOT_SUFFIX}",
        "trace@nope",
        f"{UNIFORM}@global",  # uniform's groups are flat: its baseline is the group's
        f"{UNIFORM}{PILOT_SUFFIX}",
        f"{ORACLE}{PILOT_SUFFIX}",  # the oracle runs in process, not through the service
        f"trace{PILOT_SUFFIX}@global",
    ],
)
def test_names_that_name_no_arm(known: dict[str, Arm], name: str) -> None:
    assert variant_arm(name, known, 0.5) is None


def test_the_command_line_refuses_an_unknown_arm(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse_args(["--arms", f"trace{PILOT_SUFFIX}@global"])
    assert "unknown arms" in capsys.readouterr().err


def test_the_command_line_builds_the_pilot_arm_at_its_share() -> None:
    args = parse_args(["--arms", f"trace,trace{PILOT_SUFFIX}", "--pilot-share", "0.3"])
    assert [(arm.name, arm.pilot) for arm in args.arm_list] == [
        (UNIFORM, 0.0),
        ("trace", 0.0),
        (f"trace{PILOT_SUFFIX}", 0.3),
    ]


@pytest.mark.parametrize(
    ("share", "waves"), [(0.0, [256]), (0.25, [64, 192]), (0.5, [128, 128]), (1.0, [256])]
)
def test_a_step_spends_the_arms_whole_budget_over_its_waves(
    known: dict[str, Arm], share: float, waves: list[int]
) -> None:
    arm = variant_arm(f"trace{PILOT_SUFFIX}", known, share)
    assert arm is not None and arm.waves == waves
