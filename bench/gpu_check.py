"""GPU check: recompute verdicts on the GPU, a 12B-class model's prefill and audit throughput, graft restore GB/s.

Run through bench/gpu_check.sh (it installs the carried wheels first); by hand:
    python bench/gpu_check.py --out DIR [--work DIR] [--dry-run] [--big gemma3-12b|llama-8b] [--budget S]
        [--library-tokens N] [--library-entry-tokens N] [--library-sample N] [--library-dir DIR]

Every model is built here from a config with seeded random weights (the tiny families of tests/tiny.py
on the CPU, saved to --work; the 12B-class model directly on the device in bfloat16): nothing is
downloaded, and every figure is that of those random weights, named by their identity digest. Random
weights decide neither the verdict machinery nor the throughput; accuracy figures stay with real models.

  (a) tiny families captured on the device and recomputed there (float32, bfloat16): byte-exact? Beside
      it two controls on the same device: one planted element (must be inconsistent) and a benign
      chunked rerun (must not be);
  (b) the same captured on the device machine's CPU, recomputed on the GPU (float32 with TF32 off, on;
      bfloat16): verdict and max share of the envelope (|diff| / allowed; over 1 is outside);
  (c) the 12B-class model at each --lengths: prefill tokens/s, recompute-audit tokens/s (the whole
      `recompute.audit`: verify, prefill, compare, probe, graft, natural contrast), and the projected
      time to audit the preprint's library in full and by a sample bounding failing entries at 1%;
  (d) graft restore (read + SHA-256 + copy to the device) GB/s against this machine's SHA-256 limit;
  (e) one sampled audit of a library of the 12B-class model: >= --library-tokens (200,000) tokens in
      entries of --library-entry-tokens (4,096) captured on the device by the project's writer (into
      /dev/shm when it has room, else --work), then `recompute.audit(sample=n)` with a fresh nonce
      (kvgraft.sampling's draw and exact hypergeometric bound, as `kvgraft audit recompute --sample`),
      recomputing only the n sampled entries; the sample re-derived from the root and the nonce; a
      positive control (one element of the first sampled entry changed, commitments rewritten, that
      entry audited alone: must fail `--require exact`). n: --library-sample (16), fewer when the
      budget (estimated from (c)'s measured capture and audit rates) leaves less, said so.

Writes gpu_check.md (tables for bench/RESULTS.md) and gpu_check.json to --out after every part, so a
run cut short keeps what it measured; each part starts only if --budget seconds leave time for it.
Exit 1 if any step raised (each is recorded and the run goes on), else 0. --dry-run: the same steps
on the CPU with tiny models and short lengths, (e) with a 4,096-token library of 128-token entries and
a sample of 8 (what tests/bench/test_gpu_check.py runs).
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import hashlib
import importlib.metadata as md
import json
import math
import os
import platform
import shutil
import statistics
import struct
import sys
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny.py: the tiny random model families the tests use

import torch  # noqa: E402
from graft_vs_recompute import hash_in_memory  # noqa: E402

from kvgraft import sampling  # noqa: E402
from kvgraft._internal.cores import cores  # noqa: E402
from kvgraft.inference import capture, graft, models, runtime  # noqa: E402
from kvgraft.inference.environment import cpu_name  # noqa: E402
from kvgraft.recompute import audit as recompute  # noqa: E402
from kvgraft.recompute.determinism import prefix_ids  # noqa: E402
from kvgraft.release import hashing  # noqa: E402
from kvgraft.release.format import Release  # noqa: E402
from kvgraft.signing.verify import verified  # noqa: E402

import rewrite  # noqa: E402  # tests/rewrite.py: change stored bytes and every commitment over them
import tiny  # noqa: E402

CLAIMS = ROOT / "audit" / "claims" / "kv-grafting-preprint.toml"
BOUND, CONFIDENCE = 0.01, 0.95
SCHEDULE = runtime.Schedule(add_special_tokens=False)
# (label, dtype, TF32 matmuls) for part (b): CPU captures recomputed on the device.
CPU_TO_DEVICE = (("float32, TF32 off", "float32", False), ("float32, TF32 on", "float32", True),
                 ("bfloat16", "bfloat16", False))


def library_tokens() -> int:
    """The preprint's library size: the `context-stretch` claim's to_tokens (audit/claims)."""
    claims = tomllib.loads(CLAIMS.read_text())["claims"]
    return int(next(c for c in claims if c["id"] == "context-stretch")["to_tokens"])


def big_config(name: str, dry: bool) -> Any:
    """A Gemma-3-12B- or Llama-3-8B-shaped text config (their published sizes); --dry-run: the same layout, tiny."""
    import transformers as tf

    ids = {"pad_token_id": 3, "bos_token_id": 1, "eos_token_id": 2}
    if name == "gemma3-12b":
        size = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=6, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512, sliding_window=32) if dry else
                dict(hidden_size=3840, intermediate_size=15360, num_hidden_layers=48, num_attention_heads=16,
                     num_key_value_heads=8, head_dim=256, vocab_size=262208, sliding_window=1024))
        layers = int(size["num_hidden_layers"])
        types = ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(layers)]
        return tf.Gemma3TextConfig(**size, layer_types=types, query_pre_attn_scalar=size["head_dim"],
                                   max_position_embeddings=131072, **ids)
    if name == "llama-8b":
        size = (dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                     num_key_value_heads=2, head_dim=16, vocab_size=512) if dry else
                dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
                     num_key_value_heads=8, head_dim=128, vocab_size=128256))
        return tf.LlamaConfig(**size, max_position_embeddings=131072, rope_theta=500000.0, **ids)
    raise SystemExit(f"--big {name}: expected gemma3-12b or llama-8b")


class Budget:
    """Seconds left of the run; a part starts only when its estimate fits."""

    def __init__(self, seconds: float) -> None:
        self.start = time.monotonic()
        self.seconds = seconds

    def elapsed(self) -> float:
        return time.monotonic() - self.start

    def fits(self, need: float) -> bool:
        return self.elapsed() + need <= self.seconds

    def skipped(self, what: str, need: float) -> dict[str, Any]:
        return {"skipped": f"{what}: {self.seconds - self.elapsed():.0f} s of the budget left, needs about {need:.0f} s"}


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def timed(fn: Callable[[], Any], device: str) -> tuple[Any, float]:
    sync(device)
    t0 = time.perf_counter()
    out = fn()
    sync(device)
    return out, time.perf_counter() - t0


def error_of(exc: BaseException) -> dict[str, Any]:
    text = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    print(f"ERROR {text}\n{traceback.format_exc()}", file=sys.stderr)
    return {"error": text}


@contextlib.contextmanager
def tf32(on: bool) -> Iterator[None]:
    """float32 matmuls and convolutions in TF32 (on) or full float32 (off), restored afterwards."""
    m, c = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (m.allow_tf32, c.allow_tf32)
    m.allow_tf32 = c.allow_tf32 = on
    try:
        yield
    finally:
        m.allow_tf32, c.allow_tf32 = before


def audit_row(rel: Path, lm: models.LoadedModel, require: str, device: str, **options: Any) -> dict[str, Any]:
    """One `recompute.audit` of a release, summarised; an exception becomes the row's error."""
    try:
        res, secs = timed(lambda: recompute.audit(rel, lm, require=require, **options), device)
    except Exception as exc:  # recorded, and the run goes on: one failure must not cost the lease
        return error_of(exc)
    es = res["entries"]
    return {"verdict": res["verdict"], "byte_exact": sum(e["byte_exact"] for e in es), "entries": len(es),
            "max_excess": max(e["max_excess"] for e in es), "kl_max": max(e["matched"]["kl_max"] for e in es),
            "not_replayed": sorted(res["conditions"]["not_replayed"]), "passed": res["passed"], "seconds": secs,
            "envelope_seconds": sum(e["seconds"]["envelope"] for e in es),
            "tokens": sum(e["num_tokens"] for e in es)}


