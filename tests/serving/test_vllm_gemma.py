"""The preprint's model family in vLLM: sliding-window (Gemma 3) and KV-shared (Gemma 4) layers grafted by the
kvgraft connector, prefix hits, vLLM's own prefix cache, and capture from vLLM. One build and one run of three
engines for the module (tests/vllm_gemma.py says what each engine serves); skips only as tests/serving/test_vllm.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_vllm import VENV_PY, _lines, build_and_serve

SCENARIOS = Path(__file__).resolve().parents[1] / "vllm_gemma.py"
Served = tuple[dict[str, Any], str, Path]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return build_and_serve(tmp_path_factory, SCENARIOS)


def during(log: str, name: str) -> list[str]:
    lines = log.splitlines()
    start = lines.index(f"kvgraft-scenario: request {name}")
    return lines[start:lines.index(f"kvgraft-scenario: done {name}", start)]


def plan(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "plan.json").read_text()))


def same_tokens(results: dict[str, Any], a: str, b: str) -> None:
    assert results[a]["token_ids"] == results[b]["token_ids"], (results[a], results[b])


@pytest.mark.parametrize("rid, layout", [("a", "every position"), ("w", "its window")])
def test_a_sliding_window_entry_is_grafted_whole(gemma: Served, rid: str, layout: str) -> None:
    """Sliding layers stored with every position, or as their window: the whole entry is grafted (vLLM counts its
    tokens as cached), the prompt goes on past it and past the window, and vLLM continues as after a plain
    prefill (KV from transformers, vLLM's kernels for the rest: close, not equal bits)."""
    results, log, run = gemma
    total = len(plan(run)["tokens"][rid])
    graft, plain = results[f"g3/{rid}/connector"], results[f"g3/{rid}/plain"]
    assert graft["prompt_tokens"] > total > plan(run)["window"] and plain["num_cached_tokens"] == 0
    assert graft["num_cached_tokens"] == total, (layout, graft)
    (line,) = [x for x in during(log, f"g3/{rid}/connector") if "kvgraft: grafted" in x]
    assert f"release={run / f'g3-{rid}'} entry={rid} tokens=[0, {total}) of {total} " in line, line
    same_tokens(results, f"g3/{rid}/connector", f"g3/{rid}/plain")
    assert abs(graft["first_logprob"] - plain["first_logprob"]) < 1e-3


def test_a_graft_reaches_attention_planted_values_change_the_continuation(gemma: Served) -> None:
    """The positive control beside the equalities above: entry "p" with every value tensor negated (its
    commitments redone, so it verifies) is grafted, and the continuation is no longer the plain prefill's."""
    results, log, _ = gemma
    graft, plain = results["g3/p/connector"], results["g3/p/plain"]
    assert graft["num_cached_tokens"] > 0 and [x for x in during(log, "g3/p/connector") if "kvgraft: grafted" in x]
    assert graft["first_logprob"] != plain["first_logprob"] and graft["token_ids"] != plain["token_ids"]


def prefix_hit(served: Served, name: str) -> str:
    """Prompt `name` starts with entry "a"'s first 52 tokens: its first 32-token block is grafted, vLLM computes the
    rest, and the tokens are a plain prefill's. Returns the graft's log line."""
    results, log, run = served
    total = len(plan(run)["tokens"]["a"])
    assert results[f"{name}/connector"]["num_cached_tokens"] == 32
    (line,) = [x for x in during(log, f"{name}/connector") if "kvgraft: grafted" in x]
    assert f"entry=a tokens=[0, 32) of {total} " in line, line
    same_tokens(results, f"{name}/connector", f"{name}/plain")
    return line


def test_prefix_hit_miss_and_a_window_that_cannot_give_a_prefix(gemma: Served) -> None:
    results, log, run = gemma
    assert "(rows of the entry's recorded one-shot prefill" in prefix_hit(gemma, "g3/f")
    # miss: "d" is in no release
    assert results["g3/d/connector"]["num_cached_tokens"] == 0
    assert not [x for x in during(log, "g3/d/connector") if "kvgraft: grafted" in x or "refused" in x]
    # "v" starts with entry "w"'s first 52 tokens, whose sliding layers hold only the last window: refused
    (line,) = [x for x in during(log, "g3/v/connector") if "kvgraft: graft refused" in x]
    assert f"release={run / 'g3-w'} entry=w tensor=layer.0.keys reason=layer 0 stores only its window" in line
    assert "a graft of the first 32 tokens needs positions [0, 32)" in line and line.endswith("served by prefill")
    assert results["g3/v/connector"]["num_cached_tokens"] == 0
    assert results["g3/v/connector"]["first_logprob"] == results["g3/v/plain"]["first_logprob"]


def test_tampered_entry_and_wrong_layout_are_refused_and_prefilled(gemma: Served) -> None:
    results, log, run = gemma
    tensor = plan(run)["tampered_tensor"]
    (line,) = [x for x in during(log, "g3/b/connector") if "kvgraft: graft refused" in x]
    assert f"release={run / 'g3-b'} entry=b tensor={tensor} " in line and "sha256" in line, line
    # a failed load of a model with several KV-cache groups is reported per request: vLLM recomputes it all
    assert results["g3/b/connector"]["num_cached_tokens"] == 0
    assert results["g3/b/connector"]["first_logprob"] == results["g3/b/plain"]["first_logprob"]
    (line,) = [x for x in during(log, "g3/o/connector") if "kvgraft: graft refused" in x]
    assert (f"release={run / 'g3-o'} entry=o tensor=layer.0.keys reason=layer 0 is stored with a sliding window of "
            "64; vLLM serves it with a sliding window of 48; served by prefill") in line, line
    assert results["g3/o/connector"]["num_cached_tokens"] == 0
    assert results["g3/o/connector"]["first_logprob"] == results["g3/o/plain"]["first_logprob"]


def test_vllm_capture_of_a_sliding_window_model_grafts_byte_exact_in_vllm(gemma: Served) -> None:
    """vLLM's own capture of prompt "d", grafted into a fresh engine of the same model and conditions: the first
    token's log-probability has the same bits as a fresh prefill of the same prompt there (kept apart from the
    graft's blocks by another cache salt), and the same tokens follow."""
    results, _, run = gemma
    captured = Path(results["captured"])
    doc = json.loads((captured / "manifest.json").read_text())
    from kvgraft.release.format import Release

    entry = Release.open(captured).entries[0]
    assert entry["token_ids"] == plan(run)["tokens"]["d"]
    sliding = [m for m in entry["layers"] if m["kind"] == "sliding"]
    assert [m["index"] for m in sliding] == [0, 2] and all(
        m["stores"] == "all" and m["sliding_window"] == 48 and m["positions"] == [0, len(entry["token_ids"])]
        for m in sliding), entry["layers"]
    assert doc["environment"]["engine"]["name"] == "vllm"
    graft, plain = results["cached/d/connector"], results["cached/d/plain"]
    assert graft["num_cached_tokens"] == len(entry["token_ids"]) and plain["num_cached_tokens"] == 0
    assert graft["token_ids"] == plain["token_ids"] and graft["first_logprob"] == plain["first_logprob"], (graft, plain)


def test_vllm_prefix_cache_serves_no_stale_or_unverified_blocks(gemma: Served) -> None:
    """With vLLM's prefix cache on, a second request for a grafted prompt takes the graft's whole blocks from
    vLLM's cache and only the rest from the release; a release changed after start-up is refused, its request
    recomputed, and the second request gets those recomputed blocks, never the changed bytes; a release that
    stores only windows is refused, since vLLM would cache blocks with rows it does not hold."""
    results, log, run = gemma
    total = len(plan(run)["tokens"]["d"])
    again = results["cached/d/again"]
    (line,) = [x for x in during(log, "cached/d/again") if "kvgraft: grafted" in x]
    assert f"tokens=[{total // 32 * 32}, {total}) of {total}" in line, line
    assert again["num_cached_tokens"] == total and again["first_logprob"] == results["cached/d/plain"]["first_logprob"]
    (line,) = [x for x in during(log, "cached/e/connector") if "kvgraft: graft refused" in x]
    assert f"release={run / 'g3-e'} entry=e tensor=layer.0.keys " in line and "sha256" in line, line
    assert not [x for x in during(log, "cached/e/again") if "entry=e" in x]  # not grafted, not tried again
    assert results["cached/e/again"]["num_cached_tokens"] > 0  # vLLM's own (recomputed) blocks
    for name in ("cached/e/connector", "cached/e/again"):
        assert results[name]["first_logprob"] == results["cached/e/plain"]["first_logprob"], name
        same_tokens(results, name, "cached/e/plain")
    (line,) = [x for x in during(log, "cached/w/connector") if "kvgraft: graft refused" in x]
    assert "stores only its window" in line and "vLLM's prefix cache would keep blocks" in line, line
    assert results["cached/w/connector"]["num_cached_tokens"] == 0


def test_kv_shared_layers_read_their_producers_graft(gemma: Served) -> None:
    """Gemma 4: the two KV-shared layers are stored once, as reading their producer's cache, and vLLM runs them
    so; a record naming another producer is refused at the graft, its request prefilled."""
    results, log, run = gemma
    shared = plan(run)["shared"]
    assert len(shared) == 2 and all(m["shared_with"] < m["index"] for m in shared)
    (line,) = [x for x in during(log, "g4/s/connector") if "kvgraft: graft refused" in x]
    assert f"release={run / 'g4-s'} entry=s " in line and f"layer {shared[0]['index']} is stored as reading" in line
    assert results["g4/s/connector"]["num_cached_tokens"] == 0
    assert results["g4/s/connector"]["first_logprob"] == results["g4/a/plain"]["first_logprob"]
    total = len(plan(run)["g4_tokens"])
    (line,) = [x for x in during(log, "g4/a/connector") if "kvgraft: grafted" in x]
    assert f"release={run / 'g4-a'} entry=a tokens=[0, {total}) of {total} " in line, line
    same_tokens(results, "g4/a/connector", "g4/a/plain")
    assert abs(results["g4/a/connector"]["first_logprob"] - results["g4/a/plain"]["first_logprob"]) < 1e-3


def test_cross_engine_verdict_vllm_capture_against_transformers(gemma: Served) -> None:
    """vLLM's capture of the tiny Gemma 3 recomputed by kvgraft in transformers (sdpa: vLLM's kernel cannot be
    replayed there, and the result says so): the verdict printed here is the one docs/vllm.md states."""
    results, _, run = gemma
    out = run / "vllm-gemma-recompute.json"
    cli = str(Path(sys.executable).parent / "kvgraft")
    audit = subprocess.run([cli, "audit", "recompute", results["captured"], "--model", plan(run)["models"]["gemma3-vllm"],
                            "--require", "consistent", "--out", str(out)], capture_output=True, text=True, timeout=600)
    print(audit.stdout[-1500:])
    assert audit.returncode == 0, audit.stdout + audit.stderr
    result = json.loads(out.read_text())
    assert result["verdict"] in ("byte-exact", "consistent"), result["verdict"]
    assert result["conditions"]["not_replayed"]["attn_implementation"] == ["vllm:CPU_ATTN", "sdpa"]
    print(f"cross-engine verdict (vLLM capture, transformers recompute, tiny Gemma 3): {result['verdict']}")


def readme_command() -> list[str]:
    """The README's one command that serves a Gemma-style release with vLLM's OpenAI-compatible server."""
    import shlex

    text = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    section = text[text.index("## Serving grafts in vLLM"):]
    block = section[section.index("```sh"):].split("```")[1]
    line = next(x for x in block.replace("\\\n", " ").splitlines() if "vllm.entrypoints.openai.api_server" in x)
    return shlex.split(line)


@pytest.mark.slow  # a minute: vLLM's server in its own three processes (`make test-slow`)
def test_the_readme_command_serves_a_gemma_release_over_http(gemma: Served, tmp_path: Path) -> None:
    """The README's command, as written (its placeholders filled, a port on 127.0.0.1 added), serves the tiny
    Gemma 3 release: a completion request for a prompt that starts with entry "a" is answered, and the
    server's log says the entry was grafted whole. The server starts and stops inside the test."""
    import socket
    import time
    import urllib.request

    _, _, run = gemma
    p = plan(run)
    args = [a.replace("GEMMA_DIR", p["models"]["gemma3-vllm"]).replace('"release": "out/gemma"',
                                                                       f'"release": "{run / "g3-a"}"')
            for a in readme_command()]
    kv = json.loads(args[args.index("--kv-transfer-config") + 1])
    assert args[0] == ".venv-vllm/bin/python" and kv["kv_connector_extra_config"]["release"] == str(run / "g3-a")
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    args = [str(VENV_PY), *args[1:], "--host", "127.0.0.1", "--port", str(port), "--max-model-len", "2048",
            "--enforce-eager", "--max-num-seqs", "4"]  # no torch.compile warm-up: 40 s less here
    log = tmp_path / "server.log"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2]), "HF_HUB_OFFLINE": "1",
           "VLLM_CPU_KVCACHE_SPACE": "1"}
    with log.open("w") as fh:
        server = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env)
    try:
        base = f"http://127.0.0.1:{port}"
        for _ in range(240):  # at most two minutes for the engine to start
            if server.poll() is not None:
                raise AssertionError(f"the server exited {server.returncode}:\n{log.read_text()[-3000:]}")
            try:
                with urllib.request.urlopen(f"{base}/v1/models", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.5)
        else:
            raise AssertionError(f"the server did not answer within two minutes:\n{log.read_text()[-3000:]}")
        tokens = p["tokens"]["a"] + p["tokens"]["d"][:6]
        body = json.dumps({"model": p["models"]["gemma3-vllm"], "prompt": tokens, "max_tokens": 4,
                           "temperature": 0}).encode()
        req = urllib.request.Request(f"{base}/v1/completions", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as r:
            answer = json.loads(r.read())
        assert answer["choices"][0]["finish_reason"] in ("length", "stop"), answer
    finally:
        server.terminate()
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    total = len(p["tokens"]["a"])
    text = log.read_text()
    assert _lines(text, f"kvgraft: grafted release={run / 'g3-a'} entry=a tokens=[0, {total}) of {total} "), \
        _lines(text, "kvgraft:")


def test_a_uniform_sliding_window_model_is_grafted_whole_and_as_a_prefix(gemma: Served) -> None:
    """Mistral-style: every layer has the window, so vLLM keeps one KV-cache group whose blocks outside the window
    are its null block; the graft writes the blocks vLLM holds (a failure there is taken back block by block)."""
    results, log, run = gemma
    total = len(plan(run)["mistral_tokens"])
    (line,) = [x for x in during(log, "mistral/whole/connector") if "kvgraft: grafted" in x]
    assert f"release={run / 'mistral-a'} entry=a tokens=[0, {total}) of {total} " in line, line
    (line,) = [x for x in during(log, "mistral/prefix/connector") if "kvgraft: grafted" in x]
    assert f"entry=a tokens=[0, 32) of {total} " in line, line
    assert results["mistral/whole/connector"]["num_cached_tokens"] == total
    assert results["mistral/prefix/connector"]["num_cached_tokens"] == 32
    for name in ("whole", "prefix"):
        graft, plain = results[f"mistral/{name}/connector"], results[f"mistral/{name}/plain"]
        assert graft["token_ids"] == plain["token_ids"] and plain["num_cached_tokens"] == 0, (name, graft, plain)
        assert abs(graft["first_logprob"] - plain["first_logprob"]) < 1e-3


def test_the_ttft_benchmark_runs_and_its_rows_are_its_runs(gemma: Served) -> None:
    """bench/vllm_ttft.py at two small sizes and one timed request each, on the tiny sliding-window model (the
    script's code is the same for every family; tests/vllm_gemma.py runs its build and run): every row grafted
    all the entry's tokens, gave the plain prefill's first token, and its medians and speedup are those of the
    runs it lists; the prefix-hit row's prompt is its entry and the 64 tokens after it (bench/RESULTS.md's
    figures come from this script)."""
    _, log, run = gemma
    doc = json.loads((run / "ttft" / "ttft.json").read_text())
    assert doc["family"] == "gemma3-tiny" and [r["kind"] for r in doc["rows"]] == ["whole", "whole", "prefix hit"]
    assert doc["rows"][0]["entry_tokens"] < doc["rows"][1]["entry_tokens"] == doc["rows"][2]["entry_tokens"]
    assert doc["rows"][2]["prompt_tokens"] == doc["rows"][2]["entry_tokens"] + 64
    for r in doc["rows"]:
        assert r["grafted_tokens"] == r["entry_tokens"] > 0 and r["same_first_token"] is True, r
        assert len(r["graft_runs_ms"]) == len(r["plain_runs_ms"]) == 1
        assert r["ttft_graft_ms"] == pytest.approx(r["graft_runs_ms"][0], abs=0.06)
        assert r["speedup"] == pytest.approx(r["ttft_plain_ms"] / r["ttft_graft_ms"])
    table = [line for line in log.splitlines() if line.startswith("| ") and line[2] in "wp"]
    assert len(table) == 3 and doc["release_bytes"] > 0
