"""Load and faults: two service replicas over one Redis under a bounded simulated load, then the same load
with a replica killed, with Redis restarted, and with duplicate/reordered event storms.

    python bench/load.py                                  # every scenario, about two minutes
    python bench/load.py --scenarios baseline,storm --workers 8 --steps 2

One redis-server (append-only file on) and two `trace-rollout serve` processes on 127.0.0.1 serve every
scenario in turn, each scenario as its own job: `--steps` training steps with `--workers` async generation
workers spread over both replicas, then an audit of every tree allocated against what the workers were
told.  Rollouts are synthetic (a hidden success rate per prompt, 2-5 turns, neutral texts): the load
exercises the service's bookkeeping, not its predictor.

A worker's call goes to its own replica first and fails over to the other one on a refused connection, a
timeout or a 5xx; every call is safe to repeat (events carry their ids, allocations an idempotency key).
Trees still unfinished at a step's deadline are closed by the trainer.  The load and its audit are
`trace_lab.load` (the fault and cluster tests drive the same), Redis and the replicas come from
`trace_lab.local`.

Scenarios (run in this order):
  baseline       the load as is: events/s and report latency the service holds
  storm          every report sent as two randomly split batches, three concurrent copies of each over
                 both replicas, children ordered before their parents; unknown-parent refusals re-sent
  redis-restart  halfway through the bare rollouts of the middle step, redis-server is stopped (SIGTERM)
                 and started again 1.5 s later on the same port with the same append-only file
  replica-kill   at the same point one replica is SIGKILLed; it stays dead

Columns: events/s = distinct events acknowledged / load wall time; p50/p99 = time from a report's first
send until every event in it is acknowledged (failover and waits included); lost = acknowledged events
missing from the exported trees; over-spent = units started or promised beyond a budget (bare starts over
m_i, continuation starts over their instruction's count or the tree's budget, instruction counts over the
budget, job stats beyond their promise); miscounted = |leaf counters in job stats - leaves in the exported
trees| (an event applied twice or not at all); trees = complete / closed / still open.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import sys
import tempfile
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from trace_lab.load import (
    FAULT_TOLERANT_SETTINGS,
    Audit,
    Fault,
    Ledger,
    LoadConfig,
    LoadRun,
    Replicas,
    export_run,
    percentile,
)
from trace_lab.local import RedisServer, ServiceProcess

#: In the order they run on one fleet: a killed replica stays dead, so that scenario comes last.
SCENARIOS = ("baseline", "storm", "redis-restart", "replica-kill")


# --- scenarios ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ScenarioResult:
    scenario: str
    seconds: float
    audit: Audit
    report_seconds: list[float]
    failures: Counter[str]

    @property
    def healthy(self) -> bool:
        """A clean audit, and no attempt answered with a 500 or left hanging."""
        return self.audit.clean and not (self.failures["server_error"] or self.failures["timeout"])

    @property
    def events_per_second(self) -> float:
        return self.audit.events / self.seconds if self.seconds > 0 else 0.0

    def latency_ms(self, q: float) -> float:
        return percentile(self.report_seconds, q) * 1e3


async def run_scenario(
    urls: Sequence[str], config: LoadConfig, scenario: str, fault: Fault | None
) -> ScenarioResult:
    replicas = Replicas(urls, Ledger())
    try:
        run = LoadRun(replicas, config)
        seconds = await run.run(fault)
        result = await export_run(replicas, run)
    finally:
        await replicas.aclose()
    return ScenarioResult(scenario, seconds, result, replicas.ledger.report_seconds, replicas.ledger.failures)


def run_fleet(scenarios: Sequence[str], config: LoadConfig) -> list[ScenarioResult]:
    """One redis-server and two service processes; the scenarios run one after the other on them, each as
    its own job, in the order of SCENARIOS."""
    unknown = sorted(set(scenarios) - set(SCENARIOS))
    if unknown:
        raise ValueError(f"unknown scenarios {unknown}; choose from {', '.join(SCENARIOS)}")
    results = []
    with tempfile.TemporaryDirectory(prefix="trace-load-") as tmp:
        directory = Path(tmp)
        redis = RedisServer(directory).start()
        progress("starting two replicas (each imports torch: seconds)")
        services = [ServiceProcess(redis.url, directory, FAULT_TOLERANT_SETTINGS).start() for _ in range(2)]
        try:
            for service in services:
                service.wait_ready()
            faults: dict[str, Fault] = {
                "replica-kill": services[0].kill,
                "redis-restart": functools.partial(redis.restart, down_seconds=1.5),
            }
            for scenario in (name for name in SCENARIOS if name in scenarios):
                progress(f"{scenario} ...")
                job = dataclasses.replace(config, storm=scenario == "storm", job=f"load-{scenario}")
                urls = [service.url for service in services]
                result = asyncio.run(run_scenario(urls, job, scenario, faults.get(scenario)))
                progress(f"{scenario}: {result.audit.events} events in {result.seconds:.1f} s")
                results.append(result)
        finally:
            for service in services:
                service.stop()
            redis.stop()
    return results


def progress(message: str) -> None:
    print(f"[load] {message}", file=sys.stderr, flush=True)


def table(results: Sequence[ScenarioResult]) -> str:
    header = ("scenario", "events", "events/s", "p50 ms", "p99 ms", "lost", "over-spent", "miscounted",
              "trees done/closed/open", "failed attempts")  # fmt: skip
    rows = [header]
    for r in results:
        a = r.audit
        failures = ", ".join(f"{kind} {count}" for kind, count in sorted(r.failures.items())) or "-"
        rows.append(
            (r.scenario, str(a.events), f"{r.events_per_second:,.0f}", f"{r.latency_ms(0.5):.1f}",
             f"{r.latency_ms(0.99):.1f}", str(a.lost), str(a.overspent), str(a.miscounted),
             f"{a.complete}/{a.closed}/{a.open}", failures)
        )  # fmt: skip
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    return "\n".join(
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)) for row in rows
    )


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenarios", default=",".join(SCENARIOS), help="comma-separated: " + ", ".join(SCENARIOS)
    )
    parser.add_argument("--workers", type=int, default=LoadConfig.workers)
    parser.add_argument(
        "--rollouts-per-worker",
        type=int,
        default=LoadConfig.rollouts_per_worker,
        help="concurrent rollouts per worker",
    )
    parser.add_argument("--prompts", type=int, default=LoadConfig.prompts)
    parser.add_argument("--rollouts-per-prompt", type=int, default=LoadConfig.rollouts_per_prompt)
    parser.add_argument("--expansion", type=float, default=LoadConfig.expansion)
    parser.add_argument("--steps", type=int, default=LoadConfig.steps)
    parser.add_argument(
        "--step-timeout",
        type=float,
        default=LoadConfig.step_timeout,
        help="seconds before a step closes its trees",
    )
    parser.add_argument("--seed", type=int, default=LoadConfig.seed)
    args = parser.parse_args()
    scenarios = [name.strip() for name in args.scenarios.split(",") if name.strip()]
    if not set(scenarios) <= set(SCENARIOS):
        parser.error(f"--scenarios: choose from {', '.join(SCENARIOS)}")
    config = LoadConfig(
        steps=args.steps,
        prompts=args.prompts,
        rollouts_per_prompt=args.rollouts_per_prompt,
        expansion=args.expansion,
        workers=args.workers,
        rollouts_per_worker=args.rollouts_per_worker,
        step_timeout=args.step_timeout,
        seed=args.seed,
    )
    results = run_fleet(scenarios, config)
    print(
        f"{args.workers} workers × {args.rollouts_per_worker} rollouts, {args.steps} steps of"
        f" {args.prompts} prompts × {args.rollouts_per_prompt} bare rollouts, expansion {args.expansion},"
        " two replicas, one Redis"
    )
    print(table(results))
    print(
        "p50/p99: a report's first send until all its events are acknowledged (failover and waits included)."
    )
    failed = [r.scenario for r in results if not r.healthy]
    if failed:
        print(f"FAILED (audit, 500s or timeouts): {', '.join(failed)}", file=sys.stderr)
        sys.exit(1)


if __name__ == "__main__":
    main()
