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

from trace_lab.sim.state import Prompt, RolloutState

FloatArray = npt.NDArray[np.float64]
IntArray = npt.NDArray[np.int64]

# Probabilities are kept this far off 0 and 1 before taking logits, so that a logit is always finite.
LOGIT_EPSILON = 1e-9


def logit(p: FloatArray) -> FloatArray:
    """``log(p / (1 − p))`` of ``p`` clipped to ``[ε, 1 − ε]`` (ε = `LOGIT_EPSILON`)."""
    clipped = np.clip(p, LOGIT_EPSILON, 1 - LOGIT_EPSILON)
    return np.asarray(np.log(clipped) - np.log1p(-clipped), dtype=np.float64)


def sigmoid(x: FloatArray) -> FloatArray:
    """``1 / (1 + e^(−x))``, the inverse of `logit`."""
    return np.asarray(1.0 / (1.0 + np.exp(-x)), dtype=np.float64)


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
        """Step `step`'s pool: positions [step·size, (step + 1)·size) of a stream that concatenates one
        seeded permutation of the population per epoch, so every prompt is drawn exactly once per epoch
        and recurs about once per `len(prompts) / size` steps, as epochs over a data set.

        A pool that straddles two epochs must not hold a prompt twice: the new epoch's permutation is
        repaired so that its head (the pool's rest) holds no prompt of the old epoch's tail, each such
        prompt swapped with the first later allowed one. The pool depends only on (seed, size, step).
        """
        population = len(self.prompts)
        if not 0 <= size <= population:
            raise ValueError(f"pool size must lie in [0, {population}], got {size}")
        if step < 0:
            raise ValueError(f"step must be >= 0, got {step}")
        if size == 0:
            return []
        begin = step * size
        first_epoch, offset = divmod(begin, population)
        last_epoch = (begin + size - 1) // population
        orders = self._epoch_orders(size, last_epoch)
        stream = np.concatenate(orders[first_epoch : last_epoch + 1])
        return [self.prompts[index] for index in stream[offset : offset + size].tolist()]

    def _epoch_orders(self, size: int, last_epoch: int) -> list[IntArray]:
        """The repaired permutations of epochs 0 … `last_epoch` for pools of `size` (cached: each epoch's
        repair depends on the one before)."""
        caches: dict[int, list[IntArray]] | None = getattr(self, "_epoch_order_cache", None)
        if caches is None:
            caches = {}
            self._epoch_order_cache = caches
        orders = caches.setdefault(size, [])
        population = len(self.prompts)
        while len(orders) <= last_epoch:
            epoch = len(orders)
            order = np.random.default_rng([self.seed, 7, epoch]).permutation(population).astype(np.int64)
            tail = epoch * population % size  # the previous epoch's share of the straddling pool
            if epoch > 0 and tail:
                forbidden = set(orders[-1][population - tail :].tolist())
                later = size - tail
                for position in range(size - tail):
                    if int(order[position]) in forbidden:
                        while int(order[later]) in forbidden:
                            later += 1
                        order[position], order[later] = order[later], order[position]
                        later += 1
            orders.append(order)
        return orders

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
