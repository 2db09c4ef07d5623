"""What every simulated workload family offers the demo, the benchmarks and the tests.

A family is a population of multi-turn tasks with a verifiable binary reward whose true conditional
success P(reward = 1 | prefix) is known exactly at every prefix (`RolloutState.p`). Prefixes are values:
continuing one any number of times shares it exactly. A *policy family* (`PolicyWorkload`) is driven by a
parametrised softmax policy over a finite action set, so a learner can train it by policy gradient and
have its success evaluated exactly.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from trace_client.sim.state import Prompt, RolloutState

FloatArray = npt.NDArray[np.float64]


class Workload(ABC):
    """A population of simulated tasks (`prompts`), larger than one step's pool."""

    name: str
    seed: int
    max_turns: int

    @property
    @abstractmethod
    def prompts(self) -> tuple[Prompt, ...]: ...

    @abstractmethod
    def prompt(self, prompt_id: str) -> Prompt: ...

    def epoch_pool(self, step: int, size: int) -> list[Prompt]:
        """Step `step`'s pool: consecutive slices of a seeded shuffle of the population, reshuffled every
        epoch, so a prompt recurs about once per `len(prompts) / size` steps, as epochs over a data set."""
        population = len(self.prompts)
        if not 0 <= size <= population:
            raise ValueError(f"pool size must lie in [0, {population}], got {size}")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        chosen: list[int] = []
        cursor = step * size
        while len(chosen) < size:
            epoch, offset = divmod(cursor, population)
            order = np.random.default_rng([self.seed, 7, epoch]).permutation(population)
            take = order[offset : offset + size - len(chosen)].tolist()
            chosen.extend(index for index in take if index not in chosen)
            cursor += len(take)
        return [self.prompts[index] for index in chosen]

    @abstractmethod
    def start(self, prompt_id: str) -> RolloutState:
        """The empty prefix of a fresh rollout of `prompt_id`."""

    @abstractmethod
    def step_many(self, states: Sequence[RolloutState], rng: np.random.Generator) -> list[RolloutState]:
        """One more turn of each unfinished rollout, drawn in one vectorised batch."""

    def run(self, states: Sequence[RolloutState], rng: np.random.Generator) -> list[tuple[RolloutState, ...]]:
        """Continue every state to its final turn; per input, the states after each new turn in order."""
        if any(state.done for state in states):
            raise ValueError("cannot continue a finished rollout: its last turn already carries the reward")
        trajectories: list[list[RolloutState]] = [[] for _ in states]
        current = list(states)
        active = list(range(len(states)))
        while active:
            stepped = self.step_many([current[index] for index in active], rng)
            for index, state in zip(active, stepped, strict=True):
                trajectories[index].append(state)
                current[index] = state
            active = [index for index in active if not current[index].done]
        return [tuple(trajectory) for trajectory in trajectories]

    @abstractmethod
    def true_success_many(self, prompt_ids: Sequence[str]) -> FloatArray:
        """Each prompt's exact success probability from its root, as the workload stands now."""

    def true_success(self, prompt_id: str) -> float:
        return float(self.true_success_many([prompt_id])[0])

    @abstractmethod
    def expected_remaining_turns(self, state: RolloutState) -> float:
        """Mean number of turns a continuation from `state` generates (exact)."""

    @abstractmethod
    def learn(self, prompt_id: str, mixed: bool) -> None:
        """Learning mode without a learner: a mixed group raises the prompt's success; others change
        nothing."""


class PolicyWorkload(Workload):
    """A family driven by a softmax policy π_θ(a | c) = softmax(θ[c])_a over `actions` actions in
    `contexts` observable contexts (what the agent can read of its history: the task's visible type,
    its progress, ...). Every turn records its action (`Turn.action`); `context_of(state)` is the
    context in which the next turn's action is chosen. Setting `policy` changes every success
    probability; states made before keep the probabilities they were made with."""

    contexts: int
    actions: int

    @property
    @abstractmethod
    def policy(self) -> FloatArray:
        """θ, shape (contexts, actions); a copy."""

    @policy.setter
    @abstractmethod
    def policy(self, theta: FloatArray) -> None: ...

    @abstractmethod
    def context_of(self, state: RolloutState) -> int:
        """The context in which the action of the turn after `state` is chosen."""
