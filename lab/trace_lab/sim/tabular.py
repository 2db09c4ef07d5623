"""The exact tabular engine behind the policy families (`math`, `multihop`, `toolcall`).

Each task i is a finite-horizon MDP over a small latent state space that all tasks of a family share:
states 0 … S − 1, the last two terminal (SUCCESS = S − 2, reward 1; FAILURE = S − 1, reward 0), at most
H = `max_turns` turns, `actions` actions. At turn t (0-based) in latent state s the agent reads the
context c = C[t, i, s] and draws a ~ π_θ(· | c) = softmax(θ[c]); then outcome k ~ P[t, i, s, a, ·] moves
it to s' = N[t, s, a, k]. Every outcome of the last turn (t = H − 1) is terminal; terminal states absorb.

Exactness: backward dynamic programming under the current θ,

    V_H(s) = [s = SUCCESS],
    V_t(s) = Σ_a π_θ(a | C[t, i, s]) Σ_k P[t, i, s, a, k] · V_{t+1}(N[t, s, a, k]),

is P(reward = 1 | latent state s after t turns), and a rollout draws a and k from exactly these
distributions, so the state after turn t carries p = V_t(s) and E[V_{t+1}(s') | s] = V_t(s) (the
recursion itself): p is a martingale ending at the reward. The expected number of remaining turns obeys
the same recursion with L(terminal) = 0 and L_t(s) = 1 + E[L_{t+1}(s')].
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from trace_lab.sim.base import PolicyWorkload, logit
from trace_lab.sim.family_config import FamilyConfig, LogitComponent
from trace_lab.sim.lexicon import Lexicon
from trace_lab.sim.state import Prompt, RolloutState, Turn

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]

# Features clip logits: a hidden state does not grow without bound.
_FEATURE_LOGIT_CLIP = 6.0


def softmax_rows(theta: FloatArray) -> FloatArray:
    shifted = np.exp(theta - theta.max(axis=-1, keepdims=True))
    return np.asarray(shifted / shifted.sum(axis=-1, keepdims=True), dtype=np.float64)


def draw_rows(probabilities: FloatArray, rng: np.random.Generator) -> IntArray:
    """One index per row, drawn from that row's distribution by inverse CDF.

    The CDF is divided by its last entry, so it ends at exactly 1 and an outcome of probability 0 (a flat
    step of the CDF) is never drawn, whatever the round-off.
    """
    cdf = np.cumsum(probabilities, axis=-1)
    cdf /= cdf[:, -1:]
    u = rng.random((probabilities.shape[0], 1))
    return np.asarray((u >= cdf).sum(axis=-1), dtype=np.int64)


def draw_difficulty(components: Sequence[LogitComponent], count: int, rng: np.random.Generator) -> FloatArray:
    """`count` latent difficulties z from a mixture of normals on the logit scale."""
    weights = np.array([component.weight for component in components])
    chosen = rng.choice(len(components), count, p=weights / weights.sum())
    means = np.array([component.mean for component in components])[chosen]
    sds = np.array([component.sd for component in components])[chosen]
    return np.asarray(means + sds * rng.standard_normal(count), dtype=np.float64)


def uniform_lengths(bounds: tuple[int, int], count: int, rng: np.random.Generator) -> IntArray:
    """`count` lengths drawn uniformly from the inclusive range `bounds`."""
    return np.asarray(rng.integers(bounds[0], bounds[1] + 1, size=(count,)), dtype=np.int64)


def noisy_labels(labels: IntArray, classes: int, noise: float, rng: np.random.Generator) -> IntArray:
    """Each label kept with probability 1 − noise, else replaced by a uniformly chosen other class."""
    if classes == 1:
        return labels.copy()
    shift = rng.integers(1, classes, labels.shape[0])
    wrong = rng.random(labels.shape[0]) < noise
    return np.where(wrong, (labels + shift) % classes, labels).astype(np.int64)


def draw_tasks(
    config: FamilyConfig, classes: int, noise: float, rng: np.random.Generator
) -> tuple[IntArray, IntArray, FloatArray]:
    """Per task its type (uniform over `classes`), the type the agent sees (`noisy_labels` with `noise`)
    and its difficulty z (`draw_difficulty` from `config.difficulty`)."""
    kind = rng.integers(0, classes, config.prompts).astype(np.int64)
    visible = noisy_labels(kind, classes, noise, rng)
    return kind, visible, draw_difficulty(config.difficulty, config.prompts, rng)


def apparent_difficulty(difficulty: FloatArray, config: FamilyConfig, rng: np.random.Generator) -> FloatArray:
    """How easy each prompt reads: z + `text_bias` · ε, ε ~ N(0, 1), an offset all of a prompt's graded
    words share (so text can mislead consistently); `graded_prompt_words` blurs each word again."""
    return np.asarray(
        difficulty + config.text_bias * rng.standard_normal(difficulty.shape[0]), dtype=np.float64
    )


def graded_prompt_words(
    lexicon: Lexicon,
    word_class: str,
    apparent: FloatArray,
    levels: int,
    span: float,
    config: FamilyConfig,
    rng: np.random.Generator,
) -> list[str]:
    """One text per prompt, `prompt_words` long: each word with probability `prompt_signal_rate` a word of
    the graded `word_class` for the prompt's `apparent` logit blurred by `level_noise`, else a distractor."""
    count = apparent.shape[0]
    lengths = uniform_lengths(config.prompt_words, count, rng)
    return lexicon.segments(
        lengths,
        np.full(count, config.prompt_signal_rate),
        lambda owners: lexicon.graded_words(
            word_class, apparent[owners], levels, config.level_noise, span, rng
        ),
        rng,
    )


