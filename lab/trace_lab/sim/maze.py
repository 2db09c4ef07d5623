"""Families "maze" and "maze_drift": slippery mazes — one exit taken per turn (see `MazeConfig`).

Latent state: k, the junctions passed so far (0 … max_junctions − 1), then SUCCESS / FAILURE. Outcomes of
a move: through (k + 1), through the last junction (SUCCESS), stay (k), slide back (max(k − 1, 0)), pit
(FAILURE, absorbing); on the last turn every outcome but SUCCESS fails (out of turns). The agent reads its
visible layout and k (context = visible layout · max_junctions + k); the right exit depends on the true
layout and k, right(u, k) = (u + 3k) mod actions.

Text: "maze <layout> <words>" (the words are distractors unless `prompt_signal_rate` > 0: then graded
slipperiness words too) and, per turn, "take <exit>" with an observation of what the move did, whose
words are those of another outcome with probability `observation_flip`.

"maze" is the project's no-signal control: nothing in a prompt says how hard it is, and its population
is large enough that a benchmark's pools never repeat a prompt, so only the turns carry signal.
"maze_drift" is the drift control: a small population that recurs, exits that matter a lot (`exit_bonus`
6) and long mazes, so success rates move fast as a policy learns and a prompt's outcome history goes
stale within a few steps.
"""

from __future__ import annotations

import numpy as np

from trace_lab.sim.base import sigmoid
from trace_lab.sim.family_config import MazeConfig
from trace_lab.sim.lexicon import MAZE_SPELLING, Lexicon
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

_FAMILY_TAG = 404
_DIFFICULTY_LEVELS = 5
_LEVEL_SPAN = 4.0
_THROUGH, _OUT, _STAY, _BACK, _PIT = range(5)
#: The observation word class of each outcome.
_OBSERVED = ("through", "out", "stay", "back", "pit")

#: The drift control's config: recurring prompts, exits that matter a lot, long mazes.
MAZE_DRIFT = MazeConfig(
    prompts=512, min_junctions=3, max_junctions=7, max_turns=9, exit_bonus=6.0, vocabulary_seed=1
)


