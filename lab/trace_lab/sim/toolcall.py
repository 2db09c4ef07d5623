"""Family "toolcall": function calling — a sequence of JSON tool calls (see `ToolcallConfig`).

Latent state: (k calls done, e = the last call failed recoverably), index 2k + e, then SUCCESS /
FAILURE. Outcomes of a call: ok (k + 1), ok completing the task (the m-th call: SUCCESS), recoverable
error (e = 1), fatal error (FAILURE, an absorbing failure that ends the rollout); on the last turn an ok
that does not complete the task fails too (out of turns). The agent reads its visible API, k and e
(context = (visible API · max_calls + k) · 2 + e); the right variant depends on the true API and on
(k, e), right(u, k, e) = (u + k + 2e) mod actions, so after an error the fix is another variant.

Text: the request ("request: <words>" and "tools: [...]", the visible API's tools) and, per turn, the
call `{"call": "<tool>", "arguments": {...}}` and the response `{"status": "ok", ...}` or
`{"status": "error", "code": …, "retryable": …, "message": "…"}` whose `retryable` flag is sometimes
wrong.
"""

from __future__ import annotations

import numpy as np

from trace_lab.sim.base import sigmoid
from trace_lab.sim.family_config import ToolcallConfig
from trace_lab.sim.lexicon import TOOLCALL_SPELLING, Lexicon
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

_FAMILY_TAG = 303
_DIFFICULTY_LEVELS = 7
_LEVEL_SPAN = 4.0
_OK, _COMPLETE, _RECOVERABLE, _FATAL = range(4)
_RECOVERABLE_CODES = (400, 404, 409, 422, 429)
_FATAL_CODES = (401, 403, 500, 503)


