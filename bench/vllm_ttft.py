"""Time to first token in vLLM: a verified kvgraft graft vs a plain prefill, 512 and 2048 prompt tokens.

    .venv/bin/python bench/vllm_ttft.py build out/bench-vllm        # capture the release (kvgraft's venv)
    .venv-vllm/bin/python bench/vllm_ttft.py run out/bench-vllm     # serve it (make vllm-venv)

`build OUT 64 128 --repeats 1` takes other prompt sizes and repeats (tests/serving/test_vllm.py runs it so).

One vLLM engine (CPU backend, fp32, eager, prefix caching off, block size 32) with the kvgraft
connector; for each size, graft and plain requests alternate (`max_tokens=1`, greedy), REPEATS each,
after one warm-up of each. TTFT is the wall time of `LLM.generate` for one request: it includes
vLLM's scheduling, the connector's read + SHA-256 of the entry (the verification done per graft), the
copy into the paged cache, and the forward pass over the tokens not grafted. The release's full
verification (`kvgraft.signing.verify.verified`) runs once at engine start-up; its time is measured here
separately, in this process, as is the per-graft read + hash alone.
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import time
from pathlib import Path

SIZES = (512, 2048)
REPEATS = 5
SUFFIX = " In short,"


def build(out: Path, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS) -> None:
    from kvgraft.inference import models, runtime
    from kvgraft.inference.capture import capture

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    folder = models.ensure_smollm2()
    lm = models.load(str(folder), device="cpu")
    base = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = runtime.encode(lm, base * 4, add_special_tokens=True)
    records = []
    for n in sizes:
        text = lm.tokenizer.decode(ids[:n], skip_special_tokens=True)
        records.append((f"n{n}", {"id": f"n{n}", "text": text}))
    capture(lm, records, out / "release", probe_tokens=0)
    (out / "plan.json").write_text(json.dumps({"model": str(folder), "sizes": list(sizes), "repeats": repeats}) + "\n")


def run(out: Path) -> None:
    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from kvgraft.inference.graft import read_entry_tensors
    from kvgraft.signing.policy import verify_policy
    from kvgraft.signing.verify import verified

    plan = json.loads((out / "plan.json").read_text())
    release = out / "release"
    t = time.perf_counter()
    checked = verified(release, verify_policy())
    rel = checked.release
    verify_s = time.perf_counter() - t
    entries = {e["id"]: e for e in rel.entries}
    hash_ms: dict[str, float] = {}
    for eid, entry in entries.items():
        runs = []
        for _ in range(3):
            t = time.perf_counter()
            read_entry_tensors(checked, entry)
            runs.append(time.perf_counter() - t)
        hash_ms[eid] = statistics.median(runs) * 1e3
    tok = AutoTokenizer.from_pretrained(plan["model"])
    suffix = tok(SUFFIX, add_special_tokens=False)["input_ids"]
    llm = LLM(model=plan["model"], dtype="float32", enforce_eager=True, enable_prefix_caching=False,
              max_model_len=4096, seed=0, gpu_memory_utilization=0.25, kv_cache_memory_bytes=1 << 30, block_size=32,
              kv_transfer_config=KVTransferConfig(
                  kv_connector="KvgraftConnector", kv_connector_module_path="kvgraft.vllm.connector",
                  kv_role="kv_both", kv_load_failure_policy="recompute",
                  kv_connector_extra_config={"release": str(release)}))
    import vllm

    rows = []
    for n in plan.get("sizes", SIZES):
        entry = entries[f"n{n}"]
        prompt = TokensPrompt(prompt_token_ids=entry["token_ids"] + suffix)
        times: dict[str, list[float]] = {"graft": [], "plain": []}
        firsts: dict[str, set[int]] = {"graft": set(), "plain": set()}
        cached = 0
        for i in range(plan.get("repeats", REPEATS) + 1):
            for mode in ("graft", "plain"):
                extra = {"kv_transfer_params": {"kvgraft": "off"}} if mode == "plain" else None
                params = SamplingParams(temperature=0.0, max_tokens=1, extra_args=extra)
                t = time.perf_counter()
                (res,) = llm.generate([prompt], params, use_tqdm=False)
                dt = time.perf_counter() - t
                firsts[mode].add(int(res.outputs[0].token_ids[0]))
                if i > 0:  # the first round warms up both paths
                    times[mode].append(dt)
                if mode == "graft":
                    cached = res.num_cached_tokens
                if mode == "graft" and not cached:
                    raise SystemExit(f"n{n}: the graft request was not served from the release (0 cached tokens)")
        g, p = statistics.median(times["graft"]), statistics.median(times["plain"])
        rows.append({"entry": f"n{n}", "prompt_tokens": len(prompt["prompt_token_ids"]),
                     "entry_tokens": entry["num_tokens"], "grafted_tokens": cached,
                     "ttft_graft_ms": g * 1e3, "ttft_plain_ms": p * 1e3, "speedup": p / g,
                     "read_hash_ms": hash_ms[f"n{n}"], "verify_share": hash_ms[f"n{n}"] / 1e3 / g,
                     "same_first_token": firsts["graft"] == firsts["plain"] and len(firsts["graft"]) == 1,
                     "graft_runs_ms": [round(x * 1e3, 1) for x in times["graft"]],
                     "plain_runs_ms": [round(x * 1e3, 1) for x in times["plain"]]})
    doc = {"vllm": vllm.__version__, "threads": os.cpu_count(), "startup_verify_s": verify_s,
           "release_bytes": sum(f["size"] for f in rel.all_files().values()), "rows": rows}
    (out / "ttft.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"vLLM {vllm.__version__}, CPU backend, fp32; release verified at start-up in {verify_s * 1e3:.0f} ms "
          f"({doc['release_bytes'] / 1e6:.1f} MB)")
    print("| prompt tokens | grafted | TTFT graft (ms) | TTFT plain prefill (ms) | speedup | per-graft read+SHA-256 (ms) "
          "| its share of graft TTFT | same first token |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['prompt_tokens']} | {r['grafted_tokens']} | {r['ttft_graft_ms']:.1f} | {r['ttft_plain_ms']:.1f} | "
              f"{r['speedup']:.1f}x | {r['read_hash_ms']:.1f} | {r['verify_share'] * 100:.0f} % | {r['same_first_token']} |")


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["build", "run"])
    ap.add_argument("out", type=Path)
    ap.add_argument("sizes", type=int, nargs="*", help=f"prompt sizes in tokens (build; default {SIZES})")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed requests per size and mode (build)")
    args = ap.parse_args()
    build(args.out, tuple(args.sizes) or SIZES, args.repeats) if args.what == "build" else run(args.out)
