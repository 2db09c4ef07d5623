"""`trace-rollout`: version, help texts, exit statuses and one-line errors, settings validation at start,
and docs/operations.md's command table against the parsers (the service's and the demo's)."""

from __future__ import annotations

import argparse
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from pydantic import ValidationError

from trace_lab.demo import cli as demo_cli
from trace_service import __version__, cli
from trace_service.logs import JsonFormatter
from trace_service.settings import Settings

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    (commands,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    return dict(commands.choices)


def options_of(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [action for action in parser._actions if action.option_strings and action.dest != "help"]


def error_lines(captured: str) -> list[str]:
    return [line for line in captured.splitlines() if ": error: " in line]


@pytest.fixture
def no_server(monkeypatch: pytest.MonkeyPatch) -> list[dict[str, Any]]:
    """`uvicorn.run` replaced by a recorder of its keyword arguments."""
    import uvicorn

    calls: list[dict[str, Any]] = []
    monkeypatch.setattr(uvicorn, "run", lambda app, **options: calls.append(options))
    return calls


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out == f"trace-rollout {__version__}\n"


@pytest.mark.parametrize("command", [[], ["serve"], ["openapi"]])
def test_help_is_plain_text(command: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([*command, "--help"])
    assert exited.value.code == 0
    text = capsys.readouterr().out
    assert "``" not in text
    assert "usage: trace-rollout" in text
    assert max(map(len, text.splitlines())) <= 100


def shown(default: object) -> str:
    """A default as the help texts write it."""
    if isinstance(default, tuple):
        return ",".join(str(getattr(item, "value", item)) for item in default)
    return f"{default:g}" if isinstance(default, float) else str(default)


@pytest.mark.parametrize("name", ["serve", "openapi"])
def test_every_option_has_help_and_shows_its_default(name: str) -> None:
    for action in options_of(subcommands()[name]):
        assert action.help, f"{name} {action.option_strings[0]} has no help"
        if action.default not in (None, False):
            assert f"({shown(action.default)})" in action.help, (
                f"{name} {action.option_strings[0]} does not show its default {action.default!r}"
            )


def test_serve_help_lists_every_setting_with_its_variable(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        cli.main(["serve", "--help"])
    text = capsys.readouterr().out
    for name in Settings.model_fields:
        assert f"TRACE_{name.upper()}:" in text


def test_no_command_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main([])
    assert exited.value.code == 2
    assert "the following arguments are required: COMMAND" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("port", "message"),
    [
        ("80000", "argument --port: 80000 is not a port number (1-65535)"),
        ("0", "argument --port: 0 is not a port number (1-65535)"),
        ("http", "argument --port: not a port number: 'http'"),
    ],
)
def test_serve_rejects_a_port_out_of_range(
    port: str, message: str, no_server: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        cli.main(["serve", "--port", port])
    assert exited.value.code == 2
    assert error_lines(capsys.readouterr().err) == [f"trace-rollout serve: error: {message}"]
    assert no_server == []


def test_an_invalid_setting_stops_the_start_with_one_line_naming_it(
    monkeypatch: pytest.MonkeyPatch, no_server: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRACE_LEASE_SECONDS", "-120")
    assert cli.main(["serve"]) == 2
    captured = capsys.readouterr()
    assert captured.err == (
        "trace-rollout serve: error: invalid setting TRACE_LEASE_SECONDS: Input should be greater than 0\n"
    )
    assert "-120" not in captured.err  # values are not repeated: some carry secrets
    assert no_server == []


def test_several_invalid_settings_are_named_on_one_line(
    monkeypatch: pytest.MonkeyPatch, no_server: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRACE_METRICS_PORT", "70000")
    monkeypatch.setenv("TRACE_LOG_FORMAT", "xml")
    assert cli.main(["serve"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trace-rollout serve: error: invalid settings TRACE_LOG_FORMAT: ")
    assert "; TRACE_METRICS_PORT: Input should be less than or equal to 65535" in line


@pytest.mark.parametrize(
    ("device", "problem"), [("abacus", "unknown device"), ("cuda:0", "CUDA is not available")]
)
def test_an_unusable_predictor_device_stops_the_start_with_one_line(
    device: str,
    problem: str,
    monkeypatch: pytest.MonkeyPatch,
    no_server: list[dict[str, Any]],
    capsys: pytest.CaptureFixture[str],
) -> None:
    if problem == "CUDA is not available" and torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    monkeypatch.setenv("TRACE_PREDICTOR_DEVICE", device)
    assert cli.main(["serve"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trace-rollout serve: error: invalid setting TRACE_PREDICTOR_DEVICE: ")
    assert problem in line
    assert no_server == []


def test_a_setting_given_as_a_flag_is_named_by_its_flag() -> None:
    with pytest.raises(ValidationError) as raised:
        Settings(lease_seconds=0)
    error = cli.settings_error(raised.value, {"lease_seconds": "--lease"})
    assert (str(error), error.status) == ("invalid setting --lease: Input should be greater than 0", 2)


@pytest.mark.parametrize(("given", "level"), [("debug", "DEBUG"), ("Warning", "WARNING"), ("ERROR", "ERROR")])
def test_the_log_level_takes_any_case(given: str, level: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACE_LOG_LEVEL", given)
    assert Settings().log_level == level


def test_serve_hands_uvicorn_its_address_and_the_log_configuration(
    monkeypatch: pytest.MonkeyPatch, no_server: list[dict[str, Any]]
) -> None:
    monkeypatch.setenv("TRACE_LOG_FORMAT", "json")
    monkeypatch.setenv("TRACE_LOG_LEVEL", "warning")
    assert cli.main(["serve", "--host", "0.0.0.0", "--port", "8123"]) == 0
    (options,) = no_server
    assert (options["host"], options["port"]) == ("0.0.0.0", 8123)
    config = options["log_config"]
    assert config["formatters"]["service"] == {"()": JsonFormatter}
    assert config["root"]["level"] == "WARNING"


def test_openapi_check_of_a_stale_document_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    stale = tmp_path / "openapi.json"
    stale.write_text("{}\n")
    assert cli.main(["openapi", "--check", "--out", str(stale)]) == 1
    assert capsys.readouterr().err == (
        f"trace-rollout openapi: error: {stale} is out of date: run `trace-rollout openapi`\n"
    )


def documented_commands() -> dict[str, tuple[str, list[str]]]:
    """docs/operations.md's command table: command line -> (what it does, options)."""
    section = OPERATIONS.read_text().split("## Command line", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| `([\w -]+)` \| (.+?) \| (.+?) \|$", section, flags=re.MULTILINE)
    return {name: (summary, re.findall(r"`(--[\w-]+)`", options)) for name, summary, options in rows}


def test_the_documented_command_table_matches_the_parsers() -> None:
    parser = cli.build_parser()
    (commands,) = (action for action in parser._actions if isinstance(action, argparse._SubParsersAction))
    summaries = {choice.dest: choice.help for choice in commands._choices_actions}
    expected = {
        f"trace-rollout {name}": (summaries[name], [action.option_strings[0] for action in options_of(sub)])
        for name, sub in subcommands().items()
    }
    demo = demo_cli.build_parser()
    expected[demo.prog] = (demo_cli.SUMMARY, [action.option_strings[0] for action in options_of(demo)])
    assert documented_commands() == expected


def test_a_store_that_does_not_answer_stops_the_start_with_one_line(
    monkeypatch: pytest.MonkeyPatch, no_server: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRACE_STORE_CONNECT_SECONDS", "0.5")
    assert cli.main(["serve", "--store-url", "redis://user:s3cret@127.0.0.1:1/0"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(
        "trace-rollout serve: error: the store at redis://user:***@127.0.0.1:1/0 did not answer within 0.5 s"
    )
    assert "s3cret" not in line
    assert no_server == []


def test_a_store_url_that_names_no_store_stops_the_start_with_one_line(
    no_server: list[dict[str, Any]], capsys: pytest.CaptureFixture[str]
) -> None:
    assert cli.main(["serve", "--store-url", "http://localhost:6379"]) == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("trace-rollout serve: error: invalid store URL 'http://localhost:6379': ")
    assert no_server == []
