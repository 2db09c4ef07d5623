"""Embedding tables in eight bits: the compact precision of the weights a predictor publishes and sets
down.

Each row r of a table W is stored as int8 values q and one power-of-two scale 2^e:

    e_r = max(−120, min { e ∈ ℤ : max_j |W_rj| ≤ 127 · 2^e })
    q_rj = clamp(round(W_rj / 2^e_r), −127, 127)
    Ŵ_rj = q_rj · 2^e_r

so |W_rj − Ŵ_rj| ≤ 2^(e_r − 1) ≤ max(max_j |W_rj| / 127, 2^−121).  The scale is a power of two, so
Ŵ is exact in float32 and quantizing Ŵ again gives back the same q and e (its row maximum lies in
[64, 127]·2^e_r): weights that are published already quantized travel between replicas, and through
the store, without changing a bit.  A table takes a quarter of its float32 bytes (plus one byte of
exponent per row).
"""

from __future__ import annotations

import torch
from torch import Tensor

_LEVELS = 127
_SMALLEST = 120  # the scale of the smallest rows: 2^-120, far above float32's subnormals


def quantize_rows(weight: Tensor) -> tuple[Tensor, Tensor]:
    """The int8 values and the int8 row exponents of a 2-D float table (see the module docstring)."""
    if weight.dim() != 2:
        raise ValueError(f"quantize_rows takes a 2-D table, got shape {tuple(weight.shape)}")
    table = weight.detach().to("cpu", torch.float32)
    largest = table.abs().amax(dim=1) / _LEVELS
    mantissa, exponent = torch.frexp(largest)  # largest = mantissa · 2^exponent, mantissa in [0.5, 1)
    exponent = torch.where(mantissa == 0.5, exponent - 1, exponent)  # an exact power of two
    # A zero row, or one too small for an int8 exponent, takes the smallest scale kept.
    exponent = torch.where(largest > 0, exponent, torch.full_like(exponent, -_SMALLEST)).clamp(
        -_SMALLEST, 127
    )
    values = torch.ldexp(table, -exponent.unsqueeze(1).to(torch.float32)).round().clamp(-_LEVELS, _LEVELS)
    return values.to(torch.int8), exponent.to(torch.int8)


def dequantize_rows(values: Tensor, exponents: Tensor) -> Tensor:
    """The float32 table that :func:`quantize_rows` encoded (exactly Ŵ)."""
    if values.dtype != torch.int8 or exponents.dtype != torch.int8 or values.dim() != 2:
        raise ValueError("a quantized table is a 2-D int8 tensor with int8 row exponents")
    if exponents.shape != values.shape[:1]:
        raise ValueError(f"{exponents.shape[0]} row exponents for a table of {values.shape[0]} rows")
    return torch.ldexp(values.to(torch.float32), exponents.to(torch.float32).unsqueeze(1))
