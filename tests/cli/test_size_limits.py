"""The size limits the project holds: no Python file over 600 lines, no function over 80 (its `def` to its
last line, docstring included).  ruff keeps each function's complexity and statement count in check
(C901, PLR0915 in pyproject.toml); this test keeps the lengths."""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FILE_LINES = 600
MAX_FUNCTION_LINES = 80


def python_files() -> list[Path]:
    """Every Python file git tracks or would track (untracked, not ignored)."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "*.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    return [ROOT / name for name in listed if (ROOT / name).is_file()]


def test_no_file_is_over_600_lines_and_no_function_over_80() -> None:
    files = python_files()
    assert any(path.name == "test_size_limits.py" for path in files)
    too_long = []
    for path in files:
        source = path.read_text()
        name = path.relative_to(ROOT)
        if (lines := len(source.splitlines())) > MAX_FILE_LINES:
            too_long.append(f"{name}: {lines} lines")
        for node in ast.walk(ast.parse(source, str(path))):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                length = (node.end_lineno or node.lineno) - node.lineno + 1
                if length > MAX_FUNCTION_LINES:
                    too_long.append(f"{name}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []


def test_no_two_service_modules_share_a_file_name() -> None:
    """A name says which module it is: the same file name twice in `trace_service` is allowed only for a
    router beside the engine module it calls (and for packages' `__init__.py`)."""
    service = ROOT / "service" / "trace_service"
    by_name: dict[str, list[str]] = {}
    for path in service.rglob("*.py"):
        if path.name != "__init__.py":
            by_name.setdefault(path.name, []).append(path.parent.name)
    twice = {name: sorted(folders) for name, folders in by_name.items() if len(folders) > 1}
    assert all(folders == ["engine", "routers"] for folders in twice.values()), twice
