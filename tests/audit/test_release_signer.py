"""A plan names whose release it audits: `audit run` verifies the existing release under `[release]`'s trust options
before any model loads, and the signed report states what was checked of the release's signature."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.signing import keys

from release_factory import captured_release, replication_plan

runner = CliRunner()
TEXTS = [f"Problem {i}: Mia has {i + 3} apples. Answer: {i + 3}" for i in range(4)]
RECOMPUTE = "[checks.recompute]\nsample = 2\nnonce = \"signer-test\"\n"


@pytest.fixture(scope="module")
def release_a(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A release signed by key A, and key B (a signer the release does not carry) beside it."""
    base = tmp_path_factory.mktemp("signer")
    a_key, a_pub = keys.write_keypair(base / "a")
    _, b_pub = keys.write_keypair(base / "b")
    r_key = keys.write_keypair(base / "replicator")[0]
    root = captured_release(tiny_lm("llama"), base / "release", TEXTS, signer=a_key)
    return {"base": base, "root": root, "a_pub": a_pub, "b_pub": b_pub, "replicator": r_key}


def _run(folder: Path, model: Path, rel: dict[str, Path], signer_pub: Path | None) -> tuple[Any, Path]:
    folder.mkdir()
    # A plan naming no signer re-signs an existing release with [signing]'s key (docs/reliability.md): that one's
    # report is left unsigned, so the author's signature stays for the other tests.
    signing = f'[signing]\nkey = "{rel["replicator"]}"\n' if signer_pub is not None else ""
    tables = RECOMPUTE + signing
    plan = replication_plan(folder, folder.name, model, rel["root"], tables, signer_pub=signer_pub)
    return runner.invoke(app, ["audit", "run", str(plan), "--quiet"]), folder / "out"


def test_plan_naming_the_signer_passes_and_the_report_states_its_fingerprint(
        release_a: dict[str, Path], tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    res, out = _run(tmp_path / "named-a", tiny_dir("llama"), release_a, release_a["a_pub"])
    assert res.exit_code == errors.EXIT_OK, res.output
    report = json.loads((out / "report.json").read_text())
    fingerprint = keys.key_id(keys.load_public_key(release_a["a_pub"]))
    assert report["release_signature"] == {"checked": True, "method": "key", "key_ids": [fingerprint], "identity": None,
                                           "issuer": None, "signed_time": None, "reason": None}
    recompute = next(c for c in report["checks"] if c["kind"] == "recompute")
    assert recompute["data"]["release_signature"] == report["release_signature"]  # the check's result says it too
    shown = runner.invoke(app, ["report", "show", str(out / "report.json")], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f"checked: key {fingerprint}" in " ".join(shown.stdout.split())
    pub = keys.write_keypair(tmp_path / "unused")[1]  # the report is signed by the replicator, not this key
    assert runner.invoke(app, ["report", "verify", str(out / "report.json"), "--key", str(pub)]).exit_code == 1
    replicator_pub = Path(str(release_a["replicator"]).replace(".key.pem", ".pub.pem"))
    verified = runner.invoke(app, ["report", "verify", str(out / "report.json"), "--key", str(replicator_pub),
                                   "--release", str(release_a["root"])], env={"COLUMNS": "400"})
    assert verified.exit_code == 0, verified.output
    assert f"release signature checked: key {fingerprint}" in " ".join(verified.stdout.split())
    # The replicator's key signed the report only: the author's release keeps its own signature.
    assert runner.invoke(app, ["verify", str(release_a["root"]), "--key", str(release_a["a_pub"])]).exit_code == 0


def test_plan_naming_another_signer_is_refused_before_any_model_loads(
        release_a: dict[str, Path], tiny_dir: Callable[[str], Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.inference import models

    loads: list[str] = []
    monkeypatch.setattr(models, "load", lambda spec, **_: loads.append(spec))
    res, out = _run(tmp_path / "named-b", tiny_dir("llama"), release_a, release_a["b_pub"])
    assert res.exit_code == errors.EXIT_FAILED, res.output
    assert loads == []  # refused before the model loader was called
    assert "Traceback" not in res.output and len(res.output.strip().splitlines()) == 1
    assert not (out / "report.json").exists() and not (out / "report.sigstore.json").exists()


def test_plan_naming_no_signer_says_the_signature_was_not_checked(
        release_a: dict[str, Path], tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    res, out = _run(tmp_path / "named-none", tiny_dir("llama"), release_a, None)
    assert res.exit_code == errors.EXIT_OK, res.output
    report = json.loads((out / "report.json").read_text())
    assert report["release_signature"]["checked"] is False
    assert report["release_signature"]["reason"] == "no key or Sigstore identity was given"
    shown = runner.invoke(app, ["report", "show", str(out / "report.json")], env={"COLUMNS": "200"})
    assert "release signature not checked (no key or Sigstore identity was given)" in " ".join(shown.stdout.split())


def test_single_check_commands_state_the_release_signature(release_a: dict[str, Path], tiny_dir: Callable[[str], Path],
                                                           tmp_path: Path) -> None:
    """`audit recompute` and `audit sample` take verify's trust options: the signer refused with exit 1, or the
    fingerprint checked stated in the result."""
    fingerprint = keys.key_id(keys.load_public_key(release_a["a_pub"]))
    root, model = str(release_a["root"]), str(tiny_dir("llama"))
    wrong = runner.invoke(app, ["audit", "recompute", root, "-m", model, "--key", str(release_a["b_pub"]), "-q"])
    assert wrong.exit_code == errors.EXIT_FAILED, wrong.output
    res = runner.invoke(app, ["audit", "recompute", root, "-m", model, "--key", str(release_a["a_pub"]), "--sample", "1",
                              "--nonce", "n", "--out", str(tmp_path / "r.json"), "-q"])
    assert res.exit_code == 0, res.output
    result = json.loads((tmp_path / "r.json").read_text())
    assert result["release_signature"]["key_ids"] == [fingerprint]
    assert runner.invoke(app, ["audit", "sample", root, "--nonce", "n", "--size", "1", "--key",
                               str(release_a["b_pub"])]).exit_code == errors.EXIT_FAILED
    drawn = runner.invoke(app, ["audit", "sample", root, "--check", str(tmp_path / "r.json"), "--key",
                                str(release_a["a_pub"])], env={"COLUMNS": "400"})
    assert drawn.exit_code == 0, drawn.output
    assert f"release signature: checked: key {fingerprint}" in drawn.stdout
    unchecked = runner.invoke(app, ["audit", "sample", root, "--check", str(tmp_path / "r.json")], env={"COLUMNS": "400"})
    assert "release signature: not checked (no key or Sigstore identity was given)" in unchecked.stdout


def test_a_sigstore_statement_names_identity_issuer_and_the_logs_time() -> None:
    from kvgraft.signing.sigstore import integrated_time
    from kvgraft.signing.verify import signature_sentence

    bundle = b'{"verificationMaterial": {"tlogEntries": [{"integratedTime": "1700000000"}]}}'
    when = integrated_time(bundle)
    assert when == "2023-11-14T22:13:20Z"
    assert integrated_time(b'{"verificationMaterial": {"tlogEntries": []}}') is None
    statement = {"checked": True, "method": "sigstore", "key_ids": [], "identity": "https://ci.example/wf",
                 "issuer": "https://issuer.example", "signed_time": when, "reason": None}
    assert signature_sentence(statement) == ("checked: Sigstore identity https://ci.example/wf via "
                                             "https://issuer.example, signed 2023-11-14T22:13:20Z")
