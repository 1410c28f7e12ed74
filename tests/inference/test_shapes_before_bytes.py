"""A graft checks an entry's layer count and tensor shapes against the loaded model before it reads a byte.

A re-signed record may claim a tensor of any shape its file can back (sparse zeros cost the attacker no disk),
with real digests: verification passes, as the bytes are what the record commits to. The graft refuses it from
the record alone, never reading (and hashing) what the model could not hold.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgraft.errors import IntegrityError
from kvgraft.inference import capture, graft
from kvgraft.signing import keys
from kvgraft.signing.policy import SignatureNotChecked, SignedWithKeys
from kvgraft.signing.verify import verified
from tests.verifying import verify_result

import rewrite
from release_factory import sign_as

CLAIMED_BYTES = 64 * 2**20


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
    rewrite.claim_shape(rel, 0, "layer.1.keys", shape)
    private, public = keys.write_keypair(tmp_path / "attacker")
    sign_as(rel, private)
    assert verify_result(rel, SignedWithKeys((public,))).signature.status == "verified"  # the bytes are what it commits to

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
