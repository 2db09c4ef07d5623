"""The demo's results: per-policy figures, the comparison table, the plot and the JSON document."""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

from trace_lab.demo.config import DemoConfig
from trace_proto import JobStats, Policy, PredictorInfo


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
        f"per step, {config.steps} steps, seed {config.seed}. The headline is `mixed`: trees whose rollouts "
        f"disagree, the groups a GRPO-style trainer learns from, at the same budget spent; effective ratio "
        f"= mixed / active, pooled over steps; predictor: version used at the last allocation → version at "
        f"the end, quality on held-out trees"
    )
    if config.steps < FEW_STEPS:
        lines.append(
            f"only {config.steps} step(s): the predictor trains on each step's finished trees, so the first "
            f"steps allocate from its prior; run --steps {FEW_STEPS} or more to see what it learns"
        )
    return "\n".join(lines)


#: Fewer steps than this are too few for the predictor to learn much: the footer says so.
FEW_STEPS = 5


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
    """Mixed trees and the effective ratio per step per policy, as a PNG; None when matplotlib is not
    installed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    from matplotlib.ticker import MaxNLocator

    figure, (mixed_axes, ratio_axes) = plt.subplots(1, 2, figsize=(11, 4.2), dpi=120)
    for run in report.runs:
        steps = [step.step for step in run.stats.steps]
        mixed_axes.plot(steps, [step.mixed for step in run.stats.steps], marker="o", label=run.policy.value)
        ratios = [math.nan if r is None else r for r in run.ratios()]
        ratio_axes.plot(steps, ratios, marker="o", label=run.policy.value)
    config = report.config
    mixed_axes.set_ylabel("mixed trees (rollouts that disagree)")
    ratio_axes.set_ylabel("effective ratio (mixed / active prompts)")
    ratio_axes.set_ylim(0, 1)
    for axes in (mixed_axes, ratio_axes):
        axes.set_xlabel("training step")
        axes.xaxis.set_major_locator(MaxNLocator(integer=True))
        axes.grid(alpha=0.3)
        axes.legend()
    figure.suptitle(f"Same budget per step: {config.budget} bare rollouts, expansion {config.expansion:g}")
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
