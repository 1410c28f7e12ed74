"""Scenarios for tests/serving/test_vllm.py: one vLLM start for all of them.

    .venv/bin/python tests/vllm_scenarios.py build OUT_DIR       # kvgraft's venv: capture needs its transformers
    .venv-vllm/bin/python tests/vllm_scenarios.py serve OUT_DIR  # the vLLM venv (`make vllm-venv`)

Builds four releases with kvgraft's own capture (transformers, fp32) of the default model:
  good:     entry "a", verified and of the served model: must be grafted;
  tampered: entry "b", one byte of a key tensor flipped after capture: must be refused when its request
            would graft it (start-up reads no entry bytes), and vLLM recompute those blocks;
  wrong:    entry "c", captured by the model with one weight perturbed (a valid release of another
            model, as in SGLang #24758): must be refused for its model identity;
  late:     entry "e", verified at start-up, one byte flipped after vLLM started: the read-time digest
            check must refuse it and vLLM recompute those blocks (kv_load_failure_policy "recompute").
Prompt "d" is in no release: vLLM prefills it and the connector captures it into a release. Prompt
"f" (a partial hit) starts with entry "a"'s first PARTIAL tokens and goes on as "d" does: the connector
must graft the longest block-aligned prefix of it that "a" holds, and vLLM prefill the rest.
Then starts vLLM once with the connector serving all three and writes OUT_DIR/results.json: greedy
continuations (token ids, first-token logprob) with and without the connector for each prompt. The
engine's log (stderr) is what the test reads the connector's log lines from.

    .venv-vllm/bin/python tests/vllm_scenarios.py serve-signed OUT_DIR   # `serve` runs it too, after the first

A second start with a public key in the connector's config (signatures required), serving three copies
of release "a": signed with that key (must be grafted), signed with another key and unsigned (both must
be refused at start-up). Writes OUT_DIR/results-signed.json.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn

TEXTS = {
    "a": "The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
         "movable metal type, oil-based ink and a wooden press adapted from wine making. Within fifty years, "
         "presses were running in more than two hundred cities across Europe, and the price of books fell "
         "so far that ordinary merchants could own them. Scholars argue about how much this changed",
    "b": "A lighthouse keeper's day was governed by the lamp. Before dusk the wick had to be trimmed, the brass "
         "polished and the lens cleaned of salt; through the night the keeper climbed the stairs every few "
         "hours to wind the clockwork that turned the light. Storms made the work dangerous, and in winter",
    "d": "Tides are the rise and fall of sea level caused by the gravity of the Moon and the Sun acting on the "
         "rotating Earth. Most coasts see two high and two low tides a day, but the shape of a basin can change "
         "that: some bays resonate so strongly that the water climbs more than ten metres between low and",
    "e": "Glaciers move because ice under its own weight deforms like a very slow fluid, and because meltwater "
         "at the bed lets the ice slide over the rock beneath. Surveyors once drove stakes in a line across a "
         "glacier and came back years later to find the line bent into a curve, fastest in the middle where",
    "c": "Bread dough rises because yeast ferments the sugars in flour, releasing carbon dioxide that the gluten "
         "network traps in small bubbles. A slow, cool rise gives enzymes time to break starch into more "
         "sugars and lets flavour compounds develop, which is why bakers often leave dough overnight before",
}
SUFFIX = " In short,"
PARTIAL = 32 + 20  # tokens of entry "a" prompt "f" starts with: one 32-token block and 20 more
NEW_TOKENS = 16


def inspect_models_here() -> None:
    """vLLM inspects each model architecture in a new interpreter that imports vLLM again (about 20 s here, once per
    architecture and environment: 4 architectures in these scenarios), so as not to initialize CUDA in the engine's
    process. These scenarios run on the CPU, where that cannot happen: they inspect in their own process. vLLM's
    cache of what it found (VLLM_CACHE_ROOT/modelinfos) and the engines are as they were; the README's server
    test (make test-slow) runs vLLM untouched."""
    from vllm.model_executor.models import registry

    registry._run_in_subprocess = lambda fn: fn()


def flip_one_byte(release: Path, entry_id: str) -> str:
    """Flip one byte inside the first key tensor of an entry; return the tensor's name."""
    from kvgraft.release.format import Release

    entry = Release.open(release).entry(entry_id)
    name = entry["layers"][0]["keys"]
    start, _ = entry["tensors"][name]["byte_range"]
    path = release / entry["file"]
    raw = bytearray(path.read_bytes())
    header = 8 + int.from_bytes(raw[:8], "little")
    raw[header + start + 5] ^= 0x01
    path.write_bytes(bytes(raw))
    return name


