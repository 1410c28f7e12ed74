"""Under the same schedule, logits after a graft are bit-identical to those after a fresh prefill."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from kvgraft.errors import IntegrityError
from kvgraft.inference import capture, graft, runtime
from kvgraft.inference.runtime import Schedule
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

import tiny

SUFFIX = " How many apples are left? Answer:"


def _long_record(lm: Any) -> list[tuple[str, dict[str, Any]]]:
    text = " ".join(tiny._CORPUS[:3])
    return [("t:1", {"id": "long", "text": text})]


def _logits_after(lm: Any, cache: Any) -> torch.Tensor:
    ids = lm.tokenizer(SUFFIX, add_special_tokens=False)["input_ids"]
    return runtime.forward(lm, cache, ids)


@pytest.mark.parametrize("family", tiny.FAMILIES)
@pytest.mark.parametrize("chunk", [None, 16])
def test_graft_matches_fresh_prefill(family: str, chunk: int | None, tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm(family)
    schedule = Schedule(chunk_tokens=chunk)
    manifest = capture.capture(lm, _long_record(lm), tmp_path / "rel", schedule=schedule, probe_tokens=3)
    entry = manifest["entries"][0]
    assert entry["num_tokens"] > 2 * tiny.SLIDING_WINDOW  # the prefix is longer than the sliding window

    grafted = _logits_after(lm, graft.load_cache(verified(tmp_path / "rel", SignatureNotChecked()), "long", lm))
    fresh_cache, _ = runtime.prefill(lm, entry["token_ids"], schedule)
    fresh = _logits_after(lm, fresh_cache)
    assert torch.equal(grafted, fresh)


def test_graft_run_stops_at_any_of_several_eos_ids(tiny_lm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One EOS rule (runtime.eos_ids): `kvgraft run` stops at any EOS id of a tokenizer that names several."""
    lm = tiny_lm("llama")
    capture.capture(lm, _long_record(lm), tmp_path / "rel", probe_tokens=0)
    free = graft.run(verified(tmp_path / "rel", SignatureNotChecked()), "long", lm, SUFFIX, max_new_tokens=6).token_ids
    stop = free[2]
    # the class attribute shadows the tokenizer's own lookup of its special-token ids for this test only
    monkeypatch.setattr(type(lm.tokenizer), "eos_token_id", property(lambda self: [10**6, stop]), raising=False)
    assert runtime.eos_ids(lm) == [10**6, stop]
    stopped = graft.run(verified(tmp_path / "rel", SignatureNotChecked()), "long", lm, SUFFIX, max_new_tokens=6).token_ids
    assert stopped == free[:free.index(stop) + 1]


def test_layer_map_records_sliding_and_shared(tiny_lm: Any, tmp_path: Path) -> None:
    lm = tiny_lm("gemma4")
    manifest = capture.capture(lm, _long_record(lm), tmp_path / "rel", probe_tokens=0)
    entry = manifest["entries"][0]
    n = entry["num_tokens"]
    kinds = [layer["kind"] for layer in entry["layers"]]
    assert kinds == ["sliding", "full", "sliding", "full", "shared", "shared"]
    sliding = entry["layers"][0]
    assert sliding["positions"] == [n - (tiny.SLIDING_WINDOW - 1), n]
    assert sliding["cumulative_length"] == n
    assert entry["tensors"][sliding["keys"]]["shape"][2] == tiny.SLIDING_WINDOW - 1
    # KV-shared layers store nothing and name the layer of their type that produces their states.
    assert entry["layers"][4] == {"index": 4, "kind": "shared", "shared_with": 2}
    assert entry["layers"][5] == {"index": 5, "kind": "shared", "shared_with": 3}
    assert not any(name.startswith(("layer.4.", "layer.5.")) for name in entry["tensors"])


def test_forgetting_cumulative_length_is_caught(tiny_lm: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The exactness check can fail: a restore that drops a sliding layer's length changes the logits."""
    lm = tiny_lm("gemma3")
    manifest = capture.capture(lm, _long_record(lm), tmp_path / "rel", probe_tokens=0)
    entry = manifest["entries"][0]
    rel = verified(tmp_path / "rel", SignatureNotChecked())
    tensors, _ = graft.read_entry_tensors(rel, rel.release.entry("long"))
    broken = {**entry, "layers": [{**m, "cumulative_length": 0} if m["kind"] == "sliding" else m
                                  for m in entry["layers"]]}
    fresh_cache, _ = runtime.prefill(lm, entry["token_ids"], Schedule())
    fresh = _logits_after(lm, fresh_cache)
    try:
        bad = _logits_after(lm, graft.build_cache(lm, broken, tensors, "test"))
    except (RuntimeError, IntegrityError) as exc:
        # a shape error is also a caught fault; silent equality is what must not happen. The graft
        # now refuses the record itself: its positions say the window ends at a position it has not seen.
        assert not isinstance(exc, IntegrityError) or "stores its window" in str(exc)
        return
    assert not torch.equal(bad, fresh)


def test_smollm2_graft_is_bit_identical(smollm2: Any, records: list[tuple[str, dict[str, Any]]], tmp_path: Path) -> None:
    lm = smollm2
    manifest = capture.capture(lm, records, tmp_path / "rel", probe_tokens=4)
    for entry in manifest["entries"]:
        grafted = _logits_after(lm, graft.load_cache(verified(tmp_path / "rel", SignatureNotChecked()), entry["id"], lm))
        fresh_cache, fresh_next = runtime.prefill(lm, entry["token_ids"], Schedule())
        assert torch.equal(grafted, _logits_after(lm, fresh_cache)), entry["id"]
        assert entry["next_token"]["argmax"] == int(torch.argmax(fresh_next))
