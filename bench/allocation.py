"""Stage 1 solver speed and quality: the production solver against the exact DP.

    python bench/allocation.py [--sizes 256 1024 4096] [--per-prompt 16] [--max-rollouts 128]

For each pool size B the budget is M = per_prompt·B.  Prints the fast solver's median time (one thread),
the DP's time where it fits under --dp-limit cells, and the value ratio fast/exact.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from functools import partial

import numpy as np

from trace_service.allocation import allocate_roots, allocate_roots_exact


def median_seconds(run: Callable[[], object], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 1024, 4096])
    parser.add_argument("--per-prompt", type=int, default=16, help="budget M = per_prompt × B")
    parser.add_argument("--max-rollouts", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--dp-limit", type=float, default=3e8, help="largest B·M·m_max the DP is run for")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    rng = np.random.default_rng(args.seed)
    print(f"{'B':>6} {'M':>7} {'fast ms':>9} {'DP ms':>10} {'DP/fast':>8} {'value fast/DP':>14}")
    for size in args.sizes:
        budget = args.per_prompt * size
        v = rng.beta(0.4, 0.4, size)  # U-shaped, like real RLVR pools
        fast = allocate_roots(v, budget, max_rollouts=args.max_rollouts)
        fast_s = median_seconds(
            partial(allocate_roots, v, budget, max_rollouts=args.max_rollouts), args.repeats
        )
        dp_cells = size * budget * args.max_rollouts
        if dp_cells <= args.dp_limit:
            start = time.perf_counter()
            exact = allocate_roots_exact(v, budget, max_rollouts=args.max_rollouts)
            dp_s = time.perf_counter() - start
            ratio = fast.expected_mixed / exact.expected_mixed
            timing = f"{fast_s * 1e3:>9.2f} {dp_s * 1e3:>10.0f} {dp_s / fast_s:>8.0f}"
            print(f"{size:>6} {budget:>7} {timing} {ratio:>14.12f}")
        else:
            print(f"{size:>6} {budget:>7} {fast_s * 1e3:>9.2f} {'(too big)':>10} {'':>8} {'':>14}")


if __name__ == "__main__":
    main()
