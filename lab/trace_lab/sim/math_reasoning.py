"""Family "math": mathematical reasoning — a few reasoning steps, then an answer (see `MathConfig`).

Latent state: r, the number of sound steps so far (0 … max_steps), then SUCCESS / FAILURE. Outcomes of a
turn: sound step (r + 1), unsound step (r), right answer, wrong answer; a turn answers with the
probability α_t of `MathConfig`, decided with the outcome. The agent reads its visible topic and the turn
index (context = visible topic × turn); the right method depends on the true topic and the turn,
right(u, t) = (u + t) mod actions.

Text: "problem <topic>: <words> solve <equation> for x", steps "step n via <method>: <equation>
<words>", the answer "so via <method> x = <number> boxed <words>". The equation has more terms for harder
tasks and the words hold graded difficulty words (prompt) or sound / unsound verdicts (turns), all noisy.
"""

from __future__ import annotations

import numpy as np

from trace_lab.sim.base import sigmoid
from trace_lab.sim.family_config import MathConfig
from trace_lab.sim.lexicon import MATH_SPELLING, Lexicon
from trace_lab.sim.tabular import (
    FloatArray,
    IntArray,
    TabularWorkload,
    TurnDraw,
    apparent_difficulty,
    draw_tasks,
    graded_prompt_words,
    uniform_lengths,
)

# Seeds streams of this family apart from the others' for the same user seed.
_FAMILY_TAG = 101
_DIFFICULTY_LEVELS = 7
_LEVEL_SPAN = 5.0
# Outcome indices of a turn.
_SOUND, _UNSOUND, _RIGHT, _WRONG = range(4)


