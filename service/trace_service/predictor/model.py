"""The success network: hashed n-gram bags and dense features → MLP → the prior mean of success.

    x      = [mean-bag(prompt) ⊕ mean-bag(earlier turns) ⊕ mean-bag(latest turn) ⊕ standardise(dense)]
    logit  = logit(μ₀) + head(MLP(x))
    μ(H)   = σ(logit)

The network reads only what a history carries (text, structure, client features), never the prompt's
outcome history: that enters exactly, by a conjugate update on this prior (``calibration``), instead
of as one more input the network could shrink. A fresh model (zero-initialised head) predicts the cold
start μ₀ = α / (α + β) of the configured Beta prior. ``dense`` is the structural features and, when
``feature_dim > 0``, the prompt's and the latest client feature vectors, each with a presence flag (an
absent vector is zeros). Dense inputs are standardised with the training data's mean and standard
deviation (stored in the model's buffers) so that client vectors of any scale are usable. ``x`` passes
through dropout while training.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field, fields

import numpy as np
import numpy.typing as npt
import torch
from torch import Tensor, nn

from trace_service.predictor.features import STRUCTURAL_FEATURE_NAMES, EncodedHistory, OutcomeCounts

# Standardised dense inputs are clipped to this many standard deviations: one wild client value must
# not saturate the network.
_DENSE_CLIP = 8.0


@dataclass(frozen=True, slots=True)
class Query:
    """One history to score, with its prompt's outcome counts from earlier steps (which the
    calibration applies to the network's prior; the network itself does not read them)."""

    history: EncodedHistory
    outcomes: OutcomeCounts = field(default_factory=OutcomeCounts)


@dataclass(frozen=True, slots=True)
class ModelInputs:
    """A collated batch: flat id arrays with per-row offsets for each bag, dense rows, prior logits."""

    prompt_ids: Tensor
    prompt_offsets: Tensor
    prompt_index: Tensor  # each row's prompt bag: queries of one tree share their prompt's bag
    earlier_ids: Tensor
    earlier_offsets: Tensor
    latest_ids: Tensor
    latest_offsets: Tensor
    dense: Tensor
    prior_logit: Tensor

    def to(self, device: torch.device) -> ModelInputs:
        return ModelInputs(**{item.name: getattr(self, item.name).to(device) for item in fields(self)})


def dense_dim(feature_dim: int) -> int:
    """Width of the dense input: structural features and the client slots."""
    client = 2 * (feature_dim + 1) if feature_dim > 0 else 0
    return len(STRUCTURAL_FEATURE_NAMES) + client


def dense_features(queries: Sequence[Query], feature_dim: int) -> npt.NDArray[np.float32]:
    """Unstandardised dense rows, one per query (see the module docstring for the columns)."""
    rows = np.zeros((len(queries), dense_dim(feature_dim)), dtype=np.float32)
    structural = len(STRUCTURAL_FEATURE_NAMES)
    counts = np.array([query.history.structural_counts() for query in queries], dtype=np.float64)
    rows[:, :structural] = np.log1p(counts.reshape(len(queries), structural))
    for row, query in enumerate(queries if feature_dim > 0 else ()):
        column = structural
        for vector in (query.history.prompt_features, query.history.latest_features):
            if vector is not None:
                rows[row, column] = 1.0
                rows[row, column + 1 : column + 1 + feature_dim] = vector
            column += 1 + feature_dim
    return rows


def _bag(arrays: list[npt.NDArray[np.int64]]) -> tuple[Tensor, Tensor]:
    lengths = np.fromiter((len(ids) for ids in arrays), dtype=np.int64, count=len(arrays))
    offsets = np.zeros(len(arrays), dtype=np.int64)
    np.cumsum(lengths[:-1], out=offsets[1:])
    flat = np.concatenate(arrays) if arrays else np.zeros(0, dtype=np.int64)
    return torch.from_numpy(flat), torch.from_numpy(offsets)


def _earlier_turn_ids(history: EncodedHistory, max_tokens: int) -> npt.NDArray[np.int64]:
    """Ids of all turns but the latest, keeping the most recent ``max_tokens`` of them."""
    kept: list[npt.NDArray[np.int64]] = []
    room = max_tokens
    for ids in reversed(history.turn_tokens[:-1]):
        if room <= 0:
            break
        kept.append(ids[-room:] if len(ids) > room else ids)
        room -= len(ids)
    if not kept:
        return np.zeros(0, dtype=np.int64)
    return np.concatenate(kept[::-1])


