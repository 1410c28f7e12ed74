"""Is a prefix of a one-shot prefill byte-identical to a one-shot prefill of the prefix alone?

    .venv/bin/python bench/prefix_schedule.py [--model smollm2-135m] [--lengths 64,256,1024] [--threads N]

For each T in LENGTHS and each block-aligned n < T (16, 64, 256, ... and T - 16): one-shot prefill of
T tokens and of its first n tokens, on this machine, same model, dtype, kernel and threads; prints,
per (T, n), whether rows [0, n) of every layer's keys and values are byte-identical, and if not the
first layer that differs and the largest absolute difference. This is what a prefix graft is: rows
[0, n) of the recorded prefill of T tokens (kvgraft.inference.graft.restore_prefix records that schedule).
"""

from __future__ import annotations

import argparse
import platform

import torch

from kvgraft.inference import models
from kvgraft.inference.runtime import Schedule, layer_map, prefill


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="smollm2-135m")
    p.add_argument("--lengths", default="64,256,1024")
    p.add_argument("--threads", type=int, default=0)
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    lm = models.load(args.model, device="cpu")
    vocab = int(lm.model.config.get_text_config().vocab_size)
    gen = torch.Generator().manual_seed(0)
    cpu = platform.processor() or platform.machine()
    print(f"model {lm.spec}, {lm.dtype}, {lm.attn}, {torch.get_num_threads()} threads, {cpu}")
    print(f"{'T':>6} {'n':>6}  rows [0, n) of a prefill of T vs a prefill of n")
    for t in (int(x) for x in args.lengths.split(",")):
        ids = [int(x) for x in torch.randint(100, vocab, (t,), generator=gen)]
        with torch.no_grad():
            full, _ = prefill(lm, ids, Schedule(add_special_tokens=False))
        _, full_t = layer_map(lm, full)
        ns = sorted({n for n in (16, 64, 256, 1024, t - 16) if 0 < n < t})
        for n in ns:
            with torch.no_grad():
                part, _ = prefill(lm, ids[:n], Schedule(add_special_tokens=False))
            _, part_t = layer_map(lm, part)
            first, worst, same = None, 0.0, True
            for name in sorted(part_t, key=lambda s: (int(s.split(".")[1]), s)):
                a = full_t[name][:, :, :n, :].contiguous()
                b = part_t[name].contiguous()
                if not torch.equal(a, b):
                    same = False
                    first = first or name
                    worst = max(worst, float((a.float() - b.float()).abs().max()))
            verdict = "byte-identical" if same else f"differ from {first}, max |diff| {worst:.3g}"
            print(f"{t:>6} {n:>6}  {verdict}")


if __name__ == "__main__":
    main()
