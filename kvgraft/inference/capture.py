"""Capture: run each record through the runtime and write its KV states into a new release."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch

from kvgraft._internal.jsonio import read_jsonl
from kvgraft.errors import InputError
from kvgraft.inference.environment import record as environment
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.runtime import Schedule, decode, layer_map, new_cache, prefill, tokenize
from kvgraft.inference.tensors import dtype_name, tensor_sha256
from kvgraft.release.format import ReleaseWriter
from kvgraft.release.models import Draft, Header, Manifest, dtype
from kvgraft.release.records import new_entry
from kvgraft.results.base import JsonObject

SLIDING_LAYOUTS = ("window", "all")


def capture_entry(lm: LoadedModel, rec: JsonObject, schedule: Schedule, probe_tokens: int,
                  where: str, sliding: str = "window") -> tuple[Draft, dict[str, torch.Tensor]]:
    """One record → (entry metadata without file/tensors/digest, tensors). A pure function.

    `sliding`: what sliding-window layers store, their window as transformers keeps it ("window") or
    every position of the prefill ("all", which a prefix graft can cut); recorded per layer (`stores`).
    """
    rid = rec.get("id")
    if not isinstance(rid, str) or not rid:
        raise InputError(f'{where}: record needs a non-empty string "id"')
    ids, source = tokenize(lm, rec, schedule, where)
    every = range(len(new_cache(lm).layers)) if sliding == "all" else ()
    cache, logits = prefill(lm, ids, schedule, new_cache(lm, every))
    layers, tensors = layer_map(lm, cache)
    entry = new_entry(rid, ids, source, layers, {"logits_sha256": tensor_sha256(logits),
                                                 "argmax": int(torch.argmax(logits)), "dtype": dtype(dtype_name(logits))})
    if "answer" in rec:
        answer = rec["answer"]
        if isinstance(answer, bool) or not isinstance(answer, str | int | float | None):
            raise InputError(f'{where}: "answer" must be a string, a number or null, not {type(answer).__name__}')
        entry["answer"] = answer
    if isinstance(meta := rec.get("meta"), dict):
        entry["meta"] = meta
    if probe_tokens > 0:
        # Decoding extends the cache by concatenation; the tensors collected above are not modified.
        entry["probe"] = {"token_ids": decode(lm, cache, logits, max_new_tokens=probe_tokens).token_ids}
    return entry, tensors


def header(lm: LoadedModel, schedule: Schedule, *, forced: bool = False) -> Header:
    cfg = lm.model.config
    env = environment(lm.device, lm.dtype, lm.attn)
    if forced:
        env["forced_model"] = True
    return {
        "model": {"spec": lm.spec, "architecture": (cfg.architectures or [type(lm.model).__name__])[0],
                  "model_type": cfg.model_type, "num_hidden_layers": len(new_cache(lm).layers),
                  "identity": lm.identity.record()},
        "schedule": schedule.as_dict(),
        "environment": env,
    }


def read_records(source: Path) -> list[tuple[str, JsonObject]]:
    records = [(f"{source}:{n}", rec) for n, rec in read_jsonl(source)]
    if not records:
        raise InputError(f"{source}: no records")
    seen: dict[str, str] = {}
    for where, rec in records:
        rid = rec.get("id")
        if isinstance(rid, str) and rid in seen:
            raise InputError(f"{where}: id {rid!r} already used at {seen[rid]}")
        if isinstance(rid, str):
            seen[rid] = where
    return records


def capture(lm: LoadedModel, records: list[tuple[str, JsonObject]], out: Path, *,
            schedule: Schedule = Schedule(), probe_tokens: int = 8, overwrite: bool = False,
            progress: Callable[[int, int], None] | None = None, sliding: str = "window") -> Manifest:
    """Capture every record into a new release at `out`; return its manifest (`sliding`: capture_entry)."""
    if schedule.chunk_tokens is not None and schedule.chunk_tokens < 1:
        raise InputError(f"--chunk {schedule.chunk_tokens}: must be at least 1")
    if sliding not in SLIDING_LAYOUTS:
        raise InputError(f"--sliding-layers {sliding}: expected one of {', '.join(SLIDING_LAYOUTS)}")
    writer = ReleaseWriter(out, overwrite=overwrite)
    try:
        for i, (where, rec) in enumerate(records):
            entry, tensors = capture_entry(lm, rec, schedule, probe_tokens, where, sliding)
            writer.add_entry(entry, tensors)
            if progress:
                progress(i + 1, len(records))
        return writer.finish(header(lm, schedule))
    except BaseException:
        writer.abort()
        raise
