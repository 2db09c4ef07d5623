"""What the predictor learns from: training examples (a node's history, target and weight), the bare
groups its calibration is fitted to, the FIFO buffers that hold them and the running moments that
standardise dense features."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np
import numpy.typing as npt

from trace_service.predictor.checkpoint import CheckpointError
from trace_service.predictor.features import EncodedHistory, OutcomeCounts
from trace_service.predictor.model import Query

Item = TypeVar("Item")


@dataclass(frozen=True, slots=True)
class TrainingExample:
    """One tree node: its history, target V̂ in [0, 1] and weight n (visits, > 0).

    ``outcomes`` must be the prompt's counts from before the tree's step (see :class:`OutcomeCounts`).
    NaN, infinite or out-of-range targets and weights are rejected here, so they never reach training.
    """

    history: EncodedHistory
    target: float
    weight: float = 1.0
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)

    def __post_init__(self) -> None:
        if not isinstance(self.history, EncodedHistory):
            raise ValueError(f"history must be an EncodedHistory, got {type(self.history).__name__}")
        if not (math.isfinite(self.target) and 0.0 <= self.target <= 1.0):
            raise ValueError(f"target must be a finite number in [0, 1], got {self.target}")
        if not (math.isfinite(self.weight) and self.weight > 0.0):
            raise ValueError(f"weight must be a positive finite number, got {self.weight}")

    @property
    def query(self) -> Query:
        return Query(self.history, self.outcomes)


@dataclass(frozen=True, slots=True)
class RootGroup:
    """The bare rollouts of ONE finished tree: its root, their successes and count, and the prompt's
    outcomes from before the tree's step. Groups are what the concentration κ is fitted to."""

    root: EncodedHistory
    successes: int
    trials: int
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)

    def __post_init__(self) -> None:
        if self.root.depth != 0:
            raise ValueError(
                f"a group's root must be a prompt encoding (depth 0), got depth {self.root.depth}"
            )
        if not 0 <= self.successes <= self.trials:
            raise ValueError(f"need 0 <= successes <= trials, got {self.successes}/{self.trials}")


#: Python's own bytes per training example beside its arrays (the example, its history, their fields).
_OBJECT_BYTES = 400


def training_data_bytes(histories: Sequence[EncodedHistory]) -> int:
    """An estimate of the memory the histories of a predictor's training data hold: each distinct token
    and feature array once (histories share their ancestors'), and the objects around them."""
    seen: set[int] = set()
    total = _OBJECT_BYTES * len(histories)
    for history in histories:
        for array in (
            history.prompt_tokens,
            *history.turn_tokens,
            history.prompt_features,
            history.latest_features,
        ):
            if array is not None and id(array) not in seen:
                seen.add(id(array))
                total += array.nbytes
    return total


class FifoBuffer(Generic[Item]):
    """The most recent ``capacity`` items; the oldest is overwritten first."""

    def __init__(self, capacity: int) -> None:
        self._capacity = capacity
        self._items: list[Item] = []
        self._next = 0

    def extend(self, items: Sequence[Item]) -> None:
        for item in items:
            if len(self._items) < self._capacity:
                self._items.append(item)
            else:
                self._items[self._next] = item
                self._next = (self._next + 1) % self._capacity

    def snapshot(self) -> list[Item]:
        return list(self._items)

    def oldest_first(self) -> list[Item]:
        """The items in the order they came."""
        return self._items[self._next :] + self._items[: self._next]

    def restore(self, items: Sequence[Item]) -> None:
        """Hold ``items`` (oldest first, as :meth:`oldest_first` gave them): the newest that fit."""
        self._items, self._next = [], 0
        self.extend(items[-self._capacity :])

    def __len__(self) -> int:
        return len(self._items)


class RunningMoments:
    """Per-column mean and variance of every dense row seen (Chan et al.'s parallel update)."""

    def __init__(self, width: int) -> None:
        self.count = 0
        self.mean = np.zeros(width)
        self.m2 = np.zeros(width)

    def update(self, rows: npt.NDArray[np.float32]) -> None:
        if len(rows) == 0:
            return
        batch = rows.astype(np.float64)
        batch_mean = batch.mean(axis=0)
        batch_m2 = ((batch - batch_mean) ** 2).sum(axis=0)
        total = self.count + len(batch)
        delta = batch_mean - self.mean
        self.mean = self.mean + delta * len(batch) / total
        self.m2 = self.m2 + batch_m2 + delta**2 * self.count * len(batch) / total
        self.count = total

    def std(self) -> npt.NDArray[np.float64]:
        return np.sqrt(self.m2 / self.count) if self.count else np.ones_like(self.m2)

    def to_json(self) -> dict[str, Any]:
        return {"count": self.count, "mean": self.mean.tolist(), "m2": self.m2.tolist()}

    @classmethod
    def from_json(cls, value: Any, width: int) -> RunningMoments:
        moments = cls(width)
        try:
            moments.count = int(value["count"])
            moments.mean = np.asarray(value["mean"], dtype=np.float64).reshape(width)
            moments.m2 = np.asarray(value["m2"], dtype=np.float64).reshape(width)
        except (KeyError, TypeError, ValueError) as error:
            raise CheckpointError(f"checkpoint has malformed standardisation moments: {error}") from None
        return moments
