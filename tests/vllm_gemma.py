"""Scenarios for tests/serving/test_vllm_gemma.py: the preprint's model family (sliding-window and KV-shared
layers) served through the kvgraft connector in vLLM, with tiny random Gemma 3 and Gemma 4 model folders.

    .venv/bin/python tests/vllm_gemma.py build OUT_DIR       # kvgraft's venv: models and releases (transformers)
    .venv-vllm/bin/python tests/vllm_gemma.py serve OUT_DIR  # the vLLM venv: three engines, one after another

Engine "g3" (Gemma 3, sliding window 48 on layers 0 and 2; prefix caching off; capture on) serves:
  all:      entry "a", sliding layers stored with every position: grafted whole, and its first block for
            prompt "f" (a prefix hit: "a"'s first PARTIAL tokens, then "d"'s);
  window:   entry "w", sliding layers stored as their window: grafted whole; prompt "v" (its first
            PARTIAL tokens, then "d"'s) is refused (the window lacks a prefix's rows) and prefilled;
  tampered: entry "b", one byte of a sliding layer's keys flipped: refused when read, recomputed;
  wrong:    entry "o", recorded with a sliding window of 64 (commitments redone): refused for its layout;
  planted:  entry "p", every value tensor negated (commitments redone): grafted, and the continuation
            must change (the positive control: a graft that did not reach attention would not);
and prompt "d", in no release: prefilled, and captured by the connector into a release.
Engine "g3-cached" (Gemma 3, vLLM's prefix cache on) serves vLLM's own capture of "d" (graft vs a fresh
prefill in the same engine, kept apart by cache salts), the window release (refused: its blocks would be
cached with rows it does not hold), and "e", flipped after start-up: each asked twice with one salt, the
second time served from vLLM's prefix cache. Engine "g4" (Gemma 4: 2 KV-shared layers) serves "s", a copy
of entry "a" whose record names another producer for a shared layer (asked first: refused at the graft,
the request prefilled, the entry not used again), then entry "a" itself (the shared layers read their
producers' grafted cache). Engine "mistral" (one sliding window on every layer: one KV-cache group, whose
blocks outside the window are vLLM's null block) serves entry "a" whole and as a prefix hit. Last,
bench/vllm_ttft.py's `run` on a release its `build` made of the tiny Gemma 3 (sizes 64 and 96, one round).

Writes OUT_DIR/results.json: per request the token ids, first-token logprob and vLLM's cached-token count.
The engines' log (stderr) is where the test reads the connector's lines, between `kvgraft-scenario:` marks.
"""

from __future__ import annotations

import gc
import json
import shutil
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

WORDS = {"a": "Alpha.", "w": "Whiskey.", "b": "Bravo.", "o": "Oscar.", "p": "Papa.", "d": "Delta.", "e": "Echo."}
PARTIAL = 32 + 20  # tokens of an entry a prefix prompt starts with: one 32-token block and 20 more
NEW_TOKENS = 8
BLOCK = 32


