"""`trace-rollout demo`: TRACE against uniform allocation at the same budget, on the simulated agentic
workload, through the real HTTP API and the worker driver.

With no `--url` the service runs in this process (uvicorn on a free loopback port, the embedded store).
Each policy is one job on a fresh simulated workload (same seed, learning mode: a prompt whose group was
mixed gets easier, as if the policy had trained on it), run for `steps` training steps with the same
pools and budgets. The policies take turns step by step, so at every step each of them allocates from
the same predictor (the service has one, trained on every job's trees); after each step the demo gives
the service's background loop a moment to train on the step's trees before the next allocation. At the
end it prints a comparison table (from `GET /v1/jobs/{job}/stats` and `GET /v1/predictor`) and writes
`effective_ratio.png` and `results.json` under `--out`; with `--json` the results document goes to
stdout and everything else to stderr.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import sys
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final
from urllib.parse import urlsplit

import numpy as np

from trace_client import AsyncTraceClient
from trace_client.adapters.sim import SimAgent, prompt_in
from trace_client.driver import DriverConfig, Progress, RolloutDriver
from trace_client.local import LocalService
from trace_client.sim import SimConfig, SimWorkload
from trace_proto import AllocateRequest, JobStats, Policy, PredictorInfo

#: Policies whose allocations consult the predictor (the demo waits for it to train between steps).
_PREDICTOR_POLICIES: Final = frozenset(
    {Policy.TRACE, Policy.TRACE_PAPER, Policy.TRACE_ROOT, Policy.TRACE_PREFIX, Policy.PCL, Policy.KNAPSACK}
)
_POLL_SECONDS: Final = 0.25

#: Where the demo's text goes (stdout by default; tests pass their own).
Write = Callable[[str], None]


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


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


@dataclass(frozen=True)
class PolicyRun:
    """One policy's job: the service's per-step statistics and, for predictor policies, its predictor."""

    policy: Policy
    job: str
    stats: JobStats
    predictor_versions: list[int]
    predictor: PredictorInfo | None
    seconds: float

    @property
    def active(self) -> int:
        return sum(step.active for step in self.stats.steps)

    @property
    def mixed(self) -> int:
        return sum(step.mixed for step in self.stats.steps)

    @property
    def effective_ratio(self) -> float | None:
        """Mixed trees over active prompts, pooled over all steps (skipped prompts excluded)."""
        return self.mixed / self.active if self.active else None

    def ratios(self) -> list[float | None]:
        return [step.effective_ratio for step in self.stats.steps]


@dataclass(frozen=True)
class DemoReport:
    config: DemoConfig
    runs: list[PolicyRun] = field(default_factory=list)
    seconds: float = 0.0


async def run_demo(config: DemoConfig, url: str, write: Write) -> DemoReport:
    """Drive every policy of `config` for `config.steps` steps against the service at `url`, step by
    step: each step every policy runs in turn, so all of them allocate from the same predictor."""
    started = time.monotonic()
    async with AsyncTraceClient(url) as client:
        await client.health()  # an unreachable service fails here, before any job is started
        arms = [_PolicyArm(client, config, policy, write) for policy in config.policies]
        for arm in arms:
            write(f"{arm.label} job {arm.job}: {config.steps} steps, pool {config.pool}, ")
            write(f"budget {config.budget}\n")
        for step in range(config.steps):
            for arm in arms:
                await arm.run_step(step)
            if any(arm.policy in _PREDICTOR_POLICIES for arm in arms) and step + 1 < config.steps:
                await _let_predictor_train(client, config.train_wait)
        runs = [await arm.report() for arm in arms]
    return DemoReport(config, runs, time.monotonic() - started)


class _PolicyArm:
    """One policy's job on its own simulated workload (same seed and pools as every other arm)."""

    def __init__(self, client: AsyncTraceClient, config: DemoConfig, policy: Policy, write: Write) -> None:
        self.client, self.config, self.policy, self.write = client, config, policy, write
        self.workload = SimWorkload(SimConfig(prompts=config.prompts), seed=config.seed)
        self.agent = SimAgent(self.workload, np.random.default_rng([config.seed, 1]))
        self.pools = np.random.default_rng([config.seed, 2])
        self.job = f"demo-{policy.value}-{uuid.uuid4().hex[:6]}"
        self.label = f"[{policy.value}]"
        self.versions: list[int] = []
        self.seconds = 0.0
        self.width = 0  # of the last progress line, which a step's summary overwrites
        self.driver = RolloutDriver(
            client,
            self.agent.next_turn,
            config=DriverConfig(concurrency=config.concurrency, step_timeout=config.step_timeout),
            on_progress=self._show,
        )

    def _show(self, progress: Progress) -> None:
        if self.config.progress:
            line = f"{self.label} {progress.line()}"
            self.width = max(self.width, len(line))
            self.write(f"\r{line}")

    async def run_step(self, step: int) -> None:
        config = self.config
        pool = [prompt_in(prompt) for prompt in self.workload.sample_pool(config.pool, self.pools)]
        request = AllocateRequest(
            job=self.job,
            step=step,
            budget=config.budget,
            expansion=config.expansion,
            policy=self.policy,
            prompts=pool,
        )
        result = await self.driver.run_step(request)
        self.agent.learn(result)
        self.seconds += result.progress.elapsed
        self.versions.append(result.allocation.predictor_version)
        mixed = sum(tree.tree.mixed for tree in result.trees)
        summary = (
            f"{self.label} step {step}: mixed {mixed}/{len(result.trees)} trees, "
            f"{len(result.allocation.skipped)} skipped, predictor v{result.allocation.predictor_version}, "
            f"{result.progress.elapsed:.1f}s{' (timed out)' if result.timed_out else ''}"
        )
        self.write(f"\r{summary:<{self.width}}\n")

    async def report(self) -> PolicyRun:
        stats = await self.client.job_stats(self.job)
        uses_predictor = self.policy in _PREDICTOR_POLICIES
        predictor = await self.client.predictor_info() if uses_predictor else None
        return PolicyRun(self.policy, self.job, stats, self.versions, predictor, self.seconds)


