"""The predictor's training data as checkpoint content, so that a job's predictor written to the store
and read back (evicted from a replica's memory, reloaded on its next request) goes on learning from
what it learned from: the newest of its replay and held-out examples and its calibration groups, in
their FIFO order, within a budget of bytes (``PredictorConfig.training_data_bytes``).

Histories share their token arrays (a node's encoding extends its parent's), so each array and each
history is written once and referred to by index: a header of JSON rows (:func:`pack_training_data`)
beside four flat tensors, token ids (in the narrowest integer type that holds them) and feature values
with their offsets.  Nothing is unpickled on
the way back (the checkpoint loads tensors with ``weights_only``).
"""

from __future__ import annotations

import json
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
    """Everything the predictor learns from, each buffer oldest first, and the counters that pace it."""

    replay: list[TrainingExample]
    holdout: list[TrainingExample]
    groups: list[RootGroup]
    holdout_groups: list[RootGroup]
    trees_added: int
    sample_allowance: float


def token_dtype(num_buckets: int) -> type[np.generic]:
    """The narrowest integer type that holds every token id of ``num_buckets`` buckets."""
    return np.uint16 if num_buckets <= 1 << 16 else np.int32


class _Arrays:
    """Arrays written once each (by identity), concatenated with their offsets; ``size`` counts the
    bytes they take."""

    def __init__(self, dtype: type[np.generic]) -> None:
        self.dtype = dtype
        self.size = 0
        self._index: dict[int, int] = {}
        self._parts: list[npt.NDArray[Any]] = []

    def add(self, array: npt.NDArray[Any] | None) -> int:
        if array is None:
            return -1
        key = id(array)
        if key not in self._index:
            self._index[key] = len(self._parts)
            self._parts.append(array)
            self.size += array.size * np.dtype(self.dtype).itemsize + 8  # and its offset
        return self._index[key]

    def tensors(self) -> tuple[torch.Tensor, torch.Tensor]:
        sizes = [part.size for part in self._parts]
        offsets = np.concatenate([[0], np.cumsum(sizes, dtype=np.int64)]).astype(np.int64)
        values = np.concatenate(self._parts).astype(self.dtype) if self._parts else np.zeros(0, self.dtype)
        return torch.from_numpy(values), torch.from_numpy(offsets)


class _Packer:
    """The header rows and arrays of the training data, with the bytes they take so far."""

    def __init__(self, num_buckets: int) -> None:
        self.tokens, self.features = _Arrays(token_dtype(num_buckets)), _Arrays(np.float32)
        self.rows: list[list[Any]] = []
        self.row_bytes = 0
        self._histories: dict[int, int] = {}

    @property
    def size(self) -> int:
        return self.tokens.size + self.features.size + self.row_bytes

    def history(self, encoded: EncodedHistory) -> int:
        key = id(encoded)
        if key not in self._histories:
            self._histories[key] = len(self.rows)
            self.row(
                [
                    encoded.prompt_id,
                    self.tokens.add(encoded.prompt_tokens),
                    [self.tokens.add(turn) for turn in encoded.turn_tokens],
                    encoded.prompt_token_count,
                    list(encoded.turn_token_counts),
                    self.features.add(encoded.prompt_features),
                    self.features.add(encoded.latest_features),
                    encoded.turn_token_total,
                ],
                self.rows,
            )
        return self._histories[key]

    def row(self, row: list[Any], rows: list[list[Any]]) -> None:
        rows.append(row)
        self.row_bytes += len(json.dumps(row)) + 2


def pack_training_data(
    data: TrainingData, num_buckets: int, budget: int
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The header rows and tensors (names under :data:`TENSOR_PREFIX`) that hold ``data``, newest first
    within about ``budget`` bytes: the held-out groups may fill an eighth of it, with the groups a
    quarter, with the held-out examples three eighths, and the replay the rest (each buffer stops
    before the item that starts past its share, so the whole passes ``budget`` by one history at
    most).  What does not fit is the oldest, which the FIFO buffers would drop first anyway."""
    packer = _Packer(num_buckets)

    def newest(items: list[Any], share: float, row: Any) -> list[list[Any]]:
        rows: list[list[Any]] = []
        for item in reversed(items):
            if packer.size >= share * budget:
                break
            packer.row(row(item), rows)
        return rows[::-1]

    def example(e: TrainingExample) -> list[Any]:
        return [packer.history(e.history), e.target, e.weight, e.outcomes.successes, e.outcomes.trials]

    def group(g: RootGroup) -> list[Any]:
        return [packer.history(g.root), g.successes, g.trials, g.outcomes.successes, g.outcomes.trials]

    header: dict[str, Any] = {
        "holdout_groups": newest(data.holdout_groups, 1 / 8, group),
        "groups": newest(data.groups, 2 / 8, group),
        "holdout": newest(data.holdout, 3 / 8, example),
        "replay": newest(data.replay, 1, example),
        "trees_added": data.trees_added,
        "sample_allowance": data.sample_allowance,
        "histories": packer.rows,
    }
    token_values, token_offsets = packer.tokens.tensors()
    feature_values, feature_offsets = packer.features.tensors()
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
        tokens = _slices(tensors, "token", token_dtype(num_buckets), np.int64)
        if any(ids.size and (ids.min() < 0 or ids.max() >= num_buckets) for ids in tokens):
            raise ValueError(f"token ids outside [0, {num_buckets})")
        features = _slices(tensors, "feature", np.float32, np.float32)

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
            trees_added=int(header["trees_added"]),
            sample_allowance=float(header["sample_allowance"]),
        )
    except (KeyError, TypeError, ValueError, IndexError) as error:
        raise CheckpointError(f"checkpoint has malformed training data: {error!r}") from None


def _slices(
    tensors: dict[str, torch.Tensor], kind: str, stored: type[np.generic], loaded: type[np.generic]
) -> list[npt.NDArray[Any]]:
    """The read-only arrays of one kind (written as ``stored``, given back as ``loaded``): views of its
    concatenated values between its offsets."""
    values = tensors[f"{TENSOR_PREFIX}{kind}_values"].numpy()
    if values.dtype != stored:
        raise ValueError(f"{kind} values are {values.dtype}, not {np.dtype(stored)}")
    values = values.astype(loaded)
    offsets = tensors[f"{TENSOR_PREFIX}{kind}_offsets"].numpy()
    if offsets.ndim != 1 or offsets.size == 0 or offsets[0] != 0 or offsets[-1] != values.size:
        raise ValueError(f"{kind} offsets do not cover their values")
    if np.any(np.diff(offsets) < 0):
        raise ValueError(f"{kind} offsets decrease")
    values.flags.writeable = False
    return [values[start:end] for start, end in zip(offsets[:-1].tolist(), offsets[1:].tolist(), strict=True)]
