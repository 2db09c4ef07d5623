"""Line colours the benchmarks' plots share, so that a strategy looks the same in every figure."""

from __future__ import annotations

import itertools
from collections.abc import Sequence

#: uniform black, trace red, the oracle purple, whatever else is plotted next to them.
FIXED = {"uniform": "black", "trace": "tab:red", "oracle": "tab:purple"}


def line_colors(names: Sequence[str]) -> dict[str, object]:
    """A colour per name: FIXED's, then tab10 without its red and purple, then tab20's pale (distinct
    for up to 21 names, then repeating)."""
    import matplotlib.pyplot as plt

    tab10, tab20 = plt.get_cmap("tab10").colors, plt.get_cmap("tab20").colors
    others = itertools.cycle([c for i, c in enumerate(tab10) if i not in (3, 4)] + list(tab20[1::2]))
    return {name: FIXED.get(name) or next(others) for name in names}
