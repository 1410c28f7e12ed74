"""Canonical JSON and hashing helpers."""

from __future__ import annotations

import hashlib
import random
import string
from pathlib import Path
from typing import Any

import pytest
import rfc8785

from kvgraft._internal.jsonio import canonical
from kvgraft.release.hashing import hash_file, hash_files, hash_ranges, read_and_hash

CHARS = string.printable + "\u00e9\u2028\u2029\x00\x1f\x7f\ufeff\U0001f600\ud7ff\ue000"


def _random(rng: random.Random, depth: int = 0, floats: bool = False) -> Any:
    r = rng.random()
    if depth > 3 or r < 0.3:
        leaves: list[Any] = [rng.randint(-(10**15), 10**15), True, False, None,
                             "".join(rng.choice(CHARS) for _ in range(rng.randint(0, 8)))]
        if floats:
            leaves.append(rng.uniform(-1e6, 1e6) * 10 ** rng.randint(-30, 30))
        return rng.choice(leaves)
    if r < 0.65:
        return [_random(rng, depth + 1, floats) for _ in range(rng.randint(0, 4))]
    return {"".join(rng.choice(CHARS) for _ in range(rng.randint(0, 5))): _random(rng, depth + 1, floats)
            for _ in range(rng.randint(0, 4))}


@pytest.mark.parametrize("floats", [False, True])
def test_canonical_equals_rfc8785(floats: bool) -> None:
    rng = random.Random(7)
    for _ in range(3000):
        obj = _random(rng, floats=floats)
        assert canonical(obj) == rfc8785.dumps(obj), obj


def test_canonical_refuses_what_rfc8785_refuses() -> None:
    with pytest.raises(rfc8785.IntegerDomainError):
        canonical({"n": 2**60})


def test_file_and_range_hashes(tmp_path: Path) -> None:
    data = random.Random(3).randbytes(3 * 1024 * 1024 + 17)
    files = []
    for i in range(3):
        f = tmp_path / f"f{i}"
        f.write_bytes(data[i:])
        files.append(f)
    assert hash_file(files[0]) == (hashlib.sha256(data).hexdigest(), len(data))
    assert [h for h, _ in hash_files(files)] == [hashlib.sha256(data[i:]).hexdigest() for i in range(3)]
    ranges = [(0, 10), (10, 1_000_000), (5, 3 * 1024 * 1024 + 17)]
    assert hash_ranges(files[0], ranges) == [hashlib.sha256(data[a:b]).hexdigest() for a, b in ranges]
    dest = bytearray(sum(b - a for a, b in ranges))
    digests = read_and_hash(files[0], ranges, memoryview(dest))
    assert digests == [hashlib.sha256(data[a:b]).hexdigest() for a, b in ranges]
    assert bytes(dest) == b"".join(data[a:b] for a, b in ranges)


def test_canonical_equals_rfc8785_on_release_records(tmp_path: Path) -> None:
    """The writer's records and shards (what the fast walk in jsonio._plain is for), and each of them
    changed in one way that takes the other path: a float, an integer beyond 2^53, a key beyond the
    BMP, a bool among integers, a non-string key; the same bytes as rfc8785 or the same refusal."""
    import copy
    import json as _json

    from release_factory import make_many

    root = tmp_path / "r"
    make_many(root, entries=70, tokens=5, layers=2)
    docs = [_json.loads(p.read_bytes()) for p in sorted((root / "index").glob("*.json"))]
    records = [r for d in docs for r in d["entries"]]
    assert len(records) == 70
    for obj in [*docs, *records]:
        assert canonical(obj) == rfc8785.dumps(obj)
    rec = records[3]

    def changed(f: Any) -> Any:
        r = copy.deepcopy(rec)
        f(r)
        return r

    variants = [
        changed(lambda r: r["next_token"].update(prob=0.25)),
        changed(lambda r: r["layers"][1].update({"\U0001f600k": 1, "\ue000k": 2})),
        changed(lambda r: r["token_ids"].append(True)),
        changed(lambda r: r["source"].update(none=None, text="caf\u00e9 \u2028 \U0001f600")),
        changed(lambda r: r["tensors"]["layer.0.keys"]["shape"].append(-(2**53 - 1))),
    ]
    for obj in variants:
        assert canonical(obj) == rfc8785.dumps(obj), obj
    for bad in (changed(lambda r: r["token_ids"].append(2**53)), changed(lambda r: r["layers"][0]["positions"].append(-(2**60))),
                changed(lambda r: r["next_token"].update(argmax=2**60))):  # among strings in a dict
        with pytest.raises(rfc8785.IntegerDomainError):
            canonical(bad)
    with pytest.raises(Exception):  # noqa: B017 - rfc8785's own refusal of a non-string key
        rfc8785.dumps(changed(lambda r: r["source"].update({1: "x"})))
    with pytest.raises(Exception):  # noqa: B017
        canonical(changed(lambda r: r["source"].update({1: "x"})))
