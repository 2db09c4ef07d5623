"""Helpers shared by the workload-family tests."""

import math
from typing import cast

import numpy as np

from trace_lab.sim import RolloutState, TabularWorkload, Workload, make_workload

POLICY_FAMILIES = ("math", "multihop", "toolcall", "maze")
ALL_FAMILIES = ("react", *POLICY_FAMILIES)
# The maze family with other dynamics (success rates that drift fast): its shape is the maze's.
VARIANTS = ("maze_drift",)
# Seeded runs are deterministic; five standard errors keep a correct simulator far from the threshold
# while a wrong p (off by a few points at these sample sizes) fails.
Z_SCORE = 5.0


def policy_workload(family: str, seed: int, prompts: int) -> TabularWorkload:
    return cast(TabularWorkload, make_workload(family, seed, prompts))


def binomial_tolerance(p: float, samples: int) -> float:
    return Z_SCORE * math.sqrt(p * (1 - p) / samples)


def success_frequency(workload: Workload, state: RolloutState, samples: int, seed: int) -> float:
    trajectories = workload.run([state] * samples, np.random.default_rng(seed))
    return float(np.mean([trajectory[-1].reward for trajectory in trajectories]))


def root_success(workload: Workload) -> np.ndarray:
    return workload.true_success_many([prompt.prompt_id for prompt in workload.prompts])


def prompt_near(workload: Workload, target: float) -> str:
    return workload.prompts[int(np.argmin(np.abs(root_success(workload) - target)))].prompt_id
