"""Featurisation of rollout histories for the success predictor.

A history is a prompt followed by the turns a rollout has taken so far. It is encoded once per node and
extended by one turn at a time, so a prefix tree is encoded in time linear in its total text:

    root  = featurizer.encode_prompt(prompt_id, prompt_text, prompt_features)
    child = featurizer.extend(root, turn_text, turn_features)

Text becomes stable hashed word n-grams (lower-cased ``\\w+`` words, unigrams and bigrams, each hashed
with BLAKE2b into ``num_buckets`` buckets; never Python's per-process salted ``hash``), kept in three
bags: the prompt, the earlier turns and the latest turn (the latest turn carries most of the progress
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

import hashlib
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

import numpy as np
import numpy.typing as npt

TokenIds = npt.NDArray[np.int64]
FloatVector = npt.NDArray[np.float32]

_WORD = re.compile(r"\w+")
# Structural features appended to the dense part of every query, in this order.
STRUCTURAL_FEATURE_NAMES: tuple[str, ...] = (
    "log1p_depth",
    "log1p_prompt_tokens",
    "log1p_latest_turn_tokens",
    "log1p_mean_turn_tokens",
    "log1p_total_turn_tokens",
)


# Cached: frequent words recur constantly, and a hit costs a fraction of hashing (about 1 µs).
@lru_cache(maxsize=1 << 18)
def word_hash(word: str) -> int:
    """Stable 64-bit hash of one word: the first 8 bytes of BLAKE2b(word, UTF-8), little-endian.
    Identical in every process, platform and Python version (never Python's salted ``hash``)."""
    return int.from_bytes(hashlib.blake2b(word.encode("utf-8"), digest_size=8).digest(), "little")


#: Names the token-to-bucket mapping; checkpoints record it, since embeddings are only valid under it.
TOKEN_HASHING = "blake2b64-words/mix29-bigrams"

# Odd 64-bit constants of the bigram mix (golden-ratio and MurmurHash3 finaliser multipliers).
_MIX_FIRST = np.uint64(0x9E3779B97F4A7C15)
_MIX_SECOND = np.uint64(0xC2B2AE3D27D4EB4F)


def bigram_hashes(first: npt.NDArray[np.uint64], second: npt.NDArray[np.uint64]) -> npt.NDArray[np.uint64]:
    """Stable, order-sensitive 64-bit hashes of word pairs from their word hashes (arithmetic mod 2^64):

        m = h(a)·K1 + h(b)·K2,   h(a, b) = m xor (m >> 29)

    Computed on whole arrays: hashing each bigram string on its own cost most of /v1/allocate.
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

    def structural_features(self) -> FloatVector:
        """The values named by :data:`STRUCTURAL_FEATURE_NAMES`; counts are before token truncation."""
        depth = self.depth
        latest = self.turn_token_counts[-1] if depth else 0
        mean_turn = self.turn_token_total / depth if depth else 0.0
        return np.array(
            [
                math.log1p(depth),
                math.log1p(self.prompt_token_count),
                math.log1p(latest),
                math.log1p(mean_turn),
                math.log1p(self.turn_token_total),
            ],
            dtype=np.float32,
        )


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
        if not isinstance(text, str):
            raise ValueError(f"text must be a string, got {type(text).__name__}")
        max_chars = self.config.max_chars_per_text
        if len(text) > max_chars:
            half = max_chars // 2
            text = text[:half] + " " + text[-half:]
        words = _WORD.findall(text.lower())
        unigrams = np.fromiter(map(word_hash, words), dtype=np.uint64, count=len(words))
        # In text order (w0, w0+w1, w1, w1+w2, ...), so truncation keeps the head and tail of the text.
        hashes = np.empty(max(2 * len(words) - 1, 0), dtype=np.uint64)
        hashes[0::2] = unigrams
        hashes[1::2] = bigram_hashes(unigrams[:-1], unigrams[1:])
        token_count = hashes.size
        max_tokens = self.config.max_tokens_per_text
        if token_count > max_tokens:
            half = max_tokens // 2
            hashes = np.concatenate([hashes[:half], hashes[-half:]])
        ids = (hashes % np.uint64(self.config.num_buckets)).astype(np.int64)
        ids.flags.writeable = False
        return ids, token_count

    def encode_prompt(
        self, prompt_id: str, prompt_text: str = "", prompt_features: Sequence[float] | None = None
    ) -> EncodedHistory:
        """Encoding of a root: the prompt alone (depth 0)."""
        if not isinstance(prompt_id, str):
            raise ValueError(f"prompt_id must be a string, got {type(prompt_id).__name__}")
        ids, count = self.token_ids(prompt_text)
        return EncodedHistory(
            prompt_id=prompt_id,
            prompt_tokens=ids,
            turn_tokens=(),
            prompt_token_count=count,
            turn_token_counts=(),
            prompt_features=self._feature_vector(prompt_features, "prompt features"),
            latest_features=None,
            num_buckets=self.config.num_buckets,
            feature_dim=self.config.feature_dim,
            turn_token_total=0,
        )

    def extend(
        self, parent: EncodedHistory, turn_text: str = "", turn_features: Sequence[float] | None = None
    ) -> EncodedHistory:
        """Encoding of ``parent`` followed by one more turn; only the new turn's text is processed."""
        self.check_compatible(parent)
        ids, count = self.token_ids(turn_text)
        features = self._feature_vector(turn_features, "turn features")
        return EncodedHistory(
            prompt_id=parent.prompt_id,
            prompt_tokens=parent.prompt_tokens,
            turn_tokens=(*parent.turn_tokens, ids),
            prompt_token_count=parent.prompt_token_count,
            turn_token_counts=(*parent.turn_token_counts, count),
            prompt_features=parent.prompt_features,
            latest_features=parent.latest_features if features is None else features,
            num_buckets=parent.num_buckets,
            feature_dim=parent.feature_dim,
            turn_token_total=parent.turn_token_total + count,
        )

    def encode(
        self,
        prompt_id: str,
        prompt_text: str = "",
        prompt_features: Sequence[float] | None = None,
        turns: Sequence[Turn] = (),
    ) -> EncodedHistory:
        """Encoding of a whole history at once (the same value as encoding the prompt and extending)."""
        encoded = self.encode_prompt(prompt_id, prompt_text, prompt_features)
        for turn in turns:
            encoded = self.extend(encoded, turn.text, turn.features)
        return encoded

    def check_compatible(self, encoded: EncodedHistory) -> None:
        """Raise ValueError when ``encoded`` was made under a different bucket count or feature size."""
        if (encoded.num_buckets, encoded.feature_dim) != (self.config.num_buckets, self.config.feature_dim):
            raise ValueError(
                f"history encoded with num_buckets={encoded.num_buckets}, feature_dim={encoded.feature_dim}; "
                f"this model expects num_buckets={self.config.num_buckets}, "
                f"feature_dim={self.config.feature_dim}"
            )

    def _feature_vector(self, values: Sequence[float] | None, what: str) -> FloatVector | None:
        if values is None:
            return None
        try:
            exact = np.array(values, dtype=np.float64)
        except (TypeError, ValueError) as error:
            raise ValueError(f"{what} must be a sequence of numbers: {error}") from None
        if exact.ndim != 1 or exact.shape[0] != self.config.feature_dim:
            raise ValueError(
                f"{what} must have exactly feature_dim={self.config.feature_dim} numbers, "
                f"got shape {exact.shape}"
            )
        if not np.all(np.isfinite(exact)):
            raise ValueError(f"{what} contain NaN or infinite values")
        if np.any(np.abs(exact) > np.finfo(np.float32).max):
            raise ValueError(f"{what} exceed the float32 range")
        if exact.shape[0] == 0:
            return None
        vector = exact.astype(np.float32)
        vector.flags.writeable = False
        return vector
