"""A prompt's outcome history enters by an exact conjugate update on the network's prior, with a
concentration fitted to observed groups, and the better of two prior sources is served."""

from __future__ import annotations

import math

import numpy as np
import pytest
from predictor_synthetic import SyntheticTask, tiny_config

from trace_service.predictor import (
    Calibration,
    CheckpointError,
    OutcomeCounts,
    Query,
    RootGroup,
    SuccessPredictor,
)
from trace_service.predictor.checkpoint import decode_checkpoint, encode_checkpoint


def logit(p: float) -> float:
    return math.log(p / (1 - p))


def sigmoid(x: float) -> float:
    return 1 / (1 + math.exp(-x))


def trained(task: SyntheticTask, *, informative_text: bool, trees: int = 120) -> SuccessPredictor:
    """A predictor trained on synthetic trees whose bare groups come from prompts with success p; with
    ``informative_text`` the prompt text names p's band, otherwise it carries no signal."""
    predictor = SuccessPredictor(tiny_config(holdout_every=4))
    rng = np.random.default_rng(3)
    featurizer = predictor.featurizer
    for index in range(trees):
        nodes = task.tree(featurizer, rng, f"p{index}")
        p = nodes[-1].true_probability
        text = f"band{int(p * 4)} " * 3 if informative_text else task.text(rng, 8)
        root = featurizer.encode_prompt(f"p{index}", text)
        successes = int(rng.binomial(6, p))
        group = RootGroup(root, successes, 6, OutcomeCounts(0, 0))
        predictor.add_examples(task.examples(nodes), group)
        if index % 20 == 19:
            predictor.train_round(max_steps=20)
    return predictor


def test_cold_start_is_the_configured_beta_posterior(synthetic_task: SyntheticTask) -> None:
    predictor = SuccessPredictor(tiny_config(prior_successes=1.0, prior_failures=3.0))
    root = predictor.featurizer.encode_prompt("p", "anything")
    first = predictor.featurizer.extend(root, "a turn")
    values = predictor.predict([Query(root, OutcomeCounts(2, 5)), Query(first, OutcomeCounts(2, 5))])
    # The prefix inherits the root's move: μ(H) = μ(x) = μ₀ before training.
    np.testing.assert_allclose(values, [3 / 9, 3 / 9])
    # The belief is the Beta(1 + 2, 3 + 3) posterior: concentration 4 + 5, for the prefix too.
    predictive = predictor.predictive([Query(root, OutcomeCounts(2, 5)), Query(first, OutcomeCounts(2, 5))])
    np.testing.assert_allclose(predictive.mean, values)
    np.testing.assert_allclose(predictive.concentration, [9.0, 9.0])


def test_roots_get_the_conjugate_update_and_prefixes_inherit_its_odds(synthetic_task: SyntheticTask) -> None:
    predictor = trained(synthetic_task, informative_text=False)
    calibration = predictor.calibration
    assert calibration.groups >= 16 and set(calibration.log_likelihood) == {"network", "history"}
    featurizer = predictor.featurizer
    root = featurizer.encode_prompt("fresh", "some unseen prompt words")
    prefix = featurizer.extend(root, "first turn")
    history = OutcomeCounts(1, 7)
    kappa = calibration.concentration
    network_root, network_prefix = predictor.predict([Query(root), Query(prefix)])
    if calibration.prior == "history":
        assert network_root == pytest.approx(calibration.history_mean)
    prior_mean = float(network_root)
    root_value, prefix_value = predictor.predict([Query(root, history), Query(prefix, history)])
    assert root_value == pytest.approx((kappa * prior_mean + 1) / (kappa + 7))
    # The posterior Beta(κm + 1, κ(1 − m) + 6) has concentration κ + 7, whichever source m is from.
    fresh, seen = predictor.predictive([Query(root), Query(root, history)]).concentration
    assert (fresh, seen) == (pytest.approx(kappa), pytest.approx(kappa + 7))
    # Without history a prefix is the network's μ(H); with it, the root's log-odds move carries over.
    raw_root = predictor._prior_means(predictor._published.model, [root])[0]
    raw_prefix = predictor._prior_means(predictor._published.model, [prefix])[0]
    assert network_prefix == pytest.approx(sigmoid(logit(raw_prefix) - logit(raw_root) + logit(prior_mean)))
    assert prefix_value == pytest.approx(sigmoid(logit(raw_prefix) - logit(raw_root) + logit(root_value)))


def test_the_prior_source_that_explains_the_groups_better_is_served(synthetic_task: SyntheticTask) -> None:
    noise = trained(synthetic_task, informative_text=False)
    signal = trained(synthetic_task, informative_text=True)
    assert signal.calibration.prior == "network"
    assert signal.calibration.log_likelihood["network"] > signal.calibration.log_likelihood["history"]
    # Uninformative text: the network can at best tie a constant, and must never be served worse.
    chosen = noise.calibration
    assert chosen.log_likelihood[chosen.prior] == max(chosen.log_likelihood.values())


def test_calibration_travels_with_the_weights(synthetic_task: SyntheticTask) -> None:
    predictor = trained(synthetic_task, informative_text=True)
    restored = SuccessPredictor.from_bytes(predictor.to_bytes())
    assert restored.calibration == predictor.calibration
    header, state = decode_checkpoint(predictor.to_bytes())
    for bad in ({"concentration": -1.0}, {"prior": "oracle"}, {"history_mean": 1.0}, {"groups": "x"}):
        damaged = {**header, "calibration": {**header["calibration"], **bad}}
        with pytest.raises(CheckpointError, match="calibration"):
            SuccessPredictor.from_bytes(encode_checkpoint(damaged, state))
    with pytest.raises(CheckpointError, match="calibration"):
        SuccessPredictor.from_bytes(encode_checkpoint({**header, "calibration": []}, state))


def test_root_group_validation() -> None:
    predictor = SuccessPredictor(tiny_config())
    root = predictor.featurizer.encode_prompt("p", "text")
    with pytest.raises(ValueError, match="successes"):
        RootGroup(root, 3, 2)
    with pytest.raises(ValueError, match="depth"):
        RootGroup(predictor.featurizer.extend(root, "turn"), 0, 1)
    with pytest.raises(ValueError, match="RootGroup"):
        predictor.add_examples([], group=(root, 1, 2))  # type: ignore[arg-type]
    assert Calibration(concentration=2.0).prior == "network"


def test_root_encoding_of_a_prefix_equals_the_prompts_own() -> None:
    featurizer = SuccessPredictor(tiny_config(feature_dim=2)).featurizer
    root = featurizer.encode_prompt("p", "alpha beta", [1.0, 2.0])
    prefix = featurizer.extend(featurizer.extend(root, "gamma", [3.0, 4.0]), "delta")
    derived = prefix.root()
    assert derived.depth == 0 and derived.prompt_id == "p"
    assert derived.prompt_tokens is root.prompt_tokens
    assert derived.structural_counts() == root.structural_counts()
    assert derived.latest_features is None and derived.prompt_features is root.prompt_features
