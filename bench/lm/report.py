"""The LM learner's curves (`bench/lm/learn.py`): each (task, seed, arm)'s saved under a key of the
arguments that shape it, and the tables and plots made of them."""

from __future__ import annotations

import argparse
import hashlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np

from bench.learning_arms import UNIFORM
from bench.learning_report import cost_to_reach, success_at
from bench.lm.tasks import Task
from bench.plotting import line_colors
from bench.protocol import mean_spread


@dataclass
class TokenCurve:
    """One arm's run: cumulative generated tokens and rollouts after 0, 1, … updates, and held-out
    accuracy after the updates listed in ``evaluated`` (0: the warm start)."""

    greedy: list[float] = field(default_factory=list)
    sampled: list[float] = field(default_factory=list)
    evaluated: list[int] = field(default_factory=list)
    tokens: list[int] = field(default_factory=lambda: [0])
    rollouts: list[int] = field(default_factory=lambda: [0])
    mixed: list[int] = field(default_factory=list)
    active: list[int] = field(default_factory=list)

    def evaluated_at(self, costs: Sequence[int]) -> list[int]:
        """``costs`` (tokens or rollouts) at each evaluation."""
        return [costs[update] for update in self.evaluated]

    def record_accuracy(self, greedy: float, sampled: float) -> None:
        self.greedy.append(greedy)
        self.sampled.append(sampled)
        self.evaluated.append(len(self.tokens) - 1)


#: The arguments that do not change an arm's curve (a saved curve is reused whatever they are).
NOT_IN_RUN_KEY = frozenset(
    {"task", "tasks", "arms", "seeds", "threads", "step_timeout", "out", "runs", "quick"}
)


def run_path(task: Task, seed: int, arm: str, args: argparse.Namespace) -> Path:
    """Where the curve of (task, seed, arm, every argument that shapes it) is saved: a matrix can be run
    in parts (one process per task, say), an arm added later reuses the others, and the full command
    reports it all without running again."""
    shaping = {name: value for name, value in vars(args).items() if name not in NOT_IN_RUN_KEY}
    key = json.dumps([task.name, seed, shaping], sort_keys=True, default=str)
    return args.runs / f"{task.name}-s{seed}-{hashlib.sha256(key.encode()).hexdigest()[:12]}-{arm}.json"


def save_curve(path: Path, curve: TokenCurve) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    partial = path.with_suffix(".part")
    partial.write_text(json.dumps(asdict(curve)))
    partial.replace(path)  # never a half-written run


def load_curve(path: Path) -> TokenCurve | None:
    if not path.exists():
        return None
    return TokenCurve(**json.loads(path.read_text()))


@dataclass(frozen=True)
class ArmFigures:
    final_greedy: float
    final_sampled: float
    sampled_at_rollouts: float
    tokens_ratio: float | None
    mixed_share: float


def arm_figures(curves: dict[str, TokenCurve]) -> dict[str, ArmFigures]:
    """Per arm: accuracy at uniform's total tokens (and sampled at its total rollouts), the tokens it
    needed to reach uniform's final sampled accuracy (the policy RL trains) over uniform's own (None past
    the horizon, or when uniform did not improve)."""
    uniform = curves[UNIFORM]
    target, horizon = uniform.sampled[-1], uniform.tokens[-1]
    figures = {}
    for name, curve in curves.items():
        mine = cost_to_reach(curve.evaluated_at(curve.tokens), curve.sampled, target)
        theirs = cost_to_reach(uniform.evaluated_at(uniform.tokens), uniform.sampled, target)
        ratio = mine / theirs if target > uniform.sampled[0] and mine is not None and theirs else None
        figures[name] = ArmFigures(
            final_greedy=success_at(curve.evaluated_at(curve.tokens), curve.greedy, horizon),
            final_sampled=success_at(curve.evaluated_at(curve.tokens), curve.sampled, horizon),
            sampled_at_rollouts=success_at(
                curve.evaluated_at(curve.rollouts), curve.sampled, uniform.rollouts[-1]
            ),
            tokens_ratio=ratio,
            mixed_share=sum(curve.mixed) / max(1, sum(curve.active)),
        )
    return figures


def summary(results: dict[str, dict[int, dict[str, TokenCurve]]]) -> list[str]:
    lines = [
        "| task | arm | greedy pass@1 at uniform's tokens | sampled pass@1 | sampled pass@1 at uniform's "
        "rollouts | tokens to uniform's final sampled pass@1 (× uniform's) | mixed groups |",
        "|---|---|---|---|---|---|---|",
    ]
    for task, per_seed in results.items():
        figures = [arm_figures(curves) for curves in per_seed.values()]
        for name in figures[0]:
            rows = [seed_figures[name] for seed_figures in figures]

            greedy = mean_spread([r.final_greedy for r in rows], 3)
            sampled = mean_spread([r.final_sampled for r in rows], 3)
            by_rollouts = mean_spread([r.sampled_at_rollouts for r in rows], 3)
            ratio, mixed = (
                mean_spread([r.tokens_ratio for r in rows]),
                mean_spread([r.mixed_share for r in rows]),
            )
            lines.append(f"| {task} | {name} | {greedy} | {sampled} | {by_rollouts} | {ratio} | {mixed} |")
    return lines


def collapses(results: dict[str, dict[int, dict[str, TokenCurve]]]) -> list[str]:
    """A line for every (task, seed, arm) whose last sampled accuracy fell below its warm start's: RL
    made that arm's policy worse than where it began."""
    return [
        f"collapsed: {task} seed {seed} {name}: sampled pass@1 {curve.sampled[-1]:.3f} at its end, "
        f"below its warm start's {curve.sampled[0]:.3f}"
        for task, per_seed in results.items()
        for seed, curves in per_seed.items()
        for name, curve in curves.items()
        if curve.sampled and curve.sampled[-1] < curve.sampled[0]
    ]


def plot(results: dict[str, dict[int, dict[str, TokenCurve]]], out: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for task, per_seed in results.items():
        figure, axes = plt.subplots(figsize=(8, 5))
        for name, color in line_colors(list(next(iter(per_seed.values())))).items():
            curves = [curves[name] for curves in per_seed.values()]
            # Each seed's curve on one grid up to the shortest run's tokens, then the mean.
            tokens = np.linspace(0, min(c.tokens[c.evaluated[-1]] for c in curves), 64)
            for kind, style in (("sampled", "-"), ("greedy", ":")):
                mean = np.mean(
                    [np.interp(tokens, c.evaluated_at(c.tokens), getattr(c, kind)) for c in curves], axis=0
                )
                axes.plot(
                    tokens, mean, color=color, linestyle=style, label=name if kind == "sampled" else None
                )
        axes.set_xlabel("cumulative generated tokens")
        axes.set_ylabel("held-out pass@1: sampled (solid), greedy (dotted)")
        axes.grid(alpha=0.3)
        axes.legend()
        figure.suptitle(f"{task}: mean over {len(per_seed)} seeds")
        path = out / f"lm-{task}.png"
        figure.savefig(path, dpi=110)
        plt.close(figure)
        written.append(path)
    return written
