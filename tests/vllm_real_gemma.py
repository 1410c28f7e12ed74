"""Scenarios for tests/serving/test_real_gemma_vllm.py: the real Gemma 3 270M (the gemma3-270m preset) served
through the kvgraft connector in vLLM, from releases captured in transformers.

    .venv/bin/python tests/vllm_real_gemma.py build OUT_DIR       # kvgraft's venv: the releases (transformers)
    .venv-vllm/bin/python tests/vllm_real_gemma.py serve OUT_DIR  # the vLLM venv: one engine

One engine (prefix caching off, capture on) serves:
  entry "a", longer than the 512-token sliding window, sliding layers stored with every position: grafted whole,
            and its first block for prompt "f" ("a"'s first PARTIAL tokens, then "d"'s: a prefix hit);
  entry "b", one byte of its first keys flipped after capture: refused when read, prefilled;
and prompt "d", in no release: prefilled, and captured by the connector into a release that the test
recomputes in transformers (the cross-engine verdict). Writes OUT_DIR/results.json as tests/vllm_gemma.py does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

PARTIAL = 32 + 20  # one 32-token block of entry "a", and 20 more tokens


def texts() -> dict[str, str]:
    from vllm_scenarios import TEXTS

    long = " ".join(f"{i}. {TEXTS[k]}" for i, k in enumerate("abdabdabdabd", 1))  # past the 512-token window
    return {"a": long, "b": "Bravo. " + TEXTS["b"], "d": TEXTS["d"]}


def build(out: Path) -> None:
    from vllm_scenarios import flip_one_byte

    from kvgraft.inference import models, presets
    from kvgraft.inference.capture import capture
    from kvgraft.release.format import Release

    lm = models.load("gemma3-270m", device="cpu")
    plan: dict[str, Any] = {"model": str(presets.folder(presets.PRESETS["gemma3-270m"])), "tokens": {},
                            "window": int(lm.model.config.sliding_window)}
    for rid in "ab":
        capture(lm, [(rid, {"id": rid, "text": texts()[rid]})], out / f"release-{rid}", probe_tokens=0, sliding="all")
        plan["tokens"][rid] = Release.open(out / f"release-{rid}").entry(rid)["token_ids"]
    plan["tampered_tensor"] = flip_one_byte(out / "release-b", "b")
    plan["tokens"]["d"] = [int(t) for t in lm.tokenizer(texts()["d"])["input_ids"]]
    plan["tokens"]["f"] = plan["tokens"]["a"][:PARTIAL] + plan["tokens"]["d"]
    (out / "plan.json").write_text(json.dumps(plan) + "\n")


def serve(out: Path) -> int:
    from vllm_gemma import ask, close, engine
    from vllm_scenarios import inspect_models_here

    from kvgraft.release.format import Release

    inspect_models_here()
    plan = json.loads((out / "plan.json").read_text())
    tokens: dict[str, list[int]] = plan["tokens"]
    tail = tokens["d"][:6]
    results: dict[str, Any] = {}
    print("kvgraft-scenario: engine gemma3-270m", file=sys.stderr, flush=True)
    llm = engine(plan["model"], [out / "release-a", out / "release-b"], prefix_caching=False, capture=out / "captured")
    for rid in "ab":
        ask(llm, results, f"{rid}/connector", tokens[rid] + tail)
        ask(llm, results, f"{rid}/plain", tokens[rid] + tail, plain=True)
    ask(llm, results, "f/connector", tokens["f"])
    ask(llm, results, "f/plain", tokens["f"], plain=True)
    ask(llm, results, "d/connector", tokens["d"])  # a miss: prefilled and captured
    close(llm)
    results["captured"] = str(next(m.parent for m in (out / "captured").glob("*/manifest.json")
                                   if Release.open(m.parent).entries[0]["token_ids"] == tokens["d"]))
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    from vllm_scenarios import scenario_exit

    scenario_exit(build, serve)
