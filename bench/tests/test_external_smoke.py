"""bench/external.py end to end on one short seed: Gymnasium's Taxi through real service processes."""

from __future__ import annotations

import shutil

import pytest

from bench.external import main

pytestmark = [pytest.mark.redis, pytest.mark.slow]


def test_a_short_run_reports_every_arm(capsys: pytest.CaptureFixture[str]) -> None:
    if shutil.which("redis-server") is None:
        pytest.skip("redis-server is not installed (scripts/test installs it)")
    pytest.importorskip("gymnasium", reason="the envs extra (scripts/setup installs it)")
    arms = "uniform,uniform_tree,trace,trace-shape"
    main(["--env", "taxi", "--seeds", "1", "--steps", "2", "--pool", "8", "--budget", "8", "--arms", arms])
    output = capsys.readouterr().out
    for arm in arms.split(","):
        assert f" {arm} " in output
    assert "wall time" in output
