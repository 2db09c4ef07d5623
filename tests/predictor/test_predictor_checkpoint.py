"""Checkpoints: round trips, corruption detection, compatibility, publishing between replicas."""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from predictor_synthetic import SyntheticTask, tiny_config

from trace_service.predictor import (
    CheckpointError,
    OutcomeCounts,
    Query,
    RootGroup,
    SuccessPredictor,
    TrainingExample,
)
from trace_service.predictor.checkpoint import CHECKPOINT_FORMAT, MAGIC, decode_checkpoint, encode_checkpoint


def trained_predictor(task: SyntheticTask, rounds: int = 2) -> tuple[SuccessPredictor, list[Query]]:
    predictor = SuccessPredictor(tiny_config(holdout_every=0))
    rng = np.random.default_rng(0)
    for index in range(20):
        predictor.add_examples(task.examples(task.tree(predictor.featurizer, rng, f"p{index}")))
    for _ in range(rounds):
        predictor.train_round(max_steps=5)
    queries = [node.query for node in task.tree(predictor.featurizer, rng, "probe")]
    return predictor, queries


def test_bytes_round_trip_keeps_version_counts_and_predictions(synthetic_task: SyntheticTask) -> None:
    predictor, queries = trained_predictor(synthetic_task)
    restored = SuccessPredictor.from_bytes(predictor.to_bytes())
    assert restored.version == predictor.version == 2
    assert restored.examples_seen == predictor.examples_seen
    assert restored.config.architecture() == predictor.config.architecture()
    np.testing.assert_array_equal(restored.predict(queries), predictor.predict(queries))


def test_file_round_trip(tmp_path: Path, synthetic_task: SyntheticTask) -> None:
    predictor, queries = trained_predictor(synthetic_task)
    path = tmp_path / "predictor.ckpt"
    predictor.save(path)
    assert list(tmp_path.iterdir()) == [path]  # the temporary file was renamed into place
    restored = SuccessPredictor.load(path, tiny_config(holdout_every=0, learning_rate=0.5))
    assert restored.config.learning_rate == 0.5  # runtime settings come from the caller
    np.testing.assert_array_equal(restored.predict(queries), predictor.predict(queries))


def test_restored_predictor_keeps_training_with_increasing_versions(synthetic_task: SyntheticTask) -> None:
    predictor, _ = trained_predictor(synthetic_task)
    restored = SuccessPredictor.from_bytes(predictor.to_bytes(), tiny_config(holdout_every=0))
    rng = np.random.default_rng(5)
    restored.add_examples(synthetic_task.examples(synthetic_task.tree(restored.featurizer, rng, "new")))
    assert restored.train_round(max_steps=1).version == 3


def described(item: TrainingExample | RootGroup) -> tuple[object, ...]:
    """An example or group as plain values: its history's fields (arrays as lists) and the rest."""
    history = item.history if isinstance(item, TrainingExample) else item.root
    fields = [
        value.tolist() if isinstance(value, np.ndarray) else value
        for value in (getattr(history, name) for name in history.__slots__)
    ]
    fields[2] = [turn.tolist() for turn in history.turn_tokens]
    rest = (item.target, item.weight) if isinstance(item, TrainingExample) else (item.successes, item.trials)
    return (*fields, *rest, item.outcomes)


