"""Allocation quality side by side: effective ratio and mixed groups at equal budget on the simulator.

Every strategy runs the same seeds, the same pools and the same budget for several training steps in
learning mode (a prompt improves only when its group was mixed). Prints one table (effective ratio
mean ± std over seeds, and per-step means of the rest) and saves a plot of the effective ratio over steps.

    python bench/quality.py                        # defaults: a few minutes on one core
    python bench/quality.py --budget-unit turns    # equal budget in turns instead of rollouts
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.harness import (
    BudgetUnit,
    Estimator,
    StepConfig,
    StepResult,
    Strategy,
    default_strategies,
    posterior_estimator,
    run_strategy,
)
from bench.learned import LearnedEstimator
from trace_client.sim import SimConfig

ESTIMATORS: dict[str, Callable[[], Estimator]] = {
    "posterior": lambda: posterior_estimator,
    "learned": LearnedEstimator,
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results" / "quality.png"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (workloads) per strategy")
    parser.add_argument("--steps", type=int, default=20, help="training steps per seed")
    parser.add_argument("--prompts", type=int, default=1024, help="prompts in the simulated data set")
    parser.add_argument("--pool", type=int, default=512, help="candidate prompts offered each step (B)")
    parser.add_argument("--budget", type=int, default=1024, help="bare rollouts per step (M)")
    parser.add_argument("--expansion", type=float, default=2.0, help="continuations per bare rollout (N)")
    parser.add_argument(
        "--group-size", type=int, default=8, help="rollouts per prompt of uniform-style rules (n)"
    )
    parser.add_argument(
        "--budget-unit",
        choices=[unit.value for unit in BudgetUnit],
        default=BudgetUnit.rollouts.value,
        help="what equal budget means: rollouts, or turns (R times the mean rollout length)",
    )
    parser.add_argument(
        "--min-rollouts", type=int, default=2, help="TRACE Stage 1: fewest rollouts of an active prompt"
    )
    parser.add_argument(
        "--max-rollouts", type=int, default=64, help="TRACE Stage 1: most rollouts per prompt"
    )
    parser.add_argument("--max-prompts", type=int, default=None, help="TRACE Stage 1: cap on active prompts")
    parser.add_argument("--rounds", type=int, default=1, help="Stage 2 rounds per step (rollout budgets)")
    parser.add_argument("--estimator", choices=sorted(ESTIMATORS), default="posterior", help="TRACE's Ṽ")
    parser.add_argument(
        "--strategies",
        default=None,
        help="comma-separated subset of strategies (default: all, in table order)",
    )
    parser.add_argument("--no-learning", action="store_true", help="keep prompt success rates fixed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="where to save the plot (PNG)")
    args = parser.parse_args(argv)
    for name in ("seeds", "steps", "prompts", "pool", "group_size"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.pool > args.prompts:
        parser.error("--pool cannot exceed --prompts")
    return args


def select_strategies(args: argparse.Namespace) -> list[Strategy]:
    """The strategies to run, each with a fresh estimator (call once per seed)."""
    strategies = default_strategies(ESTIMATORS[args.estimator])
    if args.strategies is None:
        return strategies
    wanted = [name.strip() for name in args.strategies.split(",") if name.strip()]
    known = {strategy.name: strategy for strategy in strategies}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"unknown strategies {unknown}; choose from {sorted(known)}")
    return [known[name] for name in wanted]


def per_step_mean(per_seed: list[list[StepResult]], field: str) -> float:
    return statistics.fmean(getattr(result, field) for seed in per_seed for result in seed)


def print_table(
    results: dict[str, list[list[StepResult]]],
    sim_config: SimConfig,
    config: StepConfig,
    args: argparse.Namespace,
) -> None:
    turns_note = f", T = {config.turn_budget} turns" if config.unit is BudgetUnit.turns else ""
    learning = "off" if args.no_learning else "on"
    print(
        f"Allocation quality: {args.seeds} seeds × {args.steps} steps, learning {learning}; "
        f"pool B = {args.pool} of {args.prompts} prompts"
    )
    print(
        f"M = {config.bare_rollouts} bare rollouts, N = {config.expansion:g}, n = {config.group_size}; "
        f"equal budget in {config.unit.value}: R = {config.total_rollouts} rollouts{turns_note} "
        f"(mean rollout {sim_config.expected_turns:.2f} turns)"
    )
    # Per-step means of these StepResult fields follow the effective ratio: (header, field, decimal places).
    columns = [
        ("mixed", "mixed", 1),
        ("kept", "kept", 1),
        ("mixed forks", "mixed_forks", 1),
        ("rollouts", "rollouts", 0),
        ("turns", "turns", 0),
        ("skipped", "skipped", 1),
    ]
    header = f"{'strategy':<13} {'effective ratio':>16}" + "".join(f" {title:>11}" for title, _, _ in columns)
    print(header + f" {'of oracle':>10}")
    print("-" * (len(header) + 11))
    oracle_mixed = sum(r.mixed for seed in results.get("oracle", []) for r in seed)
    for name, per_seed in results.items():
        seed_ratios = [statistics.fmean(r.effective_ratio for r in seed) for seed in per_seed]
        spread = statistics.stdev(seed_ratios) if len(seed_ratios) > 1 else 0.0
        cells = "".join(
            f" {per_step_mean(per_seed, field):>11.{decimals}f}" for _, field, decimals in columns
        )
        mixed = sum(r.mixed for seed in per_seed for r in seed)
        share = f"{mixed / oracle_mixed:.1%}" if oracle_mixed else "—"
        print(f"{name:<13} {statistics.fmean(seed_ratios):>8.3f} ± {spread:<5.3f}{cells} {share:>10}")
    print(
        "effective ratio: mixed / active groups per step, mean over steps, then mean ± std over seeds.\n"
        "Per-step means: mixed groups; kept (groups the trainer keeps: DAPO drops all-equal groups, the\n"
        "others keep all); mixed forks (prefixes continuations started from whose subtree holds both\n"
        "outcomes); rollouts (bare + continuations); turns; skipped (pool prompts given no rollout).\n"
        "of oracle: mixed groups as a share of the oracle's."
    )
    if "trace" in results and "uniform" in results:
        trace = per_step_mean(results["trace"], "effective_ratio")
        uniform = per_step_mean(results["uniform"], "effective_ratio")
        print(f"full TRACE vs uniform effective ratio: ×{trace / uniform:.2f} (paper, Qwen3-8B: ×2.26)")


def plot(results: dict[str, list[list[StepResult]]], args: argparse.Namespace) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    figure, axes = plt.subplots(figsize=(9, 5.5))
    steps = np.arange(1, args.steps + 1)
    for name, per_seed in results.items():
        ratios = np.array([[r.effective_ratio for r in seed] for seed in per_seed])
        mean, spread = ratios.mean(axis=0), ratios.std(axis=0)
        (line,) = axes.plot(
            steps,
            mean,
            label=name,
            linewidth=2.2 if name in ("trace", "oracle") else 1.3,
            # DAPO allocates exactly like uniform: dash it so that both lines stay visible.
            linestyle="--" if name == "dapo" else "-",
        )
        axes.fill_between(steps, mean - spread, mean + spread, color=line.get_color(), alpha=0.12)
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("training step")
    axes.set_ylabel("effective ratio (mixed / active groups)")
    axes.set_ylim(0, 1)
    axes.set_title(
        f"Equal budget in {args.budget_unit}: effective ratio per step (mean ± std over {args.seeds} seeds)"
    )
    axes.grid(alpha=0.3)
    axes.legend(ncol=2, fontsize=8)
    figure.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(args.out, dpi=120)
    plt.close(figure)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    sim_config = SimConfig(prompts=args.prompts)
    config = StepConfig(
        bare_rollouts=args.budget,
        expansion=args.expansion,
        group_size=args.group_size,
        min_rollouts=args.min_rollouts,
        max_rollouts=args.max_rollouts,
        max_prompts=args.max_prompts,
        rounds=args.rounds,
    ).counted_in(BudgetUnit(args.budget_unit), sim_config)
    results: dict[str, list[list[StepResult]]] = {strategy.name: [] for strategy in select_strategies(args)}
    started = time.perf_counter()
    for seed in range(args.seeds):
        for strategy in select_strategies(args):
            began = time.perf_counter()
            per_step = run_strategy(
                sim_config,
                seed,
                strategy,
                config,
                steps=args.steps,
                pool_size=args.pool,
                learn=not args.no_learning,
            )
            results[strategy.name].append(per_step)
            ratio = statistics.fmean(r.effective_ratio for r in per_step)
            print(
                f"[{time.perf_counter() - started:6.1f}s] seed {seed + 1}/{args.seeds} {strategy.name:<13} "
                f"effective ratio {ratio:.3f} ({time.perf_counter() - began:.1f}s)",
                file=sys.stderr,
            )
    print_table(results, sim_config, config, args)
    plot(results, args)
    print(f"plot: {args.out}")


if __name__ == "__main__":
    main()
