"""`trace-rollout-demo`: a tiny end-to-end run in process, the command against a running service (one-line
errors, `--json`, help texts), `python -m trace_lab.demo`, and the table."""

from __future__ import annotations

import argparse
import json
import socket
import subprocess
import sys
import textwrap
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from support import make_settings

from trace_lab.demo import cli, loop
from trace_lab.demo.config import DemoConfig
from trace_lab.demo.report import DemoReport, PolicyRun, comparison_table
from trace_lab.local import ThreadedService
from trace_proto import JobStats, Policy, PredictorInfo, StepStats

TINY_DEMO = ["--steps", "1", "--pool", "6", "--budget", "12", "--prompts", "24", "--policies", "uniform"]


def error_lines(captured: str) -> list[str]:
    return [line for line in captured.splitlines() if ": error: " in line]


def test_a_tiny_demo_compares_both_policies_and_writes_its_files(tmp_path: Path) -> None:
    text: list[str] = []
    config = DemoConfig(steps=2, pool=10, budget=20, prompts=40, concurrency=64, out=tmp_path, train_wait=0.5)
    report = loop.run(config, write=text.append)
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
    assert "The headline is `mixed`" in output
    assert "only 2 step(s): the predictor trains on each step's finished trees" in output
    results = json.loads((tmp_path / "results.json").read_text())
    assert [run["policy"] for run in results["runs"]] == ["trace", "uniform"]
    assert len(results["runs"][0]["steps"]) == 2
    assert (tmp_path / "mixed_per_step.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_command_drives_a_running_service(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    settings = make_settings(train_interval_seconds=60.0, sweep_interval_seconds=60.0)
    with ThreadedService.from_settings(settings) as live:
        url = live.url
        code = cli.main(
            [
                "--url", url, "--steps", "1", "--pool", "6", "--budget", "12", "--prompts", "24",
                "--policies", "uniform", "--out", str(tmp_path), "--quiet",
            ]
        )  # fmt: skip
    assert code == 0
    output = capsys.readouterr().out
    assert f"against {url}" in output
    assert "\nuniform " in output
    assert json.loads((tmp_path / "results.json").read_text())["runs"][0]["steps"][0]["prompts"] == 6


def _step(step: int, active: int, mixed: int, skipped: int) -> StepStats:
    return StepStats(
        step=step, prompts=active + skipped, active=active, skipped=skipped, trees_complete=active,
        mixed=mixed, budget_promised=8, rollouts_spent=8, continuations_promised=4, continuations_spent=4,
        fallback_units=0,
    )  # fmt: skip


def test_the_table_pools_the_effective_ratio_over_steps() -> None:
    config = DemoConfig(steps=2, pool=4, budget=8, policies=(Policy.TRACE, Policy.UNIFORM))
    info = PredictorInfo(version=3, examples_seen=10, brier=0.125, spearman=0.5, device="cpu")
    trace = PolicyRun(
        Policy.TRACE, "a", JobStats(job="a", steps=[_step(0, 2, 1, 2), _step(1, 3, 3, 1)]), [0, 2], info, 1.0
    )
    uniform = PolicyRun(
        Policy.UNIFORM,
        "b",
        JobStats(job="b", steps=[_step(0, 4, 1, 0), _step(1, 4, 2, 0)]),
        [0, 0],
        None,
        1.0,
    )
    lines = comparison_table(DemoReport(config, [trace, uniform])).splitlines()
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
        DemoConfig(**knobs)  # type: ignore[arg-type]


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])  # closed again on return: connections are refused


def test_an_unreachable_service_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    url = f"http://127.0.0.1:{closed_port()}"
    assert cli.main(["--url", url, "--quiet", "--out", str(tmp_path), *TINY_DEMO]) == 1
    captured = capsys.readouterr()
    assert "Traceback" not in captured.err
    (line,) = captured.err.splitlines()
    assert line.startswith(
        f"trace-rollout-demo: error: the service at {url} is unreachable: GET {url}/healthz"
    )
    assert line.endswith("(after 4 attempts)")
    assert not (tmp_path / "results.json").exists()


