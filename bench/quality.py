"""Allocation quality side by side: effective ratio and mixed groups at equal budget on each workload
family, with the regret decomposition against the oracle.

Every strategy runs the same seeds, the same pools (the family's epochs) and the same budget for several
training steps in learning mode (a prompt improves only when its group was mixed). The first
`--warm-up` steps run but are not counted (an estimator that learns starts cold). Per family it prints
one table (effective ratio mean ± std over seeds, and per-step means of the rest) and the regret
decomposition, and saves a plot of the effective ratio over steps and a reliability diagram.

    python bench/quality.py                              # defaults: every family, see --help
    python bench/quality.py --estimator learned          # TRACE's Ṽ is the service's predictor
    python bench/quality.py --family math --budget-unit turns
    python bench/quality.py --tune-on react              # report only on the other families

Regret decomposition, per family and strategy (counted steps, mean ± std over seeds where it says so):
  stage-1 value   Σ_i V_root(p_i, m_i) over the started groups with the true p_i, over the same for the
                  counts TRACE Stage 1 chooses from the true p_i for the strategy's bare budget (1 = the
                  oracle's Stage 1)
  bare on extremes  the share of bare rollouts spent on prompts whose true success is below 0.05 or
                  above 0.95 (such a group is almost never mixed)
  flips/cont.     continuations whose outcome differs from the observed outcome below the prefix they
                  branched from, per continuation; then the same over the oracle's
  depth/cont.     the mean depth (turns before the fork) of the prefixes continuations branched from
  turns/cont.     the mean turns one continuation generated (what it cost)
  calibration     the estimator's mean prediction at roots whose true success is below 0.02 and above
                  0.98 (with counts); the reliability diagram bins every root by true p
"""

from __future__ import annotations

import argparse
import functools
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.estimators import Estimator, declared_text_noise, posterior_estimator
from bench.harness import (
    BudgetUnit,
    StepConfig,
    StepResult,
    Strategy,
    default_strategies,
    mean_rollout_turns,
    run_strategy,
)
from bench.learned import LearnedEstimator
from bench.plotting import FIXED, line_colors
from bench.protocol import (
    add_family_arguments,
    check_sizes,
    chosen_families,
    comma_list,
    mean_std,
    protocol_line,
)
from trace_lab.sim import FAMILIES, make_workload
from trace_service.predictor import PredictorConfig

#: Each estimator for one run seed. The learned predictor's own seed (its initial weights, minibatches
#: and dropout) follows the run's, so the spread over seeds includes the predictor's.
ESTIMATORS: dict[str, Callable[[int], Estimator]] = {
    "posterior": lambda _seed: posterior_estimator,
    "learned": lambda seed: LearnedEstimator(PredictorConfig(device="cpu", seed=seed)),
}
DEFAULT_OUT = Path(__file__).resolve().parent / "results"
#: Calibration at the extremes: mean prediction where the true success is below this or above 1 − it.
CALIBRATION_EXTREME = 0.02
#: Width of the strategy column: the longest strategy name.
NAME_WIDTH = max(len(strategy.name) for strategy in default_strategies())
RELIABILITY_BINS = 10

