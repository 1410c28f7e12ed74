"""A graft checks an entry's layer count and tensor shapes against the loaded model before it reads a byte.

A re-signed record may claim a tensor of any shape its file can back (sparse zeros cost the attacker no disk),
with real digests: verification passes, as the bytes are what the record commits to. The graft refuses it from
the record alone, never reading (and hashing) what the model could not hold.
"""

from __future__ import annotations

import hashlib
import json
import struct
from pathlib import Path
from typing import Any

import pytest

from kvgraft.errors import IntegrityError
from kvgraft.inference import capture, graft
from kvgraft.signing import keys
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified, verify_release

import rewrite
from release_factory import sign_as

CLAIMED_BYTES = 64 * 2**20


def _sha_of_zeros(n: int) -> str:
    h, block = hashlib.sha256(), bytes(2**20)
    while n:
        k = min(n, len(block))
        h.update(block[:k])
        n -= k
    return h.hexdigest()


def _claim(rel: Path, name: str, shape: list[int]) -> None:
    """Entry 0's tensor `name` re-shaped to `shape`: a new safetensors file (the other tensors' bytes as they
    were, that one sparse zeros), and every digest of the record, the files table and the root rewritten."""
    rewrite._single(rel)
    m = json.loads((rel / "manifest.json").read_text())
    e = m["entries"][0]
    path = rel / e["file"]
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    head = json.loads(data[8:8 + n])
    order = sorted((k for k in head if k != "__metadata__"), key=lambda k: head[k]["data_offsets"][0])
    sizes = {k: head[k]["data_offsets"][1] - head[k]["data_offsets"][0] for k in order}
    sizes[name] = 4 * int.__mul__(*shape[:2]) * shape[2] * shape[3]
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
        entry = m["entries"][0]
        for k in order:
            a, b = head[k]["data_offsets"]
            t = entry["tensors"][k]
            t["byte_range"] = [start + a, start + b]
            if k == name:
                t["shape"], t["sha256"] = shape, _sha_of_zeros(sizes[k])
        if "header_sha256" in entry:
            entry["header_sha256"] = hashlib.sha256(struct.pack("<Q", len(raw)) + raw).hexdigest()
        m["files"][entry["file"]] = {"sha256": file_sha.hexdigest(), "size": start + at}

    rewrite.manifest(rel, change)


@pytest.mark.parametrize("where", ["tokens", "heads", "head_dim", "rank"])
def test_a_shape_the_model_cannot_hold_is_refused_before_a_byte_is_read(
        tiny_lm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    lm = tiny_lm("llama")
    rel = tmp_path / "rel"
    manifest = capture.capture(lm, [("t:1", {"id": "e", "text": "Two apples and three pears."})], rel, probe_tokens=0)
    entry = manifest["entries"][0]
    _, heads, tokens, dim = entry["tensors"]["layer.1.keys"]["shape"]
    claimed = CLAIMED_BYTES // 4
    shape = {"tokens": [1, heads, claimed // (heads * dim), dim], "heads": [1, claimed // (tokens * dim), tokens, dim],
             "head_dim": [1, heads, tokens, claimed // (heads * tokens)], "rank": [1, 1, 1, claimed]}[where]
    _claim(rel, "layer.1.keys", shape)
    private, public = keys.write_keypair(tmp_path / "attacker")
    sign_as(rel, private)
    assert verify_release(rel, key=public).signature.status == "verified"  # the bytes are what it commits to

    def no_read(*_args: Any, **_kwargs: Any) -> Any:
        raise AssertionError("the entry's bytes were read")

    monkeypatch.setattr(graft, "read_entry_tensors", no_read)
    checked = verified(rel, SignatureNotChecked())
    with pytest.raises(IntegrityError, match=r"entry 'e' layer 1 keys 'layer.1.keys': shape .* the model holds"):
        graft.restore(checked, "e", lm)


def test_an_entry_the_model_can_hold_is_grafted(tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    rel = tmp_path / "rel"
    capture.capture(lm, [("t:1", {"id": "e", "text": "Two apples and three pears."})], rel, probe_tokens=0)
    restored = graft.restore(verified(rel, SignatureNotChecked()), "e", lm)
    assert restored.kv_bytes > 0
