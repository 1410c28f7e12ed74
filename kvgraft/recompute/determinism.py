"""Determinism matrix: one prefix under varied conditions; which give byte-identical KV states?"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from kvgraft._internal.digest import digest_json
from kvgraft.inference import models
from kvgraft.inference.environment import record as environment
from kvgraft.inference.runtime import Schedule, encode, layer_map, padded_batch_row, prefill, threads
from kvgraft.inference.tensors import tensor_sha256
from kvgraft.recompute.compare import distributions
from kvgraft.recompute.compare import max_ulp as ulp_max
from kvgraft.results.determinism import DeterminismResult, MatrixCondition

EXAMPLE = Path(__file__).parents[1] / "data" / "example.jsonl"
PAD = 16


@dataclass(frozen=True)
class Condition:
    name: str
    dtype: str = "float32"
    attn: str = "sdpa"
    device: str = "cpu"
    threads: int = 0  # 0: all cores
    chunk: int | None = None
    batch4: bool = False


def conditions(include_gpu: bool) -> list[Condition]:
    out: list[Condition] = []
    for n in (0, 1):
        t = "all threads" if n == 0 else "1 thread"
        out += [Condition(f"one-shot, {t}", threads=n),
                Condition(f"chunks of 256, {t}", threads=n, chunk=256),
                Condition(f"chunks of 64, {t}", threads=n, chunk=64),
                Condition(f"chunks of 1, {t}", threads=n, chunk=1),
                Condition(f"left-padded batch of 4 (row 0), {t}", threads=n, batch4=True)]
    out += [Condition("eager attention, all threads", attn="eager"),
            Condition("bfloat16, one-shot, all threads", dtype="bfloat16"),
            Condition("bfloat16, chunks of 64, all threads", dtype="bfloat16", chunk=64),
            Condition("bfloat16, chunks of 64, 1 thread", dtype="bfloat16", chunk=64, threads=1)]
    if include_gpu and torch.cuda.is_available():
        out += [Condition("cuda, one-shot", device="cuda"), Condition("cuda, chunks of 64", device="cuda", chunk=64),
                Condition("cuda, bfloat16, one-shot", device="cuda", dtype="bfloat16")]
    return out


def prefix_ids(lm: models.LoadedModel, n: int) -> list[int]:
    """`n` tokens of natural text from the bundled example, repeated as needed."""
    text = " ".join(EXAMPLE.read_text().splitlines())
    ids: list[int] = []
    while len(ids) < n:
        ids += encode(lm, text)
    return ids[:n]


def run_condition(lm: models.LoadedModel, ids: list[int], c: Condition) -> tuple[list[torch.Tensor], torch.Tensor]:
    with threads(c.threads):
        if c.batch4:
            row, logits = padded_batch_row(lm, ids, PAD)
            return [t.cpu() for t in row.values()], logits
        cache, logits = prefill(lm, ids, Schedule(chunk_tokens=c.chunk))
        _, tensors = layer_map(lm, cache)
        return [t.cpu() for t in tensors.values()], logits


def matrix(spec: str, *, length: int = 300, include_gpu: bool = True,
           progress: Callable[[int, int], None] | None = None) -> DeterminismResult:
    conds = conditions(include_gpu)
    loaded: dict[tuple[str, str, str], models.LoadedModel] = {}
    base_kv: list[torch.Tensor] = []
    base_logits = torch.empty(0)
    rows: list[MatrixCondition] = []
    classes: dict[str, str] = {}
    ids: list[int] = []
    for i, c in enumerate(conds):
        key = (c.dtype, c.attn, c.device)
        if key not in loaded:
            loaded[key] = models.load(spec, device=c.device, dtype=c.dtype, attn=c.attn)
        lm = loaded[key]
        if not ids:
            ids = prefix_ids(lm, length)
        kv, logits = run_condition(lm, ids, c)
        digest = digest_json([tensor_sha256(t) for t in kv])
        cls = classes.setdefault(digest, chr(ord("A") + len(classes)))
        if i == 0:
            base_kv, base_logits = kv, logits.cpu()
        same_dtype = kv[0].dtype == base_kv[0].dtype
        max_abs = max(float((a.double() - b.double().cpu()).abs().max()) for a, b in zip(base_kv, kv, strict=True))
        # ULP only between finite same-sign normal numbers (compare.max_ulp): across zero it is no useful figure.
        max_ulp = max(ulp_max(a, b.cpu())[0] for a, b in zip(base_kv, kv, strict=True)) if same_dtype else None
        kl = distributions(base_logits[None], logits.cpu()[None]).kl[0]
        rows.append(MatrixCondition.model_validate({
            "name": c.name, "condition": dataclasses.asdict(c), "kv_digest": digest, "class": cls,
            "identical_to_baseline": cls == "A", "max_ulp": max_ulp, "max_abs": max_abs, "kl": kl}))
        if progress:
            progress(i + 1, len(conds))
    env = environment("cpu", "float32", "sdpa")
    odd = [r.name for r in rows if r.identical_to_baseline and r.kl != 0.0]
    notes = [f"{len(classes)} distinct KV byte classes among {len(rows)} conditions; "
             f"class A is the baseline ({rows[0].name}).",
             "KL is KL(baseline ‖ condition) of the next-token distribution after the prefix, in float64.",
             f"Measured on {env['device_name']} with torch {env['torch']}, transformers {env['transformers']}."]
    if odd:
        notes.append("KV bytes identical to the baseline but next-token logits not (the final projection ran "
                     f"with another batch shape): {'; '.join(odd)}.")
    # Unsealed: its status is judged where it becomes a verdict (kvgraft.audit.checks.seal).
    return DeterminismResult(kind="kvgraft-determinism-result", format_version=1, model=spec, length=length,
                             baseline=rows[0].name, environment=env, conditions=rows, notes=notes)
