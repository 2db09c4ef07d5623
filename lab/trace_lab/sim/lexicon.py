"""Generated word lists of the policy families, each spelled by its own rules from its own seed.

A family's words are pronounceable synthetic tokens. Spelling rules keep families apart by
construction: every word of a family contains one of its *marker* letters and no marker letter of another
family, and the ReAct family's words (`trace_lab.sim.vocabulary`) use no marker letter at all, so no
two families can ever share a generated word, whatever their seeds. `WordClasses` holds the text drawing
that a family's `Lexicon` and the ReAct `Vocabulary` share.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

IntArray = npt.NDArray[np.int64]
FloatArray = npt.NDArray[np.float64]


@dataclass(frozen=True, slots=True)
class Spelling:
    """How a family spells its words: `syllables` (inclusive range) of onset + nucleus, then a coda.

    Every coda holds one of `markers`, and no onset, nucleus or coda holds a letter of `foreign`, the
    other families' markers.
    """

    onsets: tuple[str, ...]
    nuclei: tuple[str, ...]
    codas: tuple[str, ...]
    syllables: tuple[int, int]
    markers: frozenset[str]
    foreign: frozenset[str]

    def __post_init__(self) -> None:
        low, high = self.syllables
        if not 1 <= low <= high:
            raise ValueError(f"syllables must satisfy 1 <= min <= max, got {self.syllables}")
        if not all(self.markers & set(coda) for coda in self.codas):
            raise ValueError("every coda must hold a marker letter")
        used = set("".join(self.onsets + self.nuclei + self.codas))
        if used & self.foreign:
            raise ValueError(f"spelling uses another family's marker letters {sorted(used & self.foreign)}")


# Marker letters: mathematical reasoning x (and y), multi-hop QA h (and c), function calling w (and j, q);
# the mazes mark their words with a digit, which no other family's words hold.
MATH_SPELLING = Spelling(
    onsets=("t", "d", "n", "s", "l", "p", "k", "m", "r", "v", "z", "g"),
    nuclei=("a", "e", "i", "o", "u", "y"),
    codas=("x", "ax", "ex", "ix", "yx"),
    syllables=(2, 4),
    markers=frozenset("xy"),
    foreign=frozenset("hcwjq"),
)
MULTIHOP_SPELLING = Spelling(
    onsets=("b", "d", "g", "k", "l", "m", "n", "r", "s", "t", "v", "ch", "h", "th"),
    nuclei=("a", "e", "i", "o", "u", "ae", "ei"),
    codas=("h", "th", "sh", "ch", "rh"),
    syllables=(2, 3),
    markers=frozenset("hc"),
    foreign=frozenset("xywjq"),
)
TOOLCALL_SPELLING = Spelling(
    onsets=("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "j", "q"),
    nuclei=("a", "e", "i", "o", "u"),
    codas=("w", "ow", "aw", "ew"),
    syllables=(2, 3),
    markers=frozenset("wjq"),
    foreign=frozenset("xyhc"),
)
MAZE_SPELLING = Spelling(
    onsets=("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z"),
    nuclei=("a", "e", "i", "o", "u"),
    codas=("2", "3", "a5", "o7", "u8"),
    syllables=(2, 3),
    markers=frozenset("23578"),
    foreign=frozenset("xyhcwjq"),
)


def spell_words(count: int, spelling: Spelling, rng: np.random.Generator) -> list[str]:
    """`count` distinct words spelled by `spelling`, drawn in batches."""
    words: list[str] = []
    seen: set[str] = set()
    low, high = spelling.syllables
    while len(words) < count:
        batch = 2 * (count - len(words)) + 16
        syllables = rng.integers(low, high + 1, batch).tolist()
        onsets = rng.integers(0, len(spelling.onsets), (batch, high)).tolist()
        nuclei = rng.integers(0, len(spelling.nuclei), (batch, high)).tolist()
        codas = rng.integers(0, len(spelling.codas), batch).tolist()
        for length, onset_row, nucleus_row, coda in zip(syllables, onsets, nuclei, codas, strict=True):
            word = "".join(
                spelling.onsets[o] + spelling.nuclei[n]
                for o, n in zip(onset_row[:length], nucleus_row[:length], strict=True)
            )
            word += spelling.codas[coda]
            if word not in seen and len(words) < count:
                seen.add(word)
                words.append(word)
    return words


class WordClasses:
    """Generated words split into named classes over consecutive index ranges, with the text drawing that
    any such word table supports: Zipf-distributed distractors (class "distractor", `zipf_exponent`),
    graded words, and texts of signal words among distractors. `spell(count)` spells all the words."""

    def __init__(
        self, sizes: Mapping[str, int], spell: Callable[[int], list[str]], zipf_exponent: float
    ) -> None:
        if sizes.get("distractor", 0) < 1:
            raise ValueError("a lexicon needs at least one distractor word")
        self.start: dict[str, int] = {}
        self.size: dict[str, int] = dict(sizes)
        offset = 0
        for name, size in sizes.items():
            self.start[name] = offset
            offset += size
        self.words: list[str] = spell(offset)
        self._word_array = np.array(self.words, dtype=object)
        ranks = np.arange(1, sizes["distractor"] + 1, dtype=np.float64)
        frequencies = ranks ** (-zipf_exponent)
        self._distractor_cdf = np.cumsum(frequencies / frequencies.sum())

    def distractors(self, count: int, rng: np.random.Generator) -> IntArray:
        ranks = np.searchsorted(self._distractor_cdf, rng.random(count), side="right")
        # Guard the float round-off at the top of the CDF.
        return (self.start["distractor"] + np.minimum(ranks, self.size["distractor"] - 1)).astype(np.int64)

    def graded_words(
        self,
        word_class: str,
        logits: FloatArray,
        levels: int,
        noise: float,
        span: float,
        rng: np.random.Generator,
    ) -> IntArray:
        """Word ids of a graded class (`levels` groups of synonyms) for latent logits, one per entry:

        level = clip(round((logit + noise·ε + span) / (2·span) · (levels − 1)), 0, levels − 1), ε ~ N(0, 1).
        """
        per_level = self.size[word_class] // levels
        noisy = logits + noise * rng.standard_normal(logits.shape[0])
        level = np.clip(np.rint((noisy + span) / (2 * span) * (levels - 1)), 0, levels - 1).astype(np.int64)
        synonym = rng.integers(0, per_level, logits.shape[0])
        return (self.start[word_class] + level * per_level + synonym).astype(np.int64)

    def segments(
        self,
        lengths: IntArray,
        signal_rate: FloatArray,
        signal_words: Callable[[IntArray], IntArray],
        rng: np.random.Generator,
    ) -> list[str]:
        """One text per owner: `lengths[i]` words, each a signal word with probability `signal_rate[i]`
        (`signal_words(owners)` gives one word id per owner index), the rest distractors."""
        owners = np.repeat(np.arange(lengths.shape[0]), lengths)
        ids = self.distractors(owners.shape[0], rng)
        is_signal = rng.random(owners.shape[0]) < signal_rate[owners]
        ids[is_signal] = signal_words(owners[is_signal])
        return self.join(ids, lengths)

    def join(self, ids: IntArray, lengths: IntArray, separator: str = " ") -> list[str]:
        """Consecutive runs of `lengths[i]` words, each joined by `separator`."""
        words: list[str] = self._word_array[ids].tolist()
        bounds = np.concatenate(([0], np.cumsum(lengths))).tolist()
        return [separator.join(words[begin:end]) for begin, end in itertools.pairwise(bounds)]


class Lexicon(WordClasses):
    """A family's words, spelled by `spelling` from `seed`, split into named classes (`WordClasses`);
    every class but "distractor" is drawn by index."""

    def __init__(
        self, spelling: Spelling, sizes: Mapping[str, int], seed: Sequence[int], zipf_exponent: float = 1.0
    ) -> None:
        rng = np.random.default_rng(list(seed))
        super().__init__(sizes, lambda count: spell_words(count, spelling, rng), zipf_exponent)

    def word(self, word_class: str, index: int) -> str:
        return self.words[self.start[word_class] + index]

    def of(self, word_class: str, index: IntArray) -> list[str]:
        """The words of one class at the given indices."""
        words: list[str] = self._word_array[self.start[word_class] + index].tolist()
        return words

    def uniform(self, word_class: str, count: int, rng: np.random.Generator) -> IntArray:
        """Word ids drawn uniformly from one class."""
        return (self.start[word_class] + rng.integers(0, self.size[word_class], count)).astype(np.int64)
