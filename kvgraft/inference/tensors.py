"""Tensor bytes: the one place that turns torch tensors into hashed raw bytes and back."""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch

from kvgraft._internal.digest import sha256_hex

TORCH_DTYPES: dict[str, torch.dtype] = {
    "float64": torch.float64, "float32": torch.float32, "float16": torch.float16,
    "bfloat16": torch.bfloat16, "float8_e4m3fn": torch.float8_e4m3fn, "float8_e5m2": torch.float8_e5m2,
    "int64": torch.int64, "int32": torch.int32, "int16": torch.int16, "int8": torch.int8,
    "uint8": torch.uint8, "bool": torch.bool,
}


def dtype_name(t: torch.Tensor | torch.dtype) -> str:
    dt = t.dtype if isinstance(t, torch.Tensor) else t
    return str(dt).removeprefix("torch.")


def raw_bytes(t: torch.Tensor) -> memoryview:
    """The tensor's bytes in C order on the CPU, as a zero-copy view where possible.

    bfloat16 has no numpy dtype, so the view goes through uint8.
    """
    flat = t.detach().contiguous().cpu().reshape(-1).view(torch.uint8)
    return flat.numpy().data


def tensor_sha256(t: torch.Tensor) -> str:
    return sha256_hex(raw_bytes(t))


def from_buffer(buf: torch.Tensor, start: int, end: int, dtype: str, shape: tuple[int, ...]) -> torch.Tensor:
    """A view of bytes [start, end) of a uint8 buffer as a tensor; no copy."""
    return buf[start:end].view(TORCH_DTYPES[dtype]).view(shape)


def split_views(buf: torch.Tensor, parts: Sequence[tuple[str, tuple[int, ...]]]) -> list[torch.Tensor]:
    """Views of tensors laid end to end in a uint8 buffer, given (dtype, shape) in order; no copy.

    One dtype (the usual case) is cut with a single `unbind` or `split`: per-tensor slicing cost a
    third of a millisecond per graft at 60 tensors.
    """
    kinds = set(parts)
    if len(kinds) == 1:  # one dtype and shape (keys and values of every layer, usually): one call
        dtype, shape = parts[0]
        dt = TORCH_DTYPES[dtype]
        if len(parts) * math.prod(shape) * dt.itemsize == buf.numel():
            return list(buf.view(dt).view(len(parts), *shape).unbind(0))
    if len({dtype for dtype, _ in parts}) == 1:
        dt = TORCH_DTYPES[parts[0][0]]
        counts = [math.prod(shape) for _, shape in parts]
        if sum(counts) * dt.itemsize == buf.numel():
            pieces = torch.split(buf.view(dt), counts)
            return [piece.view(shape) for piece, (_, shape) in zip(pieces, parts, strict=True)]
    out, at = [], 0
    for dtype, shape in parts:
        size = math.prod(shape) * TORCH_DTYPES[dtype].itemsize
        out.append(from_buffer(buf, at, at + size, dtype, shape))
        at += size
    return out
