"""The compact forms a predictor is stored in: eight-bit embedding tables and training data within a
byte budget."""

from __future__ import annotations

import json

import numpy as np
import torch
from hypothesis import given
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays
from predictor_synthetic import SyntheticTask, tiny_config

from trace_service.predictor import SuccessPredictor, TrainingExample
from trace_service.predictor.checkpoint import decode_checkpoint
from trace_service.predictor.quantize import dequantize_rows, quantize_rows

tables = arrays(
    np.float32,
    st.tuples(st.integers(1, 6), st.integers(1, 9)),
    elements=st.floats(-1e3, 1e3, width=32) | st.just(0.0) | st.floats(-(2.0**-100), 2.0**-100, width=32),
)


@given(tables)
def test_a_quantized_table_is_within_a_127th_of_its_row_maximum_and_stable(table: np.ndarray) -> None:
    weight = torch.from_numpy(table)
    values, exponents = quantize_rows(weight)
    restored = dequantize_rows(values, exponents)
    largest = weight.abs().amax(dim=1, keepdim=True)
    tiny = torch.ldexp(torch.ones(1), torch.tensor([-120.0]))  # the smallest scale kept
    assert torch.all((restored - weight).abs() <= torch.maximum(largest / 127, tiny))
    again_values, again_exponents = quantize_rows(restored)  # published weights travel unchanged
    assert torch.equal(again_values, values) and torch.equal(again_exponents, exponents)
    assert torch.equal(dequantize_rows(again_values, again_exponents), restored)


def test_a_checkpoint_stores_embedding_tables_in_a_quarter_of_their_bytes() -> None:
    predictor = SuccessPredictor()  # the default architecture
    tables = sum(p.numel() for name, p in predictor._trainer_model.named_parameters() if "bag" in name)
    assert len(predictor.to_bytes()) < 1.1 * tables  # one byte a weight (float32 would be four)


def test_training_data_set_down_stays_within_its_budget_and_keeps_the_newest(
    synthetic_task: SyntheticTask,
) -> None:
    budget = 20_000
    predictor = SuccessPredictor(tiny_config(training_data_bytes=budget, holdout_every=4))
    rng = np.random.default_rng(0)
    for index in range(60):
        predictor.add_examples(
            synthetic_task.examples(synthetic_task.tree(predictor.featurizer, rng, f"p{index}"))
        )
    header, state = decode_checkpoint(predictor.to_bytes(with_training_data=True))
    stored = sum(t.numel() * t.element_size() for n, t in state.items() if n.startswith("training_data."))
    stored += len(json.dumps(header["training_data"]))
    assert budget / 2 < stored <= 1.2 * budget  # past it by one small tree's history at most
    restored = SuccessPredictor.from_bytes(predictor.to_bytes(with_training_data=True), predictor.config)
    kept = restored._replay.oldest_first()
    assert 0 < len(kept) < len(predictor._replay)
    newest = predictor._replay.oldest_first()[-len(kept) :]
    assert [e.target for e in kept] == [e.target for e in newest]
    assert all(isinstance(e, TrainingExample) for e in kept)
