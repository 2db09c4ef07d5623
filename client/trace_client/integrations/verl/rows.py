"""verl's batch rows as plain Python values: its batches mix tensors, numpy values and tensordict's
non-tensor wrappers, and the manager and the agent loop read them the same way."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import torch
from tensordict import NonTensorData, NonTensorStack, TensorDict


def batch_row(batch: TensorDict, i: int) -> dict[str, Any]:
    """Row `i` of a verl batch as plain values (what the agent-loop worker hands an agent loop)."""
    row: dict[str, Any] = {}
    for key, value in batch.items():
        if isinstance(value, torch.Tensor):
            row[key] = value[i]
        elif isinstance(value, NonTensorStack):
            row[key] = value[i].data
        elif isinstance(value, NonTensorData):
            row[key] = value.data
    return row


def plain_value(value: Any) -> Any:
    """numpy and torch scalars and arrays as Python values, and pandas' NaN (a field a row lacks) as None."""
    if isinstance(value, torch.Tensor):
        return value.item() if value.numel() == 1 else value.tolist()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and math.isnan(value):
        return None
    return value
