"""Recompute one entry of the committed reference manifest and compare with its hashes."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from kvgraft import recompute

REFERENCE = Path(__file__).resolve().parents[1] / "manifests" / "smollm2-135m-example" / "manifest.json"


def test_reference_manifest_recomputes_bit_for_bit(smollm2: Any) -> None:
    manifest = json.loads(REFERENCE.read_text())
    check = recompute.digest_check(manifest, "apples", smollm2)
    assert check["identity_equal"], "the default model's fingerprint differs from the reference manifest's"
    first = check["first"]
    assert first is None, (
        f"KV bytes differ from the reference manifest, first at layer {first['layer']} {first['tensor']} "
        f"({len(check['mismatches'])} tensors differ); conditions that differ (recorded, current): "
        f"{check['differences']}; recorded environment {check['recorded_environment']}; "
        f"current {check['current_environment']}")
    assert check["next_token_logits_equal"]