def ttft() -> Any:
    """bench/vllm_ttft.py, run here at tiny sizes (one vLLM import for all of this module's engines)."""
    import importlib.util

    path = Path(__file__).resolve().parents[1] / "bench" / "vllm_ttft.py"
    spec = importlib.util.spec_from_file_location("vllm_ttft", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text(key: str) -> str:
    import tiny

    return WORDS[key] + " " + " ".join(tiny._CORPUS[:4])


def build(out: Path) -> None:
    import torch
    from vllm_scenarios import flip_one_byte

    from kvgraft.inference import models
    from kvgraft.inference.capture import capture
    from kvgraft.release.format import Release

    import rewrite
    import tiny

    plan: dict[str, Any] = {"models": {}, "tokens": {}, "window": tiny.VLLM_SLIDING_WINDOW}
    for family in tiny.VLLM_FAMILIES:
        plan["models"][family] = str(tiny.build(family, out / family))
    lm = models.load(plan["models"]["gemma3-vllm"], device="cpu")
    for rid, layout in (("a", "all"), ("w", "window"), ("b", "all"), ("o", "all"), ("p", "all"), ("e", "all")):
        capture(lm, [(rid, {"id": rid, "text": text(rid)})], out / f"g3-{rid}", probe_tokens=0, sliding=layout)
        plan["tokens"][rid] = Release.open(out / f"g3-{rid}").entry(rid)["token_ids"]
    plan["tampered_tensor"] = flip_one_byte(out / "g3-b", "b")

    def other_window(m: dict[str, Any]) -> None:
        for meta in m["entries"][0]["layers"]:
            if meta["kind"] == "sliding":
                meta["sliding_window"] = 64

    rewrite.manifest(out / "g3-o", other_window)
    entry = Release.open(out / "g3-p").entry("p")
    raw = {}
    for meta in entry["layers"]:
        start, end = entry["tensors"][meta["values"]]["byte_range"]
        data = (out / "g3-p" / entry["file"]).read_bytes()[start:end]
        raw[meta["values"]] = (-torch.frombuffer(bytearray(data), dtype=torch.float32)).numpy().tobytes()
    rewrite.tensors(out / "g3-p", 0, raw)
    plan["tokens"]["d"] = [int(t) for t in lm.tokenizer(text("d"))["input_ids"]]
    plan["tokens"]["f"] = plan["tokens"]["a"][:PARTIAL] + plan["tokens"]["d"]
    plan["tokens"]["v"] = plan["tokens"]["w"][:PARTIAL] + plan["tokens"]["d"]

    g4 = models.load(plan["models"]["gemma4-vllm"], device="cpu")
    capture(g4, [("a", {"id": "a", "text": text("a")})], out / "g4-a", probe_tokens=0, sliding="all")
    shutil.copytree(out / "g4-a", out / "g4-s")
    plan["g4_tokens"] = Release.open(out / "g4-a").entry("a")["token_ids"]

    def other_producer(m: dict[str, Any]) -> None:
        shared = [meta for meta in m["entries"][0]["layers"] if meta["kind"] == "shared"]
        shared[0]["shared_with"] = 0 if shared[0]["shared_with"] != 0 else 1
        m["entries"][0]["id"] = "s"

    rewrite.manifest(out / "g4-s", other_producer)
    plan["shared"] = [meta for meta in Release.open(out / "g4-a").entry("a")["layers"] if meta["kind"] == "shared"]
    ttft().build(out / "ttft", (64, 96), 1, "gemma3-tiny")  # bench/vllm_ttft.py's smoke run, served below
    mistral = models.load(plan["models"]["mistral-vllm"], device="cpu")
    capture(mistral, [("a", {"id": "a", "text": text("a")})], out / "mistral-a", probe_tokens=0, sliding="all")
    plan["mistral_tokens"] = Release.open(out / "mistral-a").entry("a")["token_ids"]
    (out / "plan.json").write_text(json.dumps(plan) + "\n")


def engine(model: str, releases: list[Path], *, prefix_caching: bool, capture: Path | None = None) -> Any:
    from vllm import LLM
    from vllm.config import KVTransferConfig

    extra: dict[str, Any] = {"release": [str(r) for r in releases]}
    if capture is not None:
        extra["capture"] = str(capture)
    return LLM(model=model, dtype="float32", enforce_eager=True, enable_prefix_caching=prefix_caching,
               max_model_len=2048, seed=0, kv_cache_memory_bytes=1 << 28, block_size=BLOCK,
               kv_transfer_config=KVTransferConfig(
                   kv_connector="KvgraftConnector", kv_connector_module_path="kvgraft.vllm.connector",
                   kv_role="kv_both", kv_load_failure_policy="recompute", kv_connector_extra_config=extra))


def ask(llm: Any, results: dict[str, Any], name: str, tokens: list[int], *, plain: bool = False,
        salt: str | None = None) -> None:
    from vllm import SamplingParams
    from vllm.inputs import TokensPrompt

    extra = {"kv_transfer_params": {"kvgraft": "off"}} if plain else None
    params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=1, extra_args=extra)
    prompt = TokensPrompt(prompt_token_ids=tokens)
    if salt is not None:
        prompt["cache_salt"] = salt
    print(f"kvgraft-scenario: request {name}", file=sys.stderr, flush=True)
    (res,) = llm.generate([prompt], params, use_tqdm=False)
    c = res.outputs[0]
    results[name] = {"prompt_tokens": len(tokens), "token_ids": list(c.token_ids),
                     "first_logprob": float(c.logprobs[0][c.token_ids[0]].logprob),
                     "num_cached_tokens": res.num_cached_tokens}
    print(f"kvgraft-scenario: done {name}", file=sys.stderr, flush=True)


