"""The layering the packaging promises: the service imports nothing of the client, and the base install
(pydantic and httpx, no numpy) is enough for the wire contract, the client and the worker driver."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from pathlib import Path

SERVICE = Path(__file__).resolve().parents[2] / "service" / "trace_service"

#: A meta-path finder that refuses numpy, as an environment without it would.
_WITHOUT_NUMPY = """
import sys

class RefuseNumpy:
    def find_spec(self, name, path=None, target=None):
        if name == "numpy" or name.startswith("numpy."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, RefuseNumpy())
"""


def run_python(code: str, *, prelude: str = "") -> subprocess.CompletedProcess[str]:
    script = prelude + textwrap.dedent(code)
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)


def imported_modules(path: Path) -> set[str]:
    """Every module an `import` or `from ... import` in the file names, at any depth (lazy imports too)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module is not None and node.level == 0:
            names.add(node.module)
    return names


def test_no_service_module_imports_the_client() -> None:
    offenders = {
        str(path.relative_to(SERVICE)): sorted(
            name for name in imported_modules(path) if name.split(".")[0] == "trace_client"
        )
        for path in sorted(SERVICE.rglob("*.py"))
    }
    assert {path: names for path, names in offenders.items() if names} == {}


def test_the_service_app_and_command_run_without_the_client() -> None:
    done = run_python(
        """
        import sys
        from trace_service.app import create_app
        from trace_service.cli import build_parser, openapi_text

        create_app()
        build_parser()
        openapi_text()
        loaded = sorted(name for name in sys.modules if name.split(".")[0] == "trace_client")
        assert not loaded, loaded
        """
    )
    assert done.returncode == 0, done.stderr


def test_the_base_client_surface_imports_without_numpy() -> None:
    done = run_python(
        """
        import asyncio

        import trace_client
        import trace_client.adapters
        import trace_client.adapters.skyrl
        import trace_client.adapters.verl
        import trace_client.driver
        import trace_lab.local
        import trace_proto
        from trace_client import AsyncTraceClient, TraceClient
        from trace_client.driver import DriverConfig, RolloutDriver

        async def main():
            async with AsyncTraceClient("http://127.0.0.1:9") as client:
                RolloutDriver(client, lambda history: None, config=DriverConfig())

        with TraceClient("http://127.0.0.1:9"):
            pass
        asyncio.run(main())
        assert "numpy" not in sys.modules
        try:
            import trace_lab.sim
        except ModuleNotFoundError as error:
            assert error.name == "numpy", error
        else:
            raise AssertionError("the simulator imported without numpy: the refusal did not hold")
        """,
        prelude=_WITHOUT_NUMPY,
    )
    assert done.returncode == 0, done.stderr
