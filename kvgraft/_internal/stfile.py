"""Read a safetensors header without torch and without trusting it."""

from __future__ import annotations

import itertools
import math
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kvgraft._internal.jsonio import loads_strict
from kvgraft.errors import InputError

MAX_HEADER_BYTES = 100 * 1024 * 1024
MAX_ELEMENTS = 1 << 40

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


@dataclass(frozen=True)
class TensorInfo:
    name: str
    dtype: str  # our name, e.g. "float32"
    shape: tuple[int, ...]
    start: int  # absolute byte offsets in the file
    end: int


def read_header(path: Path) -> tuple[dict[str, TensorInfo], dict[str, str]]:
    """Parse and bound-check the header; return tensors (by name) and metadata."""
    try:
        with path.open("rb") as fh:
            size = fh.seek(0, 2)
            fh.seek(0)
            head = fh.read(8)
            if len(head) < 8:
                raise InputError(f"{path}: not a safetensors file (shorter than 8 bytes)")
            (n,) = struct.unpack("<Q", head)
            if n > MAX_HEADER_BYTES or 8 + n > size:
                raise InputError(f"{path}: safetensors header length {n} is out of bounds (file is {size} bytes)")
            raw = fh.read(n)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    header: Any = loads_strict(raw, f"{path} (safetensors header)")
    if not isinstance(header, dict):
        raise InputError(f"{path}: safetensors header is not an object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise InputError(f"{path}: safetensors __metadata__ must map strings to strings")
    base = 8 + n
    tensors: dict[str, TensorInfo] = {}
    spans: list[tuple[int, int, str]] = []
    for name, info in header.items():
        where = f"{path}: tensor {name!r}"
        if not isinstance(info, dict) or set(info) != {"dtype", "shape", "data_offsets"}:
            raise InputError(f"{where}: malformed header entry")
        code, shape, offsets = info["dtype"], info["shape"], info["data_offsets"]
        if code not in DTYPES:
            raise InputError(f"{where}: unsupported dtype {code!r}")
        if not isinstance(shape, list) or not all(isinstance(d, int) and d >= 0 for d in shape):
            raise InputError(f"{where}: shape must be a list of non-negative integers")
        count = math.prod(shape)
        if count > MAX_ELEMENTS:
            raise InputError(f"{where}: {count} elements exceeds the bound")
        if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) for o in offsets)):
            raise InputError(f"{where}: data_offsets must be two integers")
        a, b = offsets
        dtype, itemsize = DTYPES[code]
        if not 0 <= a <= b or b - a != count * itemsize or base + b > size:
            raise InputError(
                f"{where}: byte range [{base + a}, {base + b}) does not fit shape {shape} {dtype} in a {size}-byte file")
        tensors[name] = TensorInfo(name, dtype, tuple(shape), base + a, base + b)
        spans.append((a, b, name))
    spans.sort()
    for (_, b1, n1), (a2, _, n2) in itertools.pairwise(spans):
        if a2 < b1:
            raise InputError(f"{path}: tensors {n1!r} and {n2!r} overlap")
    return tensors, {str(k): str(v) for k, v in meta.items()}
