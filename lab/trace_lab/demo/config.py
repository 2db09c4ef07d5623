"""The demo's configuration: `DemoConfig` and the command-line options that set it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from trace_proto import Policy


@dataclass(frozen=True)
class DemoConfig:
    """The demo's knobs; the defaults finish in well under two minutes on two CPU cores."""

    steps: int = 6
    # Twice the prompts the budget covers with groups of two: which prompts to sample is a real choice
    # (with every prompt affordable, uniform samples all of them and only group sizes differ).
    pool: int = 256
    budget: int = 256
    expansion: float = 1.0
    prompts: int = 384
    seed: int = 0
    policies: tuple[Policy, ...] = (Policy.TRACE, Policy.UNIFORM)
    concurrency: int = 256
    step_timeout: float = 60.0
    train_wait: float = 1.0
    out: Path = Path("trace-demo")
    url: str | None = None
    progress: bool = True

    def __post_init__(self) -> None:
        for name in ("steps", "pool", "budget", "prompts", "concurrency"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.pool > self.prompts:
            raise ValueError(f"pool ({self.pool}) cannot exceed the simulated prompts ({self.prompts})")
        if self.expansion < 0:
            raise ValueError(f"expansion must be >= 0, got {self.expansion}")
        if not self.policies or len(set(self.policies)) != len(self.policies):
            raise ValueError(f"policies must be distinct and not empty, got {self.policies}")
        if self.step_timeout <= 0 or self.train_wait < 0:
            raise ValueError("step_timeout must be positive and train_wait non-negative")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The demo's options; defaults are `DemoConfig`'s."""
    d = DemoConfig()
    parser.add_argument(
        "--url",
        type=service_url,
        default=None,
        help="drive the service at this http(s) URL instead of an in-process one (its token: TRACE_TOKEN)",
    )
    parser.add_argument(
        "--out", type=Path, default=d.out, help=f"folder for the plot and results.json ({d.out})"
    )
    parser.add_argument("--steps", type=int, default=d.steps, help=f"training steps per policy ({d.steps})")
    parser.add_argument("--pool", type=int, default=d.pool, help=f"candidate prompts per step ({d.pool})")
    parser.add_argument("--budget", type=int, default=d.budget, help=f"bare rollouts per step ({d.budget})")
    parser.add_argument(
        "--expansion",
        type=float,
        default=d.expansion,
        help=f"continuations per bare rollout ({d.expansion:g})",
    )
    parser.add_argument(
        "--prompts",
        type=int,
        default=d.prompts,
        help=f"simulated tasks the pools are drawn from ({d.prompts})",
    )
    parser.add_argument("--seed", type=int, default=d.seed, help=f"workload and pool seed ({d.seed})")
    parser.add_argument(
        "--policies",
        type=policy_list,
        default=d.policies,
        help=f"comma-separated, from {', '.join(p.value for p in Policy)} "
        f"({','.join(p.value for p in d.policies)})",
    )
    parser.add_argument(
        "--concurrency", type=int, default=d.concurrency, help=f"rollouts in flight ({d.concurrency})"
    )
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=d.step_timeout,
        help=f"seconds before a step's trees are closed ({d.step_timeout:g})",
    )
    parser.add_argument(
        "--json",
        action="store_true",
        help="print the results document (as results.json) on stdout; the table and progress go to stderr",
    )
    parser.add_argument("--quiet", action="store_true", help="no progress lines (none unless on a terminal)")


def service_url(text: str) -> str:
    """`--url`: an absolute http(s) URL."""
    url = urlsplit(text)
    if url.scheme not in ("http", "https") or not url.hostname:
        raise argparse.ArgumentTypeError(f"not an http(s) URL: {text!r}")
    return text


def policy_list(text: str) -> tuple[Policy, ...]:
    """`trace,uniform` → the policies, for `--policies`."""
    names = [name.strip() for name in text.split(",")]
    unknown = [name for name in names if name not in {p.value for p in Policy}]
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown {'policy' if len(unknown) == 1 else 'policies'} {', '.join(map(repr, unknown))}; "
            f"the policies are {', '.join(p.value for p in Policy)}"
        )
    return tuple(Policy(name) for name in names)


def config_from_arguments(args: argparse.Namespace) -> DemoConfig:
    return DemoConfig(
        steps=args.steps,
        pool=args.pool,
        budget=args.budget,
        expansion=args.expansion,
        prompts=args.prompts,
        seed=args.seed,
        policies=args.policies,
        concurrency=args.concurrency,
        step_timeout=args.step_timeout,
        out=args.out,
        url=args.url,
        progress=not args.quiet and (sys.stderr if args.json else sys.stdout).isatty(),
    )
