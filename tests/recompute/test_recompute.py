"""Recompute audit: exact matches, located differences, tamper-with-rehash, wrong model, determinism."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.inference import capture, runtime
from kvgraft.recompute import audit as recompute
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

import rewrite

runner = CliRunner()


def _text(n: int) -> str:
    import tiny

    return " ".join(tiny._CORPUS * 3)[: n * 4]


def test_matching_release_is_exact_with_zero_kl(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    lm = tiny_lm("gemma3")
    capture.capture(lm, [("t", {"id": "a", "text": _text(80)})], tmp_path / "rel", probe_tokens=4)
    result = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm)
    e = result["entries"][0]
    assert result["all_byte_exact"] and e["byte_exact"]
    assert e["tensors_equal"] == e["tensors"] == 8
    assert e["matched"]["kl_max"] == 0.0 and e["matched"]["logits_equal"]
    assert e["matched"]["kl_per_position"] == [0.0] * 4
    assert e["next_token_logits_equal"]
    assert "exactly 0.0 in 1/1" in result["statements"][0]


# Slow (about 2 minutes: SmolLM2 with its noise bound measured): `make test-slow`. The override's record and
# statement are pinned on tiny models by test_verdict_bite.py and test_checks_bite.py in `make test`.
@pytest.mark.slow
def test_chunked_release_vs_one_shot_recompute_is_located(smollm2: Any, tmp_path: Path) -> None:
    """Measured here: with 2 threads, 64-token chunks change SmolLM2's KV bytes vs one-shot."""
    from kvgraft.recompute.determinism import prefix_ids, threads

    lm = smollm2
    ids = prefix_ids(lm, 200)
    with threads(2):
        capture.capture(lm, [("t", {"id": "c", "text": lm.tokenizer.decode(ids)})], tmp_path / "rel",
                        schedule=runtime.Schedule(chunk_tokens=64, add_special_tokens=False), probe_tokens=3)
        res = runner.invoke(app, ["audit", "recompute", str(tmp_path / "rel"), "--one-shot", "--out",
                                  str(tmp_path / "r.json"), "--device", "cpu"])
    assert res.exit_code == errors.EXIT_NOT_EXACT, res.output
    result = json.loads((tmp_path / "r.json").read_text())
    e = result["entries"][0]
    assert result["schedule_overridden"] and not e["byte_exact"]
    first = e["first_difference"]
    assert 0 <= first["named"]["position"] < e["num_tokens"] and first["layer"] < 30
    layer = e["layers"][first["layer"]][first["tensor"]]
    assert layer["differing"] > 0 and layer["max_ulp"] > 0 and layer["first"] == first["location"]
    assert "Recomputed with an overridden schedule" in result["statements"][0]


def test_one_changed_element_with_rehashed_commitments_is_located(tiny_lm: Callable[[str], Any],
                                                                  tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    m = capture.capture(lm, [("t", {"id": "a", "text": _text(60)})], tmp_path / "rel", probe_tokens=2)
    shape = m["entries"][0]["tensors"]["layer.1.values"]["shape"]  # [1, heads, positions, dim]
    head, pos, dim = 1, 7, 3
    index = rewrite.flat_index(shape, head, pos, dim)
    rewrite.element(tmp_path / "rel", 0, "layer.1.values", index, lambda x: x * 2.0 if x else 1.0)
    result = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm)
    e = result["entries"][0]
    assert not e["byte_exact"] and e["tensors_equal"] == e["tensors"] - 1
    assert e["first_difference"]["named"] == {"batch": 0, "head": head, "position": pos, "dim": dim}
    assert e["first_difference"]["layer"] == 1 and e["first_difference"]["tensor"] == "values"
    assert e["layers"][1]["values"]["differing"] == 1
    assert e["matched"]["kl_max"] != 0.0
    assert e["verdict"] == "inconsistent" and result["verdict"] == "inconsistent"
    assert e["outside"]["first"] == {"layer": 1, "tensor": "values", "batch": 0, "head": head, "position": pos, "dim": dim}


