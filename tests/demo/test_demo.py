"""`trace-rollout demo`: a tiny end-to-end run in process, the CLI against a running service, the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from support import LiveService, make_settings

from trace_client.demo import run as demo
from trace_proto import JobStats, Policy, PredictorInfo, StepStats
from trace_service import cli


def test_a_tiny_demo_compares_both_policies_and_writes_its_files(tmp_path: Path) -> None:
    text: list[str] = []
    config = demo.DemoConfig(
        steps=2, pool=10, budget=20, prompts=40, concurrency=64, out=tmp_path, train_wait=0.5
    )
    report = demo.run(config, write=text.append)
    assert [run.policy for run in report.runs] == [Policy.TRACE, Policy.UNIFORM]
    for run in report.runs:
        assert [step.step for step in run.stats.steps] == [0, 1]
        for step in run.stats.steps:
            assert step.active + step.skipped == 10
            assert step.rollouts_spent == step.budget_promised <= 20
            assert step.continuations_spent == step.continuations_promised
    assert report.runs[0].predictor is not None and report.runs[1].predictor is None
    output = "".join(text)
    assert "eff. ratio" in output and "\ntrace " in output and "\nuniform " in output
    results = json.loads((tmp_path / "results.json").read_text())
    assert [run["policy"] for run in results["runs"]] == ["trace", "uniform"]
    assert len(results["runs"][0]["steps"]) == 2
    assert (tmp_path / "effective_ratio.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_cli_demo_drives_a_running_service(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(train_interval_seconds=60.0, sweep_interval_seconds=60.0)
    with LiveService(settings) as live:
        code = cli.main(
            [
                "demo", "--url", live.url, "--steps", "1", "--pool", "6", "--budget", "12", "--prompts", "24",
                "--policies", "uniform", "--out", str(tmp_path), "--quiet",
            ]
        )  # fmt: skip
    assert code == 0
    output = capsys.readouterr().out
    assert f"against {live.url}" in output
    assert "\nuniform " in output
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["steps"][0]["prompts"] == 6


def _step(step: int, active: int, mixed: int, skipped: int) -> StepStats:
    return StepStats(
        step=step, prompts=active + skipped, active=active, skipped=skipped, trees_complete=active,
        mixed=mixed, budget_promised=8, rollouts_spent=8, continuations_promised=4, continuations_spent=4,
        fallback_units=0,
    )  # fmt: skip


def test_the_table_pools_the_effective_ratio_over_steps() -> None:
    config = demo.DemoConfig(steps=2, pool=4, budget=8, policies=(Policy.TRACE, Policy.UNIFORM))
    info = PredictorInfo(version=3, examples_seen=10, brier=0.125, spearman=0.5, device="cpu")
    trace = demo.PolicyRun(
        Policy.TRACE, "a", JobStats(job="a", steps=[_step(0, 2, 1, 2), _step(1, 3, 3, 1)]), [0, 2], info, 1.0
    )
    uniform = demo.PolicyRun(
        Policy.UNIFORM,
        "b",
        JobStats(job="b", steps=[_step(0, 4, 1, 0), _step(1, 4, 2, 0)]),
        [0, 0],
        None,
        1.0,
    )
    lines = demo.comparison_table(demo.DemoReport(config, [trace, uniform])).splitlines()
    assert lines[1].split() == [
        "trace",
        "0.800",
        "1.000",
        "4",
        "5",
        "3",
        "16",
        "8",
        "24",
        "v2→v3",
        "0.125",
        "0.500",
    ]
    assert lines[2].split() == ["uniform", "0.375", "0.500", "3", "8", "0", "16", "8", "24", "—", "—", "—"]
    assert lines[5].split() == ["0", "0.500", "0.250"]


@pytest.mark.parametrize(
    ("knobs", "message"),
    [
        ({"steps": 0}, "steps must be at least 1"),
        ({"pool": 50, "prompts": 40}, "pool"),
        ({"expansion": -1.0}, "expansion"),
        ({"policies": ()}, "policies"),
        ({"step_timeout": 0.0}, "step_timeout"),
    ],
)
def test_demo_config_rejects_impossible_settings(knobs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        demo.DemoConfig(**knobs)  # type: ignore[arg-type]