class ToolcallWorkload(TabularWorkload):
    """Function-calling tasks; `seed` decides the tasks, `config.vocabulary_seed` the words."""

    name = "toolcall"

    def __init__(self, config: ToolcallConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else ToolcallConfig()
        config = self.config
        rng = np.random.default_rng([seed, _FAMILY_TAG])
        self.api, self.visible_api, self.difficulty = draw_tasks(config, config.apis, config.api_noise, rng)
        self.calls = rng.integers(config.min_calls, config.max_calls + 1, config.prompts).astype(np.int64)
        self.lexicon = Lexicon(
            TOOLCALL_SPELLING,
            {
                "distractor": 1000,
                "api": config.apis,
                "variant": config.apis * config.actions,
                "key": 30,
                "difficulty": 5 * _DIFFICULTY_LEVELS,
            },
            seed=(config.vocabulary_seed, _FAMILY_TAG),
        )
        apis = self.lexicon.of("api", np.arange(config.apis))
        variants = self.lexicon.of("variant", np.arange(config.apis * config.actions))
        # Tool a of API u is named "<api>_<variant>": one token per tool.
        self.tool_names = [
            [f"{apis[api]}_{variants[api * config.actions + action]}" for action in range(config.actions)]
            for api in range(config.apis)
        ]
        contexts = config.apis * config.max_calls * 2
        super().__init__(
            config,
            seed=seed,
            states=2 * config.max_calls + 2,
            contexts=contexts,
            theta=np.zeros((contexts, config.actions)),
            text_rng=rng,
        )

    def right_variant(self, api: IntArray) -> IntArray:
        """right(u, k, e) = (u + k + 2e) mod actions, shape (len(api), 2 · max_calls) by state 2k + e."""
        state = np.arange(2 * self.config.max_calls)
        done, failed = state // 2, state % 2
        return np.asarray((api[:, None] + done[None, :] + 2 * failed[None, :]) % self.config.actions)

    def right_actions(self) -> IntArray:
        return np.asarray(self.right_variant(np.arange(self.config.apis)).reshape(-1), dtype=np.int64)

    def _next_states(self) -> IntArray:
        config = self.config
        open_states = 2 * config.max_calls
        done = np.arange(open_states) // 2
        next_state = np.zeros((config.max_turns, self.states, config.actions, 4), dtype=np.int64)
        # An ok call that would pass max_calls has probability 0; it points at FAILURE to stay in range.
        after_ok = np.where(done + 1 < config.max_calls, 2 * (done + 1), self.failure_state)
        next_state[:, :open_states, :, _OK] = after_ok[:, None]
        next_state[:, :open_states, :, _COMPLETE] = self.success_state
        next_state[:, :open_states, :, _RECOVERABLE] = (2 * done + 1)[:, None]
        next_state[:, :open_states, :, _FATAL] = self.failure_state
        # Out of turns: the last turn ends every rollout that it does not complete.
        next_state[-1, :open_states, :, _OK] = self.failure_state
        next_state[-1, :open_states, :, _RECOVERABLE] = self.failure_state
        return next_state

    def _context_table(self) -> IntArray:
        config = self.config
        open_states = 2 * config.max_calls
        state = np.minimum(np.arange(self.states), open_states - 1)
        context = self.visible_api[:, None] * open_states + state[None, :]
        return np.repeat(context[None], config.max_turns, axis=0).astype(np.int64)

    def _transition_probabilities(self, tasks: IntArray) -> FloatArray:
        config = self.config
        open_states, actions = 2 * config.max_calls, config.actions
        logit = (self.difficulty[tasks] + self._competence[tasks])[:, None, None]
        right = self.right_variant(self.api[tasks])[:, :, None] == np.arange(actions)[None, None, :]
        ok = sigmoid(logit + config.variant_bonus * (right - 1.0 / actions))  # (tasks, states, actions)
        fatal = np.where(right, config.fatal_right, config.fatal_wrong)
        done = (np.arange(open_states) // 2)[None, :, None]
        completes = done + 1 >= self.calls[tasks][:, None, None]
        probabilities = np.zeros((config.max_turns, tasks.shape[0], self.states, actions, 4))
        probabilities[:, :, :open_states, :, _OK] = np.where(completes, 0.0, ok)
        probabilities[:, :, :open_states, :, _COMPLETE] = np.where(completes, ok, 0.0)
        probabilities[:, :, :open_states, :, _RECOVERABLE] = (1 - ok) * (1 - fatal)
        probabilities[:, :, :open_states, :, _FATAL] = (1 - ok) * fatal
        return probabilities

    def _prompt_texts(self, rng: np.random.Generator) -> list[str]:
        config = self.config
        apparent = apparent_difficulty(self.difficulty, config, rng)
        words = graded_prompt_words(
            self.lexicon, "difficulty", apparent, _DIFFICULTY_LEVELS, _LEVEL_SPAN, config, rng
        )
        listings = [", ".join(f'"{tool}"' for tool in tools) for tools in self.tool_names]
        return [
            f"request: {text}\ntools: [{listings[api]}]"
            for text, api in zip(words, self.visible_api.tolist(), strict=True)
        ]

    def _turn_texts(self, draw: TurnDraw, rng: np.random.Generator) -> list[str]:
        config = self.config
        count = draw.tasks.shape[0]
        lexicon = self.lexicon
        visible = self.visible_api[draw.tasks].tolist()
        arguments = np.asarray(rng.integers(1, 4, size=(count,))).tolist()
        keys = iter(lexicon.of("key", rng.integers(0, lexicon.size["key"], 3 * count)))
        values = iter(lexicon.of("distractor", rng.integers(0, lexicon.size["distractor"], 4 * count)))
        lengths = uniform_lengths(config.message_words, count, rng)
        messages = lexicon.join(lexicon.distractors(int(lengths.sum()), rng), lengths)
        # The retryable flag tells a recoverable error from a fatal one, but is wrong with retryable_flip.
        retryable = (draw.outcome == _RECOVERABLE) ^ (rng.random(count) < config.retryable_flip)
        recoverable_codes = np.asarray(rng.choice(_RECOVERABLE_CODES, size=(count,))).tolist()
        fatal_codes = np.asarray(rng.choice(_FATAL_CODES, size=(count,))).tolist()
        texts: list[str] = []
        for row in range(count):
            tool = self.tool_names[visible[row]][int(draw.action[row])]
            pairs = ", ".join(f'"{next(keys)}": "{next(values)}"' for _ in range(arguments[row]))
            call = f'{{"call": "{tool}", "arguments": {{{pairs}}}}}'
            outcome = int(draw.outcome[row])
            if outcome in (_OK, _COMPLETE):
                done = "true" if outcome == _COMPLETE else "false"
                response = f'{{"status": "ok", "result": "{next(values)}", "done": {done}}}'
            else:
                code = recoverable_codes[row] if outcome == _RECOVERABLE else fatal_codes[row]
                flag = "true" if retryable[row] else "false"
                response = (
                    f'{{"status": "error", "code": {code}, "retryable": {flag}, '
                    f'"message": "{messages[row]}"}}'
                )
            texts.append(f"{call}\n{response}")
        return texts
