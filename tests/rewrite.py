"""Rewrite a release's bytes or manifest and every commitment over them, so that it still verifies.

What an author who altered a release would publish: only a recompute can tell.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvgraft.release.format import entry_digest, root_digest, token_ids_digest
from kvgraft.release.hashing import hash_file, sha256_hex


def manifest(rel: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the manifest, then recompute token, entry and root digests."""
    m = json.loads((rel / "manifest.json").read_text())
    change(m)
    for e in m["entries"]:
        e["token_ids_sha256"] = token_ids_digest(e["token_ids"])
        e["digest"] = entry_digest(e)
    m["root_digest"] = root_digest(m)
    (rel / "manifest.json").write_text(json.dumps(m))


def element(rel: Path, entry_index: int, tensor: str, index: int,
            new_value: Callable[[float], float]) -> tuple[float, float]:
    """Set one float32 element of a stored tensor to `new_value(old)`; return (old, new)."""
    m = json.loads((rel / "manifest.json").read_text())
    e = m["entries"][entry_index]
    t = e["tensors"][tensor]
    assert t["dtype"] == "float32"
    f = rel / e["file"]
    data = bytearray(f.read_bytes())
    at = t["byte_range"][0] + index * 4
    (old,) = struct.unpack_from("<f", data, at)
    struct.pack_into("<f", data, at, new_value(old))
    (new,) = struct.unpack_from("<f", data, at)
    f.write_bytes(bytes(data))

    def rehash(m: dict[str, Any]) -> None:
        entry = m["entries"][entry_index]
        start, end = entry["tensors"][tensor]["byte_range"]
        entry["tensors"][tensor]["sha256"] = sha256_hex(bytes(data[start:end]))
        sha, size = hash_file(f)
        m["files"][entry["file"]] = {"sha256": sha, "size": size}

    manifest(rel, rehash)
    return old, new


def flat_index(shape: list[int], head: int, position: int, dim: int) -> int:
    """Index of (batch 0, head, position, dim) in a [batch, heads, positions, dim] tensor."""
    return (head * shape[2] + position) * shape[3] + dim
