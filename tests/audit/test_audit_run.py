"""`audit run`: one signed report bound to its release; `report verify` passes, then fails after edits."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app

from release_factory import records_plan

runner = CliRunner()
CLAIMS = Path(__file__).resolve().parents[2] / "audit" / "claims" / "kv-grafting-preprint.toml"


@pytest.fixture(scope="module")
def signed_run(tiny_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("run")
    texts = [f"Problem {i}: Mia has {i + 3} apples. Answer: {i + 3}" for i in range(3)]
    tables = f'[checks.verify]\n[checks.recompute]\n[checks.claims]\nfile = "{CLAIMS}"\n[signing]\nkey = "ephemeral"\n'
    plan = records_plan(out, "tiny", tiny_dir("gemma3"), texts, tables, probe_tokens=3)
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    # One reading (avg@4) fits every figure of the preprint and recompute is exact, so the verdict is PASSED.
    assert res.exit_code == errors.EXIT_OK, res.output
    return out / "out"


def _verify(out: Path, *extra: str) -> object:
    return runner.invoke(app, ["report", "verify", str(out / "report.json"), "--key",
                               str(out / "keys" / "ephemeral.pub.pem"), "--release", str(out / "release"), *extra])


def test_report_is_signed_bound_and_verifies(signed_run: Path) -> None:
    report = json.loads((signed_run / "report.json").read_text())
    assert {c["name"]: c["status"] for c in report["checks"]} == {"verify": "passed", "recompute": "passed",
                                                                 "claims": "passed"}
    for c in report["checks"]:
        if c["kind"] in ("recompute", "claims"):
            assert c["data"]["status"] == c["status"]  # the check's status is its result's own
    assert report["binding"]["release_attestation_digest"] and report["binding"]["release_root_digest"]
    assert any(c["id"] == "restore-exact" and c["verdict"] == "supported" for c in report["claims"])
    assert (signed_run / "report.sigstore.json").is_file() and (signed_run / "report.html").is_file()
    res = _verify(signed_run)
    assert res.exit_code == 0, res.output
    assert "verified" in res.stdout


def test_the_verify_check_checks_the_signature_with_the_plans_key(signed_run: Path) -> None:
    """The plan signs the release, so its verify check verifies that signature with the plan's key (not the
    default policy, which checks no signature)."""
    from kvgraft.signing import keys

    report = json.loads((signed_run / "report.json").read_text())
    data = next(c for c in report["checks"] if c["kind"] == "verify")["data"]
    kid = keys.key_id(keys.load_public_key(signed_run / "keys" / "ephemeral.pub.pem"))
    assert (data["scope"], data["signature"]["status"], data["signature"]["key_id"]) == ("all", "verified", kid)
    assert data["warnings"] == []


def test_a_plan_signing_with_an_ephemeral_key_states_it_as_the_release_signature(signed_run: Path) -> None:
    """As the demo does (audit/demo.toml: a release the run builds, signed with `[signing] key = "ephemeral"`):
    the report's "release signature" is checked against that key, named by its id, in the JSON and on its face."""
    import tomllib

    from kvgraft.signing import keys

    demo = tomllib.loads((Path(__file__).resolve().parents[2] / "audit" / "demo.toml").read_text())
    assert demo["signing"]["key"] == "ephemeral" and "path" not in demo["release"]  # the same way as this plan
    report = json.loads((signed_run / "report.json").read_text())
    kid = keys.key_id(keys.load_public_key(signed_run / "keys" / "ephemeral.pub.pem"))
    assert report["release_signature"] == {"checked": True, "method": "key", "key_ids": [kid], "identity": None,
                                           "issuer": None, "signed_time": None, "reason": None}
    shown = runner.invoke(app, ["report", "show", str(signed_run / "report.json")], env={"COLUMNS": "200"})
    assert f"release signature checked: key {kid}" in " ".join(shown.stdout.split())


