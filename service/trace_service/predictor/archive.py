"""The predictor's training data as checkpoint content, so that a job's predictor written to the store
and read back (evicted from a replica's memory, reloaded on its next request) has lost nothing: its
replay and held-out examples, its calibration groups, in their FIFO order.

Histories share their token arrays (a node's encoding extends its parent's), so each array and each
history is written once and referred to by index: a header of JSON rows (:func:`pack_training_data`)
beside four flat tensors, token ids and feature values with their offsets.  Nothing is unpickled on
the way back (the checkpoint loads tensors with ``weights_only``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from trace_service.predictor.checkpoint import CheckpointError
from trace_service.predictor.examples import RootGroup, TrainingExample
from trace_service.predictor.features import EncodedHistory, OutcomeCounts

#: The prefix of the training data's tensors among a checkpoint's model weights.
TENSOR_PREFIX = "training_data."


@dataclass(frozen=True)
class TrainingData:
    """Everything the predictor learns from, each buffer as it is laid out (``FifoBuffer.layout``:
    training samples by position), and the counters that pace it."""

    replay: list[TrainingExample]
    holdout: list[TrainingExample]
    groups: list[RootGroup]
    holdout_groups: list[RootGroup]
    next_slots: tuple[int, int, int, int]  # each buffer's next slot to overwrite, in that order
    trees_added: int
    sample_allowance: float


class _Arrays:
    """Arrays written once each (by identity), concatenated with their offsets."""

    def __init__(self, dtype: type[np.generic]) -> None:
        self.dtype = dtype
        self._index: dict[int, int] = {}
        self._parts: list[npt.NDArray[Any]] = []

    def add(self, array: npt.NDArray[Any] | None) -> int:
        if array is None:
            return -1
        key = id(array)
        if key not in self._index:
            self._index[key] = len(self._parts)
            self._parts.append(array)
        return self._index[key]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = [part.size for part in self._parts]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        values = np.concatenate(self._parts).astype(self.dtype) if self._parts else np.zeros(0, self.dtype)
        return torch.from_numpy(values), torch.from_numpy(offsets)


def pack_training_data(data: TrainingData) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The header rows and tensors (names under :data:`TENSOR_PREFIX`) that hold ``data``."""
    tokens, features = _Arrays(np.int64), _Arrays(np.float32)
    histories: dict[int, int] = {}
    rows: list[list[Any]] = []

    def history(encoded: EncodedHistory) -> int:
        key = id(encoded)
        if key not in histories:
            histories[key] = len(rows)
            rows.append(
                [
                    encoded.prompt_id,
                    tokens.add(encoded.prompt_tokens),
                    [tokens.add(turn) for turn in encoded.turn_tokens],
                    encoded.prompt_token_count,
                    list(encoded.turn_token_counts),
                    features.add(encoded.prompt_features),
                    features.add(encoded.latest_features),
                    encoded.turn_token_total,
                ]
            )
        return histories[key]

    def examples(items: list[TrainingExample]) -> list[list[Any]]:
        return [
            [history(e.history), e.target, e.weight, e.outcomes.successes, e.outcomes.trials] for e in items
        ]

    def groups(items: list[RootGroup]) -> list[list[Any]]:
        return [
            [history(g.root), g.successes, g.trials, g.outcomes.successes, g.outcomes.trials] for g in items
        ]

    header = {
        "replay": examples(data.replay),
        "holdout": examples(data.holdout),
        "groups": groups(data.groups),
        "holdout_groups": groups(data.holdout_groups),
        "next_slots": list(data.next_slots),
        "trees_added": data.trees_added,
        "sample_allowance": data.sample_allowance,
    }
    header["histories"] = rows  # after the buffers: they fill it
    token_values, token_offsets = tokens.tensors()
    feature_values, feature_offsets = features.tensors()
    tensors = {
        f"{TENSOR_PREFIX}token_values": token_values,
        f"{TENSOR_PREFIX}token_offsets": token_offsets,
        f"{TENSOR_PREFIX}feature_values": feature_values,
        f"{TENSOR_PREFIX}feature_offsets": feature_offsets,
    }
    return header, tensors


