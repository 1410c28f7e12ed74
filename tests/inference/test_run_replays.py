"""`kvgraft run` and graft.run replay the release's recorded dtype and attention kernel unless told otherwise."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.inference import graft, models
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

runner = CliRunner()


@pytest.fixture(scope="module")
def recorded(tiny_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A release captured with the non-default conditions: eager attention, bfloat16."""
    model = tiny_dir("llama")
    base = tmp_path_factory.mktemp("replay")
    src = base / "src.jsonl"
    src.write_text(json.dumps({"id": "e0", "text": "Mia has 3 apples and buys 4 more."}) + "\n")
    res = runner.invoke(app, ["capture", str(src), "--out", str(base / "rel"), "--model", str(model), "--probe", "0",
                              "--attn", "eager", "--dtype", "bfloat16"])
    assert res.exit_code == 0, res.output
    return base / "rel", model


def _run(rel: Path, model: Path, *extra: str) -> tuple[dict[str, Any], str]:
    res = runner.invoke(app, ["run", str(rel), "--entry", "e0", "--prompt", " How many?", "-n", "4",
                              "--model", str(model), "--json", *extra])
    assert res.exit_code == 0, res.output
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc, res.stderr


def test_cli_run_replays_the_recorded_kernel_and_dtype(recorded: tuple[Path, Path]) -> None:
    rel, model = recorded
    default, note = _run(rel, model)
    cond = default["ledger"]["conditions"]
    assert {"dtype", "attn_implementation"} <= set(cond["replayed"]) and cond["overridden"] == {}
    assert "dtype" not in cond["not_replayed"] and "attn_implementation" not in cond["not_replayed"]
    assert "dtype" not in default["ledger"]["conditions_differing"]
    explicit, _ = _run(rel, model, "--attn", "eager", "--dtype", "bfloat16")
    assert explicit["token_ids"] == default["token_ids"]
    assert "kvgraft: note: conditions: " in note and "overridden" not in note


def test_cli_run_says_what_it_overrides(recorded: tuple[Path, Path]) -> None:
    rel, model = recorded
    # float32 weights have another identity than the recorded bfloat16 ones: the old default needed --force here.
    refused = runner.invoke(app, ["run", str(rel), "--entry", "e0", "--model", str(model), "--dtype", "float32"])
    assert refused.exit_code == 3
    doc, note = _run(rel, model, "--attn", "sdpa", "--dtype", "float32", "--force")
    cond = doc["ledger"]["conditions"]
    assert cond["overridden"] == {"attn_implementation": {"recorded": "eager", "used": "sdpa"},
                                  "dtype": {"recorded": "bfloat16", "used": "float32"}}
    assert "overridden: attn_implementation 'eager' -> 'sdpa', dtype 'bfloat16' -> 'float32'" in note


def test_api_defaults_replay_the_record(recorded: tuple[Path, Path]) -> None:
    folder, model = recorded
    rel = verified(folder, SignatureNotChecked())
    lm = graft.model_for(rel, str(model))
    assert (lm.dtype, lm.attn) == ("bfloat16", "eager")
    # A model loaded otherwise: graft.run still continues under the recorded kernel, and says the dtype differs.
    other = models.load(str(model), device="cpu", dtype="bfloat16", attn="sdpa")
    out = graft.run(rel, "e0", other, " How many?", max_new_tokens=4)
    assert "attn_implementation" in out.ledger["conditions"]["replayed"] and other.attn == "sdpa"  # restored after
    assert out.token_ids == graft.run(rel, "e0", lm, " How many?", max_new_tokens=4).token_ids
    told = graft.run(rel, "e0", other, " How many?", max_new_tokens=4, attn="sdpa")
    assert told.ledger["conditions"]["overridden"] == {"attn_implementation": {"recorded": "eager", "used": "sdpa"}}
    f32 = models.load(str(model), device="cpu", dtype="float32", attn="eager")
    assert graft.run(rel, "e0", f32, " How many?", max_new_tokens=4, force=True).ledger["conditions"]["not_replayed"][
        "dtype"] == ["bfloat16", "float32"]
