"""OpenSSF model signing (OMS v1.0) interop: `kvgraft sign --key` also writes RELEASE/model.sig, which
the `model_signing` CLI verifies; `kvgraft verify` accepts a release signed by `model_signing sign`.
Both fail after one flipped byte. The CLI tests skip where model_signing is not installed
(`make install` installs it: the `oms` extra)."""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import VerificationError
from kvgraft.signing import attest, keys, oms, sign
from kvgraft.signing.policy import SignedWithKeys
from tests.verifying import verify_result

from release_factory import make_release

runner = CliRunner()
MODEL_SIGNING = shutil.which("model_signing") or str(Path(__file__).resolve().parents[2] / ".venv/bin/model_signing")
needs_cli = pytest.mark.skipif(not Path(MODEL_SIGNING).exists(), reason="model_signing CLI not installed")


@pytest.fixture(scope="module", params=[1, 2], ids=["format1", "format2"])
def built(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A release of each format: OMS lists every file of both (format 2: index shards and entry files)."""
    folder = tmp_path_factory.mktemp("oms")
    private, public = keys.write_keypair(folder / "k")
    make_release(folder / "rel", entries=3, seed=7, format_version=request.param)
    return folder / "rel", private, public


@pytest.fixture
def release(built: tuple[Path, Path, Path], tmp_path: Path) -> tuple[Path, Path, Path]:
    root, private, public = built
    return Path(shutil.copytree(root, tmp_path / "rel")), private, public


def _flip(path: Path, at: int = -5) -> None:
    data = bytearray(path.read_bytes())
    data[at] ^= 1
    path.write_bytes(bytes(data))


def _model_signing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MODEL_SIGNING, *args], capture_output=True, text=True, timeout=300)


def test_sign_writes_an_oms_statement_over_every_file(release: tuple[Path, Path, Path]) -> None:
    root, private, public = release
    signed = sign.sign_release(root, keys.load_private_key(private))
    assert signed.oms == root / attest.OMS_NAME
    doc = json.loads(signed.oms.read_text())
    stmt = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    assert stmt["predicateType"] == oms.PREDICATE_TYPE
    resources = stmt["predicate"]["resources"]
    names = [r["name"] for r in resources]
    on_disk = sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and p.name != attest.OMS_NAME)
    assert names == on_disk and attest.BUNDLE_NAME in names
    for r in resources:
        assert r["digest"] == hashlib.sha256((root / r["name"]).read_bytes()).hexdigest()
    root_digest = hashlib.sha256(b"".join(bytes.fromhex(r["digest"]) for r in resources)).hexdigest()
    assert stmt["subject"] == [{"name": root.name, "digest": {"sha256": root_digest}}]
    pem = Path(public).read_bytes()
    assert doc["verificationMaterial"]["publicKey"]["hint"] == hashlib.sha256(pem).hexdigest()
    result = verify_result(root, SignedWithKeys((public,)))
    assert result.signature.oms_verified and result.signature.oms_sha256 == hashlib.sha256(
        signed.oms.read_bytes()).hexdigest()


def test_a_stale_or_altered_oms_signature_fails_kvgraft_verify(release: tuple[Path, Path, Path]) -> None:
    root, private, public = release
    sign.sign_release(root, keys.load_private_key(private))
    sig = root / attest.OMS_NAME
    original = sig.read_bytes()
    doc = json.loads(original)
    doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(b"\x30" + bytes(70)).decode()
    sig.write_text(json.dumps(doc))
    with pytest.raises(VerificationError, match=r"model\.sig: DSSE signature does not verify"):
        verify_result(root, SignedWithKeys((public,)))
    sig.write_bytes(original)
    # kvgraft's own bundle re-signed by another key: the OMS list no longer matches it
    other, _ = keys.write_keypair(root.parent / "other")
    bundle = (root / attest.BUNDLE_NAME).read_bytes()
    sign.sign_release(root, keys.load_private_key(other))
    (root / attest.OMS_NAME).write_bytes(original)
    assert (root / attest.BUNDLE_NAME).read_bytes() != bundle
    with pytest.raises(VerificationError, match=f"lists {attest.BUNDLE_NAME} with sha256"):
        verify_result(root)


def test_an_ed25519_key_writes_no_oms_signature_and_removes_a_stale_one(release: tuple[Path, Path, Path]) -> None:
    root, private, _ = release
    sign.sign_release(root, keys.load_private_key(private))
    assert (root / attest.OMS_NAME).is_file()
    ed_private, ed_public = keys.write_keypair(root.parent / "ed", algorithm="ed25519")
    signed = sign.sign_release(root, keys.load_private_key(ed_private))
    assert signed.oms is None and not (root / attest.OMS_NAME).exists()
    assert verify_result(root, SignedWithKeys((ed_public,))).signature.oms_signature is None


@needs_cli
def test_model_signing_verifies_a_kvgraft_signed_release(release: tuple[Path, Path, Path]) -> None:
    root, private, public = release
    r = runner.invoke(app, ["sign", str(root), "--key", str(private)])
    assert r.exit_code == 0, r.output
    sig = root / attest.OMS_NAME
    ok = _model_signing("verify", "key", "--signature", str(sig), "--public_key", str(public), str(root))
    assert ok.returncode == 0, ok.stdout + ok.stderr
    victim = sorted((root / "entries").rglob("*.safetensors"))[1]
    _flip(victim)
    bad = _model_signing("verify", "key", "--signature", str(sig), "--public_key", str(public), str(root))
    assert bad.returncode != 0 and victim.relative_to(root).as_posix() in bad.stdout + bad.stderr


@needs_cli
def test_kvgraft_verifies_a_release_signed_by_model_signing(release: tuple[Path, Path, Path]) -> None:
    root, private, public = release
    sig = root / attest.OMS_NAME
    made = _model_signing("sign", "key", "--private_key", str(private), "--signature", str(sig), str(root))
    assert made.returncode == 0, made.stdout + made.stderr
    r = runner.invoke(app, ["verify", str(root), "--key", str(public), "--require-signature", "--json"])
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    assert doc["signature"]["status"] == "verified" and doc["signature"]["oms_verified"] is True
    assert doc["signature"]["bundle"] is None
    for victim in (root / "manifest.json", sorted((root / "entries").rglob("*.safetensors"))[2], sig):
        saved = victim.read_bytes()
        _flip(victim, len(saved) // 2)
        r = runner.invoke(app, ["verify", str(root), "--key", str(public)])
        assert r.exit_code in (1, 2) and r.stderr.count("\n") == 1, (victim, r.output)
        victim.write_bytes(saved)
    _, other_pub = keys.write_keypair(root.parent / "other")
    r = runner.invoke(app, ["verify", str(root), "--key", str(other_pub)])
    assert r.exit_code == 1 and "does not verify" in r.stderr
