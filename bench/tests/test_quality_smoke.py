"""bench/quality.py end to end at a small size, with --tune-on leaving its family out."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.quality import main


def test_small_run_prints_both_tables_and_saves_the_plots(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = [
        "--family",
        "math,toolcall",
        "--tune-on",
        "math",
        "--seeds",
        "2",
        "--steps",
        "3",
        "--warm-up",
        "1",
    ]
    main([*argv, "--prompts", "96", "--pool", "32", "--budget", "64", "--out", str(tmp_path)])
    output = capsys.readouterr().out
    assert "== toolcall:" in output and "== math:" not in output
    assert "Tuned on math: reporting only on the other families (toolcall)" in output
    regret = output[output.index("Regret decomposition (toolcall") :]
    oracle_row = next(line for line in regret.splitlines() if line.startswith("oracle "))
    assert oracle_row.split()[1] == "1.000"  # the oracle's Stage 1 against itself
    for name in ("quality.png", "quality-reliability.png"):
        assert (tmp_path / name).stat().st_size > 0
