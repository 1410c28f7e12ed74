"""Power of the recompute verdict: benign relabels (false alarms) and planted faults (detection), vs TOPLOC.

Run: .venv/bin/python bench/sensitivity.py [--elements 10] [--out bench/sensitivity.json]
     [--model SPEC --records apples,train --long-tokens 300 --weights-layer 10]   (a tiny model: tests/bench)

Every case is a release on disk audited by `recompute.audit` exactly as `kvgraft audit recompute`
would (recorded conditions replayed, noise bound measured on this machine, `--require consistent`):
- benign: states computed under another attention kernel, chunking, thread count or batch shape,
  relabelled as the recorded conditions (every commitment rewritten): must be `consistent`;
- planted: one element scaled by 1 + r (r = 1, 1e-2, 1e-4, 1e-6) at random elements, two ways of
  counting "relative": to the element itself, and to the RMS of its row (head, position);
- tokens: states of token ids with one id changed at the start, middle or end, filed under the
  original ids;
- weights: one layer's weights scaled by 1 + s while the model keeps its name (audited with force);
- another model: the same architecture with freshly initialised weights.
Also leave-one-out over the benign perturbations: the noise bound measured without the perturbation
that made the states, in units of row noise (what the constant FACTOR has to exceed).
TOPLOC's tolerance check (top-128 by magnitude per tensor, bf16: exponent matches >= 90, mantissa
error mean <= 10, median <= 8) is applied to the same stored/fresh tensors.
"""

from __future__ import annotations

import argparse
import copy
import json
import random
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from kvgraft.inference import capture, models
from kvgraft.inference.runtime import Schedule, attention, layer_map, padded_batch_row, prefill, threads
from kvgraft.recompute import audit as recompute
from kvgraft.recompute import noise
from kvgraft.recompute.determinism import prefix_ids
from kvgraft.release.format import Release
from kvgraft.signing.policy import OwnOutput
from kvgraft.signing.verify import verified

import rewrite  # tests/rewrite.py: rewrite bytes and every commitment over them

EXAMPLE = Path(__file__).resolve().parents[1] / "kvgraft" / "data" / "example.jsonl"


def toploc(stored: torch.Tensor, fresh: torch.Tensor, k: int = 128) -> bool:
    """TOPLOC's tolerance check on one tensor: the prover's top-k by magnitude, compared in bfloat16."""
    s = stored.reshape(-1)
    idx = torch.topk(s.abs(), min(k, s.numel())).indices
    a = s[idx].to(torch.bfloat16).view(torch.int16).to(torch.int32)
    b = fresh.reshape(-1)[idx].to(torch.bfloat16).view(torch.int16).to(torch.int32)
    exp_a, exp_b = (a >> 7) & 0xFF, (b >> 7) & 0xFF
    same = exp_a == exp_b
    if int(same.sum()) < 90 * len(idx) / 128:
        return False
    err = ((a & 0x7F) - (b & 0x7F)).abs()[same].double()
    return bool(err.mean() <= 10 and err.median() <= 8)


def toploc_release(rel: Path, lm: models.LoadedModel) -> bool:
    """TOPLOC over every K/V tensor of every entry, against this machine's replayed recompute."""
    r = Release.open(rel)
    ok = True
    for entry in r.entries:
        cache, _ = prefill(lm, entry["token_ids"], Schedule.from_dict(r.manifest["schedule"]))
        _, fresh = layer_map(lm, cache)
        from safetensors.torch import load_file

        stored = load_file(str(r.entry_file(entry)))
        ok = ok and all(toploc(stored[name], fresh[name]) for name in fresh)
    return ok


def audit(rel: Path, lm: models.LoadedModel, force: bool = False) -> dict[str, Any]:
    # Captured (and planted) by this script: read back as its own output, digests only.
    result = recompute.audit(verified(rel, OwnOutput("bench/sensitivity.py, which captured it")), lm,
                             require="consistent", force=force, probe_text=None)
    e = result["entries"]
    worst = max(e, key=lambda x: x["max_excess"])
    out = worst.get("outside") or {}
    return {"verdict": result["verdict"], "max_excess": worst["max_excess"],
            "where": out.get("worst") or out.get("layout") or out.get("shape"),
            "noise_bound_s": sum(x["seconds"]["noise_bound"] for x in e), "toploc": toploc_release(rel, lm)}


def states_under(lm: models.LoadedModel, ids: list[int], how: str) -> dict[str, torch.Tensor]:
    if how.startswith("eager attention, "):
        with attention(lm, "eager"):
            return states_under(lm, ids, how.removeprefix("eager attention, "))
    if how == "eager attention":
        with attention(lm, "eager"):
            return layer_map(lm, prefill(lm, ids, Schedule())[0])[1]
    if how == "1 thread":
        with threads(1):
            return layer_map(lm, prefill(lm, ids, Schedule())[0])[1]
    if how.startswith("chunks of "):
        return layer_map(lm, prefill(lm, ids, Schedule(int(how.split()[-1])))[0])[1]
    if how == "row 0 of a left-padded batch of 4":
        return padded_batch_row(lm, ids)[0]
    raise ValueError(how)


