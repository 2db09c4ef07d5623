"""examples/envs/mastermind.py runs GEM's Mastermind through an in-process service, TRACE against
uniform: both allocations complete, and restoring the continuations costs at most 1.5 environment
steps per turn of their histories."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "envs" / "mastermind.py"


@pytest.mark.slow
def test_the_mastermind_example_compares_trace_and_uniform_and_its_replay_cost() -> None:
    done = subprocess.run(
        [sys.executable, str(EXAMPLE), "--prompts", "5", "--budget", "15", "--steps", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    lines = done.stdout.splitlines()
    assert lines[0].split() == [
        "policy",
        "trees",
        "mixed",
        "leaves",
        "wins",
        "signal",
        "env",
        "steps",
        "signal/100",
        "steps",
    ]
    assert [line.split()[:2] for line in lines[1:3]] == [["trace", "5"], ["uniform", "5"]]
    restored = [line for line in lines if line.startswith("restoring continuations")]
    assert len(restored) == 2
    assert all(line.endswith("0 diverged") for line in restored)
    ratios = [
        float(m.group(1))
        for m in map(re.compile(r"per continuation / its depth: ([\d.]+)").search, lines)
        if m
    ]
    assert len(ratios) == 2
    assert all(ratio <= 1.5 for ratio in ratios)