def build_releases(out: Path) -> dict[str, object]:
    import torch

    from kvgraft.inference import models
    from kvgraft.inference.capture import capture

    folder = models.ensure_smollm2()
    lm = models.load(str(folder), device="cpu")
    info: dict[str, object] = {"model": str(folder)}
    for rid in ("a", "b", "e"):
        capture(lm, [(rid, {"id": rid, "text": TEXTS[rid]})], out / f"release-{rid}", probe_tokens=4)
    info["tampered_tensor"] = flip_one_byte(out / "release-b", "b")
    with torch.no_grad():  # another model under the same name: one weight moved by 1e-3
        lm.model.model.layers[3].mlp.down_proj.weight[0, 0] += 1e-3
    lm._identity = None
    capture(lm, [("c", {"id": "c", "text": TEXTS["c"]})], out / "release-c", probe_tokens=4)
    from kvgraft.release.format import Release

    info["tokens"] = {rid: Release.open(out / f"release-{rid}").entry(rid)["token_ids"] for rid in ("a", "b", "c", "e")}
    info["tokens"]["d"] = [int(t) for t in lm.tokenizer(TEXTS["d"])["input_ids"]]  # in no release: captured by vLLM
    info["tokens"]["f"] = info["tokens"]["a"][:PARTIAL] + info["tokens"]["d"]  # a partial hit on "a"
    info["key"] = str(sign_copies(out))
    (out / "plan.json").write_text(json.dumps(info) + "\n")
    return info


def sign_copies(out: Path) -> Path:
    """Copies of release "a" for serve-signed: signed by the key served, by another key, and unsigned."""
    from kvgraft.signing import keys, sign

    served_key, public = keys.write_keypair(out / "served")
    other_key, _ = keys.write_keypair(out / "other")
    for name, key in (("signed", served_key), ("other-signer", other_key), ("unsigned", None)):
        shutil.copytree(out / "release-a", out / f"release-{name}")
        if key is not None:
            sign.sign_release(out / f"release-{name}", keys.load_private_key(key))
    return public


def serve(out: Path) -> int:
    t0 = time.perf_counter()
    info = json.loads((out / "plan.json").read_text())
    tokens: dict[str, list[int]] = info["tokens"]

    from transformers import AutoTokenizer
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    inspect_models_here()
    tok = AutoTokenizer.from_pretrained(str(info["model"]))
    suffix = tok(SUFFIX, add_special_tokens=False)["input_ids"]
    t1 = time.perf_counter()
    llm = LLM(model=str(info["model"]), dtype="float32", enforce_eager=True, enable_prefix_caching=False,
              max_model_len=4096, seed=0, gpu_memory_utilization=0.25, kv_cache_memory_bytes=1 << 30, block_size=32,
              kv_transfer_config=KVTransferConfig(
                  kv_connector="KvgraftConnector", kv_connector_module_path="kvgraft.vllm.connector",
                  kv_role="kv_both", kv_load_failure_policy="recompute",
                  kv_connector_extra_config={"release": [str(out / f"release-{r}") for r in ("a", "b", "c", "e")],
                                             "capture": str(out / "captured")}))
    t2 = time.perf_counter()
    # Verified at start-up, changed afterwards: the read-time digest check must keep it out of the cache.
    flip_one_byte(out / "release-e", "e")
    results: dict[str, object] = {"tampered_tensor": info["tampered_tensor"],
                                  "block_size": llm.llm_engine.vllm_config.cache_config.block_size,
                                  "releases": {r: str(out / f"release-{r}") for r in ("a", "b", "c", "e")}}
    for rid in ("a", "b", "c", "d", "e", "f"):
        prompt = TokensPrompt(prompt_token_ids=tokens[rid] + (suffix if rid not in "df" else []))
        for mode in ("connector", "plain") if rid != "d" else ("connector",):
            extra = {"kv_transfer_params": {"kvgraft": "off"}} if mode == "plain" else None
            params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS, logprobs=1, extra_args=extra)
            print(f"kvgraft-scenario: request {rid} {mode}", file=sys.stderr, flush=True)
            (res,) = llm.generate([prompt], params, use_tqdm=False)
            c = res.outputs[0]
            first = c.token_ids[0]
            results[f"{rid}/{mode}"] = {
                "prompt_tokens": len(prompt["prompt_token_ids"]), "token_ids": list(c.token_ids),
                "first_logprob": float(c.logprobs[0][first].logprob) if c.logprobs else None,
                "num_cached_tokens": getattr(res, "num_cached_tokens", None), "text": c.text,
            }
            print(f"kvgraft-scenario: done {rid} {mode}", file=sys.stderr, flush=True)
    results["seconds"] = {"tokenizer": round(t1 - t0, 1), "vllm_start": round(t2 - t1, 1),
                          "requests": round(time.perf_counter() - t2, 1)}
    (out / "results.json").write_text(json.dumps(results, indent=1) + "\n")
    getattr(llm.llm_engine.engine_core, "shutdown", lambda: None)()
    del llm
    return 0


