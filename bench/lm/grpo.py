"""The policy-gradient pieces of the language-model learner: batches of token sequences, the token-level
loss, and the flat arm's group advantages."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor


def pad_batch(sequences: Sequence[Sequence[int]], pad_id: int = 0) -> tuple[Tensor, Tensor]:
    """Right-padded ids [B,T] (T the longest sequence, `pad_id` after each shorter one) and the bool mask
    [B,T] of the real tokens: the layout `TinyLM.token_logprobs` reads, where every sequence's positions
    start at 0."""
    longest = max((len(sequence) for sequence in sequences), default=0)
    ids = torch.full((len(sequences), longest), pad_id, dtype=torch.long)
    mask = torch.zeros(len(sequences), longest, dtype=torch.bool)
    for row, sequence in enumerate(sequences):
        ids[row, : len(sequence)] = torch.tensor(list(sequence), dtype=torch.long)
        mask[row, : len(sequence)] = True
    return ids, mask


def token_policy_loss(logprobs: Tensor, advantages: Tensor, mask: Tensor) -> Tensor:
    """L = −Σ_{b,t} A[b,t] · log π(y_{b,t}) · m[b,t] / Σ_{b,t} m[b,t], all tensors [B,T], m the bool mask
    of the tokens trained on (the generated ones).

    DAPO's token-level averaging: every trained token weighs the same whatever its sequence's length, so
    a long response neither dilutes its tokens (as a per-sequence mean would) nor outweighs a short one.
    ∇L = −mean over tokens of A ∇log π: a positive advantage raises its token's probability. With an
    empty mask the loss is a zero still connected to `logprobs`, so `backward()` runs and adds nothing.
    Masked entries are never read (a −inf log-probability there does not turn the loss into NaN).
    """
    if not logprobs.shape == advantages.shape == mask.shape:
        raise ValueError(f"shapes differ: {logprobs.shape}, {advantages.shape}, {mask.shape}")
    weighted = torch.where(mask, advantages * logprobs, torch.zeros_like(logprobs))
    return -weighted.sum() / mask.sum().clamp(min=1)


def group_advantages(rewards: Sequence[float]) -> list[float]:
    """A_i = r_i − mean(r) over one prompt's group of rollouts (Dr. GRPO).

    Not divided by the group's standard deviation: the per-node tree advantages the service exports
    (`GET /v1/trees/{id}`) are differences of success rates, not normalised either, so the flat and the
    tree arms train on the same scale and their comparison measures the allocation, not a rescaling.
    Without the division the estimate also stays a fixed multiple of the true gradient, instead of
    up-weighting the groups whose rewards barely vary.
    """
    if not rewards:
        return []
    mean = sum(rewards) / len(rewards)
    return [reward - mean for reward in rewards]
