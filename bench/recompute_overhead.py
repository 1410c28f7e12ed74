"""Recompute audit cost beyond the fresh prefill, and its peak memory above model + fresh cache.

Run: .venv/bin/python bench/recompute_overhead.py [--tokens 512] [--entries 3] [--model SPEC]
Times are medians over entries, measured in this one run. Peak memory is the process's resident
high-water mark (VmHWM, reset through /proc/self/clear_refs) during the comparison, minus the resident
size just before it (model and fresh cache already resident); the stored file is memory-mapped.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from kvgraft.inference import capture, models, runtime
from kvgraft.inference.runtime import Schedule
from kvgraft.recompute import audit as recompute
from kvgraft.recompute.determinism import prefix_ids
from kvgraft.signing.policy import OwnOutput
from kvgraft.signing.verify import verified


def status_kb(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1])
    raise KeyError(key)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--entries", type=int, default=3)
    ap.add_argument("--model", default=models.DEFAULT_MODEL, help="model spec (default: the default model)")
    args = ap.parse_args()
    lm = models.load(args.model, device="cpu")
    base = prefix_ids(lm, args.tokens * args.entries + args.entries)
    records = [(f"b:{i}", {"id": f"p{i}", "text": lm.tokenizer.decode(base[i * args.tokens : (i + 1) * args.tokens])})
               for i in range(args.entries)]
    prefill_s, compare_s, entry_s, peaks = [], [], [], []
    layer_kv = 0
    with tempfile.TemporaryDirectory() as tmp:
        capture.capture(lm, records, Path(tmp) / "rel", schedule=Schedule(add_special_tokens=False), probe_tokens=8)
        checked = verified(Path(tmp) / "rel", OwnOutput("bench/recompute_overhead.py, which captured it"))
        rel = checked.release
        for entry in rel.entries:
            t0 = time.perf_counter()
            cache, _ = runtime.prefill(lm, entry["token_ids"], Schedule.from_dict(rel.manifest["schedule"]))
            prefill_s.append(time.perf_counter() - t0)
            rss0 = status_kb("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")
            t1 = time.perf_counter()
            rows = recompute.compare_layers(checked, entry, lm, cache)
            compare_s.append(time.perf_counter() - t1)
            peaks.append(status_kb("VmHWM") - rss0)
            assert all(t.equal for r in rows for t in (r.keys, r.values) if t is not None)
            start, end = entry["tensors"]["layer.0.keys"]["byte_range"]
            layer_kv = 2 * (end - start)
            del cache
            t2 = time.perf_counter()
            recompute.audit_entry(checked, entry, lm)
            entry_s.append(time.perf_counter() - t2)
    p, c, e = statistics.median(prefill_s), statistics.median(compare_s), statistics.median(entry_s)
    model = "default model" if args.model == models.DEFAULT_MODEL else args.model
    print(f"{model}, {args.entries} entries of {args.tokens} tokens, fp32 sdpa cpu")
    print(f"fresh prefill                  {p * 1e3:8.1f} ms")
    print(f"KV comparison beyond prefill   {c * 1e3:8.1f} ms  = {c / p:.1%} of the prefill (target <= 10%)")
    print(f"whole audit_entry              {e * 1e3:8.1f} ms  = {e / p:.2f}x the prefill (includes the probe forwards, "
          "a verified graft and the natural-contrast prefill of prefix + probe)")
    print(f"peak memory during comparison  {max(peaks)} KiB above model + fresh cache; one layer's K/V = "
          f"{layer_kv // 1024} KiB (target <= one layer)")


if __name__ == "__main__":
    main()
