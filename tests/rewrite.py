"""Rewrite a release's bytes or manifest and every commitment over them, so that it still verifies.

What an author who altered a release would publish: only a recompute can tell.
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Callable
from pathlib import Path
from typing import Any

from kvgraft._internal.digest import sha256_hex
from kvgraft.release.hashing import hash_file
from kvgraft.release.records import entry_digest, root_digest, token_ids_digest


def _single(rel: Path) -> None:
    """A format-2 (indexed) release is first rewritten in the single-manifest layout, which is what
    these rewrites edit (the same records; tests/release_factory.as_format_1)."""
    if json.loads((rel / "manifest.json").read_text()).get("format_version") == 2:
        from release_factory import as_format_1

        as_format_1(rel)


def manifest(rel: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Apply `change` to the manifest, then recompute token, entry and root digests."""
    _single(rel)
    m = json.loads((rel / "manifest.json").read_text())
    change(m)
    for e in m["entries"]:
        e["token_ids_sha256"] = token_ids_digest(e["token_ids"])
        e["digest"] = entry_digest(e)
    m["root_digest"] = root_digest(m)
    (rel / "manifest.json").write_text(json.dumps(m))


def tensors(rel: Path, entry_index: int, new: dict[str, bytes]) -> None:
    """Replace stored tensors' raw bytes (same sizes), then rewrite their, the file's and every other digest."""
    _single(rel)
    m = json.loads((rel / "manifest.json").read_text())
    e = m["entries"][entry_index]
    f = rel / e["file"]
    data = bytearray(f.read_bytes())
    for name, raw in new.items():
        start, end = e["tensors"][name]["byte_range"]
        assert len(raw) == end - start, (name, len(raw), end - start)
        data[start:end] = raw
    f.write_bytes(bytes(data))

    def rehash(m: dict[str, Any]) -> None:
        entry = m["entries"][entry_index]
        for name, raw in new.items():
            entry["tensors"][name]["sha256"] = sha256_hex(raw)
        sha, size = hash_file(f)
        m["files"][entry["file"]] = {"sha256": sha, "size": size}

    manifest(rel, rehash)


def element(rel: Path, entry_index: int, tensor: str, index: int,
            new_value: Callable[[float], float]) -> tuple[float, float]:
    """Set one float32 element of a stored tensor to `new_value(old)`; return (old, new)."""
    _single(rel)
    m = json.loads((rel / "manifest.json").read_text())
    e = m["entries"][entry_index]
    t = e["tensors"][tensor]
    assert t["dtype"] == "float32"
    start, end = t["byte_range"]
    raw = bytearray((rel / e["file"]).read_bytes()[start:end])
    (old,) = struct.unpack_from("<f", raw, index * 4)
    struct.pack_into("<f", raw, index * 4, new_value(old))
    (new,) = struct.unpack_from("<f", raw, index * 4)
    tensors(rel, entry_index, {tensor: bytes(raw)})
    return old, new


def flat_index(shape: list[int], head: int, position: int, dim: int) -> int:
    """Index of (batch 0, head, position, dim) in a [batch, heads, positions, dim] tensor."""
    return (head * shape[2] + position) * shape[3] + dim


def _sha_of_zeros(n: int) -> str:
    h, block = hashlib.sha256(), bytes(2**20)
    while n:
        k = min(n, len(block))
        h.update(block[:k])
        n -= k
    return h.hexdigest()


def claim_shape(rel: Path, entry_index: int, name: str, shape: list[int]) -> None:
    """Entry `entry_index`'s tensor `name` re-shaped to `shape`: a new safetensors file (the other tensors' bytes as they
    were, that one sparse zeros), and every digest of the record, the files table and the root rewritten."""
    _single(rel)
    m = json.loads((rel / "manifest.json").read_text())
    e = m["entries"][entry_index]
    path = rel / e["file"]
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    order = sorted((k for k in head if k != "__metadata__"), key=lambda k: head[k]["data_offsets"][0])
    sizes = {k: head[k]["data_offsets"][1] - head[k]["data_offsets"][0] for k in order}
    sizes[name] = 4 * shape[0] * shape[1] * shape[2] * shape[3]  # float32
    at = 0
    for k in order:
        head[k]["data_offsets"] = [at, at + sizes[k]]
        at += sizes[k]
    head[name]["shape"] = shape
    raw = json.dumps(head, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    start = 8 + len(raw)
    old = {k: e["tensors"][k]["byte_range"] for k in order}
    with open(path, "wb") as fh:
        fh.write(struct.pack("<Q", len(raw)) + raw)
        for k in order:
            if k == name:
                fh.seek(sizes[k], 1)  # a hole
            else:
                fh.write(data[old[k][0]:old[k][1]])
        fh.truncate(start + at)
    file_sha = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(2**20):
            file_sha.update(chunk)

    def change(m: dict[str, Any]) -> None:
        entry = m["entries"][entry_index]
        for k in order:
            a, b = head[k]["data_offsets"]
            t = entry["tensors"][k]
            t["byte_range"] = [start + a, start + b]
            if k == name:
                t["shape"], t["sha256"] = shape, _sha_of_zeros(sizes[k])
        if "header_sha256" in entry:
            entry["header_sha256"] = hashlib.sha256(struct.pack("<Q", len(raw)) + raw).hexdigest()
        m["files"][entry["file"]] = {"sha256": file_sha.hexdigest(), "size": start + at}

    manifest(rel, change)
