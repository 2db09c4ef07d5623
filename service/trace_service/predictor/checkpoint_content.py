"""What a predictor's checkpoint holds beside the model's weights: its header (:class:`PredictorHeader`)
and, in a predictor set down whole, the state its trainer goes on from (the trained weights, the
optimiser's moments, the random streams).  The format is ``checkpoint``'s; the training data
``archive``'s."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from trace_service.allocation.tree import FreshnessEstimate
from trace_service.predictor.calibration import Calibration
from trace_service.predictor.checkpoint import CheckpointError
from trace_service.predictor.examples import RunningMoments
from trace_service.predictor.features import TOKEN_HASHING


@dataclass(frozen=True, slots=True)
class PredictorHeader:
    """A checkpoint's header: the version of its weights, the training examples seen, the running
    moments of the dense features, the continuation counts (flips and fresh flips) and the calibration."""

    version: int
    examples_seen: int
    moments: RunningMoments
    freshness: FreshnessEstimate
    calibration: Calibration

    def to_json(self, architecture: dict[str, Any]) -> dict[str, Any]:
        """The header of a checkpoint of a predictor of ``architecture``."""
        return {
            "predictor_version": self.version,
            "examples_seen": self.examples_seen,
            "architecture": architecture,
            "token_hashing": TOKEN_HASHING,
            "moments": self.moments.to_json(),
            "freshness": [self.freshness.flips, self.freshness.fresh_flips],
            "calibration": self.calibration.to_json(),
        }

    @classmethod
    def from_json(
        cls, header: dict[str, Any], architecture: dict[str, Any], dense_width: int
    ) -> PredictorHeader:
        """The header of a checkpoint for a predictor of ``architecture`` (and ``dense_width`` dense
        features); :class:`CheckpointError` when it is another model's or malformed."""
        if header.get("token_hashing") != TOKEN_HASHING:
            raise CheckpointError(
                f"checkpoint token hashing {header.get('token_hashing')!r} is not this featurizer's "
                f"{TOKEN_HASHING!r}: its embeddings would read other words"
            )
        if header.get("architecture") != architecture:
            raise CheckpointError(
                f"checkpoint architecture {header.get('architecture')} does not match this predictor's "
                f"{architecture}"
            )
        version, seen = header.get("predictor_version"), header.get("examples_seen")
        if not (isinstance(version, int) and version >= 0 and isinstance(seen, int) and seen >= 0):
            raise CheckpointError(f"checkpoint has a malformed version {version!r} or count {seen!r}")
        return cls(
            version,
            seen,
            RunningMoments.from_json(header.get("moments"), dense_width),
            _freshness_from_json(header.get("freshness")),
            Calibration.from_json(header.get("calibration")),
        )


def _freshness_from_json(value: Any) -> FreshnessEstimate:
    """A checkpoint's continuation counts: flips and fresh flips."""
    if not (
        isinstance(value, list)
        and len(value) == 2
        and all(isinstance(x, int | float) and math.isfinite(x) and x >= 0 for x in value)
    ):
        raise CheckpointError(f"checkpoint has malformed continuation counts {value!r}")
    return FreshnessEstimate(float(value[0]), float(value[1]))


#: The prefix of the trainer's tensors among a checkpoint's model weights.
TRAINER_PREFIX = "trainer."
_MODEL = f"{TRAINER_PREFIX}model."
_OPTIMIZER = f"{TRAINER_PREFIX}optimizer."
_DROPOUT = f"{TRAINER_PREFIX}dropout"


def pack_trainer_state(
    model: nn.Module, optimizer: torch.optim.Optimizer, dropout: torch.Generator, rng: np.random.Generator
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The header and the tensors (names under :data:`TRAINER_PREFIX`) that hold the trainer's state."""
    state = optimizer.state_dict()
    tensors = {f"{_MODEL}{name}": value for name, value in model.state_dict().items()}
    for index, moments in state["state"].items():
        tensors |= {f"{_OPTIMIZER}{index}.{name}": value for name, value in moments.items()}
    tensors[_DROPOUT] = dropout.get_state()
    header = {"param_groups": state["param_groups"], "rng": rng.bit_generator.state}
    return header, tensors


def restore_trainer_state(
    header: Any,
    tensors: dict[str, torch.Tensor],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    dropout: torch.Generator,
    rng: np.random.Generator,
) -> None:
    """Load what :func:`pack_trainer_state` wrote into the trainer's model, its (new) optimiser and its
    random streams; a malformed state raises :class:`CheckpointError`."""
    try:
        weights = {
            name.removeprefix(_MODEL): value for name, value in tensors.items() if name.startswith(_MODEL)
        }
        moments: dict[int, dict[str, torch.Tensor]] = {}
        for name, value in tensors.items():
            if name.startswith(_OPTIMIZER):
                index, moment = name.removeprefix(_OPTIMIZER).split(".", 1)
                moments.setdefault(int(index), {})[moment] = value
        model.load_state_dict(weights)
        optimizer.load_state_dict({"state": moments, "param_groups": header["param_groups"]})
        dropout.set_state(tensors[_DROPOUT])
        rng.bit_generator.state = header["rng"]
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint has a malformed trainer state: {error!r}") from None