def store(rel: Path, states: dict[str, torch.Tensor]) -> None:
    """Put `states` in place of the single entry's tensors, every commitment rewritten (tests/rewrite.py)."""
    rewrite.tensors(rel, 0, {name: t.detach().contiguous().to(torch.float32).numpy().tobytes()
                             for name, t in states.items()})


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--elements", type=int, default=10, help="random elements per planted size")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--model", default=models.DEFAULT_MODEL, help="model spec (default: the default model)")
    ap.add_argument("--records", default=None, help="ids of the example's records to use (comma-separated; "
                    "default: all; the planted faults go into 'train')")
    ap.add_argument("--long-tokens", type=int, default=300, help="tokens of the long record added to the example's")
    ap.add_argument("--weights-layer", type=int, default=10, help="the layer whose weights are scaled")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    torch.manual_seed(args.seed)
    t_start = time.perf_counter()
    lm = models.load(args.model, device="cpu", dtype="float32", attn="sdpa")
    records = capture.read_records(EXAMPLE)
    if args.records is not None:
        records = [(w, r) for w, r in records if r["id"] in args.records.split(",")]
    long_text = lm.tokenizer.decode(prefix_ids(lm, args.long_tokens))
    records.append(("bench", {"id": f"long{args.long_tokens}", "text": long_text}))
    tmp = Path(tempfile.mkdtemp(prefix="kvgraft-sensitivity-"))
    rows: list[dict[str, Any]] = []
    loo: list[dict[str, Any]] = []

    def case(group: str, label: str, rel: Path, force: bool = False, **extra: Any) -> dict[str, Any]:
        r = {"group": group, "case": label, **audit(rel, lm, force=force), **extra}
        rows.append(r)
        print(f"{group:10} {label:48} {r['verdict']:12} max/env {r['max_excess']:.3g} "
              f"({r['max_excess'] * noise.FACTOR:.3g}x row noise)  toploc "
              f"{'pass' if r['toploc'] else 'FAIL'}", flush=True)
        return r

    # Clean releases, one per record, captured under the default conditions.
    clean: dict[str, Path] = {}
    for where, rec in records:
        out = tmp / f"clean-{rec['id']}"
        capture.capture(lm, [(where, rec)], out, probe_tokens=2)
        clean[rec["id"]] = out
        case("control", f"{rec['id']}: unchanged", out)

    # Benign relabels, audited as recorded, and leave-one-out in units of row noise.
    # The first five are perturbations the noise bound is calibrated with (left out one at a time below);
    # token-by-token prefill (matrix-vector kernels) and chunks of 16 are never part of a calibration.
    benign = ["eager attention", "1 thread", "chunks of 64", "row 0 of a left-padded batch of 4",
              "chunks of 16", "chunks of 1", "eager attention, chunks of 1"]
    for eid, src in clean.items():
        ids = Release.open(src).entries[0]["token_ids"]
        ref = layer_map(lm, prefill(lm, ids, Schedule())[0])[1]
        for how in benign:
            states = states_under(lm, ids, how)
            rel = tmp / f"benign-{eid}-{how.replace(' ', '_')}"
            shutil.copytree(src, rel)
            store(rel, states)
            differs = any(not torch.equal(states[n], ref[n]) for n in ref)
            case("benign", f"{eid}: {how}", rel, bytes_differ=differs)
            if not differs:
                continue
            env = noise.calibrate(lm, ids, Schedule(), ref, skip={how})
            worst = 0.0
            for name, t in states.items():
                allowed = env.allowed(name, ref[name]) / env.factor  # one row's noise
                worst = max(worst, float(((t.double() - ref[name].double()).abs() / allowed).max()))
            loo.append({"entry": eid, "perturbation": how, "excess_in_row_noise": worst,
                        "calibrated_from": [p.name for p in env.runs]})
            print(f"  leave-one-out {eid}: {how}: {worst:.2f}x row noise", flush=True)

    # Planted single-element changes on the 94-token entry.
    src = clean["train"]
    man = Release.open(src).entries[0]  # either layout
    tensor_names = [n for n in man["tensors"] if n.startswith("layer.")]
    ids = man["token_ids"]
    ref = layer_map(lm, prefill(lm, ids, Schedule())[0])[1]
    for r in (1.0, 1e-2, 1e-4, 1e-6):
        for mode in ("element", "row-rms"):
            hits, toploc_hits = 0, 0
            noise_units: list[float] = []
            for k in range(args.elements):
                name = rng.choice(tensor_names)
                shape = man["tensors"][name]["shape"]
                head, pos, dim = rng.randrange(shape[1]), rng.randrange(shape[2]), rng.randrange(shape[3])
                x = float(ref[name][0, head, pos, dim])
                rms = float(ref[name][0, head, pos].double().pow(2).mean().sqrt())
                delta = r * (abs(x) if mode == "element" else rms)
                rel = tmp / f"planted-{r}-{mode}-{k}"
                shutil.copytree(src, rel)
                rewrite.element(rel, 0, name, rewrite.flat_index(shape, head, pos, dim), lambda v, d=delta: v + d)
                res = audit(rel, lm)
                w = res["where"] if isinstance(res["where"], dict) else {}
                located = (res["verdict"] == "inconsistent" and w.get("layer") == int(name.split(".")[1])
                           and w.get("tensor") == name.split(".")[2] and (w.get("head"), w.get("position"),
                                                                          w.get("dim")) == (head, pos, dim))
                hits += located
                toploc_hits += not res["toploc"]
                noise_units.append(res["max_excess"] * noise.FACTOR)
                shutil.rmtree(rel)
            rows.append({"group": "planted", "case": f"one element +{r:g} x |{'x' if mode == 'element' else 'row rms'}|",
                         "detected_and_located": hits, "trials": args.elements, "toploc_detected": toploc_hits,
                         "excess_in_row_noise": sorted(noise_units)})
            print(f"planted    +{r:g} ({mode}): located {hits}/{args.elements}, TOPLOC {toploc_hits}/{args.elements}; "
                  f"|diff| in row noise: min {min(noise_units):.3g}, median {sorted(noise_units)[len(noise_units) // 2]:.3g}",
                  flush=True)

    # One token id changed, states filed under the original ids.
    for where_label, at in (("start", 1), ("middle", len(ids) // 2), ("end", len(ids) - 1)):
        other = list(ids)
        other[at] = ids[at] + 1
        cache, _ = prefill(lm, other, Schedule())
        states = layer_map(lm, cache)[1]
        rel = tmp / f"tokens-{where_label}"
        shutil.copytree(src, rel)
        store(rel, states)
        case("tokens", f"token {at} ({where_label}) changed", rel)

    # One layer's weights scaled, the model keeping its name (audited with force).
    for s in (1e-2, 1e-3, 1e-4, 1e-5):
        other_model = copy.deepcopy(lm.model)
        with torch.no_grad():
            for p in other_model.model.layers[args.weights_layer].parameters():
                p.mul_(1 + s)
        olm = models.LoadedModel(lm.spec, other_model, lm.tokenizer, lm.device, lm.dtype, lm.attn)
        states = layer_map(olm, prefill(olm, ids, Schedule())[0])[1]
        rel = tmp / f"weights-{s}"
        shutil.copytree(src, rel)
        store(rel, states)
        case("weights", f"layer {args.weights_layer} weights x (1 + {s:g})", rel, force=True)
        del other_model, olm

    # Another model of the same architecture (fresh initialisation).
    from transformers import AutoModelForCausalLM

    torch.manual_seed(1)
    fresh_model = AutoModelForCausalLM.from_config(lm.model.config, dtype=torch.float32)
    fresh_model.eval()
    olm = models.LoadedModel(lm.spec, fresh_model, lm.tokenizer, lm.device, lm.dtype, lm.attn)
    states = layer_map(olm, prefill(olm, ids, Schedule())[0])[1]
    rel = tmp / "other-model"
    shutil.copytree(src, rel)
    store(rel, states)
    case("model", "same architecture, other weights", rel, force=True)

    benign_rows = [r for r in rows if r["group"] in ("benign", "control")]
    false_alarms = sum(r["verdict"] == "inconsistent" for r in benign_rows)
    toploc_false = sum(not r["toploc"] for r in benign_rows)
    print(f"\nfalse alarms: kvgraft {false_alarms}/{len(benign_rows)}, TOPLOC {toploc_false}/{len(benign_rows)} "
          f"(benign and unchanged releases)")
    if loo:
        print(f"leave-one-out: largest excess {max(x['excess_in_row_noise'] for x in loo):.2f}x row noise "
              f"(FACTOR = {noise.FACTOR:g})")
    print(f"total {time.perf_counter() - t_start:.0f} s; model {lm.spec}, torch threads {torch.get_num_threads()}")
    if args.out:
        args.out.write_text(json.dumps({"rows": rows, "leave_one_out": loo, "factor": noise.FACTOR,
                                        "false_alarms": false_alarms, "toploc_false_alarms": toploc_false},
                                       indent=1, default=str) + "\n")
    shutil.rmtree(tmp)


if __name__ == "__main__":
    main()