def tiny_records() -> list[tuple[str, dict[str, Any]]]:
    """The bundled example's text records and a longer one (~290 tokens of the tiny tokenizer: many
    sliding windows of 8, inside GPT-2's 512 positions)."""
    lines = (ROOT / "kvgraft" / "data" / "example.jsonl").read_text().splitlines()
    recs = [json.loads(line) for line in lines if line.strip()]
    texts = [r for r in recs if isinstance(r.get("text"), str)]
    long_text = " ".join(r["text"] for r in texts)
    return [(f"example:{i}", r) for i, r in enumerate(texts)] + [("long", {"id": "long", "text": long_text})]


def controls(family: str, rel: Path, lm: models.LoadedModel, device: str) -> list[dict[str, Any]]:
    """Beside (a)'s byte-exact: a planted change must come out inconsistent, a benign rerun consistent.

    planted: one element of the last entry's layer-1 keys (middle stored position, head 0, dim 0)
    moved by 1e-2 of its size, every commitment rewritten, so only a recompute can tell; benign: the
    same release recomputed in chunks of 16 instead of one shot (other kernels, same computation).
    """
    base = {"family": family, "part": "control", "captured": f"{device} float32"}
    planted = rel.with_name(rel.name + "-planted")
    try:
        shutil.copytree(rel, planted)
        entries = Release.open(planted).entries  # format 2: the records live in the index, not manifest.json
        shape = entries[-1]["tensors"]["layer.1.keys"]["shape"]
        index = rewrite.flat_index(shape, 0, shape[2] // 2, 0)
        rewrite.element(planted, len(entries) - 1, "layer.1.keys", index, lambda v: v + 1e-2 * max(abs(v), 1e-3))
        row = audit_row(planted, lm, "consistent", device)
    except Exception as exc:
        row = error_of(exc)
    rows = [{**base, "recomputed": f"{device} float32; planted: 1 element + 1e-2 of its size", "expect": "inconsistent", **row}]
    schedule = runtime.Schedule.from_dict({**json.loads((rel / "manifest.json").read_text())["schedule"], "chunk_tokens": 16})
    rows.append({**base, "recomputed": f"{device} float32; benign: chunks of 16", "expect": "consistent or byte-exact",
                 **audit_row(rel, lm, "consistent", device, schedule=schedule)})
    return rows


def part_tiny(args: argparse.Namespace, device: str, budget: Budget, rows: list[dict[str, Any]],
              written: Callable[[], None]) -> None:
    """(a) and (b) for each tiny family, while the 12B-class part's estimate still fits after it."""
    records = tiny_records()
    for family in tiny.FAMILIES:
        if not budget.fits(args.tiny_estimate + args.big_reserve):
            rows.append({"family": family, **budget.skipped(f"tiny {family}", args.tiny_estimate)})
            continue
        folder = args.work / "tiny" / family
        try:
            tiny.build(family, folder, seed=args.seed)
        except Exception as exc:
            rows.append({"family": family, "part": "build", **error_of(exc)})
            continue
        cpu_releases: dict[str, Path] = {}
        for dtype in ("float32", "bfloat16"):
            for where in dict.fromkeys((device, "cpu")):  # (a) on the device; the CPU captures for (b)
                rel = args.work / "releases" / f"{family}-{where}-{dtype}"
                try:
                    lm = models.load(str(folder), device=where, dtype=dtype)
                    capture.capture(lm, records, rel, probe_tokens=4)
                except Exception as exc:
                    rows.append({"family": family, "part": "capture", "captured": f"{where} {dtype}", **error_of(exc)})
                    continue
                if where == "cpu":
                    cpu_releases[dtype] = rel
                if where == device:
                    rows.append({"family": family, "part": "a", "captured": f"{where} {dtype}",
                                 "recomputed": f"{device} {dtype}", "identity": lm.identity.sha256,
                                 **audit_row(rel, lm, "exact", device)})
                    if dtype == "float32":
                        rows += [{**r, "identity": lm.identity.sha256} for r in controls(family, rel, lm, device)]
        for label, dtype, on in CPU_TO_DEVICE:
            if dtype not in cpu_releases:
                continue
            try:
                lm = models.load(str(folder), device=device, dtype=dtype)
            except Exception as exc:
                rows.append({"family": family, "part": "b", "recomputed": f"{device} {label}", **error_of(exc)})
                continue
            with tf32(on):
                rows.append({"family": family, "part": "b", "captured": f"cpu {dtype}", "recomputed": f"{device} {label}",
                             "identity": lm.identity.sha256, **audit_row(cpu_releases[dtype], lm, "consistent", device)})
        done = [r for r in rows if r["family"] == family]
        print(f"[{budget.elapsed():.0f} s] tiny {family}: " + "; ".join(
            f"{r.get('part')} {r.get('recomputed', '')} {r.get('verdict', r.get('error'))}" for r in done))
        written()


def build_big(args: argparse.Namespace, device: str) -> tuple[models.LoadedModel, dict[str, Any]]:
    """The 12B-class model: random bfloat16 weights drawn on the device from a fixed seed."""
    from transformers import AutoModelForCausalLM

    cfg = big_config(args.big, args.dry_run)
    tok = tiny.tokenizer(args.work / "big-tokenizer")  # token ids below 300 of the model's vocabulary
    torch.manual_seed(args.seed)

    def make() -> Any:
        with torch.device(device):
            return AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16, attn_implementation="sdpa")

    model, build_s = timed(make, device)
    if next(model.parameters()).device.type != device:
        model.to(device)
    lm = models.wrap(model, tok, f"random {args.big} (seed {args.seed})")
    ident, ident_s = timed(lambda: lm.identity, device)
    params = sum(p.numel() for p in model.parameters())
    info = {"name": args.big, "class": type(model).__name__, "parameters": params,
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "layers": cfg.num_hidden_layers, "identity": ident.sha256, "build_seconds": build_s,
            "identity_seconds": ident_s, "seed": args.seed}
    print(f"[built] {info['class']} {params / 1e9:.2f} B parameters in {build_s:.1f} s; identity "
          f"{ident.sha256[:16]}… in {ident_s:.1f} s")
    return lm, info


