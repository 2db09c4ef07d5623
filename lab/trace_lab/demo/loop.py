"""The demo's run loop: one job per policy, the policies taking turns step by step, against the service
at `DemoConfig.url` or one started in this process."""

from __future__ import annotations

import asyncio
import contextlib
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Final

import numpy as np

from trace_client import AsyncTraceClient
from trace_client.driver import DriverConfig, Progress, RolloutDriver
from trace_lab.demo.config import DemoConfig
from trace_lab.demo.report import DemoReport, PolicyRun, comparison_table, plot, write_results
from trace_lab.local import ThreadedService
from trace_lab.sim import SimConfig, SimWorkload
from trace_lab.sim.workers import SimAgent, prompt_in
from trace_proto import PREDICTOR_POLICIES, AllocateRequest, Policy

_POLL_SECONDS: Final = 0.25


class ServiceNotInstalled(RuntimeError):
    """The demo was to start the service in this process, but this install has no service."""


#: Where the demo's text goes (stdout by default; tests pass their own).
Write = Callable[[str], None]


def write_stdout(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


def write_stderr(text: str) -> None:
    sys.stderr.write(text)
    sys.stderr.flush()


async def run_demo(config: DemoConfig, url: str, write: Write) -> DemoReport:
    """Drive every policy of `config` for `config.steps` steps against the service at `url`, step by
    step: each step every policy runs in turn, each its own job with its own predictor."""
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
            # Between steps, give each job whose rules read Ṽ time to train its predictor.
            if step + 1 < config.steps:
                await asyncio.gather(
                    *(
                        _let_predictor_train(client, arm.job, config.train_wait)
                        for arm in arms
                        if arm.policy in PREDICTOR_POLICIES
                    )
                )
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
        uses_predictor = self.policy in PREDICTOR_POLICIES
        predictor = await self.client.predictor_info(self.job) if uses_predictor else None
        return PolicyRun(self.policy, self.job, stats, self.versions, predictor, self.seconds)


async def _let_predictor_train(client: AsyncTraceClient, job: str, patience: float) -> None:
    """Wait (at most `patience` seconds) for the job's predictor to publish a new version, i.e. for one
    more training round of the service's background loop on the job's trees that just completed."""
    version = (await client.predictor_info(job)).version
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        await asyncio.sleep(_POLL_SECONDS)
        if (await client.predictor_info(job)).version > version:
            return


@contextlib.contextmanager
def _service(config: DemoConfig) -> Iterator[str]:
    """The URL of the service to drive: `config.url`, or an in-process one on the embedded store."""
    if config.url is not None:
        yield config.url
        return
    try:
        from trace_service.app import create_app
        from trace_service.settings import Settings
    except ModuleNotFoundError as missing:
        raise ServiceNotInstalled(
            f"the in-process service needs the `service` extra ({missing.name} is not installed): "
            "pip install 'trace-rollout[demo]', or drive a running service with --url"
        ) from None

    # Fast background training so that each step's trees reach the predictor before the next one.
    settings = Settings(
        store_url="", data_dir="", train_interval_seconds=0.5, torch_threads=1, log_level="WARNING"
    )  # a fresh store per run: a comparison must not start from the last run's predictor
    with ThreadedService(create_app(settings)) as service:
        yield service.url


def run(config: DemoConfig, write: Write = write_stdout) -> DemoReport:
    """Run the demo end to end: drive the policies, print the table, write the plot and the JSON."""
    started = time.monotonic()
    with _service(config) as url:
        write(f"trace-rollout-demo against {url}\n")
        report = asyncio.run(run_demo(config, url, write))
    report = DemoReport(report.config, report.runs, time.monotonic() - started)
    write("\n" + comparison_table(report) + "\n")
    written = [write_results(report, config.out / "results.json")]
    figure = plot(report, config.out / "mixed_per_step.png")
    if figure is None:
        write("matplotlib is not installed: no plot (pip install 'trace-rollout[demo]')\n")
    else:
        written.append(figure)
    write(f"wrote {', '.join(str(path) for path in written)} in {report.seconds:.1f}s\n")
    return report
