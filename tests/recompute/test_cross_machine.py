"""Replayed conditions and the three verdicts: byte-exact, consistent (same computation), inconsistent.

Every expectation compares with what this machine computes, or with the cross-machine verdict; none
asserts bytes computed on another machine.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.inference import capture, runtime
from kvgraft.inference.environment import cpu_name
from kvgraft.recompute import audit as recompute
from kvgraft.schema import validate
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import verified

import rewrite
from release_factory import flat_manifest

runner = CliRunner()
ROOT = Path(__file__).resolve().parents[2]
# The project's own captures on two CPU kinds (tests/fixtures/cross-machine/README.md says where from).
FIXTURES = ROOT / "tests" / "fixtures" / "cross-machine"
CPU_KINDS = ("amd-epyc", "intel-xeon")
AMD_FIXTURE = FIXTURES / "smollm2-135m-amd-epyc"
APPLES = {"id": "apples", "text": "Problem: Mia has 12 apples. She gives 5 to Sam and buys 9 more. How many apples "
                                  "does she have now?\nSolution: 12 - 5 = 7, and 7 + 9 = 16.\nAnswer: 16"}


def _audit_cli(rel: Path, out: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    res = runner.invoke(app, ["audit", "recompute", str(rel), "--quiet", "--out", str(out), *extra])
    assert res.exit_code in (0, errors.EXIT_NOT_EXACT), res.output
    result = json.loads(out.read_text())
    validate(result, "recompute-result.v1.json", str(out))
    return res.exit_code, result


@pytest.fixture(scope="module")
def eager_release(smollm2: Any, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """SmolLM2 states captured with eager attention (the CLI's default is sdpa)."""
    from kvgraft.inference.runtime import attention

    out = tmp_path_factory.mktemp("eager") / "rel"
    with attention(smollm2, "eager"):
        capture.capture(smollm2, [("t", APPLES)], out, probe_tokens=2)
    return out


def test_eager_release_audits_byte_exact_with_no_options(eager_release: Path, tmp_path: Path) -> None:
    code, result = _audit_cli(eager_release, tmp_path / "r.json")
    assert code == 0 and result["verdict"] == "byte-exact" and result["passed"]
    assert result["environment"]["current"]["attn_implementation"] == "eager"
    assert "attn_implementation" in result["conditions"]["replayed"] and not result["conditions"]["overridden"]


def test_override_is_recorded_and_gives_consistent(eager_release: Path, tmp_path: Path) -> None:
    code, result = _audit_cli(eager_release, tmp_path / "r.json", "--attn", "sdpa", "--require", "consistent")
    assert code == 0 and result["verdict"] == "consistent"
    assert result["conditions"]["overridden"] == {"attn_implementation": {"recorded": "eager", "used": "sdpa"}}
    e = result["entries"][0]
    assert not e["byte_exact"] and 0.0 < e["max_excess"] <= 1.0 and e["outside"] is None
    assert "overridden: attn_implementation 'eager' -> 'sdpa'" in result["statements"][-1]


# Slow (over a minute: two audits, each measuring the noise bound): `make test-slow`. A consistent verdict that
# passes --require consistent is test_override_is_recorded_and_gives_consistent's, and that it fails --require exact is
# recompute.passes' (test_verdict_bite.py), both in `make test`.
@pytest.mark.slow
def test_relabelled_sdpa_is_consistent_only_when_required(eager_release: Path, tmp_path: Path) -> None:
    """Eager states with every commitment rewritten to claim sdpa: same computation, other kernel."""
    rel = tmp_path / "relabelled"
    shutil.copytree(eager_release, rel)
    rewrite.manifest(rel, lambda m: m["environment"].update(attn_implementation="sdpa"))
    code, result = _audit_cli(rel, tmp_path / "r.json", "--require", "consistent")
    assert code == 0 and result["verdict"] == "consistent" and result["passed"]
    e = result["entries"][0]
    assert e["noise_bound"]["factor"] > 1 and any(p["tensors_differing"] for p in e["noise_bound"]["perturbations"])
    code, result = _audit_cli(rel, tmp_path / "r2.json")
    assert code == errors.EXIT_NOT_EXACT and result["verdict"] == "consistent" and not result["passed"]
    assert "requirement exact: NOT met" in result["statements"][-1]


def test_one_element_changed_by_one_percent_is_inconsistent_and_located(eager_release: Path, tmp_path: Path) -> None:
    rel = tmp_path / "planted"
    shutil.copytree(eager_release, rel)
    shape = flat_manifest(rel)["entries"][0]["tensors"]["layer.12.keys"]["shape"]
    head, position, dim = 2, 40, 17
    old, new = rewrite.element(rel, 0, "layer.12.keys", rewrite.flat_index(shape, head, position, dim),
                               lambda x: x * 1.01)
    assert old != 0.0 and abs(new / old - 1.01) < 1e-6
    code, result = _audit_cli(rel, tmp_path / "r.json", "--require", "consistent")
    assert code == errors.EXIT_NOT_EXACT and result["verdict"] == "inconsistent"
    out = result["entries"][0]["outside"]
    where = {"layer": 12, "tensor": "keys", "batch": 0, "head": head, "position": position, "dim": dim}
    assert out["elements"] == 1 and out["layers"] == [12]
    assert out["first"] == where and {k: out["worst"][k] for k in where} == where
    assert out["worst"]["excess"] > 1.0 and out["worst"]["stored"] == pytest.approx(new)


def test_states_of_other_tokens_are_inconsistent_from_the_changed_position(tiny_lm: Callable[[str], Any],
                                                                           tmp_path: Path) -> None:
    lm = tiny_lm("llama")
    ids = [int(t) for t in lm.tokenizer(APPLES["text"])["input_ids"]]
    at = len(ids) // 2
    other = list(ids)
    other[at] = ids[at] + 1 if ids[at] + 1 < lm.model.config.vocab_size else ids[at] - 1
    m = capture.capture(lm, [("t", {"id": "a", "text": lm.tokenizer.decode(other, skip_special_tokens=True)})],
                        tmp_path / "rel", schedule=runtime.Schedule(add_special_tokens=False), probe_tokens=0)
    assert m["entries"][0]["token_ids"][:at] == ids[:at]

    def claim_ids(man: dict[str, Any]) -> None:
        man["entries"][0]["token_ids"] = ids[: len(man["entries"][0]["token_ids"])]

    rewrite.manifest(tmp_path / "rel", claim_ids)
    result = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, require="consistent")
    assert result["verdict"] == "inconsistent" and not result["passed"]
    first = result["entries"][0]["outside"]["first"]
    assert first["layer"] == 0 and first["position"] >= at