def hash_limit(nbytes: int) -> dict[str, float]:
    """This machine's SHA-256 rate: one core (hashlib, in memory) times the cores kvgraft hashes on."""
    block = os.urandom(min(nbytes, 256 << 20))
    rates = []
    for _ in range(3):
        t0 = time.perf_counter()
        hashlib.sha256(block).digest()
        rates.append(len(block) / (time.perf_counter() - t0))
    one = statistics.median(rates)
    return {"one_core_gbps": one / 1e9, "cores": cores(), "limit_gbps": one * cores() / 1e9}


def part_big(args: argparse.Namespace, device: str, budget: Budget, lm: models.LoadedModel,
             rows: list[dict[str, Any]], written: Callable[[], None]) -> None:
    """(c) and (d) at each length: capture, prefill, audit, restore; each row appended, then `written()`."""
    runtime.prefill(lm, prefix_ids(lm, 128), SCHEDULE)  # kernels, handles, allocator: out of every timing
    for length in args.lengths:
        need = args.big_estimate * length / max(args.lengths)
        if not budget.fits(need):
            rows.append({"length": length, **budget.skipped(f"{length} tokens", need)})
            continue
        row: dict[str, Any] = {"length": length}
        try:
            rel_dir = args.work / "releases" / f"big-{length}"
            text = lm.tokenizer.decode(prefix_ids(lm, length))
            _, row["capture_seconds"] = timed(lambda: capture.capture(
                lm, [("big", {"id": f"p{length}", "text": text})], rel_dir, schedule=SCHEDULE, probe_tokens=4), device)  # noqa: B023
            rel = verified(Release.open(rel_dir)).release
            entry = rel.entries[0]
            row["tokens"] = n = entry["num_tokens"]
            prefills = [timed(lambda: runtime.prefill(lm, entry["token_ids"], SCHEDULE), device)[1]  # noqa: B023
                        for _ in range(3)]
            row["prefill_seconds"] = prefills
            row["prefill_tokens_per_s"] = n / statistics.median(prefills)
            audits = []
            for _ in range(2):
                audit = audit_row(rel_dir, lm, "exact", device)
                if "error" in audit:
                    row.update(audit)
                    break
                audits.append(audit)
            if audits:
                row["audit"] = audits[-1]
                row["audit_seconds"] = [a["seconds"] for a in audits]
                row["audit_tokens_per_s"] = n / statistics.median(row["audit_seconds"])
            restores = []
            for _ in range(5):
                restored, secs = timed(lambda: graft.restore(rel, entry["id"], lm), device)  # noqa: B023
                row["kv_bytes"] = restored.kv_bytes
                del restored
                restores.append(secs)
            row["restore_seconds"] = restores
            row["restore_gbps"] = row["kv_bytes"] / statistics.median(restores) / 1e9
            ranges = sorted(tuple(t["byte_range"]) for t in entry["tensors"].values())
            dest = bytearray(row["kv_bytes"])
            path = rel.entry_file(entry)
            read_hash = [timed(lambda: hashing.read_and_hash(path, ranges, memoryview(dest)), "cpu")[1]  # noqa: B023
                         for _ in range(3)]
            all_cores = [timed(lambda: hash_in_memory(memoryview(dest), ranges), "cpu")[1] for _ in range(3)]  # noqa: B023
            row["read_hash_gbps"] = row["kv_bytes"] / statistics.median(read_hash) / 1e9
            row["all_cores_hash_gbps"] = row["kv_bytes"] / statistics.median(all_cores) / 1e9
            row.update(hash_limit(row["kv_bytes"]))
        except Exception as exc:
            row.update(error_of(exc))
        rows.append(row)
        written()
        print(f"[{budget.elapsed():.0f} s] {args.big} at {length} tokens: " +
              ", ".join(f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float)))


