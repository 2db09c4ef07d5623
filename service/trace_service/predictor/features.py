"""Featurisation of rollout histories for the success predictor.

A history is a prompt followed by the turns a rollout has taken so far. It is encoded once per node and
extended by one turn at a time, so a prefix tree is encoded in time linear in its total text:

    root  = featurizer.encode_prompt(prompt_id, prompt_text, prompt_features)
    child = featurizer.extend(root, turn_text, turn_features)

Batches (``encode_prompts``, ``encode_tree``) tokenise all their texts in one vectorised pass.

Text becomes stable hashed word n-grams (lower-cased ``\\w+`` words, unigrams and bigrams, hashed by
:func:`word_hashes` into ``num_buckets`` buckets; never Python's per-process salted ``hash``), kept in
three bags: the prompt, the earlier turns and the latest turn (the latest turn carries most of the progress
signal, so it is not averaged away among the earlier ones). Structural features (depth, text lengths)
and the client-supplied feature vectors travel next to the bags; the prompt's outcome history across
training steps is not part of the encoding because it changes between steps: it is supplied with each
query (:class:`OutcomeCounts`).

Truncation: a text longer than ``max_chars_per_text`` characters keeps its first and last halves of
that many characters, and a text with more than ``max_tokens_per_text`` n-gram tokens keeps its first
and last halves of that many tokens (the end of a turn often holds the observation, the start the
action). Empty text is allowed: it carries no tokens.
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.int64]
FloatVector = npt.NDArray[np.float32]
_FLOAT32_MAX = float(np.finfo(np.float32).max)

_WORD = re.compile(r"\w+")
# Structural features appended to the dense part of every query, in this order.
STRUCTURAL_FEATURE_NAMES: tuple[str, ...] = (
    "log1p_depth",
    "log1p_prompt_tokens",
    "log1p_latest_turn_tokens",
    "log1p_mean_turn_tokens",
    "log1p_total_turn_tokens",
)


#: Names the token-to-bucket mapping; checkpoints record it, since embeddings are only valid under it.
TOKEN_HASHING = "chunk64-fmix-words/mix29-bigrams"

# Odd 64-bit constants: the word polynomial's radix, the length mix, the MurmurHash3 finaliser
# multipliers, and the bigram mix (golden-ratio and MurmurHash3 multipliers).
_RADIX = np.uint64(0x100000001B3 * 0x9E37 | 1)
_LENGTH_MIX = np.uint64(0x9E3779B97F4A7C15)
_FMIX_FIRST = np.uint64(0xFF51AFD7ED558CCD)
_FMIX_SECOND = np.uint64(0xC4CEB9FE1A85EC53)
_MIX_FIRST = np.uint64(0x9E3779B97F4A7C15)
_MIX_SECOND = np.uint64(0xC2B2AE3D27D4EB4F)

# Byte → byte after lower-casing, 0 for a byte that is not part of a word.  ASCII word characters are
# exactly those of ``\w`` ([0-9A-Za-z_]); bytes >= 0x80 only occur in texts already split into words.
_WORD_BYTES = np.zeros(256, dtype=np.uint8)
for _byte in b"0123456789_abcdefghijklmnopqrstuvwxyz":
    _WORD_BYTES[_byte] = _byte
for _byte in b"ABCDEFGHIJKLMNOPQRSTUVWXYZ":
    _WORD_BYTES[_byte] = _byte + 32
_WORD_BYTES[0x80:] = np.arange(0x80, 0x100, dtype=np.uint8)


# The low k bytes of a 64-bit chunk, for k = 0 … 8.
_CHUNK_MASKS = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)


def _fmix64(values: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """MurmurHash3's 64-bit finaliser (xor-shift-multiply), element-wise mod 2^64."""
    shift = np.uint64(33)
    values = values ^ (values >> shift)
    values = values * _FMIX_FIRST
    values = values ^ (values >> shift)
    values = values * _FMIX_SECOND
    result: npt.NDArray[np.uint64] = values ^ (values >> shift)
    return result