def test_report_face_at_80_columns(signed_run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A real report in an 80-column terminal: each check once with its status, no JSON, nothing cut."""
    from kvgraft.cli import _base

    monkeypatch.setattr(_base.out, "_width", 80)  # not the property: its undo would pin the width read then
    res = runner.invoke(app, ["report", "show", str(signed_run / "report.json")])
    assert res.exit_code == 0, res.output
    lines = res.stdout.splitlines()
    assert max(len(line) for line in lines) <= 80
    for name in ("verify", "recompute", "claims"):
        assert sum(1 for line in lines if line.startswith(f"✓ {name} passed")) == 1, name
    assert "…" not in res.stdout and "{" not in res.stdout and "byte-exact" in res.stdout
    report = json.loads((signed_run / "report.json").read_text())
    assert report["release_root_digest"] in res.stdout
    assert all(any(c["id"] in line and c["verdict"] in line for line in lines) for c in report["claims"])
    from kvgraft.audit.checks import KINDS, view

    for c in report["checks"]:  # no face falls back to the summary on a real report
        KINDS[c["kind"]].face(view(KINDS[c["kind"]], c["data"]))


def test_any_edit_of_the_report_fails_verification(signed_run: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(signed_run, copy)
    path = copy / "report.json"
    original = path.read_bytes()
    edits = (original.replace(b'"passed"', b'"failed"', 1), original + b" ",
             original.replace(b'"headline": "', b'"headline": "(edited) ', 1))
    for edit in edits:
        assert edit != original
        path.write_bytes(edit)
        res = _verify(copy)
        assert res.exit_code == errors.EXIT_FAILED, res.output
        assert "edited after signing" in res.stderr
    path.write_bytes(original)
    assert _verify(copy).exit_code == 0


def test_report_bound_to_its_release(signed_run: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(signed_run, copy)
    bundle = copy / "release" / "release.sigstore.json"
    bundle.write_bytes(bundle.read_bytes().replace(b'"hint"', b'"hint" ', 1))  # another attestation
    res = _verify(copy)
    assert res.exit_code == errors.EXIT_FAILED
    assert "not the attestation the report audited" in res.stderr


def test_unsigned_report_refused(signed_run: Path, tmp_path: Path) -> None:
    import shutil

    copy = tmp_path / "out"
    shutil.copytree(signed_run, copy)
    (copy / "report.sigstore.json").unlink()
    res = _verify(copy)
    assert res.exit_code == errors.EXIT_FAILED and "unsigned" in res.stderr


def test_every_check_a_plan_can_name_has_one_runner() -> None:
    from kvgraft.audit.checks import KINDS as CHECKS
    from kvgraft.schema import schema_dir

    schema = json.loads((schema_dir() / "audit-plan.v1.json").read_text())
    assert sorted(CHECKS) == sorted(schema["properties"]["checks"]["properties"])
    assert list(CHECKS)[-1] == "claims"  # it reads what the checks before it measured


def test_verify_check_hashes_every_byte_of_the_release(signed_run: Path) -> None:
    """The verify check is `kvgraft verify` of everything, not what opening the release read."""
    report = json.loads((signed_run / "report.json").read_text())
    (check,) = [c for c in report["checks"] if c["name"] == "verify"]
    rel = signed_run / "release"
    signatures = {"release.sigstore.json", "model.sig"}
    on_disk = [p for p in rel.rglob("*") if p.is_file() and p.name not in signatures]
    assert check["data"]["scope"] == "all"
    assert check["data"]["files"] == len(on_disk)
    assert check["data"]["bytes_hashed"] >= sum(p.stat().st_size for p in on_disk)
    assert check["data"]["tensors"] > 0


def test_the_report_is_signed_before_it_is_written(signed_run: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """A run killed between the two writes leaves a signature without a report, never a report nobody signed
    (bench/crash_campaign.py's `audit run` kills found that order reversed); a refused report write leaves
    neither."""
    from kvgraft._internal import jsonio
    from kvgraft.report import signing
    from kvgraft.report.document import load_report
    from kvgraft.signing import keys

    report = load_report(signed_run / "report.json")
    private, public = keys.write_keypair(tmp_path / "k")
    key, path = keys.load_private_key(private), tmp_path / "report.json"
    real, written = jsonio.write_atomic, []

    def refuse_the_report(target: Path, data: bytes, mode: int = 0o644) -> None:
        written.append(target.name)
        if target == path:
            raise OSError(28, "No space left on device")
        real(target, data, mode)

    monkeypatch.setattr(jsonio, "write_atomic", refuse_the_report)
    with pytest.raises(OSError):
        signing.write_signed_report(path, report, key)
    assert written == ["report.sigstore.json", "report.json"] and not list(tmp_path.glob("report*"))
    monkeypatch.undo()
    signing.write_signed_report(path, report, key)
    assert signing.verify_report(path, key=public).report == report
    assert path.read_bytes() == (signed_run / "report.json").read_bytes()  # read as the model, written back as it was