#: Per family, per strategy, per seed: the counted steps.
Results = dict[str, dict[str, list[list[StepResult]]]]


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Defaults in the options' help; the epilog (the regret decomposition's columns) as laid out."""


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    doc = __doc__ or ""
    parser = argparse.ArgumentParser(
        description=doc.split("\n\n")[0],
        # the legend's "Regret decomposition: see --help" points here
        epilog=doc[doc.index("Regret decomposition") :],
        formatter_class=_HelpFormatter,
    )
    add_family_arguments(parser, "every registered family")
    parser.add_argument("--seeds", type=int, default=3, help="number of seeds (workloads) per strategy")
    parser.add_argument("--steps", type=int, default=10, help="training steps per seed")
    parser.add_argument("--warm-up", type=int, default=5, help="first steps run but not counted")
    parser.add_argument(
        "--prompts",
        type=int,
        default=512,
        help="prompts per family and seed: one recurs every prompts/B steps",
    )
    parser.add_argument("--pool", type=int, default=128, help="candidate prompts offered each step (B)")
    parser.add_argument("--budget", type=int, default=256, help="bare rollouts per step (M)")
    parser.add_argument("--expansion", type=float, default=1.0, help="continuations per bare rollout (N)")
    parser.add_argument(
        "--group-size", type=int, default=4, help="rollouts per prompt of uniform-style rules (n)"
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
    parser.add_argument(
        "--max-branch-depth",
        type=int,
        default=None,
        help="continuations only from prefixes at most this many turns deep (default: any depth)",
    )
    parser.add_argument("--estimator", choices=sorted(ESTIMATORS), default="posterior", help="TRACE's Ṽ")
    parser.add_argument(
        "--strategies",
        default=None,
        help="comma-separated subset of strategies (default: all, in table order)",
    )
    parser.add_argument("--no-learning", action="store_true", help="keep prompt success rates fixed")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="folder for the PNGs")
    args = parser.parse_args(argv)
    check_sizes(parser, args, ("seeds", "steps", "pool", "group_size"))
    if not 0 <= args.warm_up < args.steps:
        parser.error("--warm-up must leave at least one counted step")
    args.families = chosen_families(parser, args, list(FAMILIES))
    return args


def select_strategies(args: argparse.Namespace, seed: int, text_noise: float) -> list[Strategy]:
    """The strategies to run on `seed`, each with a fresh estimator (call once per seed); `text_noise` is
    the family's, for the `*_knowable_roots` (`declared_text_noise`)."""
    strategies = default_strategies(functools.partial(ESTIMATORS[args.estimator], seed), text_noise)
    if args.strategies is None:
        return strategies
    wanted = comma_list(args.strategies)
    known = {strategy.name: strategy for strategy in strategies}
    unknown = [name for name in wanted if name not in known]
    if unknown:
        raise SystemExit(f"unknown strategies {unknown}; choose from {sorted(known)}")
    return [known[name] for name in wanted]


def per_step_mean(per_seed: list[list[StepResult]], field: str) -> float:
    return statistics.fmean(getattr(result, field) for seed in per_seed for result in seed)


def paired_ratio(per_seed: list[list[StepResult]], baseline: list[list[StepResult]]) -> str:
    """Mixed groups over the baseline's, seed by seed (the same pools and budget): "mean ± std (k/n)",
    k the seeds where the strategy finds at least as many. Pairing removes what a seed's pools do to
    both, which the two spreads of the mixed column leave in."""
    ratios = [
        sum(r.mixed for r in seed) / sum(r.mixed for r in base)
        for seed, base in zip(per_seed, baseline, strict=True)
        if sum(r.mixed for r in base)
    ]
    if not ratios:
        return "—"
    mean, spread = mean_std(ratios)
    return f"{mean:.2f} ± {spread:.2f} ({sum(ratio >= 1.0 for ratio in ratios)}/{len(ratios)})"


# --- regret decomposition --------------------------------------------------------------------------


def stage1_share(steps: Sequence[StepResult]) -> float:
    """Σ V_root(p, m) realised under the true p over what the oracle's Stage 1 realises."""
    oracle = sum(result.stage1_oracle_value for result in steps)
    return sum(result.stage1_value for result in steps) / oracle if oracle else 1.0


def extreme_share(steps: Sequence[StepResult]) -> float:
    """The share of bare rollouts spent on near-certain prompts (true p < 0.05 or > 0.95)."""
    bare = sum(result.bare for result in steps)
    return sum(result.bare_on_extremes for result in steps) / bare if bare else 0.0


def flips_per_continuation(steps: Sequence[StepResult]) -> float | None:
    """Continuations that flipped the outcome they branched from, per continuation (None: none ran)."""
    continuations = sum(result.continuations for result in steps)
    return sum(result.flips for result in steps) / continuations if continuations else None


def per_continuation(steps: Sequence[StepResult]) -> tuple[float, float] | None:
    """Mean depth of the prefixes continuations branched from, and mean turns one generated (None: none
    ran): where a strategy branches, and what a continuation costs."""
    continuations = sum(result.continuations for result in steps)
    if not continuations:
        return None
    depth = sum(result.branch_depth for result in steps)
    turns = sum(result.continuation_turns for result in steps)
    return depth / continuations, turns / continuations


