"""The torch model and batching: bag layout, dense columns, the cold-start prior, devices."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from trace_service.predictor import FeaturizerConfig, HistoryFeaturizer, OutcomeCounts, Query
from trace_service.predictor.features import STRUCTURAL_FEATURE_NAMES
from trace_service.predictor.model import SuccessModel, collate, dense_dim, dense_features, resolve_device


def make_featurizer(feature_dim: int = 0) -> HistoryFeaturizer:
    return HistoryFeaturizer(FeaturizerConfig(num_buckets=256, feature_dim=feature_dim))


def test_collate_lays_out_prompt_earlier_and_latest_bags() -> None:
    featurizer = make_featurizer()
    root = featurizer.encode_prompt("p", "alpha beta")
    first = featurizer.extend(root, "gamma")
    second = featurizer.extend(first, "delta epsilon zeta")
    queries = [Query(root), Query(first), Query(second)]
    inputs = collate(queries, feature_dim=0, max_history_tokens=100, prior_mean=0.5)

    # One tree's histories share their prompt: its bag is pooled once and indexed by every row.
    assert inputs.prompt_ids.tolist() == root.prompt_tokens.tolist()
    assert inputs.prompt_offsets.tolist() == [0]
    assert inputs.prompt_index.tolist() == [0, 0, 0]
    other = featurizer.encode_prompt("q", "alpha beta")  # the same text, another prompt's array
    mixed = collate(
        [Query(first), Query(other), Query(second)],
        feature_dim=0, max_history_tokens=100, prior_mean=0.5,
    )  # fmt: skip
    assert mixed.prompt_offsets.tolist() == [0, 3]
    assert mixed.prompt_index.tolist() == [0, 1, 0]
    # Earlier turns: none, none, the first turn.
    assert inputs.earlier_ids.tolist() == first.turn_tokens[0].tolist()
    assert inputs.earlier_offsets.tolist() == [0, 0, 0]
    # Latest turn: none, the first turn, the second turn.
    assert inputs.latest_ids.tolist() == first.turn_tokens[0].tolist() + second.turn_tokens[1].tolist()
    assert inputs.latest_offsets.tolist() == [0, 0, 1]


def test_earlier_turn_bag_keeps_only_the_most_recent_tokens() -> None:
    featurizer = make_featurizer()
    history = featurizer.encode_prompt("p", "")
    for text in ["a b c", "d e f", "g h i", "last"]:
        history = featurizer.extend(history, text)
    inputs = collate([Query(history)], feature_dim=0, max_history_tokens=7, prior_mean=0.5)
    recent = np.concatenate(history.turn_tokens[:-1])[-7:]
    assert inputs.earlier_ids.tolist() == recent.tolist()


def test_dense_columns_hold_structure_and_client_vectors_never_the_outcome_history() -> None:
    featurizer = make_featurizer(feature_dim=2)
    root = featurizer.encode_prompt("p", "one two", [1.0, 2.0])
    turn = featurizer.extend(root, "three", [3.0, 4.0])
    rows = dense_features([Query(root, OutcomeCounts(1, 3)), Query(turn)], feature_dim=2)
    structural = len(STRUCTURAL_FEATURE_NAMES)
    assert rows.shape == (2, dense_dim(2)) == (2, structural + 6)
    np.testing.assert_allclose(rows[0, :structural], root.structural_features())
    np.testing.assert_allclose(rows[0, structural:], [1, 1, 2, 0, 0, 0])
    np.testing.assert_allclose(rows[1, structural:], [1, 1, 2, 1, 3, 4])
    # The prompt's outcomes are the calibration's business: the network's input does not change.
    np.testing.assert_array_equal(rows[0], dense_features([Query(root)], feature_dim=2)[0])


def test_fresh_model_predicts_the_cold_start_mean_exactly() -> None:
    featurizer = make_featurizer()
    root = featurizer.encode_prompt("p", "some prompt")
    queries = [Query(root, OutcomeCounts(s, 10)) for s in (0, 3, 10)]
    inputs = collate(queries, feature_dim=0, max_history_tokens=10, prior_mean=0.25)
    model = SuccessModel(num_buckets=256, dense_width=dense_dim(0), embed_dim=4, hidden_dim=8, dropout=0.0)
    np.testing.assert_allclose(model.predict(inputs), [0.25] * 3, rtol=1e-6)


def test_standardisation_treats_constant_columns_as_unit_scale() -> None:
    model = SuccessModel(num_buckets=16, dense_width=3, embed_dim=2, hidden_dim=4, dropout=0.0)
    model.set_dense_standardisation(np.array([1.0, 2.0, 3.0]), np.array([2.0, 0.0, 1e-9]))
    assert model.dense_mean.tolist() == [1.0, 2.0, 3.0]
    assert model.dense_scale.tolist() == [2.0, 1.0, 1.0]


def test_predictions_are_probabilities_even_for_extreme_weights() -> None:
    featurizer = make_featurizer()
    queries = [Query(featurizer.extend(featurizer.encode_prompt("p", "x y"), "z"))] * 3
    inputs = collate(queries, feature_dim=0, max_history_tokens=10, prior_mean=0.5)
    model = SuccessModel(num_buckets=256, dense_width=dense_dim(0), embed_dim=4, hidden_dim=8, dropout=0.0)
    with torch.no_grad():
        model.head.bias.fill_(1e6)
    predictions = model.predict(inputs)
    assert predictions.dtype == np.float64
    assert np.all((predictions >= 0) & (predictions <= 1))


def test_device_resolution() -> None:
    assert resolve_device("cpu") == torch.device("cpu")
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert resolve_device("auto").type == expected
    with pytest.raises(ValueError, match="unknown device"):
        resolve_device("abacus")


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_explicit_cuda_without_cuda_is_an_error() -> None:
    with pytest.raises(ValueError, match="CUDA is not available"):
        resolve_device("cuda")
