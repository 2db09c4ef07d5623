"""The predictor's settings: the fields that define its model (stored in every checkpoint) and the
runtime ones."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

from trace_service.predictor.features import FeaturizerConfig


@dataclass(frozen=True, slots=True)
class PredictorConfig:
    """Settings of a :class:`SuccessPredictor`.

    The fields up to ``prior_failures`` define the model's shape and meaning and are stored in every
    checkpoint (a checkpoint only loads into a predictor with the same values); the rest are runtime
    settings.
    """

    # Featurisation (see ``features``): hash buckets per bag, client vector size (0: none), truncation.
    num_buckets: int = 1 << 16
    feature_dim: int = 0
    max_tokens_per_text: int = 512
    max_chars_per_text: int = 32_768
    # Network: embedding width per bag, MLP width, most recent earlier-turn tokens kept per history.
    embed_dim: int = 32
    hidden_dim: int = 64
    max_history_tokens: int = 2048
    # Beta prior of a prompt's success rate: the cold-start prediction is its posterior mean.
    prior_successes: float = 1.0
    prior_failures: float = 1.0

    # "auto": CUDA when available, else CPU; or any torch device string.
    device: str = "auto"
    learning_rate: float = 3e-3
    weight_decay: float = 1e-5
    dropout: float = 0.2
    # Decay of the exponential moving average of weights that is published (0: publish raw weights).
    weight_averaging: float = 0.99
    batch_size: int = 256
    replay_capacity: int = 65_536
    # Bytes of training data a predictor set down keeps, newest first (``archive``): with the weights,
    # about 10 MB per job in the store.
    training_data_bytes: int = 3 << 20
    # Minibatch samples allowed per training example added (bounds training on a stale buffer).
    replay_ratio: float = 8.0
    # Every k-th completed tree is held out of training for diagnostics (0: none).
    holdout_every: int = 10
    holdout_capacity: int = 8_192
    inference_batch_size: int = 4_096
    calibration_bins: int = 10
    seed: int = 0

    def __post_init__(self) -> None:
        self.featurizer_config()  # validates the featurizer's fields
        positive_counts = (
            "embed_dim",
            "hidden_dim",
            "max_history_tokens",
            "batch_size",
            "replay_capacity",
            "training_data_bytes",
            "holdout_capacity",
            "inference_batch_size",
            "calibration_bins",
        )
        for name in positive_counts:
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)}")
        if self.holdout_every < 0:
            raise ValueError(f"holdout_every must be >= 0 (0 disables the holdout), got {self.holdout_every}")
        for name in ("prior_successes", "prior_failures", "learning_rate", "replay_ratio"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value > 0):
                raise ValueError(f"{name} must be a positive finite number, got {value}")
        for name in ("dropout", "weight_averaging"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise ValueError(f"{name} must lie in [0, 1), got {getattr(self, name)}")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ValueError(f"weight_decay must be a non-negative finite number, got {self.weight_decay}")

    def featurizer_config(self) -> FeaturizerConfig:
        return FeaturizerConfig(
            num_buckets=self.num_buckets,
            feature_dim=self.feature_dim,
            max_tokens_per_text=self.max_tokens_per_text,
            max_chars_per_text=self.max_chars_per_text,
        )

    def architecture(self) -> dict[str, Any]:
        """The shape-and-meaning fields, as stored in checkpoints."""
        values = asdict(self)
        return {name: values[name] for name in _ARCHITECTURE_FIELDS}


_ARCHITECTURE_FIELDS = (
    "num_buckets",
    "feature_dim",
    "max_tokens_per_text",
    "max_chars_per_text",
    "embed_dim",
    "hidden_dim",
    "max_history_tokens",
    "prior_successes",
    "prior_failures",
)
