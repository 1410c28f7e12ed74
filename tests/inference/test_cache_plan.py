"""runtime.new_cache builds the cache from a per-model plan instead of asking transformers each time;
it must build exactly what `DynamicCache(config=...)` builds, for every family."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch

from kvgraft.inference.runtime import Schedule, new_cache, prefill

from tiny import FAMILIES


def _state(obj: Any) -> dict[str, Any]:
    return {k: (v.tolist() if isinstance(v, torch.Tensor) else v) for k, v in vars(obj).items() if k != "layers"}


@pytest.mark.parametrize("family", FAMILIES)
def test_new_cache_matches_transformers(family: str, tiny_lm: Callable[[str], Any]) -> None:
    from transformers import DynamicCache

    lm = tiny_lm(family)
    ours, theirs = new_cache(lm), DynamicCache(config=lm.model.config)
    assert type(ours) is type(theirs)
    assert _state(ours) == _state(theirs)
    assert [type(layer) for layer in ours.layers] == [type(layer) for layer in theirs.layers]
    assert [_state(a) for a in ours.layers] == [_state(b) for b in theirs.layers]
    # Two caches never share a layer (the plan is shared, the layers are not).
    assert not {id(layer) for layer in ours.layers} & {id(layer) for layer in new_cache(lm).layers}


def test_new_cache_fills_like_transformers(tiny_lm: Callable[[str], Any]) -> None:
    from transformers import DynamicCache

    lm = tiny_lm("gemma3")
    ids = list(range(3, 3 + 20))
    ours, _ = prefill(lm, ids, Schedule())
    theirs, _ = prefill(lm, ids, Schedule(), DynamicCache(config=lm.model.config))
    for a, b in zip(ours.layers, theirs.layers, strict=True):
        assert torch.equal(a.keys, b.keys) and torch.equal(a.values, b.values)
        assert _state(a).keys() == _state(b).keys()


@pytest.mark.parametrize("family", FAMILIES)
def test_grafted_layers_have_prefilled_state(family: str, tiny_lm: Callable[[str], Any], tmp_path: Any) -> None:
    """build_cache sets layer state by hand; every attribute must equal what a prefill leaves."""
    from kvgraft.inference import capture, graft
    from kvgraft.signing.policy import SignatureNotChecked
    from kvgraft.signing.verify import verified

    lm = tiny_lm(family)
    capture.capture(lm, [("t", {"id": "e", "text": "one two three four five six seven eight nine ten eleven twelve"})],
                    tmp_path / "rel", probe_tokens=0)
    rel = verified(tmp_path / "rel", SignatureNotChecked())
    entry = rel.release.entry("e")
    grafted = graft.restore(rel, "e", lm).cache
    fresh, _ = prefill(lm, entry["token_ids"], Schedule())
    assert len(grafted.layers) == len(fresh.layers)
    for a, b in zip(grafted.layers, fresh.layers, strict=True):
        assert type(a) is type(b)
        sa, sb = _state(a), _state(b)
        assert sa == sb, type(a).__name__