def kv_entry_bytes(cfg: Any, tokens: int, element_bytes: int = 2) -> int:
    """Stored KV bytes of one entry of `tokens` tokens: full layers keep every position, sliding ones at
    most their window (transformers keeps sliding_window - 1; counted as sliding_window, a bound)."""
    types = getattr(cfg, "layer_types", None) or ["full_attention"] * cfg.num_hidden_layers
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    per_position = 2 * cfg.num_key_value_heads * head_dim * element_bytes  # keys and values
    window = getattr(cfg, "sliding_window", None) or tokens
    return sum(per_position * (min(tokens, window) if t == "sliding_attention" else tokens) for t in types)


def library_records(lm: models.LoadedModel, total: int, entry_tokens: int) -> tuple[list[tuple[str, dict[str, Any]]], int]:
    """Distinct records of about `entry_tokens` tokens each (the bundled example's text, rotated by a
    different offset per entry, after "Entry i."), as many as make at least `total` tokens; and their tokens."""
    base = prefix_ids(lm, 2 * entry_tokens)
    records: list[tuple[str, dict[str, Any]]] = []
    tokens = 0
    while tokens < total:
        i = len(records)
        shift = (97 * i) % entry_tokens
        text = f"Entry {i}. " + lm.tokenizer.decode(base[shift:shift + entry_tokens - 8])
        records.append((f"library:{i}", {"id": f"lib{i:05d}", "text": text}))
        tokens += len(runtime.encode(lm, text, add_special_tokens=SCHEDULE.add_special_tokens))
    return records, tokens


def library_folder(args: argparse.Namespace, need: int) -> tuple[Path | None, dict[str, Any]]:
    """Where the library goes: --library-dir, else /dev/shm when it has room (memory-backed: no write-back
    of tens of GB at the writer's sync), else --work; None when none has `need` bytes free (+ 10%, + 1 GB)."""
    candidates = [args.library_dir] if args.library_dir else [Path("/dev/shm"), args.work]
    seen = []
    for c in candidates:
        try:
            free = shutil.disk_usage(c).free
        except OSError:
            continue
        kind = fs_type(c)
        if kind == "tmpfs":  # memory-backed: the process needs the rest (16 GB kept for it)
            free = min(free, max(0, mem_available() - int(16e9)))
        seen.append(f"{c}: {free / 1e9:.1f} GB free{' (tmpfs: memory available less 16 GB)' if kind == 'tmpfs' else ''}")
        if free >= need * 1.1 + 1e9:
            return c / "kvgraft-gpu-check-library", {"folder": str(c), "free_bytes": free, "filesystem": kind}
    return None, {"no_room": f"{need / 1e9:.1f} GB (+ 10%, + 1 GB) needed; " + "; ".join(seen)}


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when unreadable)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fs_type(path: Path) -> str:
    """The file system `path` lies on (/proc/mounts: the longest mount point above it), or ''."""
    best, kind = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path.resolve()).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, kind = parts[1], parts[2]
    return kind


