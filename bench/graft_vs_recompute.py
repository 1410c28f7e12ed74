"""Verified graft restore from disk vs fresh prefill, vs torch.save/torch.load, vs the hashing limit.

Run: .venv/bin/python bench/graft_vs_recompute.py [--lengths 128 512 2048] [--reps 7]
All figures are measured side by side in this one run on this machine; the page cache is warm for
both disk paths (the release and the torch.save file were just written), which is stated in the output.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from kvgraft import capture, graft, models
from kvgraft.determinism import prefix_ids
from kvgraft.hashing import cores
from kvgraft.release import Release


def median_seconds(fn: Any, reps: int) -> float:
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def sha256_single_core_rate(nbytes: int = 256 * 1024 * 1024) -> float:
    buf = os.urandom(16 * 1024 * 1024) * (nbytes // (16 * 1024 * 1024))
    t = median_seconds(lambda: hashlib.sha256(buf).digest(), 3)
    return len(buf) / t


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    lm = models.load(models.DEFAULT_MODEL, device="cpu")
    rate = sha256_single_core_rate()
    n_cores = cores()
    print(f"model smollm2-135m fp32 sdpa on cpu, torch threads {torch.get_num_threads()}, cores {n_cores}")
    print(f"single-core hashlib.sha256: {rate / 1e9:.2f} GB/s; hashing limit uses {n_cores} cores")
    print("disk reads come from a warm page cache (files written in this run)")
    hdr = (f"{'tokens':>6} {'KV MB':>7} {'prefill ms':>10} {'restore ms':>10} {'x faster':>8} "
           f"{'torch.load ms':>13} {'hash-limit ms':>13} {'restore/limit':>13}")
    print(hdr)
    with tempfile.TemporaryDirectory() as tmp:
        for n in args.lengths:
            ids = prefix_ids(lm, n)
            rel_dir = Path(tmp) / f"rel{n}"
            text = lm.tokenizer.decode(ids)
            capture.capture(lm, [("bench", {"id": "p", "text": text})], rel_dir,
                            schedule=capture.Schedule(add_special_tokens=False), probe_tokens=0)
            rel = Release.open(rel_dir)
            entry = rel.entry("p")
            token_ids = entry["token_ids"]
            t_prefill = median_seconds(lambda: capture.prefill(lm, token_ids, capture.Schedule()), args.reps)  # noqa: B023
            restored = graft.restore(rel, "p", lm)
            t_restore = median_seconds(lambda: graft.restore(rel, "p", lm), args.reps)  # noqa: B023
            tensors = [(layer.keys, layer.values) for layer in restored.cache.layers]
            pt = Path(tmp) / f"cache{n}.pt"
            torch.save(tensors, pt)
            t_load = median_seconds(lambda: torch.load(pt, weights_only=True), args.reps)  # noqa: B023
            limit = restored.kv_bytes / (n_cores * rate)
            print(f"{entry['num_tokens']:>6} {restored.kv_bytes / 1e6:>7.1f} {t_prefill * 1e3:>10.1f} "
                  f"{t_restore * 1e3:>10.2f} {t_prefill / t_restore:>8.0f} {t_load * 1e3:>13.2f} "
                  f"{limit * 1e3:>13.2f} {t_restore / limit:>13.2f}")
    print("targets: restore at 512 tokens >= 60x faster than prefill; restore within 1.25x of the hashing limit")
    print("torch.load verifies nothing; the graft restore checks SHA-256 of every byte it restores")


if __name__ == "__main__":
    main()
