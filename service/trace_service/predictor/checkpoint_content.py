"""What a predictor's checkpoint holds beside the model's weights: its header (:class:`PredictorHeader`),
the compact form of its embedding tables, and, in a predictor set down whole, its trainer's random
streams.  The format is ``checkpoint``'s; the training data ``archive``'s."""

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
from trace_service.predictor.quantize import dequantize_rows, quantize_rows


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


#: The prefix of the trainer's tensors among a checkpoint's tensors.
TRAINER_PREFIX = "trainer."
_DROPOUT = f"{TRAINER_PREFIX}dropout"
#: The suffix of an embedding table's row exponents (its int8 values keep the table's name).
_EXPONENTS = ".exponents"


def compact_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """A model's weights as a checkpoint holds them: every embedding table (a name ending in
    ``bag.weight``) in eight bits with its row exponents (``quantize``), the rest as they are."""
    compact: dict[str, torch.Tensor] = {}
    for name, value in state.items():
        if name.endswith("bag.weight"):
            compact[name], compact[name + _EXPONENTS] = quantize_rows(value)
        else:
            compact[name] = value
    return compact


def expand_weights(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Inverse of :func:`compact_weights` (other tensors of the checkpoint pass through)."""
    try:
        return {
            name: dequantize_rows(value, state[name + _EXPONENTS]) if name.endswith("bag.weight") else value
            for name, value in state.items()
            if not name.endswith(_EXPONENTS)
        }
    except (KeyError, ValueError) as error:
        raise CheckpointError(f"checkpoint has a malformed embedding table: {error!r}") from None


def round_to_checkpoint(model: nn.Module) -> None:
    """Give ``model``'s embedding tables the precision a checkpoint keeps, in place: what is served
    from it is then what every replica that loads its checkpoint serves."""
    with torch.no_grad():
        for name, value in model.state_dict().items():
            if name.endswith("bag.weight"):
                value.copy_(dequantize_rows(*quantize_rows(value)).to(value.device))


def pack_random_streams(
    dropout: torch.Generator, rng: np.random.Generator
) -> tuple[dict[str, Any], dict[str, torch.Tensor]]:
    """The header and the tensor (named under :data:`TRAINER_PREFIX`) that hold the trainer's random
    streams: a predictor set down goes on drawing its minibatches and dropout masks where it stopped.
    Its trained weights and optimiser moments are not kept (``SuccessPredictor.to_bytes``)."""
    return {"rng": rng.bit_generator.state}, {_DROPOUT: dropout.get_state()}


def restore_random_streams(
    header: Any, tensors: dict[str, torch.Tensor], dropout: torch.Generator, rng: np.random.Generator
) -> None:
    """Load what :func:`pack_random_streams` wrote; a malformed state raises :class:`CheckpointError`."""
    try:
        dropout.set_state(tensors[_DROPOUT])
        rng.bit_generator.state = header["rng"]
    except (KeyError, TypeError, ValueError, RuntimeError) as error:
        raise CheckpointError(f"checkpoint has malformed random streams: {error!r}") from None