@dataclass(frozen=True, slots=True)
class TurnDraw:
    """One batch of drawn turns, for rendering: per turn its task, turn index t (0-based), the latent
    state before and after, the action and the outcome index."""

    tasks: IntArray
    turn: IntArray
    before: IntArray
    action: IntArray
    outcome: IntArray
    after: IntArray


class TabularWorkload(PolicyWorkload):
    """A population of tabular MDP tasks with exact values under the current policy (see the module).

    A family subclass draws its tasks, then calls `__init__` with its config, and supplies the tables
    (`_next_states`, `_context_table`, `_transition_probabilities`, the last reading the per-task
    competence) and the text (`_prompt_texts`, `_turn_texts`). Only non-terminal rows of the tables need
    filling.
    """

    def __init__(
        self,
        config: FamilyConfig,
        *,
        seed: int,
        states: int,
        contexts: int,
        theta: FloatArray,
        text_rng: np.random.Generator,
    ) -> None:
        prompts, max_turns = config.prompts, config.max_turns
        self.seed = seed
        self.max_turns = max_turns
        self.states = states
        self.actions = config.actions
        self.contexts = contexts
        self.success_state = states - 2
        self.failure_state = states - 1
        self._learning_rate = config.learning_rate
        self._feature_dim = config.feature_dim
        self._feature_signal = config.feature_signal
        # The feature direction follows the vocabulary seed: held-out tasks read features the same way.
        direction = np.random.default_rng([config.vocabulary_seed, 1]).standard_normal(
            max(config.feature_dim, 1)
        )
        self._feature_direction = direction / np.linalg.norm(direction)
        self._competence = np.zeros(prompts)
        self._next_state = self._with_absorbing_next(self._next_states())
        self._contexts = self._context_table()
        everyone = np.arange(prompts)
        self._probabilities = self._with_absorbing_probabilities(self._transition_probabilities(everyone))
        self._check_tables()
        self._values = np.zeros((max_turns + 1, prompts, states))
        self._lengths = np.zeros((max_turns + 1, prompts, states))
        self._stale_lengths = np.ones(prompts, dtype=np.bool_)
        self.policy = theta
        ids = [f"{self.name}{seed}-p{index:05d}" for index in range(prompts)]
        self._index = {prompt_id: index for index, prompt_id in enumerate(ids)}
        root = self._values[0, :, 0]
        features = self._features(root, text_rng)
        self._prompts = tuple(
            Prompt(prompt_id, text, None if features is None else features[index])
            for index, (prompt_id, text) in enumerate(zip(ids, self._prompt_texts(text_rng), strict=True))
        )

    # --- what a family supplies ---------------------------------------------------------------------

    @abstractmethod
    def _next_states(self) -> IntArray:
        """N, shape (max_turns, states, actions, outcomes), shared by all tasks."""

    @abstractmethod
    def _context_table(self) -> IntArray:
        """C, shape (max_turns, prompts, states): the context read at turn t in latent state s."""

    @abstractmethod
    def _transition_probabilities(self, tasks: IntArray) -> FloatArray:
        """P for the given tasks, shape (max_turns, len(tasks), states, actions, outcomes)."""

    @abstractmethod
    def right_actions(self) -> IntArray:
        """Per context, the action that is right there for a task whose visible type is its true type:
        an expert's policy (its one-hot logits raise success wherever the type is read correctly)."""

    @abstractmethod
    def _prompt_texts(self, rng: np.random.Generator) -> list[str]:
        """One text per task, in task order."""

    @abstractmethod
    def _turn_texts(self, draw: TurnDraw, rng: np.random.Generator) -> list[str]:
        """One text per drawn turn."""

    # --- the Workload interface ---------------------------------------------------------------------

    @property
    def prompts(self) -> tuple[Prompt, ...]:
        return self._prompts

    def prompt(self, prompt_id: str) -> Prompt:
        return self._prompts[self._lookup(prompt_id)]

    @property
    def policy(self) -> FloatArray:
        return self._theta.copy()

    @policy.setter
    def policy(self, theta: FloatArray) -> None:
        """Set θ and recompute every task's values (one vectorised backward pass)."""
        theta = np.asarray(theta, dtype=np.float64)
        if theta.shape != (self.contexts, self.actions):
            raise ValueError(f"policy must have shape {(self.contexts, self.actions)}, got {theta.shape}")
        if not np.isfinite(theta).all():
            raise ValueError("policy logits must be finite")
        self._theta = theta.copy()
        self._action_probabilities = softmax_rows(self._theta)
        self._solve(slice(None))

    def action_probabilities(self) -> FloatArray:
        """π_θ(a | c), shape (contexts, actions)."""
        return self._action_probabilities.copy()

    def context_of(self, state: RolloutState) -> int:
        if state.done:
            raise ValueError("a finished rollout chooses no further action")
        index, latent = self._locate(state)
        return int(self._contexts[state.turns, index, latent])

    def start(self, prompt_id: str) -> RolloutState:
        index = self._lookup(prompt_id)
        return RolloutState(prompt_id, float(self._values[0, index, 0]), (), (0,))

    def true_success_many(self, prompt_ids: Sequence[str]) -> FloatArray:
        indices = np.array([self._lookup(prompt_id) for prompt_id in prompt_ids], dtype=np.int64)
        return np.asarray(self._values[0, indices, 0], dtype=np.float64)

    def expected_remaining_turns(self, state: RolloutState) -> float:
        index, latent = self._locate(state)
        return float(self._fresh_lengths(index)[state.turns, latent])

    def successors(self, state: RolloutState) -> tuple[FloatArray, IntArray, FloatArray]:
        """The exact one-turn lookahead from an unfinished state, each of shape (actions, outcomes): the
        probability π_θ(a | c) · P(k | s, a) of every (action, outcome) pair, the latent state s' it leads
        to, and V_{t+1}(s') there. Σ probability · value = V_t(s), the martingale property."""
        if state.done:
            raise ValueError("a finished rollout has no successors")
        index, latent = self._locate(state)
        turn = state.turns
        policy = self._action_probabilities[self._contexts[turn, index, latent]]
        probability = policy[:, None] * self._probabilities[turn, index, latent]
        after = self._next_state[turn, latent].copy()
        return probability, after, self._values[turn + 1, index, after]

    def value(self, state: RolloutState) -> float:
        """V_t(s) of the state under the current policy (its `p` unless the policy changed since)."""
        index, latent = self._locate(state)
        return float(self._values[state.turns, index, latent])

    def learn(self, prompt_id: str, mixed: bool) -> None:
        """Learning mode: a mixed group raises the task's competence (a logit offset on its
        success-relevant transitions) by the config's learning rate, and its values are recomputed; a
        group without contrast gives no gradient and changes nothing."""
        index = self._lookup(prompt_id)
        if not mixed:
            return
        self._competence[index] += self._learning_rate
        task = np.array([index])
        self._probabilities[:, task] = self._with_absorbing_probabilities(
            self._transition_probabilities(task)
        )
        self._solve(task)

    def step_many(self, states: Sequence[RolloutState], rng: np.random.Generator) -> list[RolloutState]:
        """One more turn of each unfinished rollout: a ~ π_θ(· | C[t, i, s]), k ~ P[t, i, s, a, ·],
        s' = N[t, s, a, k], p' = V_{t+1}(s'); the turn is final when s' is terminal."""
        if any(state.done for state in states):
            raise ValueError("cannot step a finished rollout: its last turn already carries the reward")
        located = [self._locate(state) for state in states]
        tasks = np.array([index for index, _ in located], dtype=np.int64).reshape(-1)
        before = np.array([latent for _, latent in located], dtype=np.int64).reshape(-1)
        turn = np.array([state.turns for state in states], dtype=np.int64).reshape(-1)
        action = draw_rows(self._action_probabilities[self._contexts[turn, tasks, before]], rng)
        outcome = draw_rows(self._probabilities[turn, tasks, before, action], rng)
        after = self._next_state[turn, before, action, outcome]
        p_after = self._values[turn + 1, tasks, after]
        final = after >= self.success_state
        draw = TurnDraw(tasks=tasks, turn=turn, before=before, action=action, outcome=outcome, after=after)
        texts = self._turn_texts(draw, rng)
        features = self._features(p_after, rng)
        stepped: list[RolloutState] = []
        for row, state in enumerate(states):
            is_final = bool(final[row])
            reward = float(after[row] == self.success_state) if is_final else None
            turn_made = Turn(
                text=texts[row],
                done=is_final,
                reward=reward,
                features=None if features is None else features[row],
                action=int(action[row]),
            )
            stepped.append(
                RolloutState(
                    state.prompt_id, float(p_after[row]), (*state.history, turn_made), (int(after[row]),)
                )
            )
        return stepped

    # --- internals ----------------------------------------------------------------------------------

    def _solve(self, tasks: IntArray | slice) -> None:
        """Values V for the given tasks under the current θ; their lengths L are recomputed on demand."""
        self._values[:, tasks] = self._backward(tasks, success=1.0, turn_cost=0.0)
        self._stale_lengths[tasks] = True

    def _fresh_lengths(self, index: int) -> FloatArray:
        """L for task `index`, after recomputing it (with every other stale task's) if θ or its
        competence changed since."""
        if self._stale_lengths[index]:
            stale = np.flatnonzero(self._stale_lengths)
            self._lengths[:, stale] = self._backward(stale, success=0.0, turn_cost=1.0)
            self._stale_lengths[stale] = False
        return np.asarray(self._lengths[:, index], dtype=np.float64)

    def _backward(self, tasks: IntArray | slice, success: float, turn_cost: float) -> FloatArray:
        """X_t(s) = turn_cost + Σ_a π_θ(a | C[t, i, s]) Σ_k P[t, i, s, a, k] · X_{t+1}(N[t, s, a, k]) for
        open states, X(SUCCESS) = success and X(FAILURE) = 0 always (the module's V and L)."""
        count = len(self._competence) if isinstance(tasks, slice) else tasks.shape[0]
        terminal = [self.success_state, self.failure_state]
        result = np.zeros((self.max_turns + 1, count, self.states))
        result[:, :, self.success_state] = success
        for t in range(self.max_turns - 1, -1, -1):
            policy = self._action_probabilities[self._contexts[t][tasks]]
            transition = self._probabilities[t][tasks]
            after = result[t + 1][:, self._next_state[t]]
            result[t] = turn_cost + np.einsum("nsa,nsak,nsak->ns", policy, transition, after)
            result[t][:, terminal] = (success, 0.0)
        if success:
            np.clip(result, 0.0, 1.0, out=result)  # round-off must not push a probability past 1
        return result

    def _with_absorbing_next(self, next_state: IntArray) -> IntArray:
        next_state = next_state.astype(np.int64).copy()
        for terminal in (self.success_state, self.failure_state):
            next_state[:, terminal] = terminal
        return next_state

    def _with_absorbing_probabilities(self, probabilities: FloatArray) -> FloatArray:
        probabilities = probabilities.copy()
        for terminal in (self.success_state, self.failure_state):
            probabilities[:, :, terminal] = 0.0
            probabilities[:, :, terminal, :, 0] = 1.0
        return probabilities

    def _check_tables(self) -> None:
        """The tables define distributions, and the last turn always ends the rollout."""
        totals = self._probabilities.sum(axis=-1)
        if not np.allclose(totals, 1.0) or (self._probabilities < 0).any():
            raise ValueError(f"{self.name}: transition rows must be probability distributions")
        last = self._probabilities[-1]
        open_after_last = (last > 0) & (self._next_state[-1][None] < self.success_state)
        if open_after_last.any():
            raise ValueError(f"{self.name}: every outcome of the last turn must be terminal")

    def _lookup(self, prompt_id: str) -> int:
        try:
            return self._index[prompt_id]
        except KeyError:
            raise ValueError(
                f"unknown prompt_id {prompt_id!r} for the {self.name} workload of seed {self.seed}"
            ) from None

    def _locate(self, state: RolloutState) -> tuple[int, int]:
        if len(state.latent) != 1 or not 0 <= state.latent[0] < self.states:
            raise ValueError(f"state was not made by this {self.name} workload: latent {state.latent}")
        if state.turns > self.max_turns:
            raise ValueError(f"state has {state.turns} turns, more than max_turns = {self.max_turns}")
        return self._lookup(state.prompt_id), state.latent[0]

    def _features(self, p: FloatArray, rng: np.random.Generator) -> list[tuple[float, ...]] | None:
        """signal · clip(logit p, ±6) · u + N(0, I): a noisy stand-in for a pooled hidden state."""
        if self._feature_dim == 0:
            return None
        logits = np.clip(logit(p), -_FEATURE_LOGIT_CLIP, _FEATURE_LOGIT_CLIP)
        vectors = self._feature_signal * logits[:, None] * self._feature_direction[None, :]
        vectors += rng.standard_normal((p.shape[0], self._feature_dim))
        return [tuple(row) for row in vectors.tolist()]
