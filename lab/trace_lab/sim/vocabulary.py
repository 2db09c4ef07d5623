"""Generated vocabulary and vectorised text drawing for the simulated workload.

Words are pronounceable synthetic tokens spelled from the vocabulary seed, so no real word list is needed
and a second seed spells other words (shared only by rare chance). Text is drawn in batches: one call
renders one segment (e.g. the observation) for many turns at once, which keeps a step of thousands of
rollouts fast.
"""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from trace_lab.sim.config import TextConfig, VocabularyConfig
from trace_lab.sim.lexicon import WordClasses

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]
BoolArray = npt.NDArray[np.bool_]

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "br", "st", "kl", "tr")
_VOWELS = ("a", "e", "i", "o", "u", "ai", "ou")
_CODAS = ("", "", "", "n", "r", "s", "l", "k")


def _spell_words(count: int, rng: np.random.Generator) -> list[str]:
    """`count` distinct pseudo-words of two to four syllables, spelled in batches."""
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < count:
        batch = 2 * (count - len(words)) + 16
        syllables = rng.integers(2, 5, batch)
        onsets = rng.integers(0, len(_ONSETS), (batch, 4))
        vowels = rng.integers(0, len(_VOWELS), (batch, 4))
        codas = rng.integers(0, len(_CODAS), batch)
        for length, onset_row, vowel_row, coda in zip(
            syllables.tolist(), onsets.tolist(), vowels.tolist(), codas.tolist(), strict=True
        ):
            word = "".join(
                _ONSETS[o] + _VOWELS[v] for o, v in zip(onset_row[:length], vowel_row[:length], strict=True)
            )
            word += _CODAS[coda]
            if word not in seen and len(words) < count:
                seen.add(word)
                words.append(word)
    return words


class Vocabulary(WordClasses):
    """All words of one workload, split into classes that occupy consecutive index ranges.

    Classes: distractors (Zipf-distributed), difficulty levels (prompts), confidence levels (thoughts),
    progress and setback words (observations), tools and the finishing action.
    """

    def __init__(self, config: VocabularyConfig, text: TextConfig) -> None:
        self.config = config
        self.text = text
        graded = config.levels * config.words_per_level
        sizes = {
            "distractor": config.distractor_words,
            "difficulty": graded,
            "confidence": graded,
            "progress": config.progress_words,
            "setback": config.setback_words,
            "tool": config.tools,
            "finish": 1,
        }
        rng = np.random.default_rng(config.seed)
        super().__init__(sizes, lambda count: _spell_words(count, rng), config.zipf_exponent)

    @property
    def finish_word(self) -> str:
        return self.words[self.start["finish"]]

    def graded(self, word_class: str, logits: FloatArray, rng: np.random.Generator) -> IntArray:
        """Words of a graded class for latent logits, one word per entry (`WordClasses.graded_words` with
        the config's `levels`, `level_noise` and `level_span`)."""
        return self.graded_words(
            word_class, logits, self.config.levels, self.text.level_noise, self.text.level_span, rng
        )

    def directional(self, progressed: BoolArray, rng: np.random.Generator) -> IntArray:
        """Progress words where `progressed`, setback words elsewhere; each flips with `observation_flip`."""
        count = progressed.shape[0]
        shown = progressed ^ (rng.random(count) < self.text.observation_flip)
        progress = self.start["progress"] + rng.integers(0, self.config.progress_words, count)
        setback = self.start["setback"] + rng.integers(0, self.config.setback_words, count)
        return np.where(shown, progress, setback).astype(np.int64)

    def tools(self, count: int, rng: np.random.Generator) -> list[str]:
        ids = self.start["tool"] + rng.integers(0, self.config.tools, count)
        return list(self._word_array[ids])

    def plain(self, lengths: IntArray, rng: np.random.Generator) -> list[str]:
        """One text of distractors only per owner, `lengths[i]` words long."""
        return self.join(self.distractors(int(lengths.sum()), rng), lengths)
