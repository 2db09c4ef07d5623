"""What a trainer installs is only a client: the base install pulls neither numpy nor torch, and the
modules a trainer's workers import load nothing of the service, the lab or the numeric stack."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
#: What a trainer imports: the clients, the worker driver, the environment layer, the errors and every
#: adapter.
TRAINER_MODULES = [
    "trace_client",
    "trace_client.client",
    "trace_client.driver",
    "trace_client.envs",
    "trace_client.errors",
]
#: opentelemetry: tracing is opt-in (`instrument_tracing`) and imports it only when called.
FORBIDDEN = {
    "trace_service",
    "trace_lab",
    "numpy",
    "torch",
    "fastapi",
    "redis",
    "uvicorn",
    "opentelemetry",
    # the trainer integrations import their framework; only `trace_client.integrations.<framework>` does
    "trl",
    "transformers",
    "verl",
    # the environment adapters import their package when one is made
    "gem",
    "gymnasium",
}


def test_the_base_install_is_pydantic_and_httpx() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    names = {
        requirement.split(">")[0].split("<")[0].split("=")[0].strip()
        for requirement in project["dependencies"]
    }
    assert names == {"pydantic", "httpx"}


def test_the_trainer_side_imports_nothing_of_the_service_or_the_lab() -> None:
    script = f"""
import importlib, json, pkgutil, sys
for name in {TRAINER_MODULES!r}:
    importlib.import_module(name)
import trace_client.adapters as adapters
for module in pkgutil.walk_packages(adapters.__path__, "trace_client.adapters."):
    importlib.import_module(module.name)
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}})))
"""
    loaded = json.loads(
        subprocess.run([sys.executable, "-c", script], check=True, capture_output=True, text=True).stdout
    )
    assert "trace_client" in loaded
    assert not FORBIDDEN & set(loaded)


def test_no_client_module_imports_the_service_or_the_lab() -> None:
    """The integrations too: the lab imports the client (the verl dry run, the simulated workers), never
    the reverse, and the service is reached only over HTTP."""
    offenders = []
    for path in sorted((ROOT / "client" / "trace_client").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = (
                [alias.name for alias in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            offenders += [
                f"{path.relative_to(ROOT)}: {name}"
                for name in names
                if name.split(".")[0] in {"trace_lab", "trace_service"}
            ]
    assert offenders == []
