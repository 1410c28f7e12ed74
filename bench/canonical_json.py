"""Canonical JSON of release records: kvgraft's `canonical` against the walk it replaced and rfc8785, side by side.

    .venv/bin/python bench/canonical_json.py [--entries 10000] [--tokens 4] [--layers 1] [--repeat 3]

Builds ENTRIES entry records shaped as the writer hashes them (tests/release_factory.make_many's:
token ids, source, layer map, tensor table with digests and byte ranges, next token), then, best of
REPEAT interleaved rounds, times over all of them: `kvgraft._internal.jsonio.canonical` (the fast
walk deciding whether the C encoder gives RFC 8785 bytes, then the C encoder); the same with the
per-dict key walk it replaced (kept here as `_plain_before`); and `rfc8785.dumps`. Checks that all
three give the same bytes for every record before printing ratios.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from typing import Any

import rfc8785

from kvgraft._internal import jsonio


def _plain_before(obj: Any) -> bool:
    """The walk `jsonio._plain` used before (a generator over each dict's keys)."""
    if not isinstance(obj, (dict, list)):
        return jsonio._plain_scalar(obj)
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            if not all(isinstance(k, str) and (k.isascii() or all(ord(c) <= 0xFFFF for c in k)) for k in x):
                return False
            values = list(x.values())
        else:
            values = x
        kinds = set(map(type, values))
        if kinds <= {int}:
            if values and (max(values) > jsonio._SAFE_INT or min(values) < -jsonio._SAFE_INT):
                return False
            continue
        for v in values:
            if isinstance(v, (dict, list)):
                stack.append(v)
            elif not jsonio._plain_scalar(v):
                return False
    return True


def _before(obj: Any) -> bytes:
    if _plain_before(obj):
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return rfc8785.dumps(obj)


def records(n: int, tokens: int, layers: int) -> list[dict[str, Any]]:
    rng = random.Random(0)
    out = []
    for i in range(n):
        ids = [rng.randrange(1, 50_000) for _ in range(tokens)]
        meta, table, at = [], {}, 0
        for li in range(layers):
            k, v = f"layer.{li}.keys", f"layer.{li}.values"
            meta.append({"index": li, "kind": "full", "keys": k, "values": v, "positions": [0, tokens]})
            for name in (k, v):
                size = 4 * tokens
                table[name] = {"dtype": "float32", "shape": [1, 1, tokens, 1], "byte_range": [at, at + size],
                               "sha256": hashlib.sha256(b"%d %s" % (i, name.encode())).hexdigest()}
                at += size
        text = f"synthetic record {i}"
        out.append({"id": f"rec-{i:03d}", "num_tokens": tokens, "token_ids": ids,
                    "token_ids_sha256": hashlib.sha256(json.dumps(ids).encode()).hexdigest(),
                    "source": {"kind": "text", "sha256": hashlib.sha256(text.encode()).hexdigest(), "text": text},
                    "layers": meta, "tensors": table, "file": f"entries/{i // 1000:05d}/{i % 1000:03d}.safetensors",
                    "header_sha256": hashlib.sha256(b"h%d" % i).hexdigest(),
                    "next_token": {"logits_sha256": hashlib.sha256(b"%d" % i).hexdigest(), "argmax": 0,
                                   "dtype": "float32"}})
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--entries", type=int, default=10_000)
    p.add_argument("--tokens", type=int, default=4)
    p.add_argument("--layers", type=int, default=1)
    p.add_argument("--repeat", type=int, default=3)
    args = p.parse_args()
    recs = records(args.entries, args.tokens, args.layers)
    ways = {"canonical (now)": jsonio.canonical, "walk before": _before, "rfc8785.dumps": rfc8785.dumps}
    outputs = {name: [fn(r) for r in recs] for name, fn in ways.items()}
    assert outputs["canonical (now)"] == outputs["rfc8785.dumps"] == outputs["walk before"], "outputs differ"
    best = {name: float("inf") for name in ways}
    for _ in range(args.repeat):
        for name, fn in ways.items():
            t = time.perf_counter()
            for r in recs:
                fn(r)
            best[name] = min(best[name], time.perf_counter() - t)
    print(f"{args.entries} records ({args.tokens} tokens, {args.layers} layers), same bytes from all three; "
          f"best of {args.repeat}:")
    for name, s in best.items():
        print(f"  {name:<16} {s:7.3f} s  {s / args.entries * 1e6:7.1f} us/record  "
              f"{s / best['canonical (now)']:5.2f}x canonical (now)")


if __name__ == "__main__":
    main()
