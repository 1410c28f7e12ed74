"""Verified graft restore from disk vs fresh prefill, vs torch.save/torch.load, vs the hashing limit.

Run: .venv/bin/python bench/graft_vs_recompute.py [--lengths 128 512 2048] [--rounds 11] [--model SPEC]

All figures are measured side by side in this one run. This machine's speed drifts by up to 30%
from second to second (a shared VM: single-core hashlib varies 0.8-1.4 GB/s between samples), so
each round measures every quantity back to back and ratios are the median of per-round ratios.
The hashing limit of a round is the time one core takes to hash bytes / cores with hashlib (in
memory), i.e. bytes / (cores x single-core hashlib rate). The page cache is warm for both disk
paths (the release and the torch.save file were just written); this is stated in the output.
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import itertools
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the kvgraft CLI runs

import torch

from kvgraft._internal.cores import cores
from kvgraft.inference import capture, graft, models, runtime
from kvgraft.recompute.determinism import prefix_ids
from kvgraft.release import hashing
from kvgraft.signing.policy import OwnOutput
from kvgraft.signing.verify import VerifiedRelease, verified


def seconds(fn: Callable[[], Any]) -> float:
    """Wall time of one call with the cyclic GC paused (as timeit does): a full collection over the
    loaded model's objects takes ~170 ms and lands in whichever call crosses its threshold."""
    gc.disable()
    try:
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    finally:
        gc.enable()


def make_release(lm: models.LoadedModel, n: int, folder: Path) -> VerifiedRelease:
    ids = prefix_ids(lm, n)
    capture.capture(lm, [("bench", {"id": "p", "text": lm.tokenizer.decode(ids)})], folder,
                    schedule=runtime.Schedule(add_special_tokens=False), probe_tokens=0)
    # Verified once here (kvgraft.signing.verify.verified), as the one this process wrote: the columns time
    # the graft of a verified release, and "first" a first graft in fresh memory, not the verify.
    return verified(folder, OwnOutput("bench/graft_vs_recompute.py, which captured it"))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--lengths", type=int, nargs="+", default=[128, 512, 2048])
    ap.add_argument("--rounds", type=int, default=11)
    ap.add_argument("--model", default=models.DEFAULT_MODEL)
    args = ap.parse_args()
    lm = models.load(args.model, device="cpu")
    n_cores = cores()
    print(f"model {lm.spec} {lm.dtype} {lm.attn} on cpu, torch threads {torch.get_num_threads()}, cores {n_cores}, "
          f"OMP_WAIT_POLICY={os.environ['OMP_WAIT_POLICY']}")
    print(f"{args.rounds} rounds per length; each round times every column back to back; medians shown")
    print("disk reads come from a warm page cache (files written in this run)")
    cols = ["tokens", "KV MB", "prefill ms", "restore ms", "x faster", "hash-limit ms", "restore/limit",
            "first ms", "torch.load ms"]
    print(" ".join(f"{c:>{max(len(c), 7)}}" for c in cols))
    floors: list[tuple[int, float, float, float, float]] = []
    with tempfile.TemporaryDirectory() as tmp:
        graft.restore(make_release(lm, 16, Path(tmp) / "warm"), "p", lm)  # imports, thread pool: not part of any timing
        for n in args.lengths:
            rel = make_release(lm, n, Path(tmp) / f"rel{n}")
            entry = rel.release.entry("p")
            first = seconds(lambda: graft.restore(rel, "p", lm))  # noqa: B023
            restored = graft.restore(rel, "p", lm)
            pt = Path(tmp) / f"cache{n}.pt"
            torch.save([(layer.keys, layer.values) for layer in restored.cache.layers], pt)
            del restored
            share = os.urandom(entry_bytes(rel, entry) // n_cores)
            ranges = sorted(tuple(t["byte_range"]) for t in entry["tensors"].values())
            dest = bytearray(entry_bytes(rel, entry))
            path = rel.release.entry_file(entry)
            rows: list[dict[str, float]] = []
            for _ in range(args.rounds):
                r = {"prefill": seconds(lambda: runtime.prefill(lm, entry["token_ids"], runtime.Schedule())),  # noqa: B023
                     "restore": seconds(lambda: graft.restore(rel, "p", lm)),  # noqa: B023
                     "limit": seconds(lambda: hashlib.sha256(share).digest()),  # noqa: B023
                     "load": seconds(lambda: torch.load(pt, weights_only=True)),  # noqa: B023
                     # where the restore's time goes: the same tensors hashed on every core at once
                     # (in memory, threads pulling tensors as the restore does), then read + hashed as
                     # the restore does, without its bookkeeping
                     "hash_all": seconds(lambda: hash_in_memory(memoryview(dest), ranges)),  # noqa: B023
                     "read_hash": seconds(lambda: hashing.read_and_hash(path, ranges, memoryview(dest)))}  # noqa: B023
                r["x"] = r["prefill"] / r["restore"]
                r["ratio"] = r["restore"] / r["limit"]
                rows.append(r)

            def med(key: str) -> float:
                return statistics.median(row[key] for row in rows)  # noqa: B023

            vals = [f"{entry['num_tokens']}", f"{entry_bytes(rel, entry) / 1e6:.1f}", f"{med('prefill') * 1e3:.1f}",
                    f"{med('restore') * 1e3:.2f}", f"{med('x'):.0f}", f"{med('limit') * 1e3:.2f}", f"{med('ratio'):.2f}",
                    f"{first * 1e3:.2f}", f"{med('load') * 1e3:.2f}"]
            print(" ".join(f"{v:>{max(len(c), 7)}}" for c, v in zip(cols, vals, strict=True)))
            floors.append((entry["num_tokens"], med("limit"), med("hash_all"), med("read_hash"), med("restore")))
    print()
    print(f"where the restore time goes (medians, ms): hashing limit; all {n_cores} cores hashing at once (in memory);")
    print("read + hash into a reused buffer (no bookkeeping); the whole verified restore")
    print(f"{'tokens':>6} {'limit':>7} {'cores hashing':>13} {'read + hash':>11} {'restore':>8}")
    for tokens, limit, hash_all, read_hash, restore in floors:
        print(f"{tokens:>6} {limit * 1e3:>7.2f} {hash_all * 1e3:>13.2f} {read_hash * 1e3:>11.2f} {restore * 1e3:>8.2f}")
    print("x faster = median of per-round prefill/restore; restore/limit = median of per-round ratios")
    print("first: the first restore of that release in this process (fresh memory: page faults included)")
    print("targets: restore at 512 tokens >= 60x faster than prefill; restore within 1.25x of the hashing limit")
    print("torch.load verifies nothing; the graft restore checks SHA-256 of every byte it restores")


def hash_in_memory(buf: memoryview, ranges: list[tuple[int, int]]) -> None:
    """Every core hashes tensors of `buf` (laid end to end) until none are left, like read_and_hash."""
    spans, at = [], 0
    for a, b in ranges:
        spans.append((at, at + b - a))
        at += b - a
    take = itertools.count()

    def work() -> None:
        for k in take:
            if k >= len(spans):
                return
            hashlib.sha256(buf[spans[k][0] : spans[k][1]]).digest()

    helpers = [hashing.pool().submit(work) for _ in range(cores() - 1)]
    work()
    for f in helpers:
        f.result()


def entry_bytes(rel: VerifiedRelease, entry: dict[str, Any]) -> int:
    return sum(t["byte_range"][1] - t["byte_range"][0] for t in entry["tensors"].values())


if __name__ == "__main__":
    main()
