"""bench/learning.py --quick end to end: a real redis-server and real service processes over HTTP."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from bench.learning import main

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_quick_run_reports_every_arm_and_saves_curves(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    arms = "uniform,trace,trace+pilot,treepo,oracle"
    main(["--quick", "--family", "toolcall", "--arms", arms, "--out", str(tmp_path)])
    output = capsys.readouterr().out
    summary = output[output.index("Summary") :]
    for arm in ("uniform", "trace", "trace+pilot", "treepo", "oracle"):
        assert f"toolcall   {arm} " in summary
    assert "toolcall, seed 0: uniform's held-out success" in output
    assert (tmp_path / "learning-toolcall.png").stat().st_size > 0