def test_non_finite_measures_are_written_as_the_schema_says(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    """An infinity stored in one entry makes its graft's logits, and so its KL values, NaN; a NaN stored in another
    makes |stored - fresh| NaN; a prefix graft's largest difference is infinite. The result file writes each as a
    string (JSON has no such number), and the file it writes satisfies its own schema."""
    from kvgraft._internal.jsonio import write_json
    from kvgraft.audit import checks as registry
    from kvgraft.recompute import prefix
    from kvgraft.schema import validate

    lm = tiny_lm("llama")
    capture.capture(lm, [("t", {"id": "a", "text": _text(40)}), ("t", {"id": "b", "text": _text(48)})],
                    tmp_path / "rel", probe_tokens=2)
    rewrite.element(tmp_path / "rel", 0, "layer.1.keys", 5, lambda x: float("inf"))
    rewrite.element(tmp_path / "rel", 1, "layer.0.values", 3, lambda x: float("nan"))
    result = prefix.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, prefix=16, require="consistent")
    write_json(tmp_path / "r.json", registry.seal("recompute", result))
    written = json.loads((tmp_path / "r.json").read_text())
    a, b = written["entries"]
    assert a["matched"]["kl_max"] == a["matched"]["kl_mean"] == a["matched"]["max_abs_logit_diff"] == "NaN"
    assert "NaN" in a["natural"]["kl_per_position"] and a["outside"]["worst"]["abs_diff"] == "Infinity"
    assert b["outside"]["worst"]["abs_diff"] == "NaN" and b["layers"][0]["values"]["worst_values"]["stored"] == "NaN"
    graft = written["prefix_grafts"]["entries"][0]
    assert graft["under_recorded_schedule"]["max_abs_diff"] == "Infinity"
    validate(written, "recompute-result.v1.json", "the written result")
    # As a report's recompute check holds it: its data part admits the same strings, and the face reads them as
    # the numbers they stand for (a NaN KL is the largest).
    from kvgraft.schema import validate_part

    validate_part(written, "recompute-result.v1.json", "$defs/data", "the report's recompute data")
    kind = registry.kind("recompute")
    face = kind.face(registry.view(kind, written))
    assert "max nan" in " ".join(str(x) for x in face.figures)


def test_wrong_model_refused_names_fingerprints_then_forced(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    from kvgraft.inference import models

    import tiny

    lm = tiny_lm("llama")
    capture.capture(lm, [("t", {"id": "a", "text": _text(40)})], tmp_path / "rel", probe_tokens=2)
    other = models.load(str(tiny.build("llama", tmp_path / "seed7", seed=7)), device="cpu")
    with pytest.raises(errors.ModelMismatchError) as info:
        recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), other)
    msg = info.value.diagnostics()
    assert lm.identity.sha256[:16] in msg and other.identity.sha256[:16] in msg and "weights" in msg
    result = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), other, force=True)
    assert result["model"]["forced"] and not result["all_byte_exact"]
    assert result["entries"][0]["matched"]["kl_max"] > 0.0
    assert any("forced" in s for s in result["statements"])


