"""The benchmarks' family protocol: `--family` picks workload families, `--tune-on FAMILY` names the one
family every allocation choice (a feature, a default, a threshold) was tuned on, which is then left out
of the report, so that what is reported was never tuned on.  Also what the benchmarks' command lines and
reports share: comma lists of names (`--family`, `--strategies`, `--arms`) and mean ± std over seeds."""

from __future__ import annotations

import argparse
import statistics
from collections.abc import Sequence


def comma_list(text: str) -> list[str]:
    """The names of a comma list such as `--family toolcall, math`, in order, blanks dropped."""
    return [name.strip() for name in text.split(",") if name.strip()]


def mean_std(values: Sequence[float]) -> tuple[float, float]:
    """The mean and the sample standard deviation of `values` (0 for a single value)."""
    return statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0


def mean_spread(values: Sequence[float | None], digits: int = 2, none: str = "> horizon") -> str:
    """mean ± std of the values that exist, and how many of them do when some are missing (a ratio past
    the horizon, say); ``none`` when none does."""
    present = [value for value in values if value is not None]
    if not present:
        return none
    mean, spread = mean_std(present)
    reached = "" if len(present) == len(values) else f" ({len(present)}/{len(values)})"
    return f"{mean:.{digits}f} ± {spread:.{digits}f}{reached}"


def add_family_arguments(parser: argparse.ArgumentParser, default_help: str) -> None:
    parser.add_argument("--family", default=None, help=f"family or comma list (default: {default_help})")
    parser.add_argument(
        "--tune-on",
        default=None,
        metavar="FAMILY",
        help="the family allocation choices were tuned on: run and report only the others",
    )


def chosen_families(
    parser: argparse.ArgumentParser, args: argparse.Namespace, known: Sequence[str]
) -> list[str]:
    """`--family` (default: every one of `known`) without `--tune-on`'s family; errors through `parser`."""
    wanted = list(known) if args.family is None else comma_list(args.family)
    named = wanted + ([args.tune_on] if args.tune_on else [])
    unknown = [name for name in named if name not in known]
    if unknown:
        parser.error(f"unknown families {unknown}; choose from {', '.join(known)}")
    reported = [name for name in wanted if name != args.tune_on]
    if not reported:
        parser.error(f"--tune-on {args.tune_on} leaves no family to report on")
    return reported


def check_sizes(parser: argparse.ArgumentParser, args: argparse.Namespace, names: Sequence[str]) -> None:
    """Errors through `parser` unless every option in `names` is at least 1 and `--pool` (the prompts
    offered each step) is at most `--prompts` (the tasks it is drawn from)."""
    for name in names:
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    if args.pool > args.prompts:
        parser.error("--pool cannot exceed --prompts")


def protocol_line(args: argparse.Namespace, families: Sequence[str]) -> str:
    """What the report covers, said in the output."""
    if args.tune_on:
        return (
            f"Tuned on {args.tune_on}: reporting only on the other families ({', '.join(families)}); "
            f"{args.tune_on} was not run."
        )
    return f"Families: {', '.join(families)} (no --tune-on: nothing is held out of the report)."