def test_a_service_that_refuses_the_demo_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRACE_TOKEN", raising=False)
    with ThreadedService.from_settings(make_settings(auth_tokens="s3cret")) as live:
        url = live.url
        code = cli.main(["--url", url, "--quiet", "--out", str(tmp_path), *TINY_DEMO])
    assert code == 1
    (line,) = error_lines(capsys.readouterr().err)
    assert line.startswith(f"trace-rollout-demo: error: the service at {url} answered 401 Unauthorized")


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--url", "trace:8000"], "argument --url: not an http(s) URL: 'trace:8000'"),
        (
            ["--policies", "trace,foo"],
            "argument --policies: unknown policy 'foo'; the policies are trace, uniform, dapo, greso, pcl, "
            "knapsack, treepo, trace_root, trace_prefix, trace_paper, trace_joint, trace_shared",
        ),
        (["--steps", "0"], "steps must be at least 1, got 0"),
        (["--pool", "50", "--prompts", "40"], "pool (50) cannot exceed the simulated prompts (40)"),
    ],
)
def test_bad_options_are_usage_errors(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    try:
        code = cli.main(arguments)
    except SystemExit as exited:  # argparse's own checks exit; the configuration's return
        code = int(str(exited.code))
    assert code == 2
    assert capsys.readouterr().err.splitlines() == [f"trace-rollout-demo: error: {message}"]


def test_json_prints_the_results_on_stdout_with_the_token_from_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRACE_TOKEN", "s3cret")
    settings = make_settings(auth_tokens="s3cret", train_interval_seconds=60.0, sweep_interval_seconds=60.0)
    with ThreadedService.from_settings(settings) as live:
        url = live.url
        code = cli.main(["--url", url, "--json", "--out", str(tmp_path), *TINY_DEMO])
    assert code == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    (run,) = document["runs"]
    assert run["policy"] == "uniform"
    assert run["budget_spent"] == run["rollouts_spent"] + run["continuations_spent"] > 0
    assert run["active"] + run["skipped"] == 6
    assert run["steps"][0]["prompts"] == 6
    assert document == json.loads((tmp_path / "results.json").read_text())
    assert "eff. ratio" in captured.err and f"against {url}" in captured.err


def shown(default: object) -> str:
    """A default as the help texts write it."""
    if isinstance(default, tuple):
        return ",".join(str(getattr(item, "value", item)) for item in default)
    return f"{default:g}" if isinstance(default, float) else str(default)


def test_every_option_has_help_and_shows_its_default() -> None:
    options = [action for action in cli.build_parser()._actions if action.option_strings]
    for action in options:
        if isinstance(action, argparse._HelpAction):
            continue
        assert action.help, f"{action.option_strings[0]} has no help"
        if action.default not in (None, False):
            assert f"({shown(action.default)})" in action.help, (
                f"{action.option_strings[0]} does not show its default {action.default!r}"
            )


def test_python_m_runs_the_command() -> None:
    """`python -m trace_lab.demo` is the same command (here its help, plain text under 100 columns)."""
    done = subprocess.run(
        [sys.executable, "-m", "trace_lab.demo", "--help"], capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: trace-rollout-demo ")
    assert "``" not in done.stdout
    assert max(map(len, done.stdout.splitlines())) <= 100


def test_the_console_script_is_the_command() -> None:
    (script,) = entry_points(group="console_scripts", name="trace-rollout-demo")
    assert script.load() is cli.main


def test_without_the_service_extra_the_in_process_demo_is_one_line(tmp_path: Path) -> None:
    """A `sim`-only install (fastapi refused, as there) gets the extra to install, not a traceback."""
    refuse_fastapi = textwrap.dedent(
        """
        import sys

        class RefuseFastapi:
            def find_spec(self, name, path=None, target=None):
                if name.split(".")[0] == "fastapi":
                    raise ModuleNotFoundError(f"No module named {name!r}", name=name)
                return None

        sys.meta_path.insert(0, RefuseFastapi())
        from trace_lab.demo.cli import main

        sys.exit(main(sys.argv[1:]))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", refuse_fastapi, "--quiet", "--out", str(tmp_path), *TINY_DEMO],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert done.stderr == (
        "trace-rollout-demo: error: the in-process service needs the `service` extra (fastapi is not "
        "installed): pip install 'trace-rollout[demo]', or drive a running service with --url\n"
    )