def plant(rel: Path, position: int, tensor: str) -> dict[str, Any]:
    """One element (head 0, middle stored position, dim 0) of `tensor` in the entry at `position` set to
    v + max(|v|, 1), every commitment rewritten (tests/rewrite.py): only a recompute can tell."""
    entry = Release.open(rel).entries[position]
    t = entry["tensors"][tensor]
    size = {"float32": 4, "bfloat16": 2, "BF16": 2, "F32": 4}[t["dtype"]]
    start, end = t["byte_range"]
    with open(rel / entry["file"], "rb") as f:
        f.seek(start)
        raw = bytearray(f.read(end - start))
    at = rewrite.flat_index(t["shape"], 0, t["shape"][2] // 2, 0) * size
    old = struct.unpack("<f", raw[at:at + 4] if size == 4 else b"\0\0" + raw[at:at + 2])[0]
    new = struct.pack("<f", old + max(abs(old), 1.0))
    raw[at:at + size] = new if size == 4 else new[2:]  # bfloat16: the upper half of the float32
    rewrite.tensors(rel, position, {tensor: bytes(raw)})
    return {"entry": entry["id"], "tensor": tensor, "element": at // size, "old": old,
            "new": struct.unpack("<f", new if size == 4 else b"\0\0" + new[2:])[0]}


def library_estimates(args: argparse.Namespace, lengths: list[dict[str, Any]], entry_bytes: int,
                      entries: int) -> dict[str, Any]:
    """Seconds the library part needs, from (c)'s measured capture and audit rates (its longest measured
    length), else from --library-estimate: capture, one sampled entry's audit, the planted control."""
    measured = [r for r in lengths if r.get("capture_seconds") and r.get("audit_tokens_per_s") and r.get("kv_bytes")]
    if not measured:
        return {"from": "--library-estimate (no measured rate)", "capture": args.library_estimate * 0.6,
                "entry_audit": args.library_estimate * 0.2 / max(1, args.library_sample),
                "control": args.library_estimate * 0.2}
    r = max(measured, key=lambda r: r["tokens"])
    capture_s = 1.5 * r["capture_seconds"] * entry_bytes * entries / r["kv_bytes"]
    entry_s = 1.5 * args.library_entry_tokens / r["audit_tokens_per_s"]
    # The control's audit also measures the envelope (about 4 more prefills) and rewrites one entry file.
    return {"from": f"(c) at {r['tokens']} tokens, x1.5", "capture": capture_s, "entry_audit": entry_s,
            "control": 5 * entry_s + 2 * entry_bytes / 0.5e9}


def part_library(args: argparse.Namespace, device: str, budget: Budget, lm: models.LoadedModel,
                 lengths: list[dict[str, Any]], out: dict[str, Any], written: Callable[[], None]) -> None:
    """(e) a library of >= --library-tokens tokens captured on the device, then one sampled audit of it
    (recompute.audit(sample=n): a fresh nonce, kvgraft.sampling's draw and bound), the sample re-derived
    from the root and nonce, and a positive control: one planted element in a sampled entry, audited alone."""
    records, tokens = library_records(lm, args.library_tokens, args.library_entry_tokens)
    entry_bytes = kv_entry_bytes(lm.model.config.get_text_config(), args.library_entry_tokens)
    need_bytes = entry_bytes * len(records)
    out.update({"target_tokens": args.library_tokens, "entry_tokens": args.library_entry_tokens,
                "entries": len(records), "tokens": tokens, "estimated_bytes": need_bytes,
                "requested_sample": args.library_sample})
    est = library_estimates(args, lengths, entry_bytes, len(records))
    out["estimate"] = est
    minimum = est["capture"] + args.library_min_sample * est["entry_audit"]
    if not budget.fits(minimum):
        out.update(budget.skipped(f"the {tokens:,}-token library (capture, a sample of {args.library_min_sample})", minimum))
        return
    folder, where = library_folder(args, need_bytes)
    out["storage"] = where
    if folder is None:
        out["skipped"] = f"no room for the library: {where['no_room']}"
        return
    shutil.rmtree(folder, ignore_errors=True)
    try:
        _, out["capture_seconds"] = timed(lambda: capture.capture(lm, records, folder, schedule=SCHEDULE, probe_tokens=1),
                                          device)
        rel = verified(Release.open(folder)).release
        entries = rel.entries
        out["release"] = {"entries": len(entries), "tokens": sum(int(e["num_tokens"]) for e in entries),
                          "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
                          "kv_bytes": sum(t["byte_range"][1] - t["byte_range"][0] for e in entries
                                          for t in e["tensors"].values()),
                          "root_digest": rel.manifest["root_digest"]}
        print(f"[{budget.elapsed():.0f} s] library: {len(entries)} entries, {out['release']['tokens']:,} tokens, "
              f"{out['release']['bytes'] / 1e9:.2f} GB in {out['capture_seconds']:.1f} s ({where['folder']})")
        written()
        # The sample: as many as the budget leaves (the control's time kept), at most --library-sample. The
        # size is fixed before the nonce is drawn, so it does not depend on which entries the draw picks.
        left = budget.seconds - budget.elapsed() - est["control"]
        n = min(args.library_sample, len(entries), max(0, int(left // max(est["entry_audit"], 1e-9))))
        if n < args.library_min_sample:
            out.update(budget.skipped(f"a sample of {args.library_min_sample}",
                                      args.library_min_sample * est["entry_audit"] + est["control"]))
            return
        if n < min(args.library_sample, len(entries)):
            out["sample_reduced"] = f"sample of {n} instead of {min(args.library_sample, len(entries))}: what the budget left"
        res, secs = timed(lambda: recompute.audit(rel, lm, require="exact", sample=n), device)  # a fresh nonce
        es = res["entries"]
        out["audit"] = {"verdict": res["verdict"], "passed": res["passed"], "seconds": secs,
                        "sampled_tokens": sum(e["num_tokens"] for e in es),
                        "verdicts": dict(collections.Counter(str(e["verdict"]) for e in es)),
                        "not_replayed": sorted(res["conditions"]["not_replayed"]),
                        "sample": {k: res["sample"][k] for k in ("method", "weighting", "nonce", "nonce_source",
                                                                 "population", "population_tokens", "size", "entries")},
                        "bound": res["bound"], "bound_sentence": sampling.sentence(res["bound"]),
                        "rederived": sampling.check_sample(res["sample"], str(rel.manifest["root_digest"]),
                                                           rel.entry_ids(), rel.token_counts()),
                        "one_percent_sample": sampling.sample_size(BOUND, len(entries))}
        out["audit"]["tokens_per_s"] = out["audit"]["sampled_tokens"] / secs
        print(f"[{budget.elapsed():.0f} s] sampled audit: {out['audit']['bound_sentence']} ({secs:.1f} s)")
        written()
        first = res["sample"]["positions"][0]
        if not budget.fits(est["control"]):
            out["control"] = budget.skipped("the planted control", est["control"])
            return
        name = sorted(entries[first]["tensors"])[-1]  # the last by name: a values tensor
        planted = plant(folder, first, name)
        row = audit_row(folder, lm, "exact", device, entries=[planted["entry"]])
        out["control"] = {**planted, "expect": "not byte-exact (fails --require exact)", **row,
                          "failing": row.get("verdict") not in (None, "byte-exact")}
    except Exception as exc:
        out.update(error_of(exc))
    finally:
        shutil.rmtree(folder, ignore_errors=True)  # tens of GB, in memory when /dev/shm
        written()


def sample_sizes(entries: int) -> dict[str, int]:
    """Entries to audit, all passing, for 95% confidence that under 1% of the library's entries fail.

    binomial (an unbounded library): n = ceil(ln(0.05) / ln(0.99)) = 299; hypergeometric (this many
    entries, drawn without replacement): the smallest n at which a library with ceil(1% of N) failing
    entries shows none in the sample with probability at most 5%.
    """
    binomial = math.ceil(math.log(1 - CONFIDENCE) / math.log(1 - BOUND))
    failing = max(1, math.ceil(BOUND * entries))
    p_none, n = 1.0, 0
    while p_none > 1 - CONFIDENCE and n < entries:
        p_none *= (entries - failing - n) / (entries - n)
        n += 1
    return {"entries": entries, "failing_at_bound": failing, "binomial": binomial, "hypergeometric": n}


def projections(rows: list[dict[str, Any]], library: int) -> list[dict[str, Any]]:
    out = []
    for r in rows:
        rate = r.get("audit_tokens_per_s")
        if not rate:
            continue
        sizes = sample_sizes(math.ceil(library / r["tokens"]))
        out.append({"entry_tokens": r["tokens"], "audit_tokens_per_s": rate, "full_seconds": library / rate, **sizes,
                    "sample_seconds": sizes["hypergeometric"] * r["tokens"] / rate})
    return out


def imported_distributions() -> list[str]:
    """The installed distributions whose modules this run imported (the wheel set is checked against it)."""
    tops = {name.split(".")[0] for name in list(sys.modules)}
    owners = md.packages_distributions()
    return sorted({d for t in tops for d in owners.get(t, [])})


def fmt_s(s: float) -> str:
    return f"{s:.0f} s" if s < 120 else f"{s / 60:.1f} min" if s < 7200 else f"{s / 3600:.1f} h"


def markdown(res: dict[str, Any]) -> str:
    m = res["machine"]
    lines = [f"## GPU check{' (DRY RUN on the CPU: tiny models, figures not meaningful)' if res['dry_run'] else ''}"
             f" ({res['started']})", "",
             f"Command: `{res['command']}`; {m['device_name']}, torch {m['torch']}, transformers {m['transformers']}, "
             f"Python {m['python']}, {m['cores']} cores ({m['cpu']}); {res['elapsed']:.0f} s.", "",
             "**Every model here has seeded random weights built from a config on this machine; each figure is that "
             "of those weights (identity digests below), not of any released model.**", ""]
    tiny_rows = res.get("tiny", [])
    for part, title in (("a", "(a) captured on the device, recomputed on the device (recorded conditions replayed)"),
                        ("control", "controls beside (a): a planted change (expect inconsistent), a benign rerun "
                                    "(expect consistent or byte-exact), same device"),
                        ("b", "(b) captured on the device machine's CPU, recomputed on the device")):
        lines += [f"### {title}", "",
                  f"Tiny random models of tests/tiny.py (seed {res['seed']}); identity = sha256 of those weights, "
                  "tokenizer and config.", "",
                  "| family | captured | recomputed | verdict | byte-exact entries | max share of envelope | "
                  "conditions not replayed | seconds | identity |", "|---|---|---|---|---|---|---|---|---|"]
        for r in tiny_rows:
            if r.get("part") != part and not (part == "a" and r.get("part") in ("build", "capture", None)):
                continue
            if "verdict" in r:
                lines.append(f"| {r['family']} | {r['captured']} | {r['recomputed']} | {r['verdict']} | "
                             f"{r['byte_exact']}/{r['entries']} | {r['max_excess']:.3g} | "
                             f"{', '.join(r['not_replayed']) or 'none'} | {r['seconds']:.1f} | {r['identity'][:16]}… |")
            else:
                lines.append(f"| {r['family']} | {r.get('captured', '')} | {r.get('recomputed', '')} | "
                             f"{r.get('error') or r.get('skipped')} | | | | | |")
        lines.append("")
    big = res.get("big")
    if big:
        info = big["model"]
        lines += [f"### (c) {info['name']}-shaped model ({info['class']}, {info['parameters'] / 1e9:.2f} B parameters, "
                  f"{info['layers']} layers, bfloat16, sdpa), random weights seed {info['seed']}, identity "
                  f"{info['identity'][:16]}…", "",
                  f"Built on the device in {info['build_seconds']:.1f} s; its identity (SHA-256 of every weight) took "
                  f"{info['identity_seconds']:.1f} s. Prefill: median of 3 one-shot prefills. Audit: the whole "
                  "`recompute.audit` of a one-entry release (verify, prefill, hash and compare every tensor, probe "
                  "forward, verified graft, natural contrast), median of 2.", "",
                  "| tokens | prefill tokens/s | audit tokens/s | audit verdict | capture s | KV MB |",
                  "|---|---|---|---|---|---|"]
        for r in big.get("lengths", []):
            if "tokens" in r and "audit_tokens_per_s" in r:
                lines.append(f"| {r['tokens']} | {r['prefill_tokens_per_s']:,.0f} | {r['audit_tokens_per_s']:,.0f} | "
                             f"{r['audit']['verdict']} | {r['capture_seconds']:.1f} | {r.get('kv_bytes', 0) / 1e6:.0f} |")
            else:
                lines.append(f"| {r['length']} | {r.get('error') or r.get('skipped')} | | | | |")
        lines += ["", f"Projected audit of the preprint's library ({res['library_tokens']:,} tokens, the "
                  "`context-stretch` claim) at the measured audit rate, in entries of the measured length: in "
                  f"full, and by a uniform sample of entries that bounds the failing share under {BOUND:.0%} at "
                  f"{CONFIDENCE:.0%} confidence when all pass (binomial n = 299 for an unbounded library; "
                  "hypergeometric n for this many entries). One sequential stream on one GPU.", "",
                  "| entry tokens | entries | full audit | sample n (hypergeometric / binomial) | sampled audit |",
                  "|---|---|---|---|---|"]
        for p in big.get("projection", []):
            lines.append(f"| {p['entry_tokens']} | {p['entries']:,} | {fmt_s(p['full_seconds'])} | "
                         f"{p['hypergeometric']} / {p['binomial']} | {fmt_s(p['sample_seconds'])} |")
        lines += ["", "### (d) graft restore: read + SHA-256 + copy to the device", "",
                  "Page cache warm (the release was just written). limit = one core's hashlib SHA-256 rate (in memory) "
                  "times the cores kvgraft hashes on; all cores = kvgraft's hashing of the entry in memory on every "
                  "core; read + hash = the restore's read and hash into a buffer, no copy; restore = `graft.restore`, "
                  "median of 5.", "",
                  "| tokens | KV MB | restore GB/s | read + hash GB/s | all cores hash GB/s | limit GB/s "
                  "(cores x one core) | restore / limit |", "|---|---|---|---|---|---|---|"]
        for r in big.get("lengths", []):
            if "restore_gbps" in r:
                lines.append(f"| {r['tokens']} | {r['kv_bytes'] / 1e6:.0f} | {r['restore_gbps']:.2f} | "
                             f"{r['read_hash_gbps']:.2f} | {r['all_cores_hash_gbps']:.2f} | {r['limit_gbps']:.2f} "
                             f"({r['cores']} x {r['one_core_gbps']:.2f}) | {r['restore_gbps'] / r['limit_gbps']:.2f} |")
        lines.append("")
    lines += library_markdown(res)
    if res.get("errors"):
        lines += [f"**{res['errors']} step(s) raised**; see gpu_check.log.", ""]
    return "\n".join(lines)


def library_markdown(res: dict[str, Any]) -> list[str]:
    """(e)'s section: the library, the sampled audit and its bound, the planted control; or why not."""
    lib = res.get("library")
    name = res.get("big", {}).get("model", {}).get("name", "12B-class")
    lines = [f"### (e) one sampled audit of a library of the {name}-shaped model", ""]
    if not lib:
        return [*lines, "Not run: " + (res.get("big_skipped") or res.get("big_error") or "the 12B-class model was not built"), ""]
    lines += [f"A library of {lib['entries']:,} entries of about {lib['entry_tokens']:,} tokens ({lib['tokens']:,} tokens, "
              f"at least {lib['target_tokens']:,} asked; about {lib['estimated_bytes'] / 1e9:.1f} GB of KV) captured on "
              "the device by `capture.capture` (the project's writer, format 2) from the random-weight model above; then "
              "one `recompute.audit(sample=n)` with a fresh nonce (kvgraft.sampling: sha256-rank-v1 draw from the root "
              "digest and the nonce, uniform over entries; exact hypergeometric bound, 95% one-sided), recomputing only "
              "the sampled entries (`--require exact`: failing = not byte-exact).", ""]
    if "release" in lib:
        r, st = lib["release"], lib.get("storage", {})
        lines.append(f"Captured: {r['entries']:,} entries, {r['tokens']:,} tokens, {r['bytes'] / 1e9:.2f} GB in "
                     f"{lib['capture_seconds']:.1f} s ({r['tokens'] / lib['capture_seconds']:,.0f} tokens/s, "
                     f"{r['bytes'] / lib['capture_seconds'] / 1e9:.2f} GB/s) into {st.get('folder')} "
                     f"({st.get('filesystem') or 'file system unknown'}); root digest {r['root_digest'][:16]}….")
    a = lib.get("audit")
    if a:
        smp = a["sample"]
        lines += ["", "| sampled | verdicts | audit s | audit tokens/s | nonce | re-derived from root + nonce | "
                  "n for a 1% bound |", "|---|---|---|---|---|---|---|",
                  f"| {smp['size']} of {smp['population']:,} ({a['sampled_tokens']:,} tokens) | "
                  f"{', '.join(f'{v} {c}' for v, c in sorted(a['verdicts'].items()))} | {a['seconds']:.1f} | "
                  f"{a['tokens_per_s']:,.0f} | `{smp['nonce']}` ({smp['nonce_source']}) | "
                  f"{'yes' if not a['rederived'] else 'NO: ' + '; '.join(a['rederived'])} | {a['one_percent_sample']} |",
                  "", f"**Bound: {a['bound_sentence']}.**"]
        if lib.get("sample_reduced"):
            lines.append(f"The {lib['sample_reduced']} (fixed before the nonce was drawn).")
    c = lib.get("control")
    if c and "verdict" in c:
        lines += ["", f"Positive control: entry {c['entry']} (the first sampled), {c['tensor']} element {c['element']} "
                  f"set from {c['old']:.4g} to {c['new']:.4g}, every commitment rewritten, audited alone: {c['verdict']} "
                  f"(expect {c['expect']}: {'met' if c['failing'] else 'NOT MET'}); max share of envelope "
                  f"{c['max_excess']:.3g}, {c['seconds']:.1f} s."]
    elif c:
        lines += ["", f"Positive control: {c.get('error') or c.get('skipped')}"]
    for key in ("skipped", "error"):
        if lib.get(key):
            lines += ["", f"**{'Skipped' if key == 'skipped' else 'Error'}:** {lib[key]}"]
    est = lib.get("estimate")
    if est:
        lines += ["", f"Budget estimate ({est['from']}): capture {est['capture']:.0f} s, {est['entry_audit']:.1f} s per "
                  f"sampled entry, control {est['control']:.0f} s."]
    return [*lines, ""]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True, help="gpu_check.md and gpu_check.json go here")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvgraft-gpu-check"), help="models and releases")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny models, short lengths")
    ap.add_argument("--big", default="gemma3-12b", choices=("gemma3-12b", "llama-8b"))
    ap.add_argument("--lengths", type=int, nargs="+", help="12B-class prefix lengths (default 2048 8192; dry run 64 256)")
    ap.add_argument("--budget", type=float, default=420.0, help="seconds the parts may take in all (default 420)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--library-tokens", type=int, help="(e): the library's tokens at least (default 200000; dry run 4096)")
    ap.add_argument("--library-entry-tokens", type=int, help="(e): tokens of each entry (default 4096; dry run 128)")
    ap.add_argument("--library-sample", type=int, help="(e): entries to sample at most (default 16; dry run 8)")
    ap.add_argument("--library-min-sample", type=int, default=4, help="(e): skip the audit when fewer fit (default 4)")
    ap.add_argument("--library-dir", type=Path, help="(e): where the library goes (default /dev/shm if it has room, "
                    "else --work)")
    args = ap.parse_args()
    args.lengths = args.lengths or ([64, 256] if args.dry_run else [2048, 8192])
    args.library_tokens = args.library_tokens or (4096 if args.dry_run else 200_000)
    args.library_entry_tokens = args.library_entry_tokens or (128 if args.dry_run else 4096)
    args.library_sample = args.library_sample or (8 if args.dry_run else 16)
    # (e)'s need when (c) measured no rate to derive it from (s).
    args.library_estimate = 60.0 if args.dry_run else 240.0
    # Estimates (s) a part needs to start: generous for the H200; the dry run's are its CPU times.
    args.tiny_estimate, args.big_estimate, big_build = (10.0, 30.0, 30.0) if args.dry_run else (30.0, 90.0, 60.0)
    args.big_reserve = big_build + sum(args.big_estimate * n / max(args.lengths) for n in args.lengths)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available():
        print("no CUDA device visible to torch (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    args.out.mkdir(parents=True, exist_ok=True)
    args.work.mkdir(parents=True, exist_ok=True)
    budget = Budget(args.budget)
    import transformers

    res: dict[str, Any] = {
        "kind": "kvgraft-gpu-check", "dry_run": args.dry_run, "seed": args.seed,
        "command": " ".join(["bash bench/gpu_check.sh", *(["--dry-run"] if args.dry_run else []),
                             *([f"--big {args.big}"] if args.big != "gemma3-12b" else []),
                             *([f"--budget {args.budget:g}"] if args.budget != 420.0 else [])]),
        "started": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "library_tokens": library_tokens(),
        "machine": {"device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" else
                    f"CPU {cpu_name()}", "cpu": cpu_name(), "torch": str(torch.__version__),
                    "transformers": transformers.__version__, "python": platform.python_version(),
                    "cores": os.cpu_count(), "cuda": torch.version.cuda},
    }

    def write() -> None:
        res["elapsed"] = budget.elapsed()
        lib = res.get("library", {})
        res["errors"] = sum("error" in r for r in [*res.get("tiny", []), *res.get("big", {}).get("lengths", []), lib,
                                                   lib.get("control", {})])
        (args.out / "gpu_check.json").write_text(json.dumps(res, indent=1, default=str) + "\n")
        (args.out / "gpu_check.md").write_text(markdown(res))

    res["tiny"] = []
    part_tiny(args, device, budget, res["tiny"], write)
    if budget.fits(big_build + args.big_estimate):
        try:
            lm, info = build_big(args, device)
            res["big"] = {"model": info, "lengths": [], "projection": []}

            def written() -> None:  # after each length: a call cut short keeps what it measured
                res["big"]["projection"] = projections(res["big"]["lengths"], res["library_tokens"])
                write()

            part_big(args, device, budget, lm, res["big"]["lengths"], written)
            res["library"] = {}
            part_library(args, device, budget, lm, res["big"]["lengths"], res["library"], written)
        except Exception as exc:
            res["big_error"] = error_of(exc)["error"]
    else:
        res["big_skipped"] = budget.skipped("12B-class model", big_build + args.big_estimate)["skipped"]
    res["imported_distributions"] = imported_distributions()
    res["sigstore_imported"] = any(m == "sigstore" or m.startswith("sigstore.") for m in sys.modules)
    write()
    print(markdown(res))
    return 1 if res["errors"] or "big_error" in res else 0


if __name__ == "__main__":
    sys.exit(main())
