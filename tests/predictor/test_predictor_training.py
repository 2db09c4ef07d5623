"""Online training: cold start, learning a planted signal, validation, holdout, versions, threads."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import torch
from predictor_synthetic import SyntheticTask, tiny_config

from trace_service.predictor import OutcomeCounts, PredictorConfig, Query, SuccessPredictor, TrainingExample
from trace_service.predictor.diagnostics import spearman


def fill(predictor: SuccessPredictor, task: SyntheticTask, trees: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    for index in range(trees):
        predictor.add_examples(task.examples(task.tree(predictor.featurizer, rng, f"train-{seed}-{index}")))


def test_cold_start_predicts_the_prompt_posterior_mean() -> None:
    predictor = SuccessPredictor(tiny_config())
    featurizer = predictor.featurizer
    root = featurizer.encode_prompt("p", "never seen")
    deep = featurizer.extend(featurizer.extend(root, "one"), "two")
    queries = [Query(root), Query(deep), Query(root, OutcomeCounts(7, 8)), Query(deep, OutcomeCounts(0, 2))]
    assert predictor.version == 0
    np.testing.assert_allclose(predictor.predict(queries), [0.5, 0.5, 0.8, 0.25])


def test_cold_start_uses_the_configured_prior() -> None:
    predictor = SuccessPredictor(tiny_config(prior_successes=1.0, prior_failures=3.0))
    root = predictor.featurizer.encode_prompt("p", "x")
    predicted = predictor.predict([Query(root), Query(root, OutcomeCounts(2, 4))])
    np.testing.assert_allclose(predicted, [0.25, 3 / 8])


def test_training_reduces_loss_and_learns_the_planted_signal(synthetic_task: SyntheticTask) -> None:
    predictor = SuccessPredictor(tiny_config(num_buckets=16384, holdout_every=0))
    fill(predictor, synthetic_task, trees=1000, seed=1)
    rounds = [predictor.train_round(max_steps=60) for _ in range(5)]
    assert [(result.version, result.steps) for result in rounds] == [(v, 60) for v in range(1, 6)]
    first_loss, last_loss = rounds[0].mean_loss, rounds[-1].mean_loss
    assert first_loss is not None
    assert last_loss is not None
    assert last_loss < 0.5 * first_loss

    rng = np.random.default_rng(99)  # trees the model never saw, with fresh noise and prompts
    nodes = [
        node
        for index in range(80)
        for node in synthetic_task.tree(predictor.featurizer, rng, f"eval-{index}")
        if node.query.history.depth == 1
    ]
    predicted = predictor.predict([node.query for node in nodes])
    truth = np.array([node.true_probability for node in nodes])
    rho = spearman(predicted, truth)
    assert rho is not None
    assert rho > 0.55
    assert np.mean((predicted - truth) ** 2) < 0.7 * np.mean((0.5 - truth) ** 2)
    shows_success = np.array([node.shows_success for node in nodes])
    assert predicted[shows_success].mean() - predicted[~shows_success].mean() > 0.25


def test_replay_ratio_bounds_the_training_steps(synthetic_task: SyntheticTask) -> None:
    predictor = SuccessPredictor(tiny_config(replay_ratio=2.0, batch_size=16, holdout_every=0))
    fill(predictor, synthetic_task, trees=10, seed=2)  # 90 examples allow 180 samples = 11 steps
    first = predictor.train_round(max_steps=100)
    assert (first.version, first.steps) == (1, 11)
    exhausted = predictor.train_round(max_steps=100)
    assert (exhausted.version, exhausted.steps, exhausted.mean_loss) == (1, 0, None)
    assert predictor.version == 1
    fill(predictor, synthetic_task, trees=1, seed=3)  # 9 more examples: 18 + 4 left over = 1 step
    assert predictor.train_round(max_steps=100).steps == 1


def test_train_round_without_examples_changes_nothing() -> None:
    predictor = SuccessPredictor(tiny_config())
    result = predictor.train_round(max_steps=5)
    assert (result.version, result.steps, result.mean_loss, result.buffered_examples) == (0, 0, None, 0)
    assert predictor.version == 0
    with pytest.raises(ValueError, match="max_steps"):
        predictor.train_round(max_steps=0)


def test_every_kth_tree_is_held_out_and_not_trained_on(synthetic_task: SyntheticTask) -> None:
    predictor = SuccessPredictor(tiny_config(holdout_every=3))
    rng = np.random.default_rng(0)
    trees = [synthetic_task.tree(predictor.featurizer, rng, f"p{index}") for index in range(9)]
    destinations = [predictor.add_examples(synthetic_task.examples(tree)) for tree in trees]
    assert destinations == ["training", "training", "holdout"] * 3
    nodes_per_tree = 9
    assert predictor.examples_seen == 6 * nodes_per_tree
    report = predictor.diagnostics()
    assert report.holdout_examples == 3 * nodes_per_tree
    assert predictor.train_round(1).buffered_examples == 6 * nodes_per_tree


def test_replay_buffer_keeps_the_most_recent_examples() -> None:
    predictor = SuccessPredictor(tiny_config(replay_capacity=5, holdout_every=0))
    root = predictor.featurizer.encode_prompt("p", "x")
    for value in range(12):
        predictor.add_examples([TrainingExample(root, target=value / 20)])
    kept = sorted(example.target for example in predictor._replay.snapshot())
    assert kept == [value / 20 for value in range(7, 12)]


@pytest.mark.parametrize(
    ("target", "weight", "message"),
    [
        (float("nan"), 1.0, "target"),
        (0.5, float("nan"), "weight"),
        (float("inf"), 1.0, "target"),
        (1.5, 1.0, "target"),
        (-0.1, 1.0, "target"),
        (0.5, 0.0, "weight"),
        (0.5, -2.0, "weight"),
        (0.5, float("inf"), "weight"),
    ],
)
def test_bad_targets_and_weights_are_rejected(target: float, weight: float, message: str) -> None:
    root = SuccessPredictor(tiny_config()).featurizer.encode_prompt("p", "x")
    with pytest.raises(ValueError, match=message):
        TrainingExample(root, target=target, weight=weight)


def test_a_bad_example_rejects_the_whole_tree() -> None:
    predictor = SuccessPredictor(tiny_config(holdout_every=0))
    other = SuccessPredictor(tiny_config(num_buckets=2048))
    good = TrainingExample(predictor.featurizer.encode_prompt("p", "x"), target=1.0)
    foreign = TrainingExample(other.featurizer.encode_prompt("p", "x"), target=1.0)
    with pytest.raises(ValueError, match="num_buckets=2048"):
        predictor.add_examples([good, foreign])
    with pytest.raises(ValueError, match="TrainingExample"):
        predictor.add_examples([good, (good.history, 1.0)])  # type: ignore[list-item]
    assert predictor.examples_seen == 0
    assert predictor.train_round(1).steps == 0


def test_predict_rejects_foreign_histories_and_wrong_types() -> None:
    predictor = SuccessPredictor(tiny_config())
    other = SuccessPredictor(tiny_config(num_buckets=2048))
    with pytest.raises(ValueError, match="num_buckets"):
        predictor.predict([Query(other.featurizer.encode_prompt("p", "x"))])
    with pytest.raises(ValueError, match="Query"):
        predictor.predict([predictor.featurizer.encode_prompt("p", "x")])  # type: ignore[list-item]
    assert predictor.predict([]).shape == (0,)


@pytest.mark.parametrize(
    "arguments",
    [
        {"learning_rate": 0.0},
        {"learning_rate": float("nan")},
        {"batch_size": 0},
        {"holdout_every": -1},
        {"prior_successes": 0.0},
        {"weight_decay": -1.0},
        {"num_buckets": 1},
    ],
)
def test_bad_configuration_is_rejected(arguments: dict[str, float]) -> None:
    with pytest.raises(ValueError, match=next(iter(arguments))):
        PredictorConfig(**arguments)  # type: ignore[arg-type]


def test_predicting_while_training_sees_only_whole_versions(synthetic_task: SyntheticTask) -> None:
    predictor = SuccessPredictor(tiny_config(holdout_every=0))
    fill(predictor, synthetic_task, trees=60, seed=3)
    rng = np.random.default_rng(4)
    queries = [node.query for node in synthetic_task.tree(predictor.featurizer, rng, "probe")]
    seen: list[tuple[int, np.ndarray]] = []
    errors: list[BaseException] = []
    training_done = threading.Event()

    def train() -> None:
        try:
            for _ in range(6):
                predictor.train_round(max_steps=10)
        except BaseException as error:
            errors.append(error)
        finally:
            training_done.set()

    trainer = threading.Thread(target=train)
    trainer.start()
    while not training_done.is_set() or len(seen) < 3:
        seen.append(predictor.predict_versioned(queries))
    trainer.join()
    seen.append(predictor.predict_versioned(queries))

    assert not errors
    versions = [version for version, _ in seen]
    assert versions == sorted(versions)
    assert versions[-1] == 6
    by_version: dict[int, np.ndarray] = {}
    for version, (values, concentration) in seen:
        assert np.all((values >= 0) & (values <= 1)) and np.all(concentration > 0)
        # The same version always gives the same numbers: weights are never seen half-updated.
        np.testing.assert_array_equal(by_version.setdefault(version, values), values)


def test_constructing_a_predictor_leaves_the_global_torch_rng_alone() -> None:
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    SuccessPredictor(tiny_config())
    assert torch.equal(torch.rand(3), expected)


def test_same_seed_gives_the_same_model(synthetic_task: SyntheticTask) -> None:
    first, second = SuccessPredictor(tiny_config()), SuccessPredictor(tiny_config())
    for predictor in (first, second):
        fill(predictor, synthetic_task, trees=20, seed=7)
        predictor.train_round(max_steps=5)
    queries = [node.query for node in synthetic_task.tree(first.featurizer, np.random.default_rng(1), "q")]
    np.testing.assert_array_equal(first.predict(queries), second.predict(queries))
