"""`python -m trace_lab.sim [seeds]`: each family's `root_summary` at its defaults, mean ± standard
deviation over seeds 0 … seeds − 1 (default 5)."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from trace_lab.sim.registry import FAMILIES, RootSummary, root_summary


def main(argv: list[str]) -> None:
    seeds = int(argv[0]) if argv else 5
    names = [field.name for field in dataclasses.fields(RootSummary)]
    sys.stdout.write("family    " + "  ".join(f"{name:>22s}" for name in names) + "\n")
    for family, make in FAMILIES.items():
        rows = np.array([dataclasses.astuple(root_summary(make(seed))) for seed in range(seeds)])
        cells = [
            f"{mean:.3f} ± {sd:.3f}" for mean, sd in zip(rows.mean(axis=0), rows.std(axis=0), strict=True)
        ]
        sys.stdout.write(f"{family:9s} " + "  ".join(f"{cell:>22s}" for cell in cells) + "\n")


if __name__ == "__main__":
    main(sys.argv[1:])