def test_determinism_matrix_on_tiny_model(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    from kvgraft.recompute import determinism
    from kvgraft.schema import validate

    result = determinism.matrix(str(tiny_dir("qwen3")), length=40, include_gpu=False)
    written = result.model_dump(by_alias=True, exclude_unset=True)
    validate(written, "determinism-result.v1.json", "test")
    rows = {r["name"]: r for r in written["conditions"]}
    assert rows["one-shot, all threads"]["class"] == "A" and "status" not in written  # sealed where it is judged
    # 256-token chunks of a 40-token prefix are one pass: the same computation, the same bytes.
    assert rows["chunks of 256, all threads"]["identical_to_baseline"]
    bf16 = rows["bfloat16, one-shot, all threads"]
    assert not bf16["identical_to_baseline"] and bf16["max_ulp"] is None and bf16["kl"] != 0.0
    assert len(result.conditions) == 14 and len({r.kv_digest for r in result.conditions}) >= 2


def test_a_determinism_matrix_with_non_finite_measures_is_written_as_its_schema_says(tmp_path: Path) -> None:
    """A condition whose states overflow has an infinite max |diff| and a NaN KL: written as strings, which the
    schema admits."""
    from kvgraft._internal.jsonio import write_json
    from kvgraft.results.determinism import DeterminismResult
    from kvgraft.schema import validate

    row = {"name": "overflow", "condition": {}, "kv_digest": "0" * 64, "class": "B", "identical_to_baseline": False,
           "max_ulp": None, "max_abs": float("inf"), "kl": float("nan")}
    result = DeterminismResult.model_validate({
        "kind": "kvgraft-determinism-result", "format_version": 1, "model": "m", "length": 8, "baseline": "base",
        "environment": {}, "conditions": [{**row, "name": "base", "class": "A", "max_abs": 0.0, "kl": 0.0}, row],
        "notes": []})
    write_json(tmp_path / "d.json", result.model_dump(by_alias=True, exclude_unset=True))
    written = json.loads((tmp_path / "d.json").read_text())
    assert (written["conditions"][1]["max_abs"], written["conditions"][1]["kl"]) == ("Infinity", "NaN")
    validate(written, "determinism-result.v1.json", "the written matrix")


def test_recompute_cli_json_is_schema_valid_and_exit_zero(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    from kvgraft.schema import validate

    model = str(tiny_dir("gpt2"))
    src = tmp_path / "s.jsonl"
    src.write_text(json.dumps({"id": "a", "text": _text(30)}) + "\n")
    assert runner.invoke(app, ["capture", str(src), "--out", str(tmp_path / "rel"), "--model", model]).exit_code == 0
    res = runner.invoke(app, ["audit", "recompute", str(tmp_path / "rel"), "--model", model, "--out",
                              str(tmp_path / "r.json")])
    assert res.exit_code == 0, res.output
    validate(json.loads((tmp_path / "r.json").read_text()), "recompute-result.v1.json", "test")
    assert "KL(fresh ‖ grafted) exactly 0.0 in 1/1" in res.stdout.replace("\n", " ")


def test_recompute_holds_torch_equal_logits(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    lm = tiny_lm("gemma4")
    capture.capture(lm, [("t", {"id": "a", "text": _text(50)})], tmp_path / "rel", probe_tokens=3)
    e = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm)["entries"][0]
    assert e["byte_exact"] and e["matched"]["max_abs_logit_diff"] == 0.0
    assert [r["kind"] for r in e["layers"]][-2:] == ["shared", "shared"]
    assert torch.tensor(e["matched"]["kl_per_position"]).abs().max().item() == 0.0


def test_schedule_and_threads_replayed_unless_overridden() -> None:
    from kvgraft.inference.reapply import Conditions

    recorded = runtime.Schedule(chunk_tokens=64, add_special_tokens=False).as_dict()
    assert Conditions().schedule(recorded) is None  # the record is replayed
    assert Conditions(one_shot=True).schedule(recorded) == runtime.Schedule(None, False)
    assert Conditions(chunk=16).schedule(recorded) == runtime.Schedule(16, False)
    with pytest.raises(errors.InputError, match="exclude each other"):
        Conditions(chunk=16, one_shot=True).schedule(recorded)
    env = {"threads": 2}
    assert Conditions().thread_count(env, "cpu") == 2  # on every executor: Ray actors replay it too
    assert Conditions(threads=1).thread_count(env, "cpu") == 1
    assert Conditions().thread_count(env, "cuda") is None


def test_the_largest_kl_is_nan_wherever_a_nan_stands() -> None:
    """max() keeps a NaN only when it comes first: an entry's largest KL, and the face's over entries, are NaN in
    any order, else the largest."""
    from kvgraft.recompute.compare import DistributionDiff
    from kvgraft.results.recompute import largest

    assert all(math.isnan(largest(xs)) for xs in ([0.5, float("nan")], [float("nan"), 0.5], [0.0, float("nan"), 1.0]))
    assert largest([0.5, float("inf"), 2.0]) == float("inf") and largest([0.0, 0.25]) == 0.25
    assert math.isnan(DistributionDiff([0.0, float("nan"), 0.5], [True] * 3, [1.0] * 3, 0.0, 1).kl_max)