def test_a_checkpoint_with_training_data_gives_back_the_whole_predictor(
    synthetic_task: SyntheticTask,
) -> None:
    # Features on every history, a held-out share and groups: every part of the training data travels.
    predictor = SuccessPredictor(tiny_config(holdout_every=3, replay_capacity=50, feature_dim=2))
    rng = np.random.default_rng(0)
    for index in range(30):  # more than the replay buffer holds: its FIFO order must survive
        root = predictor.featurizer.encode_prompt(f"p{index}", f"prompt {index}", [0.5, float(index)])
        first = predictor.featurizer.extend(root, "a turn", [1.0, -1.0])
        leaf = predictor.featurizer.extend(first, "the answer")
        success = int(rng.integers(0, 2))
        outcomes = OutcomeCounts(float(index % 3), 4.0)
        predictor.add_examples(
            [TrainingExample(h, float(success), 1.0, outcomes) for h in (first, leaf)]
            + [TrainingExample(root, 0.5, 2.0, outcomes)],
            RootGroup(root, success, 2, outcomes),
        )
    predictor.train_round(max_steps=3)
    queries = [node.query for node in synthetic_task.tree(predictor.featurizer, rng, "probe")]

    restored = SuccessPredictor.from_bytes(
        predictor.to_bytes(with_training_data=True),
        tiny_config(holdout_every=3, replay_capacity=50, feature_dim=2),
    )
    assert restored.version == predictor.version
    np.testing.assert_array_equal(restored.predict(queries), predictor.predict(queries))
    assert restored.diagnostics() == predictor.diagnostics()
    for name in ("_replay", "_holdout", "_groups", "_holdout_groups"):
        before, after = getattr(predictor, name).oldest_first(), getattr(restored, name).oldest_first()
        assert len(after) == len(before) > 0
        assert [described(item) for item in after] == [described(item) for item in before]
    # Both go on: the restored one from its published weights with fresh optimiser moments (the set-down
    # state keeps neither the trained weights nor the moments), so the next round is close, not equal.
    more = synthetic_task.examples(synthetic_task.tree(predictor.featurizer, rng, "more"))
    for each in (predictor, restored):
        each.add_examples(more)
    assert restored.train_round(max_steps=2).steps == predictor.train_round(max_steps=2).steps > 0
    np.testing.assert_allclose(restored.predict(queries), predictor.predict(queries), atol=0.05)
    # The plain checkpoint (what replicas publish) holds no training data.
    assert len(SuccessPredictor.from_bytes(predictor.to_bytes())._replay) == 0


def test_malformed_training_data_is_a_checkpoint_error() -> None:
    predictor = SuccessPredictor(tiny_config())
    root = predictor.featurizer.encode_prompt("p", "text")
    predictor.add_examples([TrainingExample(root, 1.0, 1.0)])
    header, state = decode_checkpoint(predictor.to_bytes(with_training_data=True))
    for damage in ({"replay": [[7, 1.0, 1.0, 0.0, 0.0]]}, {"replay": [[-1, 1.0, 1.0, 0.0, 0.0]]}):
        damaged = {**header, "training_data": {**header["training_data"], **damage}}
        with pytest.raises(CheckpointError, match="training data"):  # a history that does not exist
            SuccessPredictor.from_bytes(encode_checkpoint(damaged, state))
    values = state["training_data.token_values"].clone()
    values[0] = tiny_config().num_buckets  # no bucket
    with pytest.raises(CheckpointError, match="token ids outside"):
        SuccessPredictor.from_bytes(
            encode_checkpoint(header, {**state, "training_data.token_values": values})
        )
    with pytest.raises(CheckpointError, match="token values are int64"):  # not the narrow type
        SuccessPredictor.from_bytes(
            encode_checkpoint(header, {**state, "training_data.token_values": values.long()})
        )


def test_untrained_checkpoint_restores_the_cold_start() -> None:
    predictor = SuccessPredictor(tiny_config())
    restored = SuccessPredictor.from_bytes(predictor.to_bytes())
    assert restored.version == 0
    root = restored.featurizer.encode_prompt("p", "text")
    assert restored.predict([Query(root)]).tolist() == [0.5]