class MazeWorkload(TabularWorkload):
    """Slippery mazes; `seed` decides the mazes, `config.vocabulary_seed` the words."""

    name = "maze"

    def __init__(self, config: MazeConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else MazeConfig()
        config = self.config
        rng = np.random.default_rng([seed, _FAMILY_TAG])
        self.layout, self.visible_layout, self.difficulty = draw_tasks(
            config, config.layouts, config.layout_noise, rng
        )
        self.junctions = rng.integers(config.min_junctions, config.max_junctions + 1, config.prompts).astype(
            np.int64
        )
        self.lexicon = Lexicon(
            MAZE_SPELLING,
            {
                "distractor": 1200,
                "layout": 3 * config.layouts,
                "exit": config.actions,
                "difficulty": 5 * _DIFFICULTY_LEVELS,
                **dict.fromkeys(_OBSERVED, 8),
            },
            seed=(config.vocabulary_seed, _FAMILY_TAG),
        )
        contexts = config.layouts * config.max_junctions
        super().__init__(
            config,
            seed=seed,
            states=config.max_junctions + 2,
            contexts=contexts,
            theta=np.zeros((contexts, config.actions)),
            text_rng=rng,
        )

    def right_exit(self, layout: IntArray) -> IntArray:
        """right(u, k) = (u + 3k) mod actions, shape (len(layout), max_junctions)."""
        passed = np.arange(self.config.max_junctions)
        return np.asarray((layout[:, None] + 3 * passed[None, :]) % self.config.actions, dtype=np.int64)

    def right_actions(self) -> IntArray:
        return np.asarray(self.right_exit(np.arange(self.config.layouts)).reshape(-1), dtype=np.int64)

    def _next_states(self) -> IntArray:
        config = self.config
        passed = np.arange(config.max_junctions)
        next_state = np.zeros((config.max_turns, self.states, config.actions, 5), dtype=np.int64)
        # Through the junction before the last has probability 0 where it would pass max_junctions.
        through = np.where(passed + 1 < config.max_junctions, passed + 1, self.failure_state)
        next_state[:, : config.max_junctions, :, _THROUGH] = through[:, None]
        next_state[:, : config.max_junctions, :, _OUT] = self.success_state
        next_state[:, : config.max_junctions, :, _STAY] = passed[:, None]
        next_state[:, : config.max_junctions, :, _BACK] = np.maximum(passed - 1, 0)[:, None]
        next_state[:, : config.max_junctions, :, _PIT] = self.failure_state
        # Out of turns: the last move ends every rollout that it does not finish.
        for outcome in (_THROUGH, _STAY, _BACK):
            next_state[-1, : config.max_junctions, :, outcome] = self.failure_state
        return next_state

    def _context_table(self) -> IntArray:
        config = self.config
        state = np.minimum(np.arange(self.states), config.max_junctions - 1)
        context = self.visible_layout[:, None] * config.max_junctions + state[None, :]
        return np.repeat(context[None], config.max_turns, axis=0).astype(np.int64)

    def _transition_probabilities(self, tasks: IntArray) -> FloatArray:
        config = self.config
        open_states, actions = config.max_junctions, config.actions
        logit = (self.difficulty[tasks] + self._competence[tasks])[:, None, None]
        right = self.right_exit(self.layout[tasks])[:, :, None] == np.arange(actions)[None, None, :]
        through = sigmoid(logit + config.exit_bonus * (right - 1.0 / actions))  # (tasks, states, actions)
        pit = np.where(right, config.pit_right, config.pit_wrong)
        passed = np.arange(open_states)[None, :, None]
        last = passed + 1 >= self.junctions[tasks][:, None, None]
        stuck = (1 - through) * (1 - pit)
        probabilities = np.zeros((config.max_turns, tasks.shape[0], self.states, actions, 5))
        probabilities[:, :, :open_states, :, _THROUGH] = np.where(last, 0.0, through)
        probabilities[:, :, :open_states, :, _OUT] = np.where(last, through, 0.0)
        probabilities[:, :, :open_states, :, _STAY] = stuck * (1 - config.slide_back)
        probabilities[:, :, :open_states, :, _BACK] = stuck * config.slide_back
        probabilities[:, :, :open_states, :, _PIT] = (1 - through) * pit
        return probabilities

    def _prompt_texts(self, rng: np.random.Generator) -> list[str]:
        config = self.config
        apparent = apparent_difficulty(self.difficulty, config, rng)
        words = graded_prompt_words(
            self.lexicon, "difficulty", apparent, _DIFFICULTY_LEVELS, _LEVEL_SPAN, config, rng
        )
        layouts = self.lexicon.of("layout", 3 * self.visible_layout + rng.integers(0, 3, config.prompts))
        return [f"maze {layout} {text}" for layout, text in zip(layouts, words, strict=True)]

    def _turn_texts(self, draw: TurnDraw, rng: np.random.Generator) -> list[str]:
        config = self.config
        count = draw.tasks.shape[0]
        lexicon = self.lexicon
        exits = lexicon.of("exit", draw.action)
        flipped = rng.random(count) < config.observation_flip
        shown = np.where(flipped, (draw.outcome + rng.integers(1, 5, count)) % 5, draw.outcome)
        lengths = uniform_lengths(config.observation_words, count, rng)
        starts = np.array([lexicon.start[name] for name in _OBSERVED])
        observations = lexicon.segments(
            lengths,
            np.full(count, 0.6),
            lambda owners: starts[shown[owners]] + rng.integers(0, 8, owners.shape[0]),
            rng,
        )
        return [f"take {exit_}: {text}" for exit_, text in zip(exits, observations, strict=True)]


class MazeDriftWorkload(MazeWorkload):
    """The drift control: mazes of :data:`MAZE_DRIFT` (their own words and prompt ids)."""

    name = "maze_drift"

    def __init__(self, config: MazeConfig | None = None, seed: int = 0) -> None:
        super().__init__(config if config is not None else MAZE_DRIFT, seed)