def collate(
    queries: Sequence[Query],
    *,
    feature_dim: int,
    max_history_tokens: int,
    prior_mean: float,
) -> ModelInputs:
    """Build the CPU tensors of one batch; ``prior_mean`` is the cold-start μ₀ every logit starts from."""
    empty = np.zeros(0, dtype=np.int64)
    # The encodings of one tree share their prompt's id array: pool each distinct prompt once.
    slots: dict[int, int] = {}
    prompts: list[npt.NDArray[np.int64]] = []
    prompt_index = np.empty(len(queries), dtype=np.int64)
    for row, query in enumerate(queries):
        tokens = query.history.prompt_tokens
        slot = slots.setdefault(id(tokens), len(prompts))
        if slot == len(prompts):
            prompts.append(tokens)
        prompt_index[row] = slot
    prompt_ids, prompt_offsets = _bag(prompts)
    earlier_ids, earlier_offsets = _bag(
        [_earlier_turn_ids(query.history, max_history_tokens) for query in queries]
    )
    latest_ids, latest_offsets = _bag(
        [query.history.turn_tokens[-1] if query.history.turn_tokens else empty for query in queries]
    )
    return ModelInputs(
        prompt_ids=prompt_ids,
        prompt_offsets=prompt_offsets,
        prompt_index=torch.from_numpy(prompt_index),
        earlier_ids=earlier_ids,
        earlier_offsets=earlier_offsets,
        latest_ids=latest_ids,
        latest_offsets=latest_offsets,
        dense=torch.from_numpy(dense_features(queries, feature_dim)),
        prior_logit=torch.full((len(queries),), math.log(prior_mean / (1.0 - prior_mean))),
    )


class SuccessModel(nn.Module):
    """Three mean-pooled embedding bags and standardised dense features into a two-layer MLP."""

    dense_mean: Tensor
    dense_scale: Tensor

    def __init__(
        self, num_buckets: int, dense_width: int, embed_dim: int, hidden_dim: int, dropout: float
    ) -> None:
        super().__init__()
        self.dropout = dropout
        self.prompt_bag = nn.EmbeddingBag(num_buckets, embed_dim, mode="mean")
        self.earlier_bag = nn.EmbeddingBag(num_buckets, embed_dim, mode="mean")
        self.latest_bag = nn.EmbeddingBag(num_buckets, embed_dim, mode="mean")
        for bag in (self.prompt_bag, self.earlier_bag, self.latest_bag):
            # Small initial embeddings: a bag of unseen tokens should start close to "no information".
            nn.init.normal_(bag.weight, std=0.1)
        self.register_buffer("dense_mean", torch.zeros(dense_width))
        self.register_buffer("dense_scale", torch.ones(dense_width))
        self.body = nn.Sequential(
            nn.Linear(3 * embed_dim + dense_width, hidden_dim),
            nn.ReLU(),
            nn.Linear(hidden_dim, hidden_dim),
            nn.ReLU(),
        )
        self.head = nn.Linear(hidden_dim, 1)
        nn.init.zeros_(self.head.weight)
        nn.init.zeros_(self.head.bias)

    def forward(self, inputs: ModelInputs, dropout_generator: torch.Generator | None = None) -> Tensor:
        """Logits of success, shape (batch,). Dropout applies only when a generator is given (training):
        a private generator keeps training reproducible and leaves the global torch RNG alone."""
        dense = ((inputs.dense - self.dense_mean) / self.dense_scale).clamp(-_DENSE_CLIP, _DENSE_CLIP)
        features = torch.cat(
            [
                self.prompt_bag(inputs.prompt_ids, inputs.prompt_offsets)[inputs.prompt_index],
                self.earlier_bag(inputs.earlier_ids, inputs.earlier_offsets),
                self.latest_bag(inputs.latest_ids, inputs.latest_offsets),
                dense,
            ],
            dim=1,
        )
        if dropout_generator is not None and self.dropout > 0:
            keep = torch.rand(features.shape, generator=dropout_generator, device=features.device)
            features = features * (keep >= self.dropout) / (1 - self.dropout)
        correction: Tensor = self.head(self.body(features))
        return inputs.prior_logit + correction.squeeze(1)

    def set_dense_standardisation(self, mean: npt.NDArray[np.float64], std: npt.NDArray[np.float64]) -> None:
        """Use ``mean`` and ``std`` (a zero std becomes 1: a constant column carries no signal)."""
        with torch.no_grad():
            self.dense_mean.copy_(torch.as_tensor(mean, dtype=torch.float32))
            self.dense_scale.copy_(torch.as_tensor(np.where(std > 1e-6, std, 1.0), dtype=torch.float32))

    def predict(self, inputs: ModelInputs) -> npt.NDArray[np.float64]:
        """Prior means of success in [0, 1] for a collated batch, without autograd."""
        device = self.dense_mean.device
        with torch.inference_mode():
            probabilities = torch.sigmoid(self.forward(inputs.to(device)))
        return probabilities.to("cpu", torch.float64).numpy()


def resolve_device(device: str) -> torch.device:
    """``"auto"`` is CUDA when available, else CPU; an explicit CUDA request without CUDA is an error."""
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        resolved = torch.device(device)
    except RuntimeError as error:
        raise ValueError(f"unknown device {device!r}: {error}") from None
    if resolved.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available")
    return resolved