def root_pairs(steps: Sequence[StepResult]) -> tuple[np.ndarray, np.ndarray]:
    """(predicted, true) success of every root the estimator was asked about."""
    pairs = np.array([pair for result in steps for pair in result.root_predictions], dtype=np.float64)
    if pairs.size == 0:
        return np.zeros(0), np.zeros(0)
    return pairs[:, 0], pairs[:, 1]


def extreme_calibration(
    predicted: np.ndarray, true: np.ndarray, extreme: float = CALIBRATION_EXTREME
) -> tuple[tuple[float | None, int], tuple[float | None, int]]:
    """(mean prediction, count) over the roots with true p < `extreme`, and over those > 1 − `extreme`."""
    answer = []
    for mask in (true < extreme, true > 1.0 - extreme):
        count = int(mask.sum())
        answer.append((float(predicted[mask].mean()) if count else None, count))
    return answer[0], answer[1]


def reliability_bins(
    predicted: np.ndarray, true: np.ndarray, bins: int = RELIABILITY_BINS
) -> list[tuple[float, float, int]]:
    """Roots binned by true p in `bins` equal bins: (mean true p, mean prediction, count), empty bins out."""
    index = np.minimum((true * bins).astype(np.int64), bins - 1)
    return [
        (float(true[index == b].mean()), float(predicted[index == b].mean()), int((index == b).sum()))
        for b in range(bins)
        if np.any(index == b)
    ]


# --- the report -------------------------------------------------------------------------------------


def print_table(
    family: str, results: dict[str, list[list[StepResult]]], config: StepConfig, args: argparse.Namespace
) -> None:
    counted = f"steps {args.warm_up + 1}–{args.steps} counted" if args.warm_up else "every step counted"
    turns = f"; T = {config.turn_budget} turns per step" if config.unit is BudgetUnit.turns else ""
    print(f"\n== {family}: {args.seeds} seeds × {args.steps} steps ({counted}{turns}) ==")
    # Per-step means of these StepResult fields follow the mixed groups: (header, field, decimal places).
    columns = [
        ("kept", "kept", 1),
        ("mixed forks", "mixed_forks", 1),
        ("rollouts", "rollouts", 0),
        ("turns", "turns", 0),
        ("skipped", "skipped", 1),
    ]
    header = f"{'strategy':<{NAME_WIDTH}} {'effective ratio':>16} {'mixed':>13}" + "".join(
        f" {title:>11}" for title, _, _ in columns
    )
    print(header + f" {'of oracle':>10} {'× uniform (seeds ≥ 1)':>22}")
    print("-" * (len(header) + 34))
    oracle_mixed = sum(r.mixed for seed in results.get("oracle", []) for r in seed)
    for name, per_seed in results.items():
        ratio, ratio_spread = mean_std(
            [statistics.fmean(r.effective_ratio for r in seed) for seed in per_seed]
        )
        mixed, mixed_spread = mean_std([statistics.fmean(r.mixed for r in seed) for seed in per_seed])
        cells = "".join(
            f" {per_step_mean(per_seed, field):>11.{decimals}f}" for _, field, decimals in columns
        )
        share = sum(r.mixed for seed in per_seed for r in seed) / oracle_mixed if oracle_mixed else None
        print(
            f"{name:<{NAME_WIDTH}} {ratio:>8.3f} ± {ratio_spread:<5.3f}"
            f" {mixed:>6.1f} ± {mixed_spread:<4.1f}{cells}"
            f" {'—' if share is None else f'{share:.1%}':>10}"
            f" {paired_ratio(per_seed, results['uniform']) if 'uniform' in results else '—':>22}"
        )
    if "trace" in results and "uniform" in results:
        trace = per_step_mean(results["trace"], "effective_ratio")
        uniform = per_step_mean(results["uniform"], "effective_ratio")
        print(f"full TRACE vs uniform effective ratio: ×{trace / uniform:.2f} (paper, Qwen3-8B: ×2.26)")


