"""The recompute audit of a prefix graft: its rows against their own schedule and against the prefix alone.

A prefix graft of n tokens (kvgraft.graft.restore_prefix, the vLLM connector) is rows [0, n) of the
entry's recorded prefill of all T tokens. Kernel blocking can depend on T (bench/prefix_schedule.py
measures it), so the audit judges those rows twice, on this machine, under the recorded conditions:

- under the schedule that made them: rows [0, n) of a fresh prefill of the T tokens, bit for bit;
  this is the graft's claim, and the verdict ("byte-exact" or "differs");
- against a fresh prefill of the n tokens alone: what a reader might assume a prefix graft is;
  recorded ("byte-identical" or the size of the difference), not a failure.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from kvgraft import replay
from kvgraft.compare import diff_tensors
from kvgraft.graft import check_model, prefix_entry, read_entry_tensors
from kvgraft.models import LoadedModel
from kvgraft.release.format import Release
from kvgraft.runtime import Schedule, every_position_layers, layer_map, new_cache, prefill
from kvgraft.verify import VerifyPolicy, verified


def _compare(rows: dict[str, torch.Tensor], fresh: dict[str, torch.Tensor], n: int) -> dict[str, Any]:
    first: str | None = None
    worst, differing = 0.0, 0
    for name in sorted(rows, key=lambda s: (int(s.split(".")[1]), s)):
        d = diff_tensors(rows[name].contiguous(), fresh[name][:, :, :n, :].contiguous())
        if not d.equal:
            first = first or name
            worst = max(worst, d.max_abs)
            differing += d.differing
    return {"byte_exact": first is None, "first_differing_tensor": first, "max_abs_diff": worst,
            "differing_elements": differing}


def audit_prefix(release: Release | Path | str, entry_id: str, n: int, lm: LoadedModel, *, force: bool = False,
                 policy: VerifyPolicy | None = None) -> dict[str, Any]:
    """Judge a graft of entry `entry_id`'s first n tokens (module docstring)."""
    rel = verified(release, policy)
    forced = check_model(rel, lm, force=force)
    entry = rel.entry(entry_id)
    stored, _ = read_entry_tensors(rel, entry)
    _, rows = prefix_entry(entry, stored, n, str(rel.root))
    schedule = Schedule.from_dict(rel.manifest["schedule"])
    ids = list(entry["token_ids"])
    every = every_position_layers(entry)  # sliding layers stored in full are recomputed in full
    with replay.applied(lm, rel.manifest["environment"], {}), torch.no_grad():
        whole, _ = prefill(lm, ids, schedule, new_cache(lm, every))
        _, fresh_whole = layer_map(lm, whole)
        alone, _ = prefill(lm, ids[:n], schedule, new_cache(lm, every))
        _, fresh_alone = layer_map(lm, alone)
    recorded = _compare(rows, fresh_whole, n)
    against_alone = _compare(rows, fresh_alone, n)
    how = "one-shot" if schedule.chunk_tokens is None else f"chunked ({schedule.chunk_tokens} tokens)"
    return {
        "entry": entry_id, "tokens": n, "of": entry["num_tokens"], "forced_model": forced,
        "schedule": f"rows [0, {n}) of a {how} prefill of all {entry['num_tokens']} tokens",
        "verdict": "byte-exact" if recorded["byte_exact"] else "differs",
        "under_recorded_schedule": recorded,
        "against_prefix_alone": against_alone,
    }
