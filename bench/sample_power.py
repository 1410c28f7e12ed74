"""Power of a sampled recompute audit, measured: k bad entries planted among N, found by a sample of n how often?

Run: .venv/bin/python bench/sample_power.py [--entries 1000] [--bad 10] [--nonces 2000] [--model tiny|SPEC]
     [--out F.json]

1. Capture N short entries (the tests' tiny random Llama by default, or --model; recorded conditions),
   then, as a publisher would, change one element of one stored tensor by a factor 1 + 1e-2 in k entries
   chosen at random, rewriting every commitment (tests/rewrite.py): the release verifies, its root digest is the published one.
2. Recompute every entry once (`recompute.audit`, as `kvgraft audit recompute` would, `--require exact`):
   the ground truth. The planted entries must fail, every other entry must be byte-exact.
3. For each of R nonces, draw the sample (kvgraft.sampling, from the root and the nonce) and, reusing the
   verdicts of step 2, count how often a sample of n holds at least one failing entry; beside it, the
   hypergeometric prediction 1 - C(N-k, n) / C(N, n), and how often the 95% bound covers the true k.
4. A few sampled audits end to end (`recompute.audit(sample=n, nonce=...)`, real recomputes): the failing
   count each finds equals the one the reused verdicts predict for its nonce.
"""

from __future__ import annotations

import argparse
import json
import random
import shutil
import sys
import tempfile
import time
from math import comb
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kvgraft import sampling
from kvgraft.inference import capture, models
from kvgraft.recompute import audit as recompute
from kvgraft.release.format import Release
from kvgraft.signing.policy import OwnOutput
from kvgraft.signing.verify import verified

import rewrite  # tests/rewrite.py: rewrite bytes and every commitment over them

WORDS = ["apples", "trains", "lockers", "rivers", "lamps", "coins", "birds", "stones", "maps", "clocks"]


def records(n: int, rng: random.Random) -> list[tuple[str, dict[str, Any]]]:
    """Short distinct texts (about 10 tokens each)."""
    return [("bench", {"id": f"e{i:05d}", "text": f"Entry {i}: {rng.randint(2, 99)} {rng.choice(WORDS)} "
                                                  f"and {rng.randint(100, 9999)} {rng.choice(WORDS)}."})
            for i in range(n)]


