"""The ReAct-style simulated workload (family "react"): a martingale on p rendered as ReAct turns."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from trace_lab.sim.base import LOGIT_EPSILON, Workload, logit, sigmoid
from trace_lab.sim.config import SimConfig
from trace_lab.sim.state import Prompt, RolloutState, Turn
from trace_lab.sim.vocabulary import BoolArray, FloatArray, IntArray, Vocabulary

# Features clip logits: a hidden state does not grow without bound.
_FEATURE_LOGIT_CLIP = 6.0
# Prompt success rates stay strictly inside (0, 1), so learning can move every prompt on the logit scale.
_P0_EPSILON = 1e-6


class SimWorkload(Workload):
    """A pool of simulated multi-turn tasks whose true conditional success is known at every prefix.

    `seed` decides the prompts (success rates and texts); the vocabulary comes from
    `config.vocabulary.seed`; rollouts draw from the generator passed to `step_many` / `run`. In learning
    mode the caller reports each group with `learn`, and prompt success rates drift accordingly.
    """

    name = "react"

    def __init__(self, config: SimConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else SimConfig()
        self.seed = seed
        self.max_turns = self.config.max_turns
        self.vocabulary = Vocabulary(self.config.vocabulary, self.config.text)
        feature_rng = np.random.default_rng([self.config.vocabulary.seed, 1])
        direction = feature_rng.standard_normal(max(self.config.feature_dim, 1))
        self._feature_direction = direction / np.linalg.norm(direction)
        rng = np.random.default_rng(seed)
        self._logit_success = logit(self._draw_success_rates(rng))
        ids = [f"s{seed}-p{index:05d}" for index in range(self.config.prompts)]
        self._index = {prompt_id: index for index, prompt_id in enumerate(ids)}
        texts = self._prompt_texts(self._logit_success, rng)
        features = self._features(self._logit_success, rng)
        self._prompts = tuple(
            Prompt(prompt_id, text, None if features is None else features[index])
            for index, (prompt_id, text) in enumerate(zip(ids, texts, strict=True))
        )

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return self._prompts

    def prompt(self, prompt_id: str) -> Prompt:
        return self._prompts[self._lookup(prompt_id)]

    def sample_pool(self, size: int, rng: np.random.Generator) -> list[Prompt]:
        """`size` distinct prompts drawn uniformly without replacement."""
        if not 0 <= size <= len(self._prompts):
            raise ValueError(f"pool size must lie in [0, {len(self._prompts)}], got {size}")
        return [self._prompts[index] for index in rng.choice(len(self._prompts), size, replace=False)]

    def true_success(self, prompt_id: str) -> float:
        """The prompt's current success rate p0 (it moves in learning mode)."""
        return float(sigmoid(self._logit_success[self._lookup(prompt_id)]))

    def true_success_many(self, prompt_ids: Sequence[str]) -> FloatArray:
        indices = np.array([self._lookup(prompt_id) for prompt_id in prompt_ids], dtype=np.int64)
        return sigmoid(self._logit_success[indices])

    def learn(self, prompt_id: str, mixed: bool) -> None:
        """Learning mode: a mixed group trains the policy on the prompt (its logit rises by
        `config.learning_rate`); a group without contrast gives no gradient and changes nothing."""
        index = self._lookup(prompt_id)
        if mixed:
            self._logit_success[index] += self.config.learning_rate

    def expected_remaining_turns(self, state: RolloutState) -> float:
        """`SimConfig.expected_remaining_turns` at the state's depth: turns do not depend on p."""
        return self.config.expected_remaining_turns(state.turns)

    def start(self, prompt_id: str) -> RolloutState:
        return RolloutState(prompt_id, self.true_success(prompt_id))

    def step(self, state: RolloutState, rng: np.random.Generator) -> tuple[Turn, RolloutState]:
        """One more turn of one rollout; prefer `step_many` or `run` for many rollouts."""
        (after,) = self.step_many([state], rng)
        turn = after.last_turn
        assert turn is not None  # a stepped state always has a turn
        return turn, after

    def step_many(self, states: Sequence[RolloutState], rng: np.random.Generator) -> list[RolloutState]:
        """One more turn of each unfinished rollout, drawn in one vectorised batch.

        Stopping is decided before the turn from the turn count alone: the turn is final when it is turn
        `max_turns`, or with probability `stop_prob` once it is at least turn `min_turns`. Then, with
        B ~ Bernoulli(p) and step a (a ~ Uniform(step_size), a = 1 for the final turn):

            p' = (1 − a)·p + a·B,    E[p' | prefix] = (1 − a)·p + a·p = p,

        so p is a martingale; the final turn sets p' = B, the reward, hence P(reward = 1 | prefix) = p at
        every prefix whatever the stopping turn.
        """
        if any(state.done for state in states):
            raise ValueError("cannot step a finished rollout: its last turn already carries the reward")
        count = len(states)
        p = np.fromiter((state.p for state in states), dtype=np.float64, count=count)
        next_turn = np.fromiter((state.turns + 1 for state in states), dtype=np.int64, count=count)
        config = self.config
        may_stop = (next_turn >= config.min_turns) & (rng.random(count) < config.stop_prob)
        final = (next_turn >= config.max_turns) | may_stop
        low, high = config.step_size
        step = np.where(final, 1.0, rng.uniform(low, high, count))
        progressed = rng.random(count) < p
        p_next = (1 - step) * p + step * progressed
        texts = self._turn_texts(p, step, progressed, final, rng)
        features = self._features(logit(p_next), rng)
        after: list[RolloutState] = []
        for index, state in enumerate(states):
            is_final = bool(final[index])
            turn = Turn(
                text=texts[index],
                done=is_final,
                reward=float(progressed[index]) if is_final else None,
                features=None if features is None else features[index],
            )
            after.append(RolloutState(state.prompt_id, float(p_next[index]), (*state.history, turn)))
        return after

    def _lookup(self, prompt_id: str) -> int:
        try:
            return self._index[prompt_id]
        except KeyError:
            raise ValueError(f"unknown prompt_id {prompt_id!r} for workload seed {self.seed}") from None

    def _draw_success_rates(self, rng: np.random.Generator) -> FloatArray:
        components = self.config.difficulty
        weights = np.array([component.weight for component in components])
        chosen = rng.choice(len(components), self.config.prompts, p=weights / weights.sum())
        alpha = np.array([component.alpha for component in components])[chosen]
        beta = np.array([component.beta for component in components])[chosen]
        return np.clip(rng.beta(alpha, beta), _P0_EPSILON, 1 - _P0_EPSILON)

    def _uniform_lengths(self, bounds: tuple[int, int], count: int, rng: np.random.Generator) -> IntArray:
        return rng.integers(bounds[0], bounds[1] + 1, count).astype(np.int64)

    def _prompt_texts(self, logit_success: FloatArray, rng: np.random.Generator) -> list[str]:
        text = self.config.text
        count = logit_success.shape[0]
        return self.vocabulary.segments(
            self._uniform_lengths(text.prompt_words, count, rng),
            np.full(count, text.prompt_signal_rate),
            lambda owners: self.vocabulary.graded("difficulty", logit_success[owners], rng),
            rng,
        )

    def _turn_texts(
        self,
        p: FloatArray,
        step: FloatArray,
        progressed: BoolArray,
        final: BoolArray,
        rng: np.random.Generator,
    ) -> list[str]:
        text = self.config.text
        vocabulary = self.vocabulary
        count = p.shape[0]
        logit_p = logit(p)
        thoughts = vocabulary.segments(
            self._uniform_lengths(text.thought_words, count, rng),
            np.full(count, text.thought_signal_rate),
            lambda owners: vocabulary.graded("confidence", logit_p[owners], rng),
            rng,
        )
        tools = vocabulary.tools(count, rng)
        arguments = vocabulary.plain(self._uniform_lengths(text.action_arguments, count, rng), rng)
        # The more a turn moved p, the more clearly its observation says which way.
        largest_step = max(self.config.step_size[1], LOGIT_EPSILON)
        observation_rate = text.observation_signal_rate * np.minimum(1.0, step / largest_step)
        observations = vocabulary.segments(
            self._uniform_lengths(text.observation_words, count, rng),
            observation_rate,
            lambda owners: vocabulary.directional(progressed[owners], rng),
            rng,
        )
        actions = [
            vocabulary.finish_word if is_final else tool for tool, is_final in zip(tools, final, strict=True)
        ]
        return [
            f"Thought: {thought}\nAction: {action}[{argument}]\nObservation: {observation}"
            for thought, action, argument, observation in zip(
                thoughts, actions, arguments, observations, strict=True
            )
        ]

    def _features(self, logits: FloatArray, rng: np.random.Generator) -> list[tuple[float, ...]] | None:
        """signal · clip(logit, ±6) · u + N(0, I): a noisy stand-in for a pooled hidden state."""
        dim = self.config.feature_dim
        if dim == 0:
            return None
        clipped = np.clip(logits, -_FEATURE_LOGIT_CLIP, _FEATURE_LOGIT_CLIP)
        vectors = self.config.feature_signal * clipped[:, None] * self._feature_direction[None, :]
        vectors += rng.standard_normal((logits.shape[0], dim))
        return [tuple(row) for row in vectors.tolist()]
