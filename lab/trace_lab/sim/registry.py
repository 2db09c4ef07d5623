"""The workload families by name (`FAMILIES[name](seed, prompts, **overrides)` builds one) and how
their tasks spread (`root_summary`)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from trace_lab.sim.base import Workload
from trace_lab.sim.config import SimConfig
from trace_lab.sim.family_config import MathConfig, MazeConfig, MultihopConfig, ToolcallConfig
from trace_lab.sim.math_reasoning import MathWorkload
from trace_lab.sim.maze import MAZE_DRIFT, MazeDriftWorkload, MazeWorkload
from trace_lab.sim.multihop import MultihopWorkload
from trace_lab.sim.toolcall import ToolcallWorkload
from trace_lab.sim.workload import SimWorkload


class WorkloadFactory(Protocol):
    def __call__(self, seed: int, prompts: int | None = None, **overrides: Any) -> Workload: ...


def _factory(build: Callable[[Any, int], Workload], default: Any) -> WorkloadFactory:
    """A factory that replaces `prompts` (when given) and any other config fields in the default."""

    def make(seed: int, prompts: int | None = None, **overrides: Any) -> Workload:
        if prompts is not None:
            overrides["prompts"] = prompts
        return build(dataclasses.replace(default, **overrides), seed)

    return make


FAMILIES: dict[str, WorkloadFactory] = {
    "react": _factory(SimWorkload, SimConfig()),
    "math": _factory(MathWorkload, MathConfig()),
    "multihop": _factory(MultihopWorkload, MultihopConfig()),
    "toolcall": _factory(ToolcallWorkload, ToolcallConfig()),
    # The controls: no difficulty in the prompt text and no prompt recurring; success rates that drift.
    "maze": _factory(MazeWorkload, MazeConfig()),
    "maze_drift": _factory(MazeDriftWorkload, MAZE_DRIFT),
}


def make_workload(family: str, seed: int, prompts: int | None = None) -> Workload:
    """The named family's workload with its default config (and `prompts` tasks when given)."""
    try:
        factory = FAMILIES[family]
    except KeyError:
        raise ValueError(f"unknown workload family {family!r}; known: {sorted(FAMILIES)}") from None
    return factory(seed, prompts)


@dataclass(frozen=True, slots=True)
class RootSummary:
    """How a workload's tasks spread from their roots, as it stands: the share of tasks whose success
    lies below 0.05 and above 0.95, the mean success p̄, the intraclass correlation of a task's episodes
    Var(p_i) / (p̄(1 − p̄)) (1: each task always or never succeeds; 0: all tasks alike), the mean number
    of turns of a fresh rollout, and the expected share of mixed groups of 8 rollouts."""

    below_5_percent: float
    above_95_percent: float
    mean_success: float
    intraclass_correlation: float
    mean_turns: float
    mixed_share_of_8: float


def root_summary(workload: Workload) -> RootSummary:
    """`RootSummary` of the workload, exactly (from its stated probabilities, no sampling)."""
    starts = [workload.start(prompt.prompt_id) for prompt in workload.prompts]
    p = np.array([state.p for state in starts])
    mean = float(p.mean())
    spread = mean * (1 - mean)
    return RootSummary(
        below_5_percent=float(np.mean(p < 0.05)),
        above_95_percent=float(np.mean(p > 0.95)),
        mean_success=mean,
        intraclass_correlation=float(p.var() / spread) if spread > 0 else 0.0,
        mean_turns=float(np.mean([workload.expected_remaining_turns(state) for state in starts])),
        mixed_share_of_8=float(np.mean(1 - p**8 - (1 - p) ** 8)),
    )