def close(llm: Any) -> None:
    shutdown = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
    if shutdown is not None and hasattr(shutdown, "shutdown"):
        shutdown.shutdown()
    del llm
    gc.collect()


def serve(out: Path) -> int:
    from vllm_scenarios import inspect_models_here

    from kvgraft.release.format import Release

    inspect_models_here()

    plan = json.loads((out / "plan.json").read_text())
    tokens: dict[str, list[int]] = plan["tokens"]
    tail = tokens["d"][:6]  # what follows an entry in its prompt: the prompt goes on past the entry
    results: dict[str, Any] = {}

    print("kvgraft-scenario: engine g3", file=sys.stderr, flush=True)
    llm = engine(plan["models"]["gemma3-vllm"], [out / f"g3-{r}" for r in "awbop"], prefix_caching=False,
                 capture=out / "captured")
    for rid in "awbop":
        ask(llm, results, f"g3/{rid}/connector", tokens[rid] + tail)
        ask(llm, results, f"g3/{rid}/plain", tokens[rid] + tail, plain=True)
    for rid in "fv":
        ask(llm, results, f"g3/{rid}/connector", tokens[rid])
        ask(llm, results, f"g3/{rid}/plain", tokens[rid], plain=True)
    ask(llm, results, "g3/d/connector", tokens["d"])  # a miss: prefilled and captured
    close(llm)

    captured = next(m.parent for m in (out / "captured").glob("*/manifest.json")
                    if Release.open(m.parent).entries[0]["token_ids"] == tokens["d"])
    results["captured"] = str(captured)
    print("kvgraft-scenario: engine g3-cached", file=sys.stderr, flush=True)
    llm = engine(plan["models"]["gemma3-vllm"], [captured, out / "g3-w", out / "g3-e"], prefix_caching=True)
    from vllm_scenarios import flip_one_byte

    flip_one_byte(out / "g3-e", "e")  # verified at start-up, changed afterwards
    for rid, prompt in (("d", tokens["d"] + tail), ("w", tokens["w"] + tail), ("e", tokens["e"] + tail)):
        ask(llm, results, f"cached/{rid}/connector", prompt, salt=f"graft-{rid}")
        ask(llm, results, f"cached/{rid}/again", prompt, salt=f"graft-{rid}")  # vLLM's prefix cache has its blocks
        ask(llm, results, f"cached/{rid}/plain", prompt, plain=True, salt=f"plain-{rid}")
    close(llm)

    print("kvgraft-scenario: engine g4", file=sys.stderr, flush=True)
    # "s" first: the prompt matches it first, its graft fails at the shared layer, and then "a" serves it
    llm = engine(plan["models"]["gemma4-vllm"], [out / "g4-s", out / "g4-a"], prefix_caching=False)
    ask(llm, results, "g4/s/connector", plan["g4_tokens"] + tail)
    ask(llm, results, "g4/a/connector", plan["g4_tokens"] + tail)
    ask(llm, results, "g4/a/plain", plan["g4_tokens"] + tail, plain=True)
    close(llm)

    print("kvgraft-scenario: engine mistral", file=sys.stderr, flush=True)
    llm = engine(plan["models"]["mistral-vllm"], [out / "mistral-a"], prefix_caching=False)
    m = plan["mistral_tokens"]
    for name, prompt in (("whole", m + tail), ("prefix", m[:PARTIAL] + tokens["d"])):
        ask(llm, results, f"mistral/{name}/connector", prompt)
        ask(llm, results, f"mistral/{name}/plain", prompt, plain=True)
    close(llm)
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    print("kvgraft-scenario: bench/vllm_ttft.py", file=sys.stderr, flush=True)
    ttft().run(out / "ttft")  # its table goes to stdout, into the same log
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    from vllm_scenarios import scenario_exit

    scenario_exit(build, serve)
