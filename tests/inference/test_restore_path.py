"""The graft restore's fast paths must never weaken a check: header fast path, reused buffers,
one-call tensor views, threads pulling ranges."""

from __future__ import annotations

import gc
import hashlib
import json
import os
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

from kvgraft.errors import IntegrityError
from kvgraft.inference import buffers, capture, graft
from kvgraft.inference.tensors import from_buffer, split_views
from kvgraft.release.hashing import read_and_hash
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import VerifiedRelease, verified
from tests.verifying import verify_result

TEXT = "one two three four five six seven eight nine ten eleven twelve thirteen"


@pytest.fixture()
def rel(tiny_lm: Callable[[str], Any], tmp_path: Path) -> VerifiedRelease:
    capture.capture(tiny_lm("llama"), [("t", {"id": "e", "text": TEXT})], tmp_path / "rel", probe_tokens=0)
    return verified(tmp_path / "rel", SignatureNotChecked())


def _header(path: Path) -> tuple[int, bytes]:
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    return n, data[8 : 8 + n]


def _rewrite_header(path: Path, new: bytes) -> None:
    data = bytearray(path.read_bytes())
    n = int.from_bytes(data[:8], "little")
    assert len(new) == n  # same length: tensor offsets stay where the manifest says
    data[8 : 8 + n] = new
    path.write_bytes(bytes(data))


def test_header_changed_after_a_restore_is_caught(rel: VerifiedRelease, tiny_lm: Callable[[str], Any]) -> None:
    lm = tiny_lm("llama")
    entry = rel.release.entry("e")
    graft.restore(rel, "e", lm)  # the header is now known-good to this Release object
    path = rel.release.entry_file(entry)
    _, raw = _header(path)
    _rewrite_header(path, raw.replace(b'"layer.0.keys"', b'"layer.0.kezs"'))
    with pytest.raises(IntegrityError, match=r"safetensors header bytes \[0, \d+\): sha256 [0-9a-f]{64}, the manifest says"):
        graft.restore(rel, "e", lm)


def test_header_in_another_key_order_is_refused(rel: VerifiedRelease, tiny_lm: Callable[[str], Any]) -> None:
    """A rewritten header (same tensors, other key order) is not the header the signed record binds
    (header_sha256), so the graft is refused, by a fresh Release and by the one that grafted before
    the rewrite; `kvgraft verify` finds the file's sha256 changed."""
    lm = tiny_lm("llama")
    graft.restore(rel, "e", lm)
    path = rel.release.entry_file(rel.release.entry("e"))
    n, raw = _header(path)
    doc = json.loads(raw)
    reordered = {k: dict(reversed(list(v.items()))) for k, v in reversed(list(doc.items()))}
    new = json.dumps(reordered, separators=(",", ":")).encode()
    _rewrite_header(path, new + b" " * (n - len(new)))
    with pytest.raises(IntegrityError, match=r"safetensors header bytes \[0, \d+\): sha256"):
        graft.restore(verified(rel.root, SignatureNotChecked()), "e", lm)
    with pytest.raises(IntegrityError, match=r"safetensors header bytes \[0, \d+\): sha256"):
        graft.restore(rel, "e", lm)
    with pytest.raises(IntegrityError, match=r"000.safetensors: sha256 [0-9a-f]{64} does not match the manifest"):
        verify_result(rel.root)


def test_buffers_are_reused_only_when_free() -> None:
    buffers.clear()
    a = buffers.take(1 << 16)
    b = buffers.take(1 << 16)
    assert a.data_ptr() != b.data_ptr()  # a is still in use
    view = a[100:200]
    address = a.data_ptr()
    del a
    gc.collect()
    c = buffers.take(1 << 16)
    assert c.data_ptr() != address  # a view keeps the region busy
    del view
    gc.collect()
    d = buffers.take(1 << 15)
    assert d.data_ptr() == address  # now idle: reused (smaller requests fit)
    del b, c, d
    for _ in range(buffers.MAX_REGIONS + 3):
        buffers.take(1 << 12)  # each is dropped at once: idle regions are trimmed to the cap
    assert buffers.held_bytes() <= buffers.MAX_REGIONS * (1 << 16)
    graft.free_buffers()
    assert buffers.held_bytes() == 0


def test_restores_on_reused_memory_are_independent(rel: VerifiedRelease, tiny_lm: Callable[[str], Any]) -> None:
    lm = tiny_lm("llama")
    first = graft.restore(rel, "e", lm).cache
    keys = [layer.keys.clone() for layer in first.layers]
    second = graft.restore(rel, "e", lm).cache  # first is alive: different memory
    assert first.layers[0].keys.data_ptr() != second.layers[0].keys.data_ptr()
    second.layers[0].keys.zero_()
    assert all(torch.equal(k, layer.keys) for k, layer in zip(keys, first.layers, strict=True))


@pytest.mark.parametrize("parts", [
    [("float32", (2, 3, 4))] * 5,                                       # one shape: unbind
    [("float32", (2, 3, 4)), ("float32", (7,)), ("float32", (1, 5))],   # one dtype: split
    [("float32", (2, 3)), ("bfloat16", (4,)), ("int64", (2,))],          # mixed: per tensor
])
def test_split_views_match_per_tensor_views(parts: list[tuple[str, tuple[int, ...]]]) -> None:
    sizes = [torch.empty(shape, dtype=getattr(torch, dtype)).nbytes for dtype, shape in parts]
    buf = torch.tensor(list(random.Random(1).randbytes(sum(sizes))), dtype=torch.uint8)
    views = split_views(buf, parts)
    at = 0
    for (dtype, shape), size, view in zip(parts, sizes, views, strict=True):
        expect = from_buffer(buf, at, at + size, dtype, shape)
        assert view.dtype == expect.dtype and view.shape == expect.shape
        assert view.data_ptr() == expect.data_ptr()  # a view, not a copy
        at += size


def test_read_and_hash_many_ranges_from_an_open_file(tmp_path: Path) -> None:
    data = random.Random(5).randbytes(1 << 20)
    f = tmp_path / "f"
    f.write_bytes(data)
    cuts = sorted(random.Random(6).sample(range(1, len(data)), 40))
    ranges = list(zip([0, *cuts], [*cuts, len(data)], strict=True))
    dest = bytearray(len(data))
    fd = os.open(f, os.O_RDONLY)
    try:
        digests = read_and_hash(fd, ranges, memoryview(dest))
        with pytest.raises(EOFError):
            read_and_hash(fd, [(len(data) - 10, len(data) + 10)], memoryview(bytearray(20)))
    finally:
        os.close(fd)
    assert digests == [hashlib.sha256(data[a:b]).hexdigest() for a, b in ranges]
    assert bytes(dest) == data


@pytest.mark.parametrize("shape", ["[true, 2]", "[1.0, 2]", "[-1, 2]", "2"])
def test_header_shapes_must_be_plain_integers(shape: str) -> None:
    from kvgraft.errors import InputError
    from kvgraft.release import safetensors_header as stfile

    raw = f'{{"t": {{"dtype": "F32", "shape": {shape}, "data_offsets": [0, 8]}}}}'.encode()
    with pytest.raises(InputError, match="shape must be a list of non-negative integers"):
        stfile.parse_header(Path("x.safetensors"), 8 + len(raw) + 8, len(raw), raw)
    good = raw.replace(f"\"shape\": {shape}".encode(), b"\"shape\": [1, 2]")
    tensors, _ = stfile.parse_header(Path("x.safetensors"), 8 + len(good) + 8, len(good), good)
    assert tensors["t"].shape == (1, 2) and tensors["t"].end - tensors["t"].start == 8
