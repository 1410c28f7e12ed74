"""The real Gemma 3 270M in vLLM (`make test-gemma`): releases captured in transformers grafted by the kvgraft
connector (whole past the 512-token window, and as a prefix hit), a tampered entry refused, and vLLM's own capture
recomputed in transformers with the cross-engine verdict stated. One build and one engine (tests/vllm_real_gemma.py)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_vllm import build_and_serve
from test_vllm_gemma import during, prefix_hit, same_tokens

pytestmark = pytest.mark.gemma
SCENARIOS = Path(__file__).resolve().parents[1] / "vllm_real_gemma.py"
Served = tuple[dict[str, Any], str, Path]


@pytest.fixture(scope="module")
def gemma(tmp_path_factory: pytest.TempPathFactory) -> Served:
    return build_and_serve(tmp_path_factory, SCENARIOS)


def plan(run: Path) -> dict[str, Any]:
    return dict(json.loads((run / "plan.json").read_text()))


def test_an_entry_past_the_window_is_grafted_whole(gemma: Served) -> None:
    results, log, run = gemma
    total = len(plan(run)["tokens"]["a"])
    graft, plain = results["a/connector"], results["a/plain"]
    assert total > plan(run)["window"] == 512 and graft["num_cached_tokens"] == total and plain["num_cached_tokens"] == 0
    (line,) = [x for x in during(log, "a/connector") if "kvgraft: grafted" in x]
    assert f"release={run / 'release-a'} entry=a tokens=[0, {total}) of {total} " in line, line
    same_tokens(results, "a/connector", "a/plain")
    assert abs(graft["first_logprob"] - plain["first_logprob"]) < 1e-3


def test_prefix_hit(gemma: Served) -> None:
    prefix_hit(gemma, "f")


def test_a_tampered_entry_is_refused_and_prefilled(gemma: Served) -> None:
    results, log, run = gemma
    (line,) = [x for x in during(log, "b/connector") if "kvgraft: graft refused" in x]
    assert f"release={run / 'release-b'} entry=b tensor={plan(run)['tampered_tensor']} " in line and "sha256" in line
    assert results["b/connector"]["num_cached_tokens"] == 0
    assert results["b/connector"]["first_logprob"] == results["b/plain"]["first_logprob"]


def test_cross_engine_verdict_vllm_capture_against_transformers(gemma: Served) -> None:
    """vLLM's capture of prompt "d" recomputed by kvgraft in transformers, the model taken from the release
    (no --model): the verdict is printed, and must be byte-exact or inside the noise bound measured here."""
    results, _, run = gemma
    out = run / "vllm-gemma-recompute.json"
    cli = str(Path(sys.executable).parent / "kvgraft")
    audit = subprocess.run([cli, "audit", "recompute", results["captured"], "--model", "gemma3-270m",
                            "--require", "consistent", "--out", str(out)], capture_output=True, text=True, timeout=900)
    print(audit.stdout[-1500:])
    assert audit.returncode == 0, audit.stdout + audit.stderr
    result = json.loads(out.read_text())
    assert result["verdict"] in ("byte-exact", "consistent"), result["verdict"]
    print(f"cross-engine verdict (vLLM capture, transformers recompute, Gemma 3 270M): {result['verdict']}")
