"""Strict JSON in, canonical JSON out, atomic writes."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import rfc8785

from kvgraft.errors import InputError

MAX_JSON_BYTES = 64 * 1024 * 1024


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"duplicate key {key!r}")
        out[key] = value
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not JSON")


def loads_strict(data: bytes | str, where: str) -> Any:
    """Parse JSON refusing duplicate keys and NaN/Infinity; errors name `where`."""
    try:
        return json.loads(data, object_pairs_hook=_no_duplicates, parse_constant=_no_constant)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: invalid JSON: {exc}") from None


def read_bounded(path: Path, max_bytes: int, what: str) -> bytes:
    """A file's bytes, refused (naming `what` it should be) when larger than `max_bytes`; the size is
    checked before reading and again on what was read, in case the file grew in between."""
    try:
        size = path.stat().st_size
        if size <= max_bytes:
            with path.open("rb") as fh:
                data = fh.read(max_bytes + 1)
            size = len(data)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    if size > max_bytes:
        raise InputError(f"{path}: {size} bytes exceeds the {max_bytes}-byte limit for {what}")
    return data


def load_file(path: Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read and strictly parse a JSON file whose size is bounded before reading."""
    return loads_strict(read_bounded(path, max_bytes, "JSON"), str(path))


_SAFE_INT = 2**53 - 1  # RFC 8785 (I-JSON) integers; rfc8785 refuses larger ones, and so must we


def _plain_scalar(v: Any) -> bool:
    return not isinstance(v, float) and not (isinstance(v, int) and not -_SAFE_INT <= v <= _SAFE_INT)


def _plain(obj: Any) -> bool:
    """True when `json.dumps` already yields RFC 8785 output: no floats, no integer beyond 2^53, and no
    key with a character beyond the BMP (RFC 8785 sorts keys by UTF-16 code units, Python by code points)."""
    if not isinstance(obj, (dict, list)):
        return _plain_scalar(obj)
    stack = [obj]
    while stack:
        x = stack.pop()
        values = x.values() if isinstance(x, dict) else x
        if isinstance(x, dict) and any(not isinstance(k, str) or any(ord(c) > 0xFFFF for c in k) for k in x):
            return False
        for v in values:
            if isinstance(v, (dict, list)):
                stack.append(v)
            elif not _plain_scalar(v):
                return False
    return True


def canonical(obj: Any) -> bytes:
    """RFC 8785 canonical JSON bytes.

    Without floats, RFC 8785 is exactly sorted, compact, non-ASCII-escaping JSON (same string
    escapes), so the C encoder is used; anything with a float goes through the rfc8785 package.
    """
    if _plain(obj):
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return rfc8785.dumps(obj)


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; errors name file and line."""
    try:
        fh = path.open("rb")
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = loads_strict(line, f"{path}:{lineno}")
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, obj


def refuse_existing(path: Path, overwrite: bool) -> None:
    """The one refusal to replace an output that exists (exit 5) unless overwriting was asked for."""
    from kvgraft.errors import ExistsError

    if not overwrite and Path(path).exists():
        raise ExistsError(f"{path}: already exists; pass --overwrite to replace it")


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    """Write to a temp name in the same folder, fsync, rename: never a partial file.

    `mode` is set explicitly: mkstemp's 0600 would make published files unreadable to others,
    while private keys must keep 0600.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def write_json(path: Path, obj: Any, *, canonical_form: bool = False) -> None:
    data = canonical(obj) if canonical_form else (json.dumps(obj, indent=2) + "\n").encode()
    write_atomic(path, data)