def unpack_training_data(
    header: Any, tensors: dict[str, torch.Tensor], *, num_buckets: int, feature_dim: int
) -> TrainingData:
    """Inverse of :func:`pack_training_data` for a predictor of this bucket count and feature size;
    raises :class:`CheckpointError` on anything malformed."""
    try:
        tokens = _slices(tensors, "token", np.int64)
        if any(ids.size and (ids.min() < 0 or ids.max() >= num_buckets) for ids in tokens):
            raise ValueError(f"token ids outside [0, {num_buckets})")
        features = _slices(tensors, "feature", np.float32)

        def array(slices: list[npt.NDArray[Any]], index: Any) -> npt.NDArray[Any] | None:
            if index == -1:
                return None
            if not (isinstance(index, int) and 0 <= index < len(slices)):
                raise ValueError(f"array index {index} out of range")
            return slices[index]

        histories = []
        for prompt_id, prompt, turns, prompt_count, turn_counts, prompt_features, latest, total in header[
            "histories"
        ]:
            prompt_tokens = array(tokens, prompt)
            if prompt_tokens is None or not isinstance(prompt_id, str):
                raise ValueError("a history without its prompt")
            turn_tokens = tuple(array(tokens, turn) for turn in turns)
            if any(turn is None for turn in turn_tokens) or len(turn_counts) != len(turn_tokens):
                raise ValueError("a history's turns do not match their counts")
            histories.append(
                EncodedHistory(
                    prompt_id,
                    prompt_tokens,
                    turn_tokens,  # type: ignore[arg-type]
                    int(prompt_count),
                    tuple(int(count) for count in turn_counts),
                    array(features, prompt_features),
                    array(features, latest),
                    num_buckets,
                    feature_dim,
                    int(total),
                )
            )

        def history(index: Any) -> EncodedHistory:
            if not (isinstance(index, int) and 0 <= index < len(histories)):
                raise ValueError(f"history index {index!r} out of range")
            return histories[index]

        def examples(rows: list[list[Any]]) -> list[TrainingExample]:
            return [
                TrainingExample(history(h), float(target), float(weight), OutcomeCounts(float(s), float(n)))
                for h, target, weight, s, n in rows
            ]

        def groups(rows: list[list[Any]]) -> list[RootGroup]:
            return [
                RootGroup(history(h), int(successes), int(trials), OutcomeCounts(float(s), float(n)))
                for h, successes, trials, s, n in rows
            ]

        return TrainingData(
            replay=examples(header["replay"]),
            holdout=examples(header["holdout"]),
            groups=groups(header["groups"]),
            holdout_groups=groups(header["holdout_groups"]),
            next_slots=_next_slots(header["next_slots"]),
            trees_added=int(header["trees_added"]),
            sample_allowance=float(header["sample_allowance"]),
        )
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise CheckpointError(f"checkpoint has malformed training data: {error!r}") from None


def _slices(tensors: dict[str, torch.Tensor], kind: str, dtype: type[np.generic]) -> list[npt.NDArray[Any]]:
    """The read-only arrays of one kind: views of its concatenated values between its offsets."""
    values = tensors[f"{TENSOR_PREFIX}{kind}_values"].numpy().astype(dtype, copy=False)
    offsets = tensors[f"{TENSOR_PREFIX}{kind}_offsets"].numpy()
    if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != values.size:
        raise ValueError(f"{kind} offsets do not cover their values")
    if np.any(np.diff(offsets) < 0):
        raise ValueError(f"{kind} offsets decrease")
    values.flags.writeable = False
    return [values[start:end] for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]


def _next_slots(value: Any) -> tuple[int, int, int, int]:
    slots = tuple(int(slot) for slot in value)
    if len(slots) != 4 or min(slots) < 0:
        raise ValueError(f"next slots {value!r} are not four counts")
    return slots