def plant(rel: Path, n_entries: int, k: int, rng: random.Random, relative: float) -> list[int]:
    """Scale one element of one tensor by 1 + relative in k random entries; every commitment rewritten."""
    entries = Release.open(rel).entries  # either layout; the first rewrite turns it into the single manifest
    bad = sorted(rng.sample(range(n_entries), k))
    for i in bad:
        e = entries[i]
        layer = rng.randrange(len(e["layers"]))
        name = e["layers"][layer][rng.choice(["keys", "values"])]
        elements = 1
        for d in e["tensors"][name]["shape"]:
            elements *= d
        rewrite.element(rel, i, name, rng.randrange(elements), lambda v: v * (1 + relative) if v else relative)
    return bad


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="tiny", help="tiny: the tests' tiny random Llama (fast; the figures are "
                    "about sampling, and every verdict is confirmed by a real recompute); or a model spec")
    ap.add_argument("--entries", type=int, default=1000)
    ap.add_argument("--bad", type=int, default=10)
    ap.add_argument("--relative", type=float, default=1e-2)
    ap.add_argument("--nonces", type=int, default=2000)
    ap.add_argument("--sizes", default="10,25,50,100,200,300")
    ap.add_argument("--end-to-end", type=int, default=3, help="sampled audits run for real")
    ap.add_argument("--end-to-end-size", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=None, help="also write the figures as JSON here")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    sizes = [int(x) for x in args.sizes.split(",")]
    work = Path(tempfile.mkdtemp(prefix="kvgraft-power-"))
    try:
        spec = args.model
        if spec == "tiny":
            import tiny  # tests/tiny.py

            spec = str(tiny.build("llama", work / "tiny-llama"))
        lm = models.load(spec, device="cpu", dtype="float32", attn="sdpa")
        rel = work / "release"
        t0 = time.perf_counter()
        capture.capture(lm, records(args.entries, rng), rel, probe_tokens=1)
        t_capture = time.perf_counter() - t0
        bad = plant(rel, args.entries, args.bad, rng, args.relative)
        # Written (and planted) by this script, read back here: its own output, digests only.
        release = verified(rel, OwnOutput("bench/sample_power.py, which captured and planted it"))
        root = str(release.manifest["root_digest"])
        ids = [str(e["id"]) for e in release.release.entries]

        # Ground truth: every entry recomputed once.
        t0 = time.perf_counter()
        full = recompute.audit(release, lm)
        t_full = time.perf_counter() - t0
        failing = {e["id"] for e in full["entries"] if recompute.failing(e, "exact")}
        planted = {ids[i] for i in bad}
        verdicts = {v: sum(e["verdict"] == v for e in full["entries"]) for v in ("byte-exact", "consistent", "inconsistent")}
        assert failing == planted, f"recompute found {sorted(failing)}, planted {sorted(planted)}"
        print(f"{args.entries} entries ({full['cost']['library_tokens']:,} tokens), {args.bad} planted (x(1 + "
              f"{args.relative:g}) on one element each); full recompute {t_full:.0f} s: {verdicts} — the failing "
              f"entries are exactly the planted ones")

        # Repeated nonces: the draw for each nonce, its prefixes the smaller samples (reused verdicts).
        t0 = time.perf_counter()
        orders = [sampling.draw(root, f"power-{r}", args.entries, max(sizes)) for r in range(args.nonces)]
        t_draw = time.perf_counter() - t0
        bad_pos = {ids.index(i) for i in failing}
        rows = []
        for n in sizes:
            found = [sum(1 for i in order[:n] if i in bad_pos) for order in orders]
            hit = sum(1 for f in found if f) / len(found)
            predicted = 1 - comb(args.entries - args.bad, n) / comb(args.entries, n)
            se = (predicted * (1 - predicted) / len(found)) ** 0.5
            bounds = [sampling.upper_bound(f, n, args.entries) for f in found]
            covered = sum(1 for b in bounds if b >= args.bad) / len(bounds)
            rows.append({"n": n, "found_at_least_one": hit, "predicted": predicted, "standard_error": se,
                         "z": (hit - predicted) / se if se else 0.0,
                         "bound_if_none_found": sampling.upper_bound(0, n, args.entries),
                         "mean_bound": sum(bounds) / len(bounds), "bound_covers_true_k": covered})
        print(f"{args.nonces} nonces per sample size (draws: {t_draw:.1f} s)")
        print(f"{'n':>5} {'found >= 1':>11} {'hypergeom':>10} {'z':>6} {'bound if 0 found':>17} {'covers k':>9}")
        for r in rows:
            print(f"{r['n']:>5} {r['found_at_least_one']:>11.4f} {r['predicted']:>10.4f} {r['z']:>6.2f} "
                  f"{r['bound_if_none_found']:>7} ({sampling.pct(r['bound_if_none_found'] / args.entries):>6}) "
                  f"{r['bound_covers_true_k']:>9.4f}")

        # A few sampled audits end to end: real recomputes, the failing count the reused verdicts predict.
        e2e = []
        for r in range(args.end_to_end):
            nonce = f"power-{r}"
            t0 = time.perf_counter()
            n = min(args.end_to_end_size, max(sizes))
            res = recompute.audit(release, lm, sample=n, nonce=nonce)
            expected = sum(1 for i in orders[r][:n] if i in bad_pos)
            assert res["bound"]["failing"] == expected, (nonce, res["bound"]["failing"], expected)
            e2e.append({"nonce": nonce, "failing": res["bound"]["failing"], "expected": expected,
                        "bound": res["bound"]["max_failing_entries"], "seconds": time.perf_counter() - t0,
                        "tokens_per_second": res["cost"]["tokens_per_second"]})
            print(f"end to end, nonce {nonce}, n = {n}: {sampling.sentence(res['bound'])} "
                  f"(predicted failing: {expected}) in {e2e[-1]['seconds']:.1f} s")
        out = {"entries": args.entries, "bad": args.bad, "relative": args.relative, "nonces": args.nonces,
               "model": args.model, "root_digest": root, "verdicts": verdicts, "capture_seconds": t_capture,
               "full_recompute_seconds": t_full, "rows": rows, "end_to_end": e2e}
        if args.out:
            args.out.write_text(json.dumps(out, indent=2) + "\n")
            print(f"wrote {args.out}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
