"""A tiny policy family for the benchmark tests: each task is a 2-turn, 2-action MDP whose reward
probability depends on both actions, so its exact success J(θ) is a closed form and the learner's
gradient can be checked against finite differences."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trace_lab.sim import Prompt, RolloutState, Turn
from trace_lab.sim.base import FloatArray, PolicyWorkload
from trace_lab.sim.tabular import softmax_rows as softmax


class TinyPolicyWorkload(PolicyWorkload):
    """Context = the turn index (0 or 1); task k succeeds with probability `rewards[k, a1, a2]`."""

    name = "tiny"
    max_turns = 2
    contexts = 2
    actions = 2

    def __init__(self, rewards: Sequence[Sequence[Sequence[float]]], seed: int = 0) -> None:
        self.seed = seed
        self.rewards = np.asarray(rewards, dtype=np.float64)
        self._theta = np.zeros((self.contexts, self.actions))
        self._prompts = tuple(Prompt(f"tiny{seed}-{k}", f"task {k}") for k in range(len(self.rewards)))
        self._index = {prompt.prompt_id: k for k, prompt in enumerate(self._prompts)}

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return self._prompts

    def prompt(self, prompt_id: str) -> Prompt:
        return self._prompts[self._index[prompt_id]]

    @property
    def policy(self) -> FloatArray:
        return self._theta.copy()

    @policy.setter
    def policy(self, theta: FloatArray) -> None:
        self._theta = np.array(theta, dtype=np.float64)

    def context_of(self, state: RolloutState) -> int:
        return state.turns

    def _p(self, prompt_id: str, history: tuple[Turn, ...]) -> float:
        pi = softmax(self._theta)
        table = self.rewards[self._index[prompt_id]]
        if not history:
            return float(pi[0] @ table @ pi[1])
        first = history[0].action
        assert first is not None
        return float(table[first] @ pi[1])

    def start(self, prompt_id: str) -> RolloutState:
        return RolloutState(prompt_id, self._p(prompt_id, ()))

    def step_many(self, states: Sequence[RolloutState], rng: np.random.Generator) -> list[RolloutState]:
        pi = softmax(self._theta)
        after = []
        for state in states:
            action = int(rng.random() >= pi[state.turns, 0])
            if state.turns == 0:
                turn = Turn(text=f"first {action}", done=False, action=action)
                history = (turn,)
                after.append(RolloutState(state.prompt_id, self._p(state.prompt_id, history), history))
                continue
            first = state.history[0].action
            assert first is not None
            success = rng.random() < self.rewards[self._index[state.prompt_id], first, action]
            turn = Turn(text=f"second {action}", done=True, reward=float(success), action=action)
            after.append(RolloutState(state.prompt_id, float(success), (*state.history, turn)))
        return after

    def true_success_many(self, prompt_ids: Sequence[str]) -> FloatArray:
        return np.array([self._p(prompt_id, ()) for prompt_id in prompt_ids])

    def expected_remaining_turns(self, state: RolloutState) -> float:
        return float(self.max_turns - state.turns)

    def learn(self, prompt_id: str, mixed: bool) -> None:
        """The tiny family learns only through its policy."""
