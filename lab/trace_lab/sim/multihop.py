"""Family "multihop": multi-hop question answering — search turns, then an answer (see `MultihopConfig`).

Latent state: on track with f documents found (index f, 0 … max_hops), derailed believing f found
(index max_hops + f, f = 1 … max_hops), then SUCCESS / FAILURE. A search finds the next document
(f + 1), misses (f; also any search once all h are found) or is misled (derailed at f + 1); a derailed
search "finds" along the wrong chain or misses; an answer is right or wrong; every action of the last
turn answers. The agent reads its visible question kind and the documents it believes found (context =
visible kind × f, the same on track or derailed: it cannot tell); the right search style depends on
the true kind and the hop, right(u, f) = (u + f) mod search_styles.

Text: "question: <relation> of … of <Entity>? <words>" (one relation per hop, from the visible kind's
relations; graded prominence words), turns "search <style> <Entity> <relation>" then "doc <Title>:
<snippet>" (a found document's title is the bridge entity and its snippet holds relevance cues; a
misleading one names a wrong entity with cues that often look relevant) or "final answer: <Entity>".
"""

from __future__ import annotations

import numpy as np

from trace_lab.sim.base import sigmoid
from trace_lab.sim.family_config import MultihopConfig
from trace_lab.sim.lexicon import MULTIHOP_SPELLING, Lexicon
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

_FAMILY_TAG = 202
_PROMINENCE_LEVELS = 7
_LEVEL_SPAN = 4.0
_RELATIONS_PER_KIND = 4
_ENTITIES = 1500
# Outcome indices: of a search, and of an answer (whose third outcome has probability 0).
_FOUND, _MISSED, _MISLED = range(3)
_RIGHT, _WRONG = 0, 1