def _fixture_verdict(kind: str, tmp_path: Path) -> tuple[dict[str, str], dict[str, str], dict[str, Any]]:
    """Recompute one CPU kind's fixture here; return (this machine's tensor digests, the fixture's, the result)."""
    code, result = _audit_cli(FIXTURES / f"smollm2-135m-{kind}", tmp_path / f"{kind}.json", "--require", "consistent")
    assert code == 0, result["statements"]
    fresh, stored = {}, {}
    for row in result["entries"][0]["layers"]:
        for part in ("keys", "values"):
            if part in row:
                fresh[f"layer.{row['index']}.{part}"] = row[part]["sha256_fresh"]
                stored[f"layer.{row['index']}.{part}"] = row[part]["sha256_stored"]
    manifest = json.loads((FIXTURES / f"smollm2-135m-{kind}" / "manifest.json").read_text())
    assert stored == {n: t["sha256"] for n, t in manifest["entries"][0]["tensors"].items()}  # the fixture's bytes
    return fresh, stored, result


def test_cross_machine_fixture_verdict(smollm2: Any, tmp_path: Path) -> None:
    """Each CPU kind's release, recomputed here: byte-exact where this machine's KV bytes are the fixture's, else
    consistent (the same computation, other bytes).

    Which fixture this machine matches is read from the bytes it computes, never from its CPU's name: machines
    of one name differ in microcode and kernels, and machines of other names may compute the same bytes. The two
    fixtures differ in every tensor (test_cross_machine_fixtures_differ_in_every_tensor), so at most one matches.
    """
    verdicts = {kind: _fixture_verdict(kind, tmp_path) for kind in CPU_KINDS}
    (here, *others) = [fresh for fresh, _, _ in verdicts.values()]
    assert all(fresh == here for fresh in others), "the same computation gave other bytes on this machine"
    matched = [kind for kind, (fresh, stored, _) in verdicts.items() if fresh == stored]
    assert len(matched) <= 1, "one machine cannot compute the bytes of both fixtures"
    for kind, (fresh, stored, result) in verdicts.items():
        if fresh == stored:
            assert result["verdict"] == "byte-exact" and result["all_byte_exact"], (kind, result["statements"])
        else:
            assert result["verdict"] == "consistent", (f"{kind} on {cpu_name()}", result["statements"])
            assert not result["entries"][0]["byte_exact"]
            assert set(result["conditions"]["not_replayed"]) <= {"device_name", "cpu_isa", "torch", "transformers"}


def test_cross_machine_fixtures_differ_in_every_tensor() -> None:
    """The two captures are the same computation (model, tokens, schedule, threads) with other bytes."""
    amd, intel = (json.loads((FIXTURES / f"smollm2-135m-{k}" / "manifest.json").read_text()) for k in CPU_KINDS)
    for key in ("model", "schedule"):
        assert amd[key] == intel[key]
    (a,), (i,) = amd["entries"], intel["entries"]
    assert a["token_ids"] == i["token_ids"] and a["num_tokens"] == 72
    same = {k: amd["environment"][k] == intel["environment"][k] for k in ("threads", "dtype", "attn_implementation")}
    assert all(same.values()), same
    assert amd["environment"]["device_name"] != intel["environment"]["device_name"]
    assert a["tensors"].keys() == i["tensors"].keys()
    assert all(a["tensors"][n]["sha256"] != i["tensors"][n]["sha256"] for n in a["tensors"])
    # The Intel capture replicates on another machine of its kind: the project's reference manifest.
    ref = json.loads((ROOT / "manifests" / "smollm2-135m-example" / "manifest.json").read_text())
    (r,) = [e for e in ref["entries"] if e["id"] == i["id"]]
    assert {n: t["sha256"] for n, t in r["tensors"].items()} == {n: t["sha256"] for n, t in i["tensors"].items()}


def test_unknown_requirement_is_refused(tmp_path: Path) -> None:
    res = runner.invoke(app, ["audit", "recompute", str(AMD_FIXTURE), "--require", "close-enough"])
    assert res.exit_code == errors.EXIT_INPUT and "--require close-enough" in res.output
