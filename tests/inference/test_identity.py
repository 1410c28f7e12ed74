"""The model fingerprint names what is loaded, independent of the container."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from kvgraft.inference import models


def test_same_weights_resaved_elsewhere_same_fingerprint(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    lm.model.save_pretrained(tmp_path / "copy", max_shard_size="20KB")  # a different container: sharded files
    lm.tokenizer.save_pretrained(tmp_path / "copy")
    assert len(list((tmp_path / "copy").glob("*.safetensors"))) > 1
    again = models.load(str(tmp_path / "copy"), device="cpu")
    assert again.identity == lm.identity


def test_one_weight_changed_changes_weights_digest_only(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    a = models.load(str(tiny_dir("qwen3")), device="cpu")
    b = models.load(str(tiny_dir("qwen3")), device="cpu")
    with torch.no_grad():
        p = next(b.model.parameters())
        p.view(-1)[0] = torch.nextafter(p.view(-1)[0], torch.tensor(1e9))  # one ULP
    assert a.identity.weights_sha256 != b.identity.weights_sha256
    assert a.identity.tokenizer_sha256 == b.identity.tokenizer_sha256
    assert a.identity.config_sha256 == b.identity.config_sha256
    assert a.identity.sha256 != b.identity.sha256


def test_tokenizer_and_dtype_are_part_of_identity(tiny_dir: Callable[[str], Path]) -> None:
    a = models.load(str(tiny_dir("gpt2")), device="cpu")
    b = models.load(str(tiny_dir("gpt2")), device="cpu")
    b.tokenizer.chat_template = "{{ messages }}"
    b._identity = None
    assert a.identity.tokenizer_sha256 != b.identity.tokenizer_sha256
    c = models.load(str(tiny_dir("gpt2")), device="cpu", dtype="bfloat16")
    assert c.identity.weights_sha256 != a.identity.weights_sha256
    assert c.identity.config_sha256 == a.identity.config_sha256


def test_default_model_converted_once_and_reused(smollm2: Any) -> None:
    target = models.home() / "models" / "smollm2-135m-instruct"
    assert (target / "model.safetensors").is_file()
    stamp = (target / "model.safetensors").stat().st_mtime_ns
    assert models.resolve(models.DEFAULT_MODEL) == str(target)
    assert (target / "model.safetensors").stat().st_mtime_ns == stamp
    assert smollm2.model.config.num_hidden_layers == 30
    assert smollm2.identity.num_parameters > 100_000_000


def test_converted_default_model_is_a_plain_hugging_face_folder(smollm2: Any) -> None:
    """What other tools (vLLM) need to load it: the class to load, and the tied embedding by its own name."""
    import json

    from safetensors import safe_open

    from kvgraft.inference.models import ensure_smollm2

    folder = ensure_smollm2()
    cfg = json.loads((folder / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"] and cfg["tie_word_embeddings"] is True
    with safe_open(str(folder / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    # The identity the reference releases were recorded under (no `architectures` in their folder).
    reference = json.loads((Path(__file__).resolve().parents[2] / "manifests" / "smollm2-135m-example"
                            / "manifest.json").read_text())
    assert smollm2.identity.sha256 == reference["model"]["identity"]["sha256"]
