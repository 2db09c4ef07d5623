"""Array kernels the Stage 1 and Stage 2 solvers share."""

from __future__ import annotations

import numpy as np
import numpy.typing as npt

from trace_service.allocation._validate import FloatArray


def geometric_powers(base: FloatArray, first: int, out: FloatArray) -> FloatArray:
    """Fill ``out[r, j] = base_r ** (first + j)`` by cumulative products (much cheaper than pow)."""
    if out.shape[1]:
        out[:, 0] = base**first
        out[:, 1:] = base[:, None]
        np.cumprod(out, axis=1, out=out)
    return out


def top_units(values: FloatArray, take: int) -> npt.NDArray[np.bool_]:
    """Mask of the ``take`` largest positive entries of a row-major matrix; ties go in row-major order.

    Rows must be non-increasing, so each row's selection is a prefix (a valid allocation).
    """
    flat = values.ravel()
    positive = int(np.count_nonzero(flat > 0.0))
    if take >= positive:
        return values > 0.0
    if take <= 0:
        return np.zeros(values.shape, dtype=bool)
    threshold = np.partition(flat, flat.size - take)[flat.size - take]
    chosen: npt.NDArray[np.bool_] = flat > threshold
    ties = np.flatnonzero(flat == threshold)
    chosen[ties[: take - int(np.count_nonzero(chosen))]] = True
    return chosen.reshape(values.shape)
