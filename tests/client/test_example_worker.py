"""examples/worker.py, the README's worker written against the v1 API alone, runs to the end against a
real service: every tree it was allocated completes, continuations included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from support import make_settings

from trace_lab.local import ThreadedService

WORKER = Path(__file__).resolve().parents[2] / "examples" / "worker.py"


def test_the_example_worker_completes_every_tree_it_was_allocated() -> None:
    with ThreadedService.from_settings(make_settings()) as live:
        done = subprocess.run(
            [sys.executable, str(WORKER), "--url", live.url, "--prompts", "8", "--budget", "16"],
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
    lines = done.stdout.splitlines()
    assert lines[0] == "allocated 8 trees, skipped 0 prompts"
    trees = [line for line in lines if line.startswith("task-")]
    assert len(trees) == 8
    assert all(": complete, " in line for line in trees)
    assert any(line.startswith("  continue ") for line in lines)  # Stage 2 placed continuations
