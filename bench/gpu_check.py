"""GPU check: recompute verdicts on the GPU, a 12B-class model's prefill and audit throughput, graft restore GB/s.

Run through bench/gpu_check.sh (it installs the carried wheels first); by hand:
    python bench/gpu_check.py --out DIR [--work DIR] [--dry-run] [--plan] [--big gemma3-12b|llama-8b] [--budget S]
        [--started-at EPOCH_S] [--library-tokens N] [--library-entry-tokens N] [--library-sample N] [--library-dir DIR]

Every model is built here from a config with seeded random weights (the tiny families of tests/tiny.py
on the CPU, saved to --work; the 12B-class model directly on the device in bfloat16): nothing is
downloaded, and every figure is that of those random weights, named by their identity digest. Random
weights decide neither the verdict machinery nor the throughput; accuracy figures stay with real models.

  (a) tiny families captured on the device and recomputed there (float32, bfloat16): byte-exact? Beside
      it two controls on the same device: one planted element (must be inconsistent) and a benign
      chunked rerun (must not be);
  (b) the same captured on the device machine's CPU, recomputed on the GPU (float32 with TF32 off, on;
      bfloat16): verdict and max share of the noise bound (|diff| / allowed; over 1 is outside);
  (c) the 12B-class model at each --lengths: prefill tokens/s, recompute-audit tokens/s (the whole
      `recompute.audit`: verify, prefill, compare, probe, graft, natural contrast), and the projected
      time to audit the preprint's library in full and by a sample bounding failing entries at 1%;
  (d) graft restore (read + SHA-256 + copy to the device) GB/s against this machine's SHA-256 limit;
  (e) one sampled audit of a library of the 12B-class model: >= --library-tokens (200,000) tokens in
      entries of --library-entry-tokens (4,096; fewer when the room or the time measured says so)
      captured on the device by kvgraft's writer (into /dev/shm when it holds them all, else
      --work), then `recompute.audit(sample=n)` with a fresh nonce (kvgraft.sampling's draw and exact
      hypergeometric bound, as `kvgraft audit recompute --sample`), recomputing only the n sampled
      entries; the sample re-derived from the root and the nonce; a positive control (one element of
      the first sampled entry changed, commitments rewritten, that entry audited alone: must fail
      `--require exact`). n: --library-sample (16), fewer when the budget (estimated from (c)'s
      measured capture and audit rates) leaves less, said so.

First it measures the library's folders (room, file system, write rate) and the rates the estimates use,
then prints its plan (--plan: only that): the steps of bench/gpu_plan.py in order, each started only
when its estimate fits what is left of --budget (from --started-at: bench/gpu_check.sh passes its
start), and cut at the budget if it overruns. Writes gpu_check.md (tables for bench/RESULTS.md) and
gpu_check.json to --out after every step, so a run cut short keeps what it measured. Exit 1 if any step
raised or was cut (each is recorded and the run goes on), else 0. --dry-run: the same steps on the CPU
with tiny models and short lengths, (e) with a 4,096-token library of 128-token entries and a sample of
8 (what tests/bench/test_gpu_check.py runs).
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
import threading
import time
import tomllib
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

PROCESS_START = time.time()  # the budget's start when run by hand (bench/gpu_check.sh passes its own)
HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT / "tests"))  # tiny.py: the tiny random model families the tests use

import gpu_plan as plan  # noqa: E402
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
from kvgraft.signing.policy import OwnOutput  # noqa: E402
from kvgraft.signing.verify import verified  # noqa: E402

import rewrite  # noqa: E402  # tests/rewrite.py: change stored bytes and every commitment over them
import tiny  # noqa: E402

OWN = OwnOutput("bench/gpu_check.py, which captured it")  # every release it reads, it wrote in this process
BUDGET = 480.0  # s, from bench/gpu_check.sh's start: the install, imports and every step
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
        res, secs = timed(lambda: recompute.audit(verified(rel, OWN), lm, require=require, **options), device)
    except Exception as exc:  # recorded, and the run goes on: one failure must not cost the lease
        return error_of(exc)
    es = res["entries"]
    return {"verdict": res["verdict"], "byte_exact": sum(e["byte_exact"] for e in es), "entries": len(es),
            "max_excess": max(e["max_excess"] for e in es), "kl_max": max(e["matched"]["kl_max"] for e in es),
            "not_replayed": sorted(res["conditions"]["not_replayed"]), "passed": res["passed"], "seconds": secs,
            "noise_bound_seconds": sum(e["seconds"]["noise_bound"] for e in es),
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


def tiny_family(args: argparse.Namespace, device: str, family: str, rows: list[dict[str, Any]]) -> None:
    """(a) and (b) for one tiny family: each capture and audit a row (an exception becomes the row's error)."""
    records = tiny_records()
    folder = args.work / "tiny" / family
    tiny.build(family, folder, seed=args.seed)
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
    mine = [r for r in rows if r["family"] == family]
    print(f"tiny {family}: " + "; ".join(f"{r.get('part')} {r.get('recomputed', '')} {r.get('verdict', r.get('error'))}"
                                         for r in mine))
    if any("error" in r for r in mine):
        raise RuntimeError(f"{sum('error' in r for r in mine)} of {family}'s captures or audits raised (see its rows)")


def big_model(args: argparse.Namespace, device: str) -> Any:
    """The 12B-class model, random bfloat16 weights from a fixed seed, made on `device` ("meta": no memory, to size it)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(args.seed)
    with torch.device(device):
        return AutoModelForCausalLM.from_config(big_config(args.big, args.dry_run), dtype=torch.bfloat16,
                                                attn_implementation="sdpa")


def big_size(args: argparse.Namespace) -> dict[str, int]:
    """Parameters and their bytes (what the build draws), and the state dict's bytes (what the identity hashes:
    a tied output layer counts again) of the 12B-class model, from a copy on the meta device (under a second)."""
    model = big_model(args, "meta")
    state = model.state_dict()
    return {"parameters": sum(p.numel() for p in model.parameters()),
            "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
            "state_bytes": sum(t.numel() * t.element_size() for t in state.values()), "tensors": len(state)}


def build_big(args: argparse.Namespace, device: str, big: dict[str, Any]) -> None:
    """The 12B-class model drawn on the device; its identity is the next step."""
    tok = tiny.tokenizer(args.work / "big-tokenizer")  # token ids below 300 of the model's vocabulary
    model, build_s = timed(lambda: big_model(args, device), device)
    if next(model.parameters()).device.type != device:
        model.to(device)
    big["lm"] = models.wrap(model, tok, f"random {args.big} (seed {args.seed})")
    cfg = model.config.get_text_config()
    params = sum(p.numel() for p in model.parameters())
    big["model"] = {"name": args.big, "class": type(model).__name__, "parameters": params,
                    "weight_bytes": sum(p.numel() * p.element_size() for p in model.parameters()),
                    "layers": cfg.num_hidden_layers, "build_seconds": build_s, "seed": args.seed}
    print(f"[built] {type(model).__name__} {params / 1e9:.2f} B parameters in {build_s:.1f} s")


def identify_big(device: str, big: dict[str, Any]) -> None:
    """The model's identity: SHA-256 of every weight (copied to the host) on every core, the tokenizer and
    config. Every capture records it and every audit compares it, so it is computed here, once."""
    ident, secs = timed(lambda: big["lm"].identity, device)
    big["model"].update(identity=ident.sha256, identity_seconds=secs)
    print(f"[identity] {ident.sha256[:16]}… in {secs:.1f} s")


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


def big_length(args: argparse.Namespace, device: str, big: dict[str, Any], length: int) -> None:
    """(c) and (d) at one length: capture, prefill, audit, restore; the row appended to big["lengths"]."""
    lm = big["lm"]
    if not big.get("warm"):
        runtime.prefill(lm, prefix_ids(lm, 128), SCHEDULE)  # kernels, handles, allocator: out of every timing
        big["warm"] = True
    row: dict[str, Any] = {"length": length}
    big["lengths"].append(row)  # a step cut at the budget keeps what it measured
    try:
        rel_dir = args.work / "releases" / f"big-{length}"
        text = lm.tokenizer.decode(prefix_ids(lm, length))
        _, row["capture_seconds"] = timed(lambda: capture.capture(
            lm, [("big", {"id": f"p{length}", "text": text})], rel_dir, schedule=SCHEDULE, probe_tokens=4), device)
        checked = verified(rel_dir, OWN)
        entry = checked.release.entries[0]
        row["tokens"] = n = entry["num_tokens"]
        prefills = [timed(lambda: runtime.prefill(lm, entry["token_ids"], SCHEDULE), device)[1]
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
            restored, secs = timed(lambda: graft.restore(checked, entry["id"], lm), device)
            row["kv_bytes"] = restored.kv_bytes
            del restored
            restores.append(secs)
        row["restore_seconds"] = restores
        row["restore_gbps"] = row["kv_bytes"] / statistics.median(restores) / 1e9
        ranges = sorted(tuple(t["byte_range"]) for t in entry["tensors"].values())
        dest = bytearray(row["kv_bytes"])
        path = checked.release.entry_file(entry)
        read_hash = [timed(lambda: hashing.read_and_hash(path, ranges, memoryview(dest)), "cpu")[1]
                     for _ in range(3)]
        all_cores = [timed(lambda: hash_in_memory(memoryview(dest), ranges), "cpu")[1] for _ in range(3)]
        row["read_hash_gbps"] = row["kv_bytes"] / statistics.median(read_hash) / 1e9
        row["all_cores_hash_gbps"] = row["kv_bytes"] / statistics.median(all_cores) / 1e9
        row.update(hash_limit(row["kv_bytes"]))
        if "error" in row:  # an audit raised (audit_row recorded it); the restores still ran
            raise RuntimeError(row["error"])
    except Exception as exc:
        row.setdefault("error", error_of(exc)["error"])
        raise
    finally:
        big["projection"] = projections(big["lengths"], library_tokens())
    print(f"{args.big} at {length} tokens: " + ", ".join(f"{k} {v:.4g}" for k, v in row.items() if isinstance(v, float)))


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


def library_rates(args: argparse.Namespace, state: dict[str, Any]) -> dict[str, Any]:
    """Seconds per library entry to capture and to audit, an audit's fixed cost, and the control's, from
    (c)'s longest measured length (x1.5; the fixed cost: its one-entry audit, whole), the capture at least
    the chosen folder's measured write rate; else from --library-estimate."""
    store, entry_bytes = state["storage"], state["entry_bytes"]
    write_s = entry_bytes / store["write_bps"] if store.get("write_bps") else 0.0
    measured = [r for r in state["big"].get("lengths", [])
                if r.get("capture_seconds") and r.get("audit_tokens_per_s") and r.get("kv_bytes")]
    if not measured:
        audit_s = args.library_estimate * 0.2 / max(1, args.library_sample)
        return {"from": "--library-estimate (no rate measured yet)", "entry_audit": audit_s, "overhead": audit_s,
                "control": 5 * audit_s, "entry_capture": max(args.library_estimate * 0.6 / max(1, state["planned_entries"]),
                                                             1.5 * write_s)}
    r = max(measured, key=lambda r: r["tokens"])
    audit_s = 1.5 * args.library_entry_tokens / r["audit_tokens_per_s"]
    overhead = 1.5 * statistics.median(r["audit_seconds"])
    # The control's audit also measures the noise bound (about 4 more prefills) and rewrites one entry file.
    return {"from": f"(c) at {r['tokens']} tokens, x1.5", "entry_audit": audit_s, "overhead": overhead,
            "control": overhead + 5 * audit_s + 2 * write_s,
            "entry_capture": 1.5 * max(r["capture_seconds"] * entry_bytes / r["kv_bytes"], write_s)}


