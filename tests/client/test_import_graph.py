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


def _module_name(path: Path, package_root: Path) -> str:
    parts = list(path.relative_to(package_root).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _client_imports() -> dict[str, set[str]]:
    """Each `trace_client` module and the `trace_client` modules it imports anywhere in its source, under
    `TYPE_CHECKING` and inside functions too (`from package import name` counts as the submodule
    `package.name` when that is a module, else as the package)."""
    package_root = ROOT / "client"
    paths = {_module_name(path, package_root): path for path in (package_root / "trace_client").rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        edges: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                edges |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                    base = ".".join([*anchor, *([base] if base else [])])
                for alias in node.names:
                    submodule = f"{base}.{alias.name}"
                    edges.add(submodule if submodule in paths else base)
        graph[name] = {edge for edge in edges if edge in paths and edge != name}
    return graph


def test_no_import_cycle_among_client_modules_even_for_type_checking() -> None:
    """A cycle hidden behind `TYPE_CHECKING` is still a cycle: two modules that need each other are one
    module in two files."""
    graph = _client_imports()
    assert "trace_client.driver._events" in graph and graph["trace_client.driver.run"]
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []
    cycles: list[list[str]] = []

    def visit(module: str) -> None:
        state[module] = 1
        path.append(module)
        for target in sorted(graph[module]):
            if state.get(target) == 1:
                cycles.append([*path[path.index(target) :], target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = 2

    for module in sorted(graph):
        if module not in state:
            visit(module)
    assert cycles == []