def print_regret(family: str, results: dict[str, list[list[StepResult]]]) -> None:
    oracle_flips = flips_per_continuation([r for seed in results.get("oracle", []) for r in seed])
    print(f"Regret decomposition ({family}; stage-1 value and bare on extremes: mean ± std over seeds):")
    header = (
        f"{'strategy':<{NAME_WIDTH}} {'stage-1 value':>15} {'bare on extremes':>17} {'flips/cont.':>12}"
        f" {'of oracle':>10} {'depth/cont.':>12} {'turns/cont.':>12}"
        f" {f'Ṽ at true p<{CALIBRATION_EXTREME:g} (n)':>22}"
        f" {f'Ṽ at true p>{1 - CALIBRATION_EXTREME:g} (n)':>22}"
    )
    print(header)
    print("-" * len(header))
    for name, per_seed in results.items():
        value, value_spread = mean_std([stage1_share(seed) for seed in per_seed])
        extreme, extreme_spread = mean_std([extreme_share(seed) for seed in per_seed])
        everything = [r for seed in per_seed for r in seed]
        flips = flips_per_continuation(everything)
        flips_cell = "—" if flips is None else f"{flips:.3f}"
        of_oracle = "—" if flips is None or not oracle_flips else f"{flips / oracle_flips:.1%}"
        branching = per_continuation(everything)
        depth_cell, turns_cell = ("—", "—") if branching is None else (f"{value:.2f}" for value in branching)
        predicted, true = root_pairs(everything)
        low, high = extreme_calibration(predicted, true)
        calibration = [
            "—" if not predicted.size else ("none" if mean is None else f"{mean:.3f} ({count})")
            for mean, count in (low, high)
        ]
        print(
            f"{name:<{NAME_WIDTH}} {value:>7.3f} ± {value_spread:<5.3f}"
            f" {extreme:>9.1%} ± {extreme_spread:<5.1%}"
            f" {flips_cell:>12} {of_oracle:>10} {depth_cell:>12} {turns_cell:>12}"
            f" {calibration[0]:>22} {calibration[1]:>22}"
        )


def print_legend(config: StepConfig, args: argparse.Namespace) -> None:
    turns = args.budget_unit == BudgetUnit.turns.value
    turns_note = " (T = R × the family's mean rollout length)" if turns else ""
    learning = "off" if args.no_learning else "on"
    print(
        f"\nAllocation quality: {args.seeds} seeds × {args.steps} steps, learning {learning}, estimator "
        f"{args.estimator}; pool B = {args.pool} of {args.prompts} prompts; M = {config.bare_rollouts} "
        f"bare rollouts, "
        f"N = {config.expansion:g}, n = {config.group_size}; equal budget in {args.budget_unit}: "
        f"R = {config.total_rollouts} rollouts{turns_note}"
    )
    print(protocol_line(args, args.families))
    print(
        "effective ratio: mixed / active groups per step, mean over steps, then mean ± std over seeds;\n"
        "mixed: mixed groups per step, the same way. Per-step means: kept (groups the trainer keeps: DAPO\n"
        "drops all-equal groups, the others keep all); mixed forks (prefixes continuations started from\n"
        "whose subtree holds both outcomes); rollouts (bare + continuations); turns; skipped (pool\n"
        "prompts given no rollout). of oracle: mixed groups as a share of the oracle's. Regret\n"
        "decomposition: see --help."
    )