class MathWorkload(TabularWorkload):
    """Mathematical reasoning tasks; `seed` decides the tasks, `config.vocabulary_seed` the words."""

    name = "math"

    def __init__(self, config: MathConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else MathConfig()
        config = self.config
        rng = np.random.default_rng([seed, _FAMILY_TAG])
        self.topic, self.visible_topic, self.difficulty = draw_tasks(
            config, config.topics, config.topic_noise, rng
        )
        self.lexicon = Lexicon(
            MATH_SPELLING,
            {
                "distractor": 1500,
                "topic": 3 * config.topics,
                "method": config.actions,
                "difficulty": 6 * _DIFFICULTY_LEVELS,
                "sound": 12,
                "unsound": 12,
            },
            seed=(config.vocabulary_seed, _FAMILY_TAG),
        )
        super().__init__(
            config,
            seed=seed,
            states=config.max_steps + 3,
            contexts=config.topics * config.max_turns,
            theta=np.zeros((config.topics * config.max_turns, config.actions)),
            text_rng=rng,
        )

    def answer_probabilities(self) -> FloatArray:
        """α_t, the chance that turn t (0-based) is the answer."""
        config = self.config
        turn = np.arange(config.max_turns)
        alpha = np.where(turn < config.min_steps, 0.0, config.answer_prob)
        return np.asarray(np.where(turn >= config.max_steps, 1.0, alpha), dtype=np.float64)

    def right_method(self, topic: IntArray) -> IntArray:
        """right(u, t) = (u + t) mod actions, shape (len(topic), max_turns)."""
        turn = np.arange(self.config.max_turns)
        return np.asarray((topic[:, None] + turn[None, :]) % self.config.actions, dtype=np.int64)

    def right_actions(self) -> IntArray:
        return self.right_method(np.arange(self.config.topics)).reshape(-1)

    def _next_states(self) -> IntArray:
        config = self.config
        sound = np.arange(config.max_steps + 1)
        next_state = np.zeros((config.max_turns, self.states, config.actions, 4), dtype=np.int64)
        next_state[:, : config.max_steps + 1, :, _SOUND] = np.minimum(sound + 1, config.max_steps)[:, None]
        next_state[:, : config.max_steps + 1, :, _UNSOUND] = sound[:, None]
        next_state[..., _RIGHT] = self.success_state
        next_state[..., _WRONG] = self.failure_state
        return next_state

    def _context_table(self) -> IntArray:
        turns = self.config.max_turns
        context = self.visible_topic[None, :] * turns + np.arange(turns)[:, None]
        return np.repeat(context[:, :, None], self.states, axis=2).astype(np.int64)

    def _transition_probabilities(self, tasks: IntArray) -> FloatArray:
        config = self.config
        turns, actions, levels = config.max_turns, config.actions, config.max_steps + 1
        # Axes: (turn t, task, sound steps r, action a).
        logit = (self.difficulty[tasks] + self._competence[tasks])[None, :, None, None]
        right = self.right_method(self.topic[tasks]).T[:, :, None, None] == np.arange(actions)
        bonus = config.method_bonus * (right - 1.0 / actions)
        sound = sigmoid(logit + bonus)
        steps_taken = np.arange(turns)[:, None, None, None]
        sound_steps = np.arange(levels)[None, None, :, None]
        right_answer = sigmoid(logit + config.prefix_weight * (2 * sound_steps - steps_taken) + bonus)
        alpha = self.answer_probabilities()[:, None, None, None]
        probabilities = np.zeros((turns, tasks.shape[0], self.states, actions, 4))
        probabilities[:, :, :levels, :, _SOUND] = (1 - alpha) * sound
        probabilities[:, :, :levels, :, _UNSOUND] = (1 - alpha) * (1 - sound)
        probabilities[:, :, :levels, :, _RIGHT] = alpha * right_answer
        probabilities[:, :, :levels, :, _WRONG] = alpha * (1 - right_answer)
        return probabilities

    def _prompt_texts(self, rng: np.random.Generator) -> list[str]:
        config = self.config
        count = config.prompts
        apparent = apparent_difficulty(self.difficulty, config, rng)
        lexicon = self.lexicon
        topic_words = lexicon.of("topic", 3 * self.visible_topic + rng.integers(0, 3, count))
        words = graded_prompt_words(
            lexicon, "difficulty", apparent, _DIFFICULTY_LEVELS, _LEVEL_SPAN, config, rng
        )
        # Harder-reading tasks get longer equations: terms = clip(round(3 − (apparent + 1.5·ε) / 2.5), 1, 6).
        noisy = apparent + 1.5 * rng.standard_normal(count)
        terms = np.clip(np.rint(3 - noisy / 2.5), 1, 6).astype(np.int64).tolist()
        coefficients = rng.integers(2, 20, (count, 7)).tolist()
        return [
            f"problem {topic}: {text} solve {_equation(row[:term], row[6])} for x"
            for topic, text, term, row in zip(topic_words, words, terms, coefficients, strict=True)
        ]

    def _turn_texts(self, draw: TurnDraw, rng: np.random.Generator) -> list[str]:
        config = self.config
        count = draw.tasks.shape[0]
        lexicon = self.lexicon
        methods = lexicon.of("method", draw.action)
        # A verdict word tells whether the step was sound (or the answer right), flipped with verdict_flip.
        good = (draw.outcome == _SOUND) | (draw.outcome == _RIGHT)
        shown = good ^ (rng.random(count) < config.verdict_flip)
        lengths = uniform_lengths(config.step_words, count, rng)
        verdicts = lexicon.segments(
            lengths,
            np.full(count, config.verdict_rate),
            lambda owners: np.where(
                shown[owners],
                lexicon.uniform("sound", owners.shape[0], rng),
                lexicon.uniform("unsound", owners.shape[0], rng),
            ),
            rng,
        )
        numbers = rng.integers(2, 100, (count, 2)).tolist()
        answered = draw.outcome >= _RIGHT
        return [
            f"so via {method} x = {left} boxed {words}"
            if is_answer
            else f"step {turn + 1} via {method}: {left} x = {right} {words}"
            for method, words, (left, right), is_answer, turn in zip(
                methods, verdicts, numbers, answered.tolist(), draw.turn.tolist(), strict=True
            )
        ]


def _equation(coefficients: list[int], constant: int) -> str:
    return " + ".join(f"{coefficient} x" for coefficient in coefficients) + f" = {constant}"