def word_hashes(data: npt.NDArray[np.uint8]) -> tuple[npt.NDArray[np.uint64], npt.NDArray[np.intp]]:
    """Stable 64-bit hashes of the words of ``data``, a byte array in which words are the maximal runs
    of non-zero bytes (UTF-8 of lower-cased words), and each word's starting offset.  A word of L bytes
    is read as 64-bit little-endian chunks c_0, c_1, … (the last one zero-padded):

        h(w) = fmix64( (Σ_j c_j · R^j  mod 2^64)  xor  L · K )

    Identical in every process, platform and Python version (never Python's salted ``hash``), and
    computed on whole arrays, eight bytes of every word at a time: hashing word by word in Python cost
    most of /v1/allocate.
    """
    edges = np.flatnonzero(np.diff(data != 0, prepend=False, append=False))
    starts, lengths = edges[0::2], edges[1::2] - edges[0::2]
    # Every offset of the (zero-padded) data read as an unaligned little-endian 64-bit chunk.
    padded = np.concatenate([data, np.zeros(8, dtype=np.uint8)])
    chunks_at = np.ndarray((data.size + 1,), dtype="<u8", buffer=padded, strides=(1,))
    polynomial = np.zeros(starts.size, dtype=np.uint64)
    words, offsets, remaining, power = np.arange(starts.size), starts, lengths, 1
    while words.size:
        chunk = chunks_at[offsets] & _CHUNK_MASKS[np.minimum(remaining, 8)]
        polynomial[words] += chunk * np.uint64(power)
        longer = remaining > 8
        words, offsets, remaining = words[longer], offsets[longer] + 8, remaining[longer] - 8
        power = power * int(_RADIX) % (1 << 64)
    return _fmix64(polynomial ^ (lengths.astype(np.uint64) * _LENGTH_MIX)), starts


def bigram_hashes(first: npt.NDArray[np.uint64], second: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Stable, order-sensitive 64-bit hashes of word pairs from their word hashes (arithmetic mod 2^64):

    m = h(a)·K1 + h(b)·K2,   h(a, b) = m xor (m >> 29)
    """
    mixed = first * _MIX_FIRST + second * _MIX_SECOND
    result: npt.NDArray[np.uint64] = mixed ^ (mixed >> np.uint64(29))
    return result


@dataclass(frozen=True, slots=True)
class FeaturizerConfig:
    """Shape of the encoding; a model is only valid for the configuration it was trained with."""

    num_buckets: int = 1 << 16
    feature_dim: int = 0
    max_tokens_per_text: int = 512
    max_chars_per_text: int = 32_768

    def __post_init__(self) -> None:
        if self.num_buckets < 2:
            raise ValueError(f"num_buckets must be at least 2, got {self.num_buckets}")
        if self.feature_dim < 0:
            raise ValueError(f"feature_dim must be >= 0, got {self.feature_dim}")
        if self.max_tokens_per_text < 2:
            raise ValueError(f"max_tokens_per_text must be at least 2, got {self.max_tokens_per_text}")
        if self.max_chars_per_text < 2:
            raise ValueError(f"max_chars_per_text must be at least 2, got {self.max_chars_per_text}")


@dataclass(frozen=True, slots=True)
class EncodedHistory:
    """Immutable encoding of a prompt plus the turns so far.

    ``turn_tokens`` holds one read-only id array per turn; an extension shares its parent's arrays, so
    storing one encoding per tree node costs O(depth) references per node, not a copy of the text.
    ``latest_features`` is the most recent client feature vector on the path (carried forward over
    turns that sent none); ``None`` when no turn sent one.
    """

    prompt_id: str
    prompt_tokens: TokenIds
    turn_tokens: tuple[TokenIds, ...]
    prompt_token_count: int
    turn_token_counts: tuple[int, ...]
    prompt_features: FloatVector | None
    latest_features: FloatVector | None
    num_buckets: int
    feature_dim: int
    turn_token_total: int

    @property
    def depth(self) -> int:
        """Number of turns so far (0 for the prompt alone)."""
        return len(self.turn_tokens)

    def structural_counts(self) -> tuple[float, float, float, float, float]:
        """Depth, prompt tokens, latest turn's tokens, mean and total turn tokens (before token
        truncation): :data:`STRUCTURAL_FEATURE_NAMES` before their log1p."""
        depth = self.depth
        latest = self.turn_token_counts[-1] if depth else 0
        mean_turn = self.turn_token_total / depth if depth else 0.0
        return (depth, self.prompt_token_count, latest, mean_turn, self.turn_token_total)

    def root(self) -> EncodedHistory:
        """The encoding of this history's prompt alone (depth 0), sharing its token arrays."""
        if not self.turn_tokens:
            return self
        return replace(self, turn_tokens=(), turn_token_counts=(), latest_features=None, turn_token_total=0)

    def structural_features(self) -> FloatVector:
        """The values named by :data:`STRUCTURAL_FEATURE_NAMES`."""
        return np.log1p(np.array(self.structural_counts(), dtype=np.float64)).astype(np.float32)


@dataclass(frozen=True, slots=True)
class OutcomeCounts:
    """The prompt's own outcomes in earlier training steps (the store keeps them per ``prompt_id``).

    Pass the counts known when the decision is made; for a training example, the counts from before
    the tree's own step, or the label leaks into the input.
    """

    successes: float = 0.0
    trials: float = 0.0

    def __post_init__(self) -> None:
        if not (math.isfinite(self.successes) and math.isfinite(self.trials)):
            raise ValueError(f"outcome counts must be finite, got {self.successes}/{self.trials}")
        if not 0.0 <= self.successes <= self.trials:
            raise ValueError(f"need 0 <= successes <= trials, got {self.successes}/{self.trials}")

    def posterior_mean(self, prior_successes: float = 1.0, prior_failures: float = 1.0) -> float:
        """Mean of the Beta posterior: (s + α) / (n + α + β); 0.5 with no history under Beta(1, 1)."""
        return (self.successes + prior_successes) / (self.trials + prior_successes + prior_failures)


