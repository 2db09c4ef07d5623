"""Self-checking checkpoint format for predictor weights.

Layout (all integers little-endian)::

    magic    8 bytes   b"TRACEPRD"
    format   2 bytes   unsigned, CHECKPOINT_FORMAT
    length   4 bytes   unsigned, byte length of the header
    digest  32 bytes   SHA-256 of header + payload
    header   length    UTF-8 JSON object (predictor version, configuration, counters)
    payload  rest      torch.save of the tensors (``checkpoint_content``), loaded with weights_only=True

Any truncation or flipped byte fails the digest, and a corrupt file raises :class:`CheckpointError`
before anything is deserialised, so the caller can keep the weights it has.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import tempfile
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

MAGIC = b"TRACEPRD"
CHECKPOINT_FORMAT = 2
_PREAMBLE = struct.Struct("<8sHI32s")


class CheckpointError(ValueError):
    """A checkpoint that is corrupt, truncated, of another format or for another model shape."""


def encode_checkpoint(header: dict[str, Any], state: dict[str, Tensor]) -> bytes:
    """Serialise ``header`` (JSON-able) and ``state`` (tensors, moved to CPU) into one blob."""
    header_bytes = json.dumps(header, sort_keys=True).encode("utf-8")
    buffer = io.BytesIO()
    torch.save({name: tensor.detach().cpu() for name, tensor in state.items()}, buffer)
    payload = buffer.getvalue()
    digest = hashlib.sha256(header_bytes + payload).digest()
    return _PREAMBLE.pack(MAGIC, CHECKPOINT_FORMAT, len(header_bytes), digest) + header_bytes + payload


def decode_checkpoint(data: bytes) -> tuple[dict[str, Any], dict[str, Tensor]]:
    """Inverse of :func:`encode_checkpoint`; raises :class:`CheckpointError` on any damage."""
    if len(data) < _PREAMBLE.size:
        raise CheckpointError(f"checkpoint truncated: {len(data)} bytes is shorter than its preamble")
    magic, version, header_length, digest = _PREAMBLE.unpack_from(data)
    if magic != MAGIC:
        raise CheckpointError("not a trace-rollout predictor checkpoint (bad magic bytes)")
    if version != CHECKPOINT_FORMAT:
        raise CheckpointError(f"checkpoint format {version} is not supported (expected {CHECKPOINT_FORMAT})")
    body = data[_PREAMBLE.size :]
    if header_length > len(body) or hashlib.sha256(body).digest() != digest:
        raise CheckpointError("checkpoint is corrupt: its SHA-256 digest does not match its contents")
    try:
        header = json.loads(body[:header_length].decode("utf-8"))
        state = torch.load(io.BytesIO(body[header_length:]), map_location="cpu", weights_only=True)
    except Exception as error:  # a digest-valid blob written by something else: still a bad checkpoint
        raise CheckpointError(f"checkpoint is unreadable: {error}") from error
    if not isinstance(header, dict) or not isinstance(state, dict):
        raise CheckpointError("checkpoint header or state has the wrong structure")
    return header, state


def write_checkpoint(path: str | os.PathLike[str], data: bytes) -> None:
    """Write a checkpoint to ``path`` atomically (a reader never sees half a file)."""
    target = Path(path)
    with tempfile.NamedTemporaryFile(dir=target.parent, prefix=f".{target.name}.", delete=False) as file:
        file.write(data)
        temporary = Path(file.name)
    try:
        os.replace(temporary, target)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
