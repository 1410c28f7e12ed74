"""Read a safetensors header without torch and without trusting it."""

from __future__ import annotations

import itertools
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgraft._internal import jsonio
from kvgraft._internal.jsonio import loads_strict
from kvgraft.errors import InputError, short_int, short_repr

MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_ELEMENTS = 1 << 40
# The manifest schema's bound on a tensor's shape (maxItems): checked before any arithmetic on one, so a
# header stating millions of dimensions costs no more than reading it.
MAX_RANK = 8

# safetensors dtype code -> (our dtype name, bytes per element)
DTYPES: dict[str, tuple[str, int]] = {
    "F64": ("float64", 8),
    "F32": ("float32", 4),
    "F16": ("float16", 2),
    "BF16": ("bfloat16", 2),
    "F8_E4M3": ("float8_e4m3fn", 1),
    "F8_E5M2": ("float8_e5m2", 1),
    "I64": ("int64", 8),
    "I32": ("int32", 4),
    "I16": ("int16", 2),
    "I8": ("int8", 1),
    "U8": ("uint8", 1),
    "BOOL": ("bool", 1),
}
ITEMSIZE = {name: size for name, size in DTYPES.values()}
_FIELDS = {"dtype", "shape", "data_offsets"}


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # our name, e.g. "float32"
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_raw_header(path: Path, fd: int | None = None) -> tuple[int, int, bytes]:
    """(file size, header length, header bytes), bounds-checked against the file size; `fd` as in read_header."""
    try:
        handle = os.open(path, os.O_RDONLY) if fd is None else fd
        try:
            size = os.fstat(handle).st_size
            head = os.pread(handle, 8, 0)
            if len(head) < 8:
                raise InputError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise InputError(f"{path}: safetensors header length {n} is out of bounds (file is {size} bytes)")
            raw = os.pread(handle, n, 8)
            if len(raw) < n:
                raise InputError(f"{path}: safetensors header is truncated ({len(raw)} of {n} bytes)")
        finally:
            if fd is None:
                os.close(handle)
    except OSError as exc:
        raise jsonio.unreadable(path, exc) from None
    return size, n, raw


def read_header(path: Path, fd: int | None = None) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and bound-check the header; return tensors (by name) and metadata.

    With `fd`, the header is read from that open file (the one the caller goes on to read tensors
    from), and `path` only names it in messages.
    """
    size, n, raw = read_raw_header(path, fd)
    return parse_header(path, size, n, raw)


def parse_header(path: Path, size: int, n: int, raw: bytes) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Validate header bytes read by read_raw_header from a `size`-byte file (header length `n`)."""
    header: Any = loads_strict(raw, f"{path} (safetensors header)")
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header is not an object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InputError(f"{path}: safetensors __metadata__ must map strings to strings")
    base = 8 + n
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    # `type(x) is int`: JSON booleans are not sizes.
    for name, info in header.items():
        if type(info) is not dict or info.keys() != _FIELDS:
            raise InputError(f"{path}: tensor {short_repr(name)}: malformed header entry")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if code not in DTYPES:
            raise InputError(f"{path}: tensor {short_repr(name)}: unsupported dtype {short_repr(code)}")
        if type(shape) is not list:
            raise InputError(f"{path}: tensor {short_repr(name)}: shape must be a list of non-negative integers")
        if len(shape) > MAX_RANK:
            raise InputError(f"{path}: tensor {short_repr(name)}: shape has {len(shape)} dimensions; at most {MAX_RANK}")
        count = 1
        for d in shape:
            if type(d) is not int or d < 0:
                raise InputError(f"{path}: tensor {short_repr(name)}: shape must be a list of non-negative integers")
            # Saturating: the count stays within a few bits of the bound, and a later 0 still makes it 0.
            count = min(count * d, MAX_ELEMENTS + 1)
        if count > MAX_ELEMENTS:
            raise InputError(f"{path}: tensor {short_repr(name)}: shape {shape} has more than {MAX_ELEMENTS} elements: "
                             f"exceeds the bound")
        if type(offsets) is not list or len(offsets) != 2 or type(offsets[0]) is not int or type(offsets[1]) is not int:
            raise InputError(f"{path}: tensor {short_repr(name)}: data_offsets must be two integers")
        a, b = offsets
        dtype, itemsize = DTYPES[code]
        if not 0 <= a <= b or b - a != count * itemsize or base + b > size:
            raise InputError(f"{path}: tensor {short_repr(name)}: byte range [{short_int(base + a)}, {short_int(base + b)}) does "
                             f"not fit shape {shape} {dtype} in a {size}-byte file")
        tensors[name] = TensorInfo(name, dtype, tuple(shape), base + a, base + b)
        spans.append((a, b, name))
    spans.sort()
    for (_, b1, n1), (a2, _, n2) in itertools.pairwise(spans):
        if a2 < b1:
            raise InputError(f"{path}: tensors {short_repr(n1)} and {short_repr(n2)} overlap")
    return tensors, {str(k): str(v) for k, v in meta.items()}