@dataclass(frozen=True, slots=True)
class Turn:
    """One turn of a history given all at once to :meth:`HistoryFeaturizer.encode`."""

    text: str = ""
    features: Sequence[float] | None = None


class HistoryFeaturizer:
    """Turns prompt and turn texts into :class:`EncodedHistory` values. Stateless and thread-safe."""

    def __init__(self, config: FeaturizerConfig) -> None:
        self.config = config

    def token_ids(self, text: str) -> tuple[TokenIds, int]:
        """Bucket ids of the unigrams and bigrams of ``text`` after truncation, and the number of
        tokens before token truncation."""
        return self.token_ids_many([text])[0]

    def token_ids_many(self, texts: Sequence[str]) -> list[tuple[TokenIds, int]]:
        """:meth:`token_ids` of many texts in one pass over their concatenated bytes.

        ASCII texts (the common case) are split into words by a byte table, other texts by the
        ``\\w+`` regex; both give the words of ``re.findall(r"\\w+", text.lower())``.
        """
        max_chars = self.config.max_chars_per_text
        pieces: list[bytes] = []
        for text in texts:
            if not isinstance(text, str):
                raise ValueError(f"text must be a string, got {type(text).__name__}")
            if len(text) > max_chars:
                half = max_chars // 2
                text = text[:half] + " " + text[-half:]
            if text.isascii():
                pieces.append(text.encode("ascii"))
            else:
                pieces.append("\x00".join(_WORD.findall(text.lower())).encode("utf-8"))
        data = _WORD_BYTES[np.frombuffer(b"\x00".join(pieces), dtype=np.uint8)]
        unigrams, word_starts = word_hashes(data)
        # Words per text: the word starts that fall inside each text's byte range.
        piece_ends = np.cumsum([len(piece) + 1 for piece in pieces])
        word_ends = np.searchsorted(word_starts, piece_ends).tolist()
        # In text order (w0, w0+w1, w1, w1+w2, ...), so truncation keeps the head and tail of the text;
        # the bigram joining one text's last word to the next text's first is never part of either.
        hashes = np.empty(max(2 * unigrams.size - 1, 0), dtype=np.uint64)
        hashes[0::2] = unigrams
        hashes[1::2] = bigram_hashes(unigrams[:-1], unigrams[1:])
        ids = (hashes % np.uint64(self.config.num_buckets)).astype(np.int64)
        ids.flags.writeable = False
        max_tokens, half = self.config.max_tokens_per_text, self.config.max_tokens_per_text // 2
        result = []
        first_word = 0
        for last_word in word_ends:
            tokens = ids[2 * first_word : max(2 * last_word - 1, 2 * first_word)]
            count = tokens.size
            if count > max_tokens:
                tokens = np.concatenate([tokens[:half], tokens[-half:]])
                tokens.flags.writeable = False
            result.append((tokens, count))
            first_word = last_word
        return result

    def encode_prompt(
        self, prompt_id: str, prompt_text: str = "", prompt_features: Sequence[float] | None = None
    ) -> EncodedHistory:
        """Encoding of a root: the prompt alone (depth 0)."""
        return self.encode_prompts([(prompt_id, prompt_text, prompt_features)])[0]

    def encode_prompts(
        self, prompts: Sequence[tuple[str, str, Sequence[float] | None]]
    ) -> list[EncodedHistory]:
        """:meth:`encode_prompt` of many ``(prompt_id, text, features)`` at once (one tokenising pass)."""
        tokens = self.token_ids_many([text for _, text, _ in prompts])
        return [
            self._root(prompt_id, prompt_tokens, features)
            for (prompt_id, _, features), prompt_tokens in zip(prompts, tokens, strict=True)
        ]

    def extend(
        self, parent: EncodedHistory, turn_text: str = "", turn_features: Sequence[float] | None = None
    ) -> EncodedHistory:
        """Encoding of ``parent`` followed by one more turn; only the new turn's text is processed."""
        self.check_compatible(parent)
        return self._child(parent, self.token_ids(turn_text), turn_features)

    def encode_tree(
        self,
        prompt_id: str,
        prompt_text: str,
        prompt_features: Sequence[float] | None,
        turns: Sequence[Turn],
        parents: Sequence[int],
    ) -> tuple[EncodedHistory, list[EncodedHistory]]:
        """The root and every turn of a prefix tree in one tokenising pass.  ``parents[i]`` is the index
        of turn ``i``'s parent turn (earlier in ``turns``), or -1 when it starts from the prompt."""
        if len(parents) != len(turns):
            raise ValueError(f"{len(turns)} turns but {len(parents)} parents")
        prompt_tokens, *tokens = self.token_ids_many([prompt_text, *(turn.text for turn in turns)])
        root = self._root(prompt_id, prompt_tokens, prompt_features)
        encoded: list[EncodedHistory] = []
        for index, (turn, parent, turn_tokens) in enumerate(zip(turns, parents, tokens, strict=True)):
            if not -1 <= parent < index:
                raise ValueError(f"turn {index} names parent {parent}: parents must come first")
            encoded.append(self._child(encoded[parent] if parent >= 0 else root, turn_tokens, turn.features))
        return root, encoded

    def encode(
        self,
        prompt_id: str,
        prompt_text: str = "",
        prompt_features: Sequence[float] | None = None,
        turns: Sequence[Turn] = (),
    ) -> EncodedHistory:
        """Encoding of a whole history at once (the same value as encoding the prompt and extending)."""
        root, encoded = self.encode_tree(
            prompt_id, prompt_text, prompt_features, turns, range(-1, len(turns) - 1)
        )
        return encoded[-1] if encoded else root

    def _root(
        self, prompt_id: str, tokens: tuple[TokenIds, int], features: Sequence[float] | None
    ) -> EncodedHistory:
        if not isinstance(prompt_id, str):
            raise ValueError(f"prompt_id must be a string, got {type(prompt_id).__name__}")
        ids, count = tokens
        return EncodedHistory(
            prompt_id=prompt_id,
            prompt_tokens=ids,
            turn_tokens=(),
            prompt_token_count=count,
            turn_token_counts=(),
            prompt_features=self._feature_vector(features, "prompt features"),
            latest_features=None,
            num_buckets=self.config.num_buckets,
            feature_dim=self.config.feature_dim,
            turn_token_total=0,
        )

    def _child(
        self, parent: EncodedHistory, tokens: tuple[TokenIds, int], features: Sequence[float] | None
    ) -> EncodedHistory:
        ids, count = tokens
        vector = self._feature_vector(features, "turn features")
        return EncodedHistory(
            prompt_id=parent.prompt_id,
            prompt_tokens=parent.prompt_tokens,
            turn_tokens=(*parent.turn_tokens, ids),
            prompt_token_count=parent.prompt_token_count,
            turn_token_counts=(*parent.turn_token_counts, count),
            prompt_features=parent.prompt_features,
            latest_features=parent.latest_features if vector is None else vector,
            num_buckets=parent.num_buckets,
            feature_dim=parent.feature_dim,
            turn_token_total=parent.turn_token_total + count,
        )

    def check_compatible(self, encoded: EncodedHistory) -> None:
        """Raise ValueError when ``encoded`` was made under a different bucket count or feature size."""
        if (encoded.num_buckets, encoded.feature_dim) != (self.config.num_buckets, self.config.feature_dim):
            raise ValueError(
                f"history encoded with num_buckets={encoded.num_buckets}, feature_dim={encoded.feature_dim}; "
                f"this model expects num_buckets={self.config.num_buckets}, "
                f"feature_dim={self.config.feature_dim}"
            )

    def feature_problem(self, values: Sequence[float], what: str = "features") -> str | None:
        """Why the model cannot use ``values`` (finite numbers, as the contract's feature vectors are)
        as a client feature vector, or None if it can.  The service refuses an event with its answer
        before storing it; :meth:`encode_prompt` and :meth:`extend` raise it."""
        dim = self.config.feature_dim
        if len(values) != dim:
            if dim == 0:
                return f"this server takes no {what} (feature_dim=0); leave {what} out"
            return f"{what} must have exactly feature_dim={dim} numbers, got {len(values)}"
        if dim and max(map(abs, values)) > _FLOAT32_MAX:  # one C-level pass: this runs for every event
            return f"{what} exceed the float32 range"
        return None

    def _feature_vector(self, values: Sequence[float] | None, what: str) -> FloatVector | None:
        if values is None:
            return None
        try:
            exact = np.array(values, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{what} must be a sequence of numbers: {error}") from None
        if exact.ndim != 1:
            raise ValueError(
                f"{what} must be a flat list of exactly feature_dim={self.config.feature_dim} numbers, "
                f"got shape {exact.shape}"
            )
        if not np.all(np.isfinite(exact)):
            raise ValueError(f"{what} contain NaN or infinite values")
        if (problem := self.feature_problem(exact.tolist(), what)) is not None:
            raise ValueError(problem)
        if exact.shape[0] == 0:
            return None
        vector = exact.astype(np.float32)
        vector.flags.writeable = False
        return vector
