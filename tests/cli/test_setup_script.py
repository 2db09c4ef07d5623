"""`scripts/setup`, against a stand-in `.venv/bin/python` that records what pip is asked: torch==2.13.0
first exactly as CI installs it, `TORCH_INDEX_URL` choosing another index, an installed torch kept; the
extras a job asks for; nothing done again when they are installed from the same pyproject.toml."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SETUP = ROOT / "scripts" / "setup"

#: Records its arguments; `pip show torch` succeeds only when TORCH_INSTALLED is set.
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$*" >> "$(dirname "$0")/calls"
if [ "$*" = "-m pip show torch" ] && [ -z "${TORCH_INSTALLED:-}" ]; then exit 1; fi
"""


def pip_calls(tmp_path: Path, *arguments: str, **environment: str) -> list[str]:
    if not (tmp_path / "scripts").exists():
        (tmp_path / "scripts").mkdir()
        shutil.copy(SETUP, tmp_path / "scripts" / "setup")
        shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
        python = tmp_path / ".venv" / "bin" / "python"
        python.parent.mkdir(parents=True)
        python.write_text(FAKE_PYTHON)
        python.chmod(0o755)
    calls = tmp_path / ".venv" / "bin" / "calls"
    calls.unlink(missing_ok=True)
    inherited = {key: value for key, value in os.environ.items() if key != "TORCH_INDEX_URL"}
    subprocess.run([tmp_path / "scripts" / "setup", *arguments], env={**inherited, **environment}, check=True)
    return calls.read_text().splitlines() if calls.exists() else []


#: How the project's own install starts (its extras and constraints may change).
PROJECT_INSTALL = "-m pip install --quiet --disable-pip-version-check -e .["


def torch_installs(calls: list[str]) -> list[str]:
    """The torch installs, checked to come before the project's own install."""
    installs = [call for call in calls if call.endswith("torch==2.13.0")]
    project = next(index for index, call in enumerate(calls) if call.startswith(PROJECT_INSTALL))
    assert all(calls.index(install) < project for install in installs)
    return installs


def test_by_default_torch_2_13_0_goes_first_from_the_configured_index(tmp_path: Path) -> None:
    calls = pip_calls(tmp_path)
    assert calls[:2] == [
        "-m pip install --quiet --disable-pip-version-check --upgrade pip",
        "-m pip show torch",
    ]
    assert torch_installs(calls) == ["-m pip install --quiet torch==2.13.0"]


@pytest.mark.parametrize("index", ["https://download.pytorch.org/whl/cpu", "http://mirror.test/whl cpu"])
def test_torch_index_url_chooses_where_torch_comes_from(tmp_path: Path, index: str) -> None:
    calls = pip_calls(tmp_path, TORCH_INDEX_URL=index)
    assert torch_installs(calls) == [f"-m pip install --quiet --index-url {index} torch==2.13.0"]
    assert not any("--index-url" in call for call in calls if call.startswith(PROJECT_INSTALL))


def test_an_installed_torch_is_kept(tmp_path: Path) -> None:
    calls = pip_calls(tmp_path, TORCH_INSTALLED="1", TORCH_INDEX_URL="https://download.pytorch.org/whl/cpu")
    assert not any("torch==" in call for call in calls)


def test_a_job_installs_the_extras_it_names(tmp_path: Path) -> None:
    assert any(call.startswith(f"{PROJECT_INSTALL}dev,verl]") for call in pip_calls(tmp_path))
    assert any(call.startswith(f"{PROJECT_INSTALL}demo]") for call in pip_calls(tmp_path, "demo"))


def test_nothing_is_installed_again_from_the_same_pyproject(tmp_path: Path) -> None:
    pip_calls(tmp_path, "demo")
    stamp = tmp_path / ".venv" / ".trace-rollout-setup"
    project = stamp.read_text().split()[0]
    stamp.write_text(f"{project} bench,demo,service,sim\n")  # what the real closure of demo is
    assert pip_calls(tmp_path, "demo") == []
    assert pip_calls(tmp_path, "sim") == []
    assert pip_calls(tmp_path, "verl") != []  # an extra not installed yet
    (tmp_path / "pyproject.toml").write_text((tmp_path / "pyproject.toml").read_text() + "\n# changed\n")
    assert pip_calls(tmp_path, "demo") != []  # another pyproject.toml