def library_entries(args: argparse.Namespace, state: dict[str, Any], left: float) -> tuple[int, str]:
    """Entries to capture when `left` seconds remain: as planned (the storage's room), fewer when the
    time after a sample of --library-min-sample and the control is short; at least --library-min-entries."""
    rates, planned = library_rates(args, state), state["planned_entries"]
    spare = left - rates["overhead"] - args.library_min_sample * rates["entry_audit"] - rates["control"]
    n = min(planned, int(spare // rates["entry_capture"]))
    if n < args.library_min_entries:  # estimated at the minimum, which does not fit: the step is skipped
        return args.library_min_entries, f"{planned} entries planned; the time left holds under {args.library_min_entries}"
    return n, f"{planned} entries" + (f" cut to {n}: the time left" if n < planned else "")


def library_sample(args: argparse.Namespace, state: dict[str, Any], left: float) -> int:
    """The sample: as many as `left` seconds allow after the control, at most --library-sample."""
    rates = library_rates(args, state)
    fit = int((left - rates["control"] - rates["overhead"]) // max(rates["entry_audit"], 1e-9))
    return max(args.library_min_sample, min(args.library_sample, state["library"].get("entries", state["planned_entries"]), fit))


def library_capture(args: argparse.Namespace, device: str, state: dict[str, Any], left: float) -> None:
    """(e)'s library: >= --library-tokens in entries of --library-entry-tokens (as many as the storage and
    the time allow), captured on the device by kvgraft's writer into the folder the probe chose."""
    lm, lib = state["big"]["lm"], state["library"]
    records, _ = library_records(lm, args.library_tokens, args.library_entry_tokens)
    n, why = library_entries(args, state, left)
    if len(records) < n:  # the plan counted entries of the fewest tokens a record can have
        why = f"{len(records)} entries: the {args.library_tokens:,} tokens asked"
    records = records[:n]
    folder = Path(state["storage"]["folder"]) / "kvgraft-gpu-check-library"
    lib.update({"target_tokens": args.library_tokens, "entry_tokens": args.library_entry_tokens, "entries": len(records),
                "size_reason": why, "estimated_bytes": state["entry_bytes"] * len(records),
                "requested_sample": args.library_sample, "folder": str(folder), "estimate": library_rates(args, state),
                "storage": {k: state["storage"].get(k) for k in ("folder", "filesystem", "write_bps")}})
    shutil.rmtree(folder, ignore_errors=True)
    _, lib["capture_seconds"] = timed(lambda: capture.capture(lm, records, folder, schedule=SCHEDULE, probe_tokens=1), device)
    rel = verified(folder, OWN).release
    entries = rel.entries
    lib["tokens"] = sum(int(e["num_tokens"]) for e in entries)
    lib["release"] = {"entries": len(entries), "tokens": lib["tokens"],
                      "bytes": sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()),
                      "kv_bytes": sum(t["byte_range"][1] - t["byte_range"][0] for e in entries for t in e["tensors"].values()),
                      "root_digest": rel.manifest["root_digest"]}
    print(f"library: {len(entries)} entries, {lib['tokens']:,} tokens, {lib['release']['bytes'] / 1e9:.2f} GB in "
          f"{lib['capture_seconds']:.1f} s ({folder})")


def library_audit(args: argparse.Namespace, device: str, state: dict[str, Any], left: float) -> None:
    """One `recompute.audit(sample=n)` with a fresh nonce; n fixed before the nonce is drawn, so it does
    not depend on which entries the draw picks; the sample re-derived from the root and the nonce."""
    lm, lib = state["big"]["lm"], state["library"]
    checked = verified(Path(lib["folder"]), OWN)
    rel = checked.release
    entries = rel.entries
    n = library_sample(args, state, left)
    if n < min(args.library_sample, len(entries)):
        lib["sample_reduced"] = f"sample of {n} instead of {min(args.library_sample, len(entries))}: what the budget left"
    res, secs = timed(lambda: recompute.audit(checked, lm, require="exact", sample=n), device)  # a fresh nonce
    es = res["entries"]
    lib["audit"] = {"verdict": res["verdict"], "passed": res["passed"], "seconds": secs,
                    "sampled_tokens": sum(e["num_tokens"] for e in es),
                    "verdicts": dict(collections.Counter(str(e["verdict"]) for e in es)),
                    "not_replayed": sorted(res["conditions"]["not_replayed"]),
                    "sample": {k: res["sample"][k] for k in ("method", "weighting", "nonce", "nonce_source",
                                                             "population", "population_tokens", "size", "entries")},
                    "positions": res["sample"]["positions"],
                    "bound": res["bound"], "bound_sentence": sampling.sentence(res["bound"]),
                    "rederived": sampling.check_sample(res["sample"], str(rel.manifest["root_digest"]),
                                                        rel.entry_ids(), rel.token_counts()),
                    "one_percent_sample": sampling.sample_size(BOUND, len(entries)),
                    "tokens_per_s": sum(e["num_tokens"] for e in es) / secs}
    print(f"sampled audit: {lib['audit']['bound_sentence']} ({secs:.1f} s)")


def library_control(device: str, state: dict[str, Any]) -> None:
    """The positive control: one element of the first sampled entry changed, every commitment rewritten,
    that entry audited alone: must fail `--require exact`."""
    lm, lib = state["big"]["lm"], state["library"]
    folder = Path(lib["folder"])
    first = lib["audit"]["positions"][0]
    name = sorted(Release.open(folder).entries[first]["tensors"])[-1]  # the last by name: a values tensor
    planted = plant(folder, first, name)
    row = audit_row(folder, lm, "exact", device, entries=[planted["entry"]])
    lib["control"] = {**planted, "expect": "not byte-exact (fails --require exact)", **row,
                      "failing": row.get("verdict") not in (None, "byte-exact")}
    if "error" in row or not lib["control"]["failing"]:
        raise RuntimeError(row.get("error") or f"the planted entry came out {row.get('verdict')}")


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
                  "| family | captured | recomputed | verdict | byte-exact entries | max share of the noise bound | "
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
                  f"{info.get('identity', 'not computed')[:16]}…", "",
                  f"Built on the device in {info['build_seconds']:.1f} s; its identity (SHA-256 of every weight) took "
                  f"{info.get('identity_seconds', math.nan):.1f} s. Prefill: median of 3 one-shot prefills. Audit: the whole "
                  "`recompute.audit` of a one-entry release (verify, prefill, hash and compare every tensor, probe "
                  "forward, verified graft, natural contrast), median of 2.", "",
                  "| tokens | prefill tokens/s | audit tokens/s | audit verdict | capture s | KV MB |",
                  "|---|---|---|---|---|---|"]
        for r in big.get("lengths", []):
            if "tokens" in r and "audit_tokens_per_s" in r:
                lines.append(f"| {r['tokens']} | {r['prefill_tokens_per_s']:,.0f} | {r['audit_tokens_per_s']:,.0f} | "
                             f"{r['audit']['verdict']} | {r['capture_seconds']:.1f} | {r.get('kv_bytes', 0) / 1e6:.0f} |")
            else:
                lines.append(f"| {r['length']} | {r.get('error') or 'not finished'} | | | | |")
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
            if "limit_gbps" in r:  # the row's last figure: a row cut short has no line
                lines.append(f"| {r['tokens']} | {r['kv_bytes'] / 1e6:.0f} | {r['restore_gbps']:.2f} | "
                             f"{r['read_hash_gbps']:.2f} | {r['all_cores_hash_gbps']:.2f} | {r['limit_gbps']:.2f} "
                             f"({r['cores']} x {r['one_core_gbps']:.2f}) | {r['restore_gbps'] / r['limit_gbps']:.2f} |")
        lines.append("")
    lines += library_markdown(res)
    lines += steps_markdown(res)
    if res.get("errors"):
        lines += [f"**{res['errors']} step(s) raised or were cut**; see gpu_check.log.", ""]
    return "\n".join(lines)


def steps_markdown(res: dict[str, Any]) -> list[str]:
    """The plan as run: each step's estimate, basis, seconds and status; where the library went and why."""
    probe = res.get("probe", {})
    lines = ["### Steps and budget", "", f"Budget {res['budget']:.0f} s from the script's start (wheel install and "
             f"imports included); {res.get('elapsed', 0):.0f} s used. Each step started only when its estimate fit "
             "what was left (the 12B-class steps' kept); a step past the budget is cut.", "",
             f"Library storage, measured first: {probe.get('storage', {}).get('said', 'not measured')}.", "",
             "| step | estimate s | seconds | status | basis |", "|---|---|---|---|---|"]
    for r in res.get("steps", []):
        status = r["status"] + (f": {r['why']}" if r.get("why") else "")
        lines.append(f"| {r['step']} | {r['estimate']:.1f} | {r.get('seconds', math.nan):.1f} | {status} | {r['basis']} |")
    return [*lines, ""]


def library_markdown(res: dict[str, Any]) -> list[str]:
    """(e)'s section: the library, the sampled audit and its bound, the planted control; or why not."""
    lib = res.get("library")
    name = res.get("big", {}).get("model", {}).get("name", "12B-class")
    lines = [f"### (e) one sampled audit of a library of the {name}-shaped model", ""]
    if not lib:
        why = next((f"{r['status']}: {r['why']}" for r in res.get("steps", []) if r["step"] == "library capture (e)"), "")
        return [*lines, f"Not run: {why or 'the 12B-class model was not built'}", ""]
    lines += [f"A library of {lib['entries']:,} entries of about {lib['entry_tokens']:,} tokens (at least "
              f"{lib['target_tokens']:,} tokens asked; {lib['size_reason']}; about {lib['estimated_bytes'] / 1e9:.1f} GB of "
              "KV) captured on "
              "the device by `capture.capture` (kvgraft's writer, format 2) from the random-weight model above; then "
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
                  f"(expect {c['expect']}: {'met' if c['failing'] else 'NOT MET'}); max share of the noise bound "
                  f"{c['max_excess']:.3g}, {c['seconds']:.1f} s."]
    elif c:
        lines += ["", f"Positive control: {c.get('error') or c.get('skipped')}"]
    if lib.get("estimate"):
        est = lib["estimate"]
        lines += ["", f"Size: {lib['size_reason']}. Estimates ({est['from']}): capture {est['entry_capture']:.2f} s per "
                  f"entry, an audit's fixed cost {est['overhead']:.1f} s, {est['entry_audit']:.1f} s per sampled entry, "
                  f"control {est['control']:.0f} s."]
    return [*lines, ""]


def copy_rate(device: str) -> float | None:
    """Bytes/s of a 256 MiB copy from the device to the host (the identity's copies); None on the CPU."""
    if device != "cuda":
        return None
    t = torch.empty(256 << 20, dtype=torch.uint8, device=device)
    secs = [timed(lambda: t.cpu(), device)[1] for _ in range(2)]  # the first also sets up the staging
    return t.numel() / secs[-1]


def probe(args: argparse.Namespace, device: str, state: dict[str, Any]) -> dict[str, Any]:
    """Measured before anything runs: the library's folders (room, file system, write rate) and the rates the
    identity's estimate uses (one core's SHA-256, the device-to-host copy). The plan follows from these."""
    cfg = big_config(args.big, args.dry_run)
    state["entry_bytes"] = kv_entry_bytes(cfg, args.library_entry_tokens)
    entries = -(-args.library_tokens // (args.library_entry_tokens - 8))  # each record has at least this many tokens
    folders = [args.library_dir] if args.library_dir else [Path("/dev/shm"), args.work]
    measured = [plan.measure_folder(f) for f in folders]
    state["storage"] = plan.choose_storage(measured, state["entry_bytes"], entries, args.library_min_entries)
    state["planned_entries"] = state["storage"]["entries"]
    block = os.urandom(64 << 20)
    t0 = time.perf_counter()
    hashlib.sha256(block).digest()
    state["hash_bps"] = len(block) / (time.perf_counter() - t0)
    state["copy_bps"] = copy_rate(device) if torch.cuda.is_available() else None
    state["size"] = big_size(args)
    print(f"storage: {state['storage']['said']}")
    return {"storage": {k: v for k, v in state["storage"].items()}, "folders": measured, "entry_bytes": state["entry_bytes"],
            "hash_one_core_bps": state["hash_bps"], "cores": cores(), "copy_bps": state["copy_bps"],
            "memory_available": plan.mem_available(), "big": state["size"]}


def steps(args: argparse.Namespace, device: str, state: dict[str, Any], res: dict[str, Any]) -> list[plan.Step]:
    """The run's steps in order, with their estimates (s): generous for an H200 where nothing is measured
    yet; the dry run's are this 2-core machine's CPU times."""
    big = state["big"]
    weight, hashed = state["size"]["weight_bytes"], state["size"]["state_bytes"]

    def fixed(seconds: float, basis: str) -> Callable[[float], tuple[float, str]]:
        return lambda left: (seconds, basis)

    def identity_estimate(left: float) -> tuple[float, str]:
        hash_bps = state["hash_bps"] * cores()
        rate = min(hash_bps, state["copy_bps"] or math.inf)
        return 2 + 1.5 * hashed / rate, (f"{hashed / 1e9:.1f} GB of state dict: SHA-256 at {hash_bps / 1e9:.1f} GB/s "
                                         f"({cores()} cores x one measured)" + (
            f", device-to-host copy at {state['copy_bps'] / 1e9:.1f} GB/s measured" if state["copy_bps"] else "")
                                         + ", the slower of the two, x1.5, + 2 s")

    def length_estimate(length: int) -> Callable[[float], tuple[float, str]]:
        share = args.big_estimate * length / max(args.lengths)
        return fixed(share + (5 if length == args.lengths[0] else 0),
                     f"{args.big_estimate:.0f} s at {max(args.lengths)} tokens, in proportion"
                     + ("; + 5 s warm-up prefill" if length == args.lengths[0] else ""))

    def library_estimate(left: float) -> tuple[float, str]:
        n, why = library_entries(args, state, left)
        rates = library_rates(args, state)
        return n * rates["entry_capture"], f"{why} x {rates['entry_capture']:.2f} s each ({rates['from']})"

    def sample_estimate(left: float) -> tuple[float, str]:
        n, rates = library_sample(args, state, left), library_rates(args, state)
        return rates["overhead"] + n * rates["entry_audit"], (f"{rates['overhead']:.1f} s + a sample of {n} x "
                                                              f"{rates['entry_audit']:.2f} s ({rates['from']})")

    def control_estimate(left: float) -> tuple[float, str]:
        return library_rates(args, state)["control"], ("an audit's fixed cost + 5 entry audits (it measures a noise bound) "
                                                       "+ 2 writes of the entry")

    def tiny_step(family: str) -> plan.Step:
        return plan.Step(f"tiny {family} (a, b)", fixed(args.tiny_estimate, "fixed"),
                         lambda left: tiny_family(args, device, family, res["tiny"]))

    build_s = 10 + weight / 0.5e9

    def no_room() -> str:
        return "" if state["storage"]["folder"] else f"no room: {state['storage']['said']}"

    return [
        *[tiny_step(f) for f in tiny.FAMILIES],
        plan.Step("12B build", fixed(build_s, f"{weight / 1e9:.1f} GB of weights drawn at 0.5 GB/s, + 10 s"),
                  lambda left: build_big(args, device, big), reserved=True),
        plan.Step("12B identity", identity_estimate, lambda left: identify_big(device, big), needs=("12B build",),
                  reserved=True),
        *[plan.Step(f"12B {n} tokens (c, d)", length_estimate(n), lambda left, n=n: big_length(args, device, big, n),
                    needs=("12B identity",), reserved=True) for n in args.lengths],
        plan.Step("library capture (e)", library_estimate, lambda left: library_capture(args, device, state, left),
                  needs=("12B identity",), blocked=no_room),
        plan.Step("sampled audit (e)", sample_estimate, lambda left: library_audit(args, device, state, left),
                  needs=("library capture (e)",)),
        plan.Step("planted control (e)", control_estimate, lambda left: library_control(device, state),
                  needs=("sampled audit (e)",)),
        plan.Step("remove the library", fixed(0.0, "under a second"),
                  lambda left: remove_library(state), always=True),
    ]


def remove_library(state: dict[str, Any]) -> None:
    folder = state["library"].get("folder")
    if folder:
        shutil.rmtree(folder, ignore_errors=True)  # tens of GB, in memory when /dev/shm


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, help="gpu_check.md and gpu_check.json go here (required unless --plan)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/kvgraft-gpu-check"), help="models and releases")
    ap.add_argument("--dry-run", action="store_true", help="the CPU, tiny models, short lengths")
    ap.add_argument("--plan", action="store_true", help="measure the folders and rates, print the steps, their "
                    "estimates and order, and exit without running a step")
    ap.add_argument("--big", default="gemma3-12b", choices=("gemma3-12b", "llama-8b"))
    ap.add_argument("--lengths", type=int, nargs="+", help="12B-class prefix lengths (default 2048 8192; dry run 64 256)")
    ap.add_argument("--budget", type=float, default=BUDGET, help=f"seconds for the whole run (default {BUDGET:g}), "
                    "counted from --started-at")
    ap.add_argument("--started-at", type=float, help="the time (epoch s) the budget counts from (bench/gpu_check.sh "
                    "passes its own start; default: this process's start)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--library-tokens", type=int, help="(e): the library's tokens at least (default 200000; dry run 4096)")
    ap.add_argument("--library-entry-tokens", type=int, help="(e): tokens of each entry (default 4096; dry run 128)")
    ap.add_argument("--library-sample", type=int, help="(e): entries to sample at most (default 16; dry run 8)")
    ap.add_argument("--library-min-sample", type=int, default=4, help="(e): skip the audit when fewer fit (default 4)")
    ap.add_argument("--library-min-entries", type=int, default=8, help="(e): skip the library when fewer fit (default 8)")
    ap.add_argument("--library-dir", type=Path, help="(e): where the library goes (default /dev/shm if it has room, "
                    "else --work)")
    args = ap.parse_args()
    if args.out is None and not args.plan:
        ap.error("--out is required unless --plan")
    args.lengths = args.lengths or ([64, 256] if args.dry_run else [2048, 8192])
    args.library_tokens = args.library_tokens or (4096 if args.dry_run else 200_000)
    args.library_entry_tokens = args.library_entry_tokens or (128 if args.dry_run else 4096)
    args.library_sample = args.library_sample or (8 if args.dry_run else 16)
    # (e)'s need when (c) measured no rate to derive it from (s).
    args.library_estimate = 60.0 if args.dry_run else 240.0
    # Estimates (s): generous for the H200; the dry run's are this 2-core machine's CPU times (a tiny
    # family took 14-76 s there, loaded).
    args.tiny_estimate, args.big_estimate = (30.0, 30.0) if args.dry_run else (30.0, 90.0)
    device = "cpu" if args.dry_run else "cuda"
    if device == "cuda" and not torch.cuda.is_available() and not args.plan:
        print("no CUDA device visible to torch (use --dry-run on a CPU)", file=sys.stderr)
        return 2
    budget = plan.Budget(args.budget, spent=max(0.0, time.time() - (args.started_at or PROCESS_START)))
    args.work.mkdir(parents=True, exist_ok=True)
    import transformers

    state: dict[str, Any] = {"big": {"lengths": [], "projection": []}, "library": {}}
    res: dict[str, Any] = {
        "kind": "kvgraft-gpu-check", "dry_run": args.dry_run, "seed": args.seed, "budget": args.budget,
        "command": " ".join(["bash bench/gpu_check.sh", *(["--dry-run"] if args.dry_run else []),
                             *([f"--big {args.big}"] if args.big != "gemma3-12b" else []),
                             *([f"--budget {args.budget:g}"] if args.budget != BUDGET else [])]),
        "started": time.strftime("%Y-%m-%dT%H:%MZ", time.gmtime()), "library_tokens": library_tokens(),
        "machine": {"device": device, "device_name": torch.cuda.get_device_name() if device == "cuda" and
                    torch.cuda.is_available() else f"CPU {cpu_name()}", "cpu": cpu_name(), "torch": str(torch.__version__),
                    "transformers": transformers.__version__, "python": platform.python_version(),
                    "cores": os.cpu_count(), "cuda": torch.version.cuda},
        "tiny": [],
    }
    res["probe"] = probe(args, device, state)
    todo = steps(args, device, state, res)
    res["plan"] = plan.describe(todo, budget)
    print(plan.plan_table(res["plan"], args.budget))
    if args.plan:
        return 0
    args.out.mkdir(parents=True, exist_ok=True)

    lock = threading.Lock()  # the hard stop writes from its own thread

    def write() -> None:
        with lock:
            write_files()

    def write_files() -> None:
        res["elapsed"] = budget.elapsed()
        if state["big"].get("model"):
            res["big"] = {k: v for k, v in state["big"].items() if k in ("model", "lengths", "projection")}
        if state["library"]:
            res["library"] = state["library"]
        res["errors"] = sum(r.get("status") in ("error", "stopped") for r in res.get("steps", []))
        for attempt in range(3):  # the main thread may change a dict under json.dumps while the stop writes
            try:
                text = json.dumps(res, indent=1, default=str) + "\n"
                break
            except RuntimeError:
                if attempt == 2:
                    raise
        (args.out / "gpu_check.json").write_text(text)
        try:
            md = markdown(res)
        except Exception as exc:  # the JSON has every figure: a table that cannot be drawn must not lose it
            md = f"# GPU check\n\nThe tables could not be drawn ({error_of(exc)['error']}); see gpu_check.json.\n"
        (args.out / "gpu_check.md").write_text(md)

    run = plan.Plan(todo, budget, after=write)
    res["steps"] = run.records

    def stop(rec: dict[str, Any]) -> None:
        rec.update(status="stopped", seconds=budget.elapsed() - rec["start"])
        rec["why"] = (f"cut at the budget ({budget.elapsed():.0f} of {args.budget:.0f} s) after {rec['seconds']:.0f} s; "
                      f"estimated {rec['estimate']:.0f} s")
        try:
            remove_library(state)
            reached = {r["step"] for r in run.records}
            run.records += [{**{k: r[k] for k in ("step", "estimate", "basis")}, "status": "not started",
                             "why": "the run was cut at the budget before it"} for r in res["plan"] if r["step"] not in reached]
            write()
            print(f"STOPPED {rec['step']}: {rec['why']}", file=sys.stderr, flush=True)
        finally:
            os._exit(1)  # from the watchdog thread, whatever the main thread is in

    plan.start_watch(run, stop)
    run.run()
    res["imported_distributions"] = imported_distributions()
    res["sigstore_imported"] = any(m == "sigstore" or m.startswith("sigstore.") for m in sys.modules)
    write()
    print(markdown(res))
    return 1 if res["errors"] else 0


if __name__ == "__main__":
    sys.exit(main())