SIGNED = ("signed", "other-signer", "unsigned")


def serve_signed(out: Path) -> int:
    """The signed copy is served over HTTP (a release read where it is published: the connector fetches and
    checks the entry it grafts), the other two from their folders."""
    info = json.loads((out / "plan.json").read_text())
    from vllm import LLM, SamplingParams
    from vllm.config import KVTransferConfig
    from vllm.inputs import TokensPrompt

    from remote_servers import folder_server

    print("kvgraft-scenario: engine signed", file=sys.stderr, flush=True)
    os.environ["KVGRAFT_CACHE"] = str(out / "remote-cache")  # the engine process inherits it
    with folder_server(signed=out / "release-signed") as server:
        releases = {r: server.url("signed") if r == "signed" else str(out / f"release-{r}") for r in SIGNED}
        llm = LLM(model=str(info["model"]), dtype="float32", enforce_eager=True, enable_prefix_caching=False,
                  max_model_len=4096, seed=0, gpu_memory_utilization=0.25, kv_cache_memory_bytes=1 << 30,
                  block_size=32, kv_transfer_config=KVTransferConfig(
                      kv_connector="KvgraftConnector", kv_connector_module_path="kvgraft.vllm.connector",
                      kv_role="kv_both", kv_connector_extra_config={
                          "release": [releases[r] for r in SIGNED], "key": info["key"]}))
        params = SamplingParams(temperature=0.0, max_tokens=NEW_TOKENS)
        (res,) = llm.generate([TokensPrompt(prompt_token_ids=info["tokens"]["a"])], params, use_tqdm=False)
        fetched = server.paths()
    results = {"releases": releases, "fetched": fetched,
               "a/connector": {"num_cached_tokens": getattr(res, "num_cached_tokens", None),
                               "token_ids": list(res.outputs[0].token_ids)}}
    (out / "results-signed.json").write_text(json.dumps(results, indent=1) + "\n")
    return 0


def scenario_main(build: Callable[[Path], object], serve: Callable[[Path], int],
                  more: dict[str, Callable[[Path], int]] | None = None) -> int:
    """A scenario script's command line, `build OUT` or `serve OUT` (or one of `more`): the build starts from an
    empty OUT."""
    what, out = sys.argv[1], Path(sys.argv[2])
    if what == "build":
        shutil.rmtree(out, ignore_errors=True)
        out.mkdir(parents=True)
        build(out)
        return 0
    return (more or {}).get(what, serve)(out)


def scenario_exit(build: Callable[[Path], object], serve: Callable[[Path], int],
                  more: dict[str, Callable[[Path], int]] | None = None) -> NoReturn:
    """A scenario script run as a command: offline (no hub is reached), exiting with `scenario_main`'s status."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    sys.exit(scenario_main(build, serve, more))


if __name__ == "__main__":  # vLLM spawns its engine process: the guard is required
    # one interpreter for both engines by default: vLLM's import is a quarter minute
    scenario_exit(build_releases, lambda out: serve(out) or serve_signed(out), {"serve-signed": serve_signed})
