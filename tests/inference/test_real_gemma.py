"""The real Gemma 3 270M (the gemma3-270m preset, `make test-gemma`): converted once, an entry longer than its
512-token sliding window captured and recomputed byte-exact on this machine, a prefix graft, and a planted
difference the recompute must see (the positive control beside the byte-exact verdict)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.gemma
KVGRAFT = str(Path(sys.executable).parent / "kvgraft")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def cli(*args: str, timeout: int = 900) -> subprocess.CompletedProcess[str]:
    return subprocess.run([KVGRAFT, *args], capture_output=True, text=True, timeout=timeout)


@pytest.fixture(scope="module")
def releases(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from vllm_real_gemma import texts

    out = tmp_path_factory.mktemp("real-gemma")
    (out / "records.jsonl").write_text("".join(json.dumps({"id": k, "text": v}) + "\n" for k, v in texts().items()))
    for layout in ("window", "all"):
        r = cli("capture", str(out / "records.jsonl"), "--out", str(out / layout), "--model", "gemma3-270m",
                "--device", "cpu", "--probe", "4", "--sliding-layers", layout)
        assert r.returncode == 0, r.stderr
    return out


def test_the_preset_is_converted_once_and_listed() -> None:
    from kvgraft.inference import models, presets

    folder = Path(models.resolve("gemma3-270m"))
    stamp = (folder / "model.safetensors").stat().st_mtime_ns
    assert models.resolve("gemma3-270m") == str(folder)
    assert (folder / "model.safetensors").stat().st_mtime_ns == stamp  # a second run converts nothing
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["Gemma3ForCausalLM"] and "quantization_config" not in cfg
    assert (cfg["sliding_window"], cfg["num_hidden_layers"], cfg["num_key_value_heads"], cfg["head_dim"]) == (
        512, 18, 1, 256)
    assert cfg["layer_types"].count("full_attention") == 3
    assert not list(folder.glob("*.gguf"))  # the joined parts are not kept
    r = cli("models", "--json")
    listed = {m["name"]: m for m in json.loads(r.stdout)["models"]}["gemma3-270m"]
    assert r.returncode == 0 and listed["installed"] and listed["converted"]
    assert listed["bytes"] == presets.disk_used(folder) > 10**9


def test_identity_counts_the_tied_embedding_once() -> None:
    from kvgraft.inference import models

    lm = models.load("gemma3-270m", device="cpu")
    assert lm.identity.num_parameters == sum(p.numel() for p in lm.model.parameters()) == 268_098_176


def _manifest(rel: Path) -> dict[str, Any]:
    return dict(json.loads((rel / "manifest.json").read_text()))


def test_an_entry_past_the_window_recomputes_byte_exact_without_naming_the_model(releases: Path) -> None:
    from kvgraft.release.format import Release

    for layout in ("window", "all"):
        rel = Release.open(releases / layout)
        assert rel.manifest["model"]["spec"] == "gemma3-270m"
        assert max(int(e["num_tokens"]) for e in rel.entries) > 512
        out = releases / f"recompute-{layout}.json"
        r = cli("audit", "recompute", str(releases / layout), "--require", "exact", "--out", str(out), "--quiet")
        assert r.returncode == 0, r.stderr  # no --model: the release's own
        result = json.loads(out.read_text())
        assert result["verdict"] == "byte-exact" and result["model"]["spec"] == "gemma3-270m"
        assert {e["verdict"] for e in result["entries"]} == {"byte-exact"} and len(result["entries"]) == 3


def test_a_planted_difference_is_seen(releases: Path) -> None:
    """The positive control: the long entry's first values negated, commitments redone so it verifies."""
    import torch

    from kvgraft.release.format import Release

    import rewrite

    planted = releases / "planted"
    shutil.copytree(releases / "all", planted)
    rel = Release.open(planted)
    index = next(i for i, e in enumerate(rel.entries) if e["id"] == "a")
    entry = rel.entries[index]
    name = entry["layers"][0]["values"]
    start, end = entry["tensors"][name]["byte_range"]
    data = (planted / entry["file"]).read_bytes()[start:end]
    rewrite.tensors(planted, index, {name: (-torch.frombuffer(bytearray(data), dtype=torch.float32)).numpy().tobytes()})
    r = cli("audit", "recompute", str(planted), "--entry", "a", "--require", "consistent", "--json")
    assert r.returncode == 4, r.stderr
    assert json.loads(r.stdout)["entries"][0]["verdict"] == "inconsistent"


def test_prefix_graft_from_every_position_layout_and_refusal_from_the_window_layout(releases: Path) -> None:
    from vllm_real_gemma import texts

    prompt = texts()["a"][:400] + " And then"
    r = cli("run", str(releases / "all"), "--prefix", "--prompt", prompt, "-n", "4", "--json")
    assert r.returncode == 0, r.stderr
    prefix = json.loads(r.stdout)["ledger"]["prefix"]
    assert prefix["entry"] == "a" and 0 < prefix["tokens"] < prefix["of"] and prefix["tokens"] % 16 == 0, prefix
    r = cli("run", str(releases / "window"), "--prefix", "--prompt", prompt)
    assert r.returncode == 2 and "no entry can serve a prefix graft" in r.stderr
    assert "positions [" in r.stderr and ", window)" in r.stderr and "Traceback" not in r.stderr