class MultihopWorkload(TabularWorkload):
    """Multi-hop questions; `seed` decides the tasks, `config.vocabulary_seed` the words."""

    name = "multihop"

    def __init__(self, config: MultihopConfig | None = None, seed: int = 0) -> None:
        self.config = config if config is not None else MultihopConfig()
        config = self.config
        rng = np.random.default_rng([seed, _FAMILY_TAG])
        self.kind, self.visible_kind, self.difficulty = draw_tasks(
            config, config.kinds, config.kind_noise, rng
        )
        self.hops = self.hops_of(self.kind)
        # The question's subject and the entity each hop leads to (the last is the answer).
        self._chain = rng.integers(0, _ENTITIES, (config.prompts, config.max_hops + 1)).astype(np.int64)
        self.lexicon = Lexicon(
            MULTIHOP_SPELLING,
            {
                "distractor": 1200,
                "entity": _ENTITIES,
                "relation": _RELATIONS_PER_KIND * config.kinds,
                "style": config.search_styles,
                "prominence": 6 * _PROMINENCE_LEVELS,
                "relevant": 16,
                "irrelevant": 16,
            },
            seed=(config.vocabulary_seed, _FAMILY_TAG),
        )
        levels = config.max_hops + 1
        theta = np.zeros((config.kinds * levels, config.actions))
        theta[:, -1] = np.tile(np.array(config.answer_prior), config.kinds)
        super().__init__(
            config,
            seed=seed,
            states=2 * config.max_hops + 3,
            contexts=config.kinds * levels,
            theta=theta,
            text_rng=rng,
        )

    @property
    def answer_action(self) -> int:
        return self.config.search_styles

    def believed_documents(self, state: IntArray) -> IntArray:
        """The documents the agent believes found in each open latent state (on track or derailed)."""
        max_hops = self.config.max_hops
        return np.asarray(np.where(state > max_hops, state - max_hops, state), dtype=np.int64)

    def is_derailed(self, state: IntArray) -> IntArray:
        """Whether each latent state is a derailed one (a misleading document was taken for the next)."""
        return np.asarray((state > self.config.max_hops) & (state < self.success_state), dtype=np.bool_)

    def right_style(self, kind: IntArray) -> IntArray:
        """right(u, f) = (u + f) mod search_styles, shape (len(kind), max_hops + 1)."""
        found = np.arange(self.config.max_hops + 1)
        return np.asarray((kind[:, None] + found[None, :]) % self.config.search_styles, dtype=np.int64)

    def hops_of(self, kind: IntArray) -> IntArray:
        """h(u) = min_hops + (u mod (max_hops − min_hops + 1)), the documents a kind-u question needs."""
        config = self.config
        return np.asarray(config.min_hops + kind % (config.max_hops - config.min_hops + 1), dtype=np.int64)

    def right_actions(self) -> IntArray:
        """Search with the right style until h(u) documents are found, then answer."""
        kinds = np.arange(self.config.kinds)
        found = np.arange(self.config.max_hops + 1)[None, :]
        complete = found >= self.hops_of(kinds)[:, None]
        return np.where(complete, self.answer_action, self.right_style(kinds)).reshape(-1).astype(np.int64)

    def _next_states(self) -> IntArray:
        config = self.config
        max_hops = config.max_hops
        found = np.arange(max_hops + 1)
        further = np.minimum(found + 1, max_hops)
        derailed = slice(max_hops + 1, 2 * max_hops + 1)  # believing 1 … max_hops documents found
        next_state = np.zeros((config.max_turns, self.states, config.actions, 3), dtype=np.int64)
        next_state[:, : max_hops + 1, :, _FOUND] = further[:, None]
        next_state[:, : max_hops + 1, :, _MISSED] = found[:, None]
        next_state[:, : max_hops + 1, :, _MISLED] = (max_hops + further)[:, None]
        next_state[:, derailed, :, _FOUND] = (max_hops + further[1:])[:, None]
        next_state[:, derailed, :, _MISSED] = (max_hops + found[1:])[:, None]
        next_state[:, derailed, :, _MISLED] = (max_hops + found[1:])[:, None]
        for answering in (next_state[:, :, self.answer_action], next_state[-1]):
            answering[..., _RIGHT], answering[..., _WRONG] = self.success_state, self.failure_state
            answering[..., 2] = self.failure_state
        return next_state

    def _context_table(self) -> IntArray:
        levels = self.config.max_hops + 1
        believed = np.minimum(self.believed_documents(np.arange(self.states)), levels - 1)
        context = self.visible_kind[:, None] * levels + believed[None, :]
        return np.repeat(context[None], self.config.max_turns, axis=0).astype(np.int64)

    def _transition_probabilities(self, tasks: IntArray) -> FloatArray:
        config = self.config
        max_hops, styles = config.max_hops, config.search_styles
        open_states = 2 * max_hops + 1
        # Axes: (task, open latent state, search style).
        state = np.arange(open_states)
        believed = self.believed_documents(state)[None, :]
        derailed = self.is_derailed(state)[None, :]
        logit = (self.difficulty[tasks] + self._competence[tasks])[:, None]
        hops = self.hops[tasks][:, None]
        right = self.right_style(self.kind[tasks])[:, believed[0]][:, :, None] == np.arange(styles)
        find = sigmoid(logit[:, :, None] + config.style_bonus * (right - 1.0 / styles))
        # On track, nothing is left to find once all h documents are; derailed, the wrong chain goes on.
        searching = np.where(derailed, believed < max_hops, believed < hops)[:, :, None]
        find = np.where(searching, find, 0.0)
        misled = np.where(searching & ~derailed[:, :, None], (1 - find) * config.mislead_rate, 0.0)
        missing = np.maximum(hops - believed, 0)
        penalty = np.where(derailed, config.derail_penalty, config.missing_penalty * missing)
        answer = sigmoid(logit + config.answer_bias - penalty)  # (tasks, open states)
        probabilities = np.zeros((config.max_turns, tasks.shape[0], self.states, config.actions, 3))
        probabilities[:, :, :open_states, :styles, _FOUND] = find
        probabilities[:, :, :open_states, :styles, _MISLED] = misled
        probabilities[:, :, :open_states, :styles, _MISSED] = 1 - find - misled
        probabilities[:, :, :open_states, styles, _RIGHT] = answer
        probabilities[:, :, :open_states, styles, _WRONG] = 1 - answer
        probabilities[-1, :, :open_states, :, _RIGHT] = answer[:, :, None]
        probabilities[-1, :, :open_states, :, _WRONG] = 1 - answer[:, :, None]
        probabilities[-1, :, :open_states, :, _MISLED] = 0.0
        return probabilities

    def _prompt_texts(self, rng: np.random.Generator) -> list[str]:
        config = self.config
        count = config.prompts
        apparent = apparent_difficulty(self.difficulty, config, rng)
        lexicon = self.lexicon
        relation_ids = _RELATIONS_PER_KIND * self.visible_kind[:, None] + rng.integers(
            0, _RELATIONS_PER_KIND, (count, config.max_hops)
        )
        relations = np.array(lexicon.of("relation", relation_ids.reshape(-1)), dtype=object).reshape(
            count, config.max_hops
        )
        subjects = self._entities(self._chain[:, 0])
        words = graded_prompt_words(
            lexicon, "prominence", apparent, _PROMINENCE_LEVELS, _LEVEL_SPAN, config, rng
        )
        return [
            f"question: {' of '.join(row[:hops])} of {subject}? {text}"
            for row, hops, subject, text in zip(
                relations.tolist(), self.hops.tolist(), subjects, words, strict=True
            )
        ]

    def _turn_texts(self, draw: TurnDraw, rng: np.random.Generator) -> list[str]:
        config = self.config
        count = draw.tasks.shape[0]
        lexicon = self.lexicon
        believed = self.believed_documents(draw.before)
        on_track = ~self.is_derailed(draw.before)
        answered = (draw.action == self.answer_action) | (draw.turn == config.max_turns - 1)
        searched = ~answered
        found = searched & on_track & (draw.outcome == _FOUND)
        misled = searched & ((draw.outcome == _MISLED) | (~on_track & (draw.outcome == _FOUND)))
        # A search after all hops are found brings a redundant document: no cue either way.
        redundant = searched & on_track & (believed >= self.hops[draw.tasks])
        # Derailed, the agent queries and answers along a wrong chain of random entities.
        wrong = rng.integers(0, _ENTITIES, (3, count))
        query_entities = self._entities(np.where(on_track, self._chain[draw.tasks, believed], wrong[0]))
        titles = self._entities(
            np.where(found, self._chain[draw.tasks, np.minimum(believed + 1, config.max_hops)], wrong[1])
        )
        answers = self._entities(
            np.where(
                draw.after == self.success_state, self._chain[draw.tasks, self.hops[draw.tasks]], wrong[2]
            )
        )
        relations = lexicon.of(
            "relation",
            _RELATIONS_PER_KIND * self.visible_kind[draw.tasks] + rng.integers(0, _RELATIONS_PER_KIND, count),
        )
        styles = lexicon.of("style", np.minimum(draw.action, config.search_styles - 1))
        shown_relevant = np.where(
            misled,
            rng.random(count) < config.misled_relevance,
            found ^ (rng.random(count) < config.document_flip),
        )
        lengths = uniform_lengths(config.document_words, count, rng)
        snippets = lexicon.segments(
            lengths,
            np.where(redundant, 0.0, config.relevance_rate),
            lambda owners: np.where(
                shown_relevant[owners],
                lexicon.uniform("relevant", owners.shape[0], rng),
                lexicon.uniform("irrelevant", owners.shape[0], rng),
            ),
            rng,
        )
        return [
            f"final answer: {answer}"
            if is_answer
            else f"search {style} {entity} {relation}\ndoc {title}: {snippet}"
            for is_answer, answer, style, entity, relation, title, snippet in zip(
                answered.tolist(), answers, styles, query_entities, relations, titles, snippets, strict=True
            )
        ]

    def _entities(self, index: IntArray) -> list[str]:
        return [name.capitalize() for name in self.lexicon.of("entity", index)]