def plot_ratios(results: Results, args: argparse.Namespace) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    families = list(results)
    figure, grid = plt.subplots(1, len(families), figsize=(6 * len(families), 5), squeeze=False)
    steps = np.arange(args.warm_up + 1, args.steps + 1)
    for axes, family in zip(grid[0], families, strict=True):
        colors = line_colors(list(results[family]))
        for name, per_seed in results[family].items():
            ratios = np.array([[r.effective_ratio for r in seed] for seed in per_seed])
            mean, spread = ratios.mean(axis=0), ratios.std(axis=0)
            axes.plot(
                steps,
                mean,
                label=name,
                color=colors[name],
                linewidth=2.2 if name in FIXED else 1.3,
                # DAPO allocates exactly like uniform: dash it so that both lines stay visible.
                linestyle="--" if name == "dapo" else "-",
            )
            axes.fill_between(steps, mean - spread, mean + spread, color=colors[name], alpha=0.12)
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.set_xlabel("training step")
        axes.set_ylabel("effective ratio (mixed / active groups)")
        axes.set_ylim(0, 1)
        axes.set_title(f"{family} (mean ± std over {args.seeds} seeds)")
        axes.grid(alpha=0.3)
    grid[0][0].legend(ncol=2, fontsize=8)
    figure.suptitle(f"Equal budget in {args.budget_unit}: effective ratio per counted step")
    figure.tight_layout()
    path = args.out / "quality.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def plot_reliability(results: Results, args: argparse.Namespace) -> Path:
    """Per family: roots binned by true p, the estimator's mean prediction against the bin's mean true p,
    with the count of each bin; the diagonal is perfect calibration."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    families = list(results)
    figure, grid = plt.subplots(1, len(families), figsize=(5.5 * len(families), 5), squeeze=False)
    for axes, family in zip(grid[0], families, strict=True):
        axes.plot([0, 1], [0, 1], color="grey", linewidth=1, linestyle=":")
        colors = line_colors(list(results[family]))
        for name, per_seed in results[family].items():
            predicted, true = root_pairs([r for seed in per_seed for r in seed])
            if name == "oracle" or not predicted.size:
                continue  # the oracle sits on the diagonal
            rows = reliability_bins(predicted, true)
            axes.plot([r[0] for r in rows], [r[1] for r in rows], marker="o", label=name, color=colors[name])
            if name == "trace":
                for mean_true, mean_predicted, count in rows:
                    axes.annotate(str(count), (mean_true, mean_predicted), fontsize=7, color=colors[name],
                                  xytext=(3, -9), textcoords="offset points")  # fmt: skip
        axes.set_xlabel("true success at the root (bin mean)")
        axes.set_ylabel("predicted Ṽ (bin mean)")
        axes.set_xlim(0, 1)
        axes.set_ylim(0, 1)
        axes.set_title(f"{family}: {args.estimator} estimator at roots (counts: trace)")
        axes.grid(alpha=0.3)
        axes.legend(fontsize=8)
    figure.tight_layout()
    path = args.out / "quality-reliability.png"
    figure.savefig(path, dpi=110)
    plt.close(figure)
    return path


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    step_config = StepConfig(
        bare_rollouts=args.budget,
        expansion=args.expansion,
        group_size=args.group_size,
        min_rollouts=args.min_rollouts,
        max_rollouts=args.max_rollouts,
        max_prompts=args.max_prompts,
        rounds=args.rounds,
        max_branch_depth=args.max_branch_depth,
    )
    results: Results = {}
    started = time.perf_counter()
    for family in args.families:
        make = functools.partial(make_workload, family, prompts=args.prompts)
        # Equal turns: R × the family's mean rollout length, measured on seed 0 before any learning.
        first = make(0)
        config = step_config.counted_in(BudgetUnit(args.budget_unit), mean_rollout_turns(first))
        text_noise = declared_text_noise(first)
        family_results: dict[str, list[list[StepResult]]] = {}
        for seed in range(args.seeds):
            for strategy in select_strategies(args, seed, text_noise):
                began = time.perf_counter()
                per_step = run_strategy(
                    make,
                    seed,
                    strategy,
                    config,
                    steps=args.steps,
                    pool_size=args.pool,
                    learn=not args.no_learning,
                )[args.warm_up :]
                family_results.setdefault(strategy.name, []).append(per_step)
                ratio = statistics.fmean(r.effective_ratio for r in per_step)
                print(
                    f"[{time.perf_counter() - started:6.1f}s] {family} seed {seed + 1}/{args.seeds} "
                    f"{strategy.name:<{NAME_WIDTH}} effective ratio {ratio:.3f}"
                    f" ({time.perf_counter() - began:.1f}s)",
                    file=sys.stderr,
                )
        results[family] = family_results
        print_table(family, family_results, config, args)
        print_regret(family, family_results)
    print_legend(step_config, args)
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"plots: {plot_ratios(results, args)}, {plot_reliability(results, args)}")
    print(f"wall time {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
