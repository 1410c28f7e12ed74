"""Sliding-window layers stored as their window or with every position.

Tiny Gemma 3 (sliding and full layers) and Gemma 4 (sliding, full and KV-shared layers), window 8:
each layout is captured, recorded per layer (`stores`), grafted, and recomputed byte-exact on this
machine; a value planted in a sliding layer's stored tail is found by the recompute audit, and one
planted before the window (stored only by the "all" layout, never grafted) is found too.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import VerifiedRelease, verified

import rewrite

FAMILIES = ("gemma3", "gemma4")
LAYOUTS = ("window", "all")
TEXT = " ".join(f"w{i}" for i in range(40))


def _capture(lm: Any, out: Path, layout: str) -> VerifiedRelease:
    from kvgraft.inference import capture

    capture.capture(lm, [("t", {"id": "g", "text": TEXT})], out, probe_tokens=2, sliding=layout)
    return verified(out, SignatureNotChecked())


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_capture_graft_and_recompute_each_layout(tiny_lm: Any, tmp_path: Path, family: str, layout: str) -> None:
    import torch

    from kvgraft.inference import graft
    from kvgraft.inference.runtime import Schedule, layer_map, prefill
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm(family)
    rel = _capture(lm, tmp_path / "rel", layout)
    entry = rel.release.entry("g")
    n = entry["num_tokens"]
    sliding = [m for m in entry["layers"] if m["kind"] == "sliding"]
    assert n > 2 * sliding[0]["sliding_window"] and len(sliding) >= 2
    if family == "gemma4":
        assert any(m["kind"] == "shared" for m in entry["layers"])
    held = {m["index"]: entry["tensors"][m["keys"]]["shape"][2] for m in sliding}
    for m in sliding:
        assert m["stores"] == layout and m["cumulative_length"] == n
        want = [0, n] if layout == "all" else [n - m["sliding_window"] + 1, n]
        assert m["positions"] == want and held[m["index"]] == want[1] - want[0]

    # The graft holds what a fresh prefill's cache holds (sliding layers: their window), bit for bit.
    grafted = graft.restore(rel, "g", lm).cache
    with torch.no_grad():
        fresh, _ = prefill(lm, entry["token_ids"], Schedule())
    _, want_t = layer_map(lm, fresh)
    _, got_t = layer_map(lm, grafted)
    assert want_t.keys() == got_t.keys()
    for name in want_t:
        assert torch.equal(got_t[name], want_t[name]), name

    result = recompute.audit(rel, lm)
    (e,) = result["entries"]
    assert result["verdict"] == "byte-exact" and e["byte_exact"] and e["tensors_equal"] == e["tensors"]
    assert e["matched"]["logits_equal"] and e["next_token_logits_equal"]


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_planted_difference_in_a_sliding_tail_is_found(tiny_lm: Any, tmp_path: Path, family: str,
                                                        layout: str) -> None:
    """Positive control: the last stored position of a sliding layer, altered and every digest rewritten."""
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm(family)
    rel = _capture(lm, tmp_path / "rel", layout)
    entry = rel.release.entry("g")
    meta = next(m for m in entry["layers"] if m["kind"] == "sliding" and m["index"] > 0)
    shape = entry["tensors"][meta["values"]]["shape"]
    rewrite.element(tmp_path / "rel", 0, meta["values"], rewrite.flat_index(shape, 1, shape[2] - 1, 3),
                    lambda x: x + 0.5)
    result = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm)
    (e,) = result["entries"]
    assert result["verdict"] == "inconsistent" and not e["byte_exact"]
    first = e["first_difference"]
    assert first["layer"] == meta["index"] and first["tensor"] == "values"
    assert first["named"] == {"batch": 0, "head": 1, "position": entry["num_tokens"] - 1, "dim": 3}


@pytest.mark.parametrize("family", FAMILIES)
def test_a_stored_position_before_the_window_is_audited(tiny_lm: Any, tmp_path: Path, family: str) -> None:
    """Layout "all": position 0 of a sliding layer is never grafted (the graft keeps the window) but is
    stored and signed; the audit compares it, so a value planted there is found."""
    import torch

    from kvgraft.inference import graft
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm(family)
    rel = _capture(lm, tmp_path / "rel", "all")
    before = graft.restore(rel, "g", lm).cache
    entry = rel.release.entry("g")
    meta = next(m for m in entry["layers"] if m["kind"] == "sliding")
    shape = entry["tensors"][meta["keys"]]["shape"]
    rewrite.element(tmp_path / "rel", 0, meta["keys"], rewrite.flat_index(shape, 0, 0, 0), lambda x: x + 0.5)
    after = graft.restore(verified(tmp_path / "rel", SignatureNotChecked()), "g", lm).cache
    assert torch.equal(after.layers[meta["index"]].keys, before.layers[meta["index"]].keys)  # not grafted
    (e,) = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm)["entries"]
    assert not e["byte_exact"] and e["first_difference"]["layer"] == meta["index"]
    assert e["first_difference"]["named"]["position"] == 0


def test_capture_refuses_an_unknown_layout(tiny_lm: Any, tmp_path: Path) -> None:
    from kvgraft.errors import InputError
    from kvgraft.inference import capture

    with pytest.raises(InputError, match="--sliding-layers some: expected one of window, all"):
        capture.capture(tiny_lm("gemma3"), [("t", {"id": "g", "text": TEXT})], tmp_path / "x", sliding="some")
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("family", FAMILIES)
def test_chunked_capture_of_every_position(tiny_lm: Any, tmp_path: Path, family: str) -> None:
    """Chunks of 5 tokens (the window is 8): the layer that keeps every position concatenates each
    chunk's rows; the stored window is the window layout's, byte for byte, and the audit is byte-exact."""
    from kvgraft.inference import capture
    from kvgraft.inference.graft import read_entry_tensors
    from kvgraft.inference.runtime import Schedule
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm(family)
    rels = {}
    for layout in LAYOUTS:
        capture.capture(lm, [("t", {"id": "g", "text": TEXT})], tmp_path / layout, probe_tokens=0, sliding=layout,
                        schedule=Schedule(chunk_tokens=5))
        rels[layout] = verified(tmp_path / layout, SignatureNotChecked())
    every, _ = read_entry_tensors(rels["all"], rels["all"].release.entry("g"))
    window, _ = read_entry_tensors(rels["window"], rels["window"].release.entry("g"))
    for m in rels["window"].release.entry("g")["layers"]:
        if m["kind"] == "sliding":
            keep = window[m["keys"]].shape[-2]
            assert every[m["keys"]][:, :, -keep:, :].contiguous().numpy().tobytes() == window[m["keys"]].numpy().tobytes()
    assert recompute.audit(rels["all"], lm)["verdict"] == "byte-exact"