async def _let_predictor_train(client: AsyncTraceClient, patience: float) -> None:
    """Wait (at most `patience` seconds) for the predictor to publish a new version, i.e. for one more
    training round of the service's background loop on the trees that just completed."""
    version = (await client.predictor_info()).version
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
        if (await client.predictor_info()).version > version:
            return


# --- presenting the results --------------------------------------------------------------------------


def _number(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def comparison_table(report: DemoReport) -> str:
    """The per-policy comparison and the per-step effective ratios, as aligned text."""
    header = (
        "policy",
        "eff. ratio",
        "last step",
        "mixed",
        "active",
        "skipped",
        "bare",
        "cont.",
        "budget spent",
        "predictor",
        "Brier",
        "Spearman",
    )
    rows = [header]
    for run in report.runs:
        steps = run.stats.steps
        bare = sum(step.rollouts_spent for step in steps)
        continuations = sum(step.continuations_spent for step in steps)
        info = run.predictor
        rows.append(
            (
                run.policy.value,
                _number(run.effective_ratio),
                _number(steps[-1].effective_ratio if steps else None),
                str(run.mixed),
                str(run.active),
                str(sum(step.skipped for step in steps)),
                str(bare),
                str(continuations),
                str(bare + continuations),
                "—" if info is None else f"v{run.predictor_versions[-1]}→v{info.version}",
                _number(None if info is None else info.brier),
                _number(None if info is None else info.spearman),
            )
        )
    lines = [_aligned(rows)]
    per_step = [("step", *(run.policy.value for run in report.runs))]
    for index in range(report.config.steps):
        per_step.append((str(index), *(_number(_at(run.ratios(), index)) for run in report.runs)))
    lines.append("effective ratio per step (mixed trees / active prompts):")
    lines.append(_aligned(per_step))
    config = report.config
    lines.append(
        f"pool {config.pool} prompts, budget {config.budget} bare rollouts + expansion {config.expansion:g} "
        f"per step, {config.steps} steps, seed {config.seed}; effective ratio pooled over steps; "
        f"predictor: version used at the last allocation → version at the end, quality on held-out trees"
    )
    return "\n".join(lines)


def _at(values: list[float | None], index: int) -> float | None:
    return values[index] if index < len(values) else None


def _aligned(rows: Sequence[Sequence[str]]) -> str:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    return "\n".join(
        "  ".join(
            cell.ljust(width) if column == 0 else cell.rjust(width)
            for column, (cell, width) in enumerate(zip(row, widths, strict=True))
        )
        for row in rows
    )


def plot(report: DemoReport, path: Path) -> Path | None:
    """Effective ratio per step per policy, as a PNG; None when matplotlib is not installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    figure, axes = plt.subplots(figsize=(7, 4.2), dpi=120)
    for run in report.runs:
        ratios = run.ratios()
        steps = [step.step for step in run.stats.steps]
        axes.plot(steps, [np.nan if r is None else r for r in ratios], marker="o", label=run.policy.value)
    config = report.config
    axes.set_xlabel("training step")
    axes.set_ylabel("effective ratio (mixed / active prompts)")
    axes.set_title(f"Same budget per step: {config.budget} bare rollouts, expansion {config.expansion:g}")
    axes.set_ylim(0, 1)
    axes.grid(alpha=0.3)
    axes.legend()
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


def results_document(report: DemoReport) -> dict[str, object]:
    """The report as JSON data: configuration, and per policy the table's figures, its per-step
    statistics and its predictor."""
    config = asdict(report.config)
    config["out"] = str(report.config.out)
    runs = []
    for run in report.runs:
        steps = run.stats.steps
        bare = sum(step.rollouts_spent for step in steps)
        continuations = sum(step.continuations_spent for step in steps)
        runs.append(
            {
                "policy": run.policy.value,
                "job": run.job,
                "seconds": run.seconds,
                "effective_ratio": run.effective_ratio,
                "last_step_effective_ratio": steps[-1].effective_ratio if steps else None,
                "mixed": run.mixed,
                "active": run.active,
                "skipped": sum(step.skipped for step in steps),
                "rollouts_spent": bare,
                "continuations_spent": continuations,
                "budget_spent": bare + continuations,
                "predictor_versions": run.predictor_versions,
                "predictor": None if run.predictor is None else run.predictor.model_dump(mode="json"),
                "steps": [step.model_dump(mode="json") for step in steps],
            }
        )
    return {"config": config, "seconds": report.seconds, "runs": runs}


def write_results(report: DemoReport, path: Path) -> Path:
    """`results_document` as a JSON file."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results_document(report), indent=2) + "\n")
    return path


# --- running it ----------------------------------------------------------------------------------------


@contextlib.contextmanager
def _service(config: DemoConfig) -> Iterator[str]:
    """The URL of the service to drive: `config.url`, or an in-process one on the embedded store."""
    if config.url is not None:
        yield config.url
        return
    from trace_service.app import create_app
    from trace_service.settings import Settings

    # Fast background training so that each step's trees reach the predictor before the next one.
    settings = Settings(
        store_url="", data_dir="", train_interval_seconds=0.5, torch_threads=1, log_level="WARNING"
    )  # a fresh store per run: a comparison must not start from the last run's predictor
    with LocalService(create_app(settings)) as service:
        yield service.url


def run(config: DemoConfig, write: Write = write_stdout) -> DemoReport:
    """Run the demo end to end: drive the policies, print the table, write the plot and the JSON."""
    started = time.monotonic()
    with _service(config) as url:
        write(f"trace-rollout demo against {url}\n")
        report = asyncio.run(run_demo(config, url, write))
    report = DemoReport(report.config, report.runs, time.monotonic() - started)
    write("\n" + comparison_table(report) + "\n")
    written = [write_results(report, config.out / "results.json")]
    figure = plot(report, config.out / "effective_ratio.png")
    if figure is None:
        write("matplotlib is not installed: no plot (pip install 'trace-rollout[bench]')\n")
    else:
        written.append(figure)
    write(f"wrote {', '.join(str(path) for path in written)} in {report.seconds:.1f}s\n")
    return report


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The `demo` subcommand's options; defaults are `DemoConfig`'s."""
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
    return tuple(Policy(name.strip()) for name in text.split(","))


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
