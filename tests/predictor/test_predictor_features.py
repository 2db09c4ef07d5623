"""Featurisation: stable hashing, incremental encoding, truncation, feature vectors, bad input."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trace_service.predictor import EncodedHistory, FeaturizerConfig, HistoryFeaturizer, OutcomeCounts, Turn
from trace_service.predictor import features as features_module
from trace_service.predictor.features import word_hashes

SAMPLE_TEXT = "Ünïcode words, numbers 42 and_underscores; repeated repeated words."


MASK = (1 << 64) - 1


def reference_word_hash(word: str) -> int:
    """h(w) = fmix64((Σ_j c_j·R^j mod 2^64) xor L·K) over the 8-byte little-endian chunks c_j of w's
    UTF-8 bytes, with Python integers."""
    radix, length_mix = (0x100000001B3 * 0x9E37) | 1, 0x9E3779B97F4A7C15
    data = word.encode("utf-8")
    chunks = [int.from_bytes(data[i : i + 8], "little") for i in range(0, len(data), 8)]
    value = sum(chunk * pow(radix, j, 1 << 64) for j, chunk in enumerate(chunks)) & MASK
    value ^= len(data) * length_mix & MASK
    for multiplier in (0xFF51AFD7ED558CCD, 0xC4CEB9FE1A85EC53):
        value = ((value ^ (value >> 33)) * multiplier) & MASK
    return value ^ (value >> 33)


def reference_ids(text: str, num_buckets: int) -> list[int]:
    """Unigram and bigram buckets in text order, written independently of the featurizer: the words of
    ``re.findall(r"\\w+", text.lower())``, h(a, b) = m xor (m >> 29) with m = h(a)·K1 + h(b)·K2."""
    k1, k2 = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
    hashes = [reference_word_hash(word) for word in re.findall(r"\w+", text.lower())]
    ids: list[int] = []
    for index, hashed in enumerate(hashes):
        if index:
            mixed = (hashes[index - 1] * k1 + hashed * k2) & MASK
            ids.append((mixed ^ (mixed >> 29)) % num_buckets)
        ids.append(hashed % num_buckets)
    return ids


def test_token_ids_are_hashed_buckets_of_unigrams_and_bigrams() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=997))
    ids, count = featurizer.token_ids(SAMPLE_TEXT)
    expected = reference_ids(SAMPLE_TEXT, 997)
    assert ids.tolist() == expected
    assert count == len(expected)


# ASCII and non-ASCII texts take different paths to their words; both must match the regex.
TEXTS = st.text(st.characters(codec="ascii"), max_size=120) | st.text(max_size=120)


@settings(max_examples=200, deadline=None)
@given(st.lists(TEXTS, max_size=6))
def test_batched_token_ids_equal_the_reference_text_by_text(texts: list[str]) -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=1 << 20, max_tokens_per_text=1 << 12))
    batched = featurizer.token_ids_many(texts)
    assert [ids.tolist() for ids, _ in batched] == [reference_ids(text, 1 << 20) for text in texts]
    assert [count for _, count in batched] == [len(reference_ids(text, 1 << 20)) for text in texts]


def test_word_hashes_match_the_reference_for_any_word_length() -> None:
    words = ["a", "日本語", "x" * 300, "_", "ß" * 7, "exactly8", "sixteen-bytes-ab"]
    data = np.frombuffer("\x00".join(words).encode("utf-8"), dtype=np.uint8)
    hashes, starts = word_hashes(data)
    assert hashes.tolist() == [reference_word_hash(word) for word in words]
    assert starts.tolist() == [0, 2, 12, 313, 315, 330, 339]
    assert word_hashes(np.zeros(3, dtype=np.uint8))[0].size == 0


def test_bigrams_depend_on_word_order() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=1 << 20))
    forward, _ = featurizer.token_ids("alpha beta")
    backward, _ = featurizer.token_ids("beta alpha")
    assert forward[1] != backward[1]


def test_hashing_is_stable_across_processes_with_different_hash_seeds() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=1 << 16))
    here = featurizer.token_ids(SAMPLE_TEXT)[0].tolist()
    # Load features.py by path: it needs only numpy, so the child process starts fast (no torch).
    program = (
        "import importlib.util, sys\n"
        f"spec = importlib.util.spec_from_file_location('features', {features_module.__file__!r})\n"
        "features = importlib.util.module_from_spec(spec)\n"
        "sys.modules['features'] = features\n"
        "spec.loader.exec_module(features)\n"
        "featurizer = features.HistoryFeaturizer(features.FeaturizerConfig(num_buckets=1 << 16))\n"
        f"print(featurizer.token_ids({SAMPLE_TEXT!r})[0].tolist())"
    )
    for hash_seed in ("1", "2"):
        result = subprocess.run(
            [sys.executable, "-c", program],
            env={**os.environ, "PYTHONHASHSEED": hash_seed},
            capture_output=True,
            text=True,
            check=True,
        )
        assert result.stdout.strip() == str(here)


def test_incremental_encoding_equals_whole_history_encoding_and_leaves_parent_untouched() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=512, feature_dim=2))
    turns = [Turn("open the door", [1.0, 2.0]), Turn(""), Turn("look around the room", [3.0, 4.0])]
    whole = featurizer.encode("p", "find the key", [0.5, 0.5], turns)

    root = featurizer.encode_prompt("p", "find the key", [0.5, 0.5])
    first = featurizer.extend(root, "open the door", [1.0, 2.0])
    sibling = featurizer.extend(first, "a different branch")
    second = featurizer.extend(first, "")
    third = featurizer.extend(second, "look around the room", [3.0, 4.0])

    assert first.depth == 1
    assert sibling.depth == 2
    assert second.depth == 2
    for encoded in (whole, third):
        assert encoded.depth == 3
        assert encoded.prompt_tokens.tolist() == featurizer.token_ids("find the key")[0].tolist()
        assert [ids.tolist() for ids in encoded.turn_tokens] == [
            featurizer.token_ids(turn.text)[0].tolist() for turn in turns
        ]
        assert encoded.turn_token_counts == (5, 0, 7)
        assert encoded.latest_features is not None
        assert encoded.latest_features.tolist() == [3.0, 4.0]
        np.testing.assert_array_equal(encoded.structural_features(), whole.structural_features())


def test_tree_encoding_equals_extending_each_node_from_its_parent() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=4096, feature_dim=1, max_tokens_per_text=6))
    turns = [Turn("open the door"), Turn("look", [2.0]), Turn("a long turn of many words here"), Turn("")]
    parents = [-1, 0, 0, 2]
    root, encoded = featurizer.encode_tree("p", "find the key", [1.0], turns, parents)
    expected_root = featurizer.encode_prompt("p", "find the key", [1.0])
    expected: list[EncodedHistory] = []
    for turn, parent in zip(turns, parents, strict=True):
        expected.append(
            featurizer.extend(expected[parent] if parent >= 0 else expected_root, turn.text, turn.features)
        )
    for got, want in zip([root, *encoded], [expected_root, *expected], strict=True):
        assert got.prompt_tokens.tolist() == want.prompt_tokens.tolist()
        assert [ids.tolist() for ids in got.turn_tokens] == [ids.tolist() for ids in want.turn_tokens]
        assert got.turn_token_counts == want.turn_token_counts
        np.testing.assert_array_equal(got.structural_features(), want.structural_features())
    assert encoded[2].turn_tokens[1].size == 6  # truncated to head and tail inside the batch
    assert encoded[3].latest_features is None
    assert encoded[1].latest_features is not None


@pytest.mark.parametrize("parents", [[0], [-2], [1]])
def test_tree_encoding_rejects_parents_that_do_not_come_first(parents: list[int]) -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64))
    with pytest.raises(ValueError, match="parents must come first"):
        featurizer.encode_tree("p", "", None, [Turn("x")], parents)
    with pytest.raises(ValueError, match="1 turns but 2 parents"):
        featurizer.encode_tree("p", "", None, [Turn("x")], [-1, 0])


def test_extension_shares_parent_arrays_instead_of_copying_them() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=512))
    parent = featurizer.extend(featurizer.encode_prompt("p", "a prompt"), "first turn text")
    child = featurizer.extend(parent, "second turn")
    assert child.prompt_tokens is parent.prompt_tokens
    assert child.turn_tokens[0] is parent.turn_tokens[0]
    with pytest.raises(ValueError, match="read-only"):
        child.turn_tokens[0][0] = 1


def test_latest_features_carry_forward_over_turns_without_features() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64, feature_dim=1))
    root = featurizer.encode_prompt("p", "x", [9.0])
    assert root.latest_features is None
    with_features = featurizer.extend(root, "a", [1.0])
    without = featurizer.extend(with_features, "b")
    assert without.latest_features is not None
    assert without.latest_features.tolist() == [1.0]
    assert without.prompt_features is not None
    assert without.prompt_features.tolist() == [9.0]


def test_structural_features_follow_depth_and_lengths() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64))
    root = featurizer.encode_prompt("p", "one two three")  # 3 words → 5 tokens
    turn = featurizer.extend(root, "four five")  # 3 tokens
    np.testing.assert_allclose(root.structural_features(), np.log1p([0, 5, 0, 0, 0]), rtol=1e-6)
    np.testing.assert_allclose(turn.structural_features(), np.log1p([1, 5, 3, 3, 3]), rtol=1e-6)


def test_empty_text_carries_no_tokens() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64))
    encoded = featurizer.extend(featurizer.encode_prompt("p"), "")
    assert encoded.prompt_tokens.size == 0
    assert encoded.turn_tokens[0].size == 0


def test_long_text_keeps_head_and_tail_tokens() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=1 << 20, max_tokens_per_text=10))
    words = [f"w{index}" for index in range(100)]
    ids, count = featurizer.token_ids(" ".join(words))
    full = reference_ids(" ".join(words), 1 << 20)
    assert count == len(full) == 199
    assert ids.tolist() == full[:5] + full[-5:]


def test_very_long_text_is_cut_by_characters_before_tokenising() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64, max_chars_per_text=100))
    ids, count = featurizer.token_ids("a " * 1_000_000)
    assert count <= 100
    assert ids.size <= 512


@settings(max_examples=50, deadline=None)
@given(st.text(max_size=200), st.integers(min_value=2, max_value=64))
def test_any_text_yields_ids_within_bucket_range(text: str, max_tokens: int) -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=97, max_tokens_per_text=max_tokens))
    ids, count = featurizer.token_ids(text)
    assert ids.size == (count if count <= max_tokens else 2 * (max_tokens // 2))
    assert np.all((ids >= 0) & (ids < 97))


@pytest.mark.parametrize(
    ("features", "message"),
    [
        ([1.0], "exactly feature_dim=2"),
        ([1.0, 2.0, 3.0], "exactly feature_dim=2"),
        ([[1.0, 2.0]], "exactly feature_dim=2"),
        ([1.0, float("nan")], "NaN or infinite"),
        ([float("inf"), 1.0], "NaN or infinite"),
        ([1e300, 1.0], "float32 range"),
        (["a", "b"], "sequence of numbers"),
    ],
)
def test_bad_feature_vectors_are_rejected(features: list[object], message: str) -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64, feature_dim=2))
    with pytest.raises(ValueError, match=message):
        featurizer.encode_prompt("p", "text", features)  # type: ignore[arg-type]
    root = featurizer.encode_prompt("p", "text")
    with pytest.raises(ValueError, match=message):
        featurizer.extend(root, "turn", features)  # type: ignore[arg-type]


def test_features_without_a_configured_dimension_are_rejected() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64))
    with pytest.raises(ValueError, match="feature_dim=0"):
        featurizer.encode_prompt("p", "text", [1.0])


def test_non_string_text_and_prompt_id_are_rejected() -> None:
    featurizer = HistoryFeaturizer(FeaturizerConfig(num_buckets=64))
    with pytest.raises(ValueError, match="text must be a string"):
        featurizer.encode_prompt("p", None)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="prompt_id must be a string"):
        featurizer.encode_prompt(7)  # type: ignore[arg-type]


def test_history_from_another_configuration_is_rejected() -> None:
    small = HistoryFeaturizer(FeaturizerConfig(num_buckets=64))
    large = HistoryFeaturizer(FeaturizerConfig(num_buckets=128))
    with pytest.raises(ValueError, match="num_buckets=64"):
        large.extend(small.encode_prompt("p", "text"), "turn")


@pytest.mark.parametrize(
    "arguments",
    [
        {"num_buckets": 1},
        {"feature_dim": -1},
        {"max_tokens_per_text": 1},
        {"max_chars_per_text": 0},
    ],
)
def test_bad_featurizer_configuration_is_rejected(arguments: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(arguments))):
        FeaturizerConfig(**arguments)


def test_outcome_counts_posterior_mean_and_validation() -> None:
    assert OutcomeCounts().posterior_mean() == 0.5
    assert OutcomeCounts(successes=3, trials=4).posterior_mean() == pytest.approx(4 / 6)
    assert OutcomeCounts(successes=3, trials=4).posterior_mean(2.0, 1.0) == pytest.approx(5 / 7)
    for successes, trials in [(-1, 2), (3, 2), (float("nan"), 2), (1, float("inf"))]:
        with pytest.raises(ValueError, match=r"successes|finite"):
            OutcomeCounts(successes=successes, trials=trials)


def test_encoded_history_is_immutable() -> None:
    encoded = HistoryFeaturizer(FeaturizerConfig(num_buckets=64)).encode_prompt("p", "text")
    assert isinstance(encoded, EncodedHistory)
    with pytest.raises(AttributeError):
        encoded.prompt_id = "q"  # type: ignore[misc]