@pytest.mark.parametrize("where", ["magic", "format", "length", "digest", "header", "payload", "end"])
def test_any_damage_is_detected_and_the_previous_weights_stay(
    where: str, synthetic_task: SyntheticTask
) -> None:
    source, queries = trained_predictor(synthetic_task, rounds=3)
    replica, _ = trained_predictor(synthetic_task, rounds=1)
    before = replica.predict(queries)
    data = bytearray(source.to_bytes())
    offsets = {"magic": 0, "format": 8, "length": 10, "digest": 14, "header": 50, "payload": len(data) // 2}
    if where == "end":
        data = data[:-1]
    else:
        data[offsets[where]] ^= 0x5A
    with pytest.raises(CheckpointError):
        replica.update_from_bytes(bytes(data))
    with pytest.raises(CheckpointError):
        SuccessPredictor.from_bytes(bytes(data))
    assert replica.version == 1
    np.testing.assert_array_equal(replica.predict(queries), before)


def test_truncated_and_foreign_blobs_are_rejected_with_clear_messages() -> None:
    with pytest.raises(CheckpointError, match="truncated"):
        decode_checkpoint(b"TRACE")
    with pytest.raises(CheckpointError, match="magic"):
        decode_checkpoint(b"\x00" * 100)


def test_digest_valid_but_unreadable_payload_is_a_checkpoint_error() -> None:
    header = json.dumps({"predictor_version": 1}).encode()
    payload = b"not a torch file"
    digest = hashlib.sha256(header + payload).digest()
    preamble = struct.pack("<8sHI32s", MAGIC, CHECKPOINT_FORMAT, len(header), digest)
    with pytest.raises(CheckpointError, match="unreadable"):
        decode_checkpoint(preamble + header + payload)


def test_checkpoint_of_another_architecture_is_rejected(synthetic_task: SyntheticTask) -> None:
    predictor, _ = trained_predictor(synthetic_task)
    with pytest.raises(CheckpointError, match="architecture"):
        SuccessPredictor.from_bytes(predictor.to_bytes(), tiny_config(embed_dim=4))
    other = SuccessPredictor(tiny_config(hidden_dim=32))
    with pytest.raises(CheckpointError, match="architecture"):
        other.update_from_bytes(predictor.to_bytes())
    assert other.version == 0


def test_checkpoint_of_another_token_hashing_is_rejected() -> None:
    predictor = SuccessPredictor(tiny_config())
    header, state = decode_checkpoint(predictor.to_bytes())
    header["predictor_version"] = 4
    header["token_hashing"] = "an-older-scheme"  # same shapes, but every bucket would mean other words
    with pytest.raises(CheckpointError, match="token hashing"):
        predictor.update_from_bytes(encode_checkpoint(header, state))
    assert predictor.version == 0


def test_weights_that_do_not_fit_are_rejected() -> None:
    predictor = SuccessPredictor(tiny_config())
    header, state = decode_checkpoint(predictor.to_bytes())
    header["predictor_version"] = 4
    state["head.weight"] = torch.zeros(3, 3)
    with pytest.raises(CheckpointError, match="do not fit"):
        predictor.update_from_bytes(encode_checkpoint(header, state))
    assert predictor.version == 0


def test_replica_adopts_only_newer_versions(synthetic_task: SyntheticTask) -> None:
    leader, queries = trained_predictor(synthetic_task, rounds=2)
    replica = SuccessPredictor(tiny_config(holdout_every=0))
    assert replica.update_from_bytes(leader.to_bytes())
    assert replica.version == 2
    np.testing.assert_array_equal(replica.predict(queries), leader.predict(queries))
    assert not replica.update_from_bytes(leader.to_bytes())  # same version: nothing to do
    older = SuccessPredictor.from_bytes(leader.to_bytes())
    tree = synthetic_task.tree(leader.featurizer, np.random.default_rng(9), "x")
    leader.add_examples(synthetic_task.examples(tree))
    leader.train_round(max_steps=1)
    assert replica.update_from_bytes(leader.to_bytes())
    assert replica.version == 3
    assert not replica.update_from_bytes(older.to_bytes())
    assert replica.version == 3


def test_continuation_freshness_travels_with_the_weights(synthetic_task: SyntheticTask) -> None:
    predictor, _ = trained_predictor(synthetic_task)
    assert predictor.freshness == 0.5  # the prior, before any continuation was seen
    for _ in range(50):
        predictor.observe_continuations(flips=2, fresh_flips=10.0)
    assert predictor.freshness == pytest.approx(0.2, abs=0.02)
    restored = SuccessPredictor.from_bytes(predictor.to_bytes())
    assert restored.freshness == predictor.freshness
    follower = SuccessPredictor(tiny_config(holdout_every=0))
    assert follower.update_from_bytes(predictor.to_bytes())
    assert follower.freshness == predictor.freshness


def test_checkpoint_with_malformed_continuation_counts_is_refused(synthetic_task: SyntheticTask) -> None:
    predictor, _ = trained_predictor(synthetic_task)
    header, state = decode_checkpoint(predictor.to_bytes())
    for bad in ([1.0], [-1.0, 2.0], ["x", 1.0], [float("nan"), 1.0], None):
        with pytest.raises(CheckpointError, match="continuation counts"):
            SuccessPredictor.from_bytes(encode_checkpoint({**header, "freshness": bad}, state))
