"""OpenSSF model signing as releases are really published: P-384 keys, a release kept in a git
or Hugging Face Hub repository, a detached signature, and two signers (the kvgraft bundle by one key,
model.sig by another). Signatures are made by the `model_signing` CLI itself (skipped, saying so, where
it is not installed: `make install` installs it, the `oms` extra)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.schema import validate
from kvgraft.signing import attest, keys, oms

from release_factory import release_fixtures

runner = CliRunner()
MODEL_SIGNING = shutil.which("model_signing") or str(Path(sys.executable).parent / "model_signing")
needs_cli = pytest.mark.skipif(not Path(MODEL_SIGNING).exists(), reason="model_signing CLI not installed")
CARD = """---
license: apache-2.0
library_name: kvgraft
tags: [kv-cache, kvgraft]
---
# A KV-cache release

Verify with `kvgraft verify . --key signer.pub.pem`.
"""
GITATTRIBUTES = "*.safetensors filter=lfs diff=lfs merge=lfs -text\n*.sig -text\n"


def _ec_keypair(folder: Path, name: str, curve: ec.EllipticCurve) -> tuple[Path, Path]:
    key = ec.generate_private_key(curve)
    private, public = folder / f"{name}.key.pem", folder / f"{name}.pub.pem"
    private.write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                          serialization.NoEncryption()))
    public.write_bytes(keys.public_pem(key))
    return private, public


built, release = release_fixtures("built", "release", entries=2, seed=23)


def _model_signing(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([MODEL_SIGNING, *args], capture_output=True, text=True, timeout=300)


def _ms_sign(root: Path, private: Path, signature: Path) -> None:
    made = _model_signing("sign", "key", "--private_key", str(private), "--signature", str(signature), str(root))
    assert made.returncode == 0, made.stdout + made.stderr


def _ms_verify(root: Path, public: Path, signature: Path) -> subprocess.CompletedProcess[str]:
    return _model_signing("verify", "key", "--signature", str(signature), "--public_key", str(public), str(root))


def _verify(root: Path, *args: str) -> Any:
    return runner.invoke(app, ["verify", str(root), *args])


def _flip(path: Path) -> bytes:
    saved = path.read_bytes()
    data = bytearray(saved)
    data[len(data) // 2] ^= 1
    path.write_bytes(bytes(data))
    return saved


@needs_cli
@pytest.mark.parametrize("curve", [ec.SECP384R1(), ec.SECP521R1(), ec.SECP256R1()], ids=lambda c: c.name)
def test_a_release_signed_by_model_signing_with_any_oms_curve_verifies(release: Path, tmp_path: Path,
                                                                       curve: ec.EllipticCurve) -> None:
    """Was: "kvgraft uses ECDSA P-256 or Ed25519" for a P-384 key, which OMS allows (SHA-384 with it)."""
    private, public = _ec_keypair(tmp_path, "k", curve)
    sig = release / attest.OMS_NAME
    _ms_sign(release, private, sig)
    r = _verify(release, "--key", str(public), "--require-signature", "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["signature"]["oms_verified"] is True and doc["signature"]["key_id"] == keys.key_id(keys.load_public_key(public))
    saved = _flip(sorted((release / "entries").iterdir())[1])
    assert _verify(release, "--key", str(public)).exit_code == 1
    assert _ms_verify(release, public, sig).returncode != 0  # the positive control: model_signing refuses it too
    sorted((release / "entries").iterdir())[1].write_bytes(saved)
    _, other = _ec_keypair(tmp_path, "other", curve)
    r = _verify(release, "--key", str(other))
    assert r.exit_code == 1 and "does not verify" in r.stderr and r.stderr.count("\n") == 1


def _git(repo: Path, *args: str) -> None:
    subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.org", *args],
                   check=True, capture_output=True, timeout=60)


@needs_cli
@pytest.mark.skipif(shutil.which("git") is None, reason="git not installed")
def test_a_release_in_a_git_repository_with_a_hub_card_verifies(release: Path, tmp_path: Path) -> None:
    """Was: "not part of the release: .gitattributes, ..." from kvgraft, where model_signing verified it."""
    private, public = _ec_keypair(tmp_path, "k", ec.SECP256R1())
    _git(release, "init", "-q")
    (release / ".gitattributes").write_text(GITATTRIBUTES)
    (release / ".gitignore").write_text("*.tmp\n")
    (release / ".github" / "workflows").mkdir(parents=True)
    (release / ".github" / "workflows" / "verify.yml").write_text("on: push\n")
    (release / "README.md").write_text(CARD)
    _git(release, "add", "-A")
    _git(release, "commit", "-q", "-m", "release")
    sig = release / attest.OMS_NAME
    _ms_sign(release, private, sig)
    assert _ms_verify(release, public, sig).returncode == 0
    names = [r["name"] for r in json.loads(__import__("base64").b64decode(
        json.loads(sig.read_text())["dsseEnvelope"]["payload"]))["predicate"]["resources"]]
    assert "README.md" in names and not any(n.startswith(".git") for n in names)  # what model_signing signs
    r = _verify(release, "--key", str(public), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate(doc, "verify-result.v1.json", "verify --json")
    assert doc["signature"]["oms_verified"] is True and doc["signature"]["oms_beside_release"] == ["README.md"]
    text = _verify(release, "--key", str(public))
    assert text.exit_code == 0 and "README.md" in text.output  # said: signed by the OMS signature only
    loose = _verify(release)  # no key: nothing is authenticated, and the note says the card was only compared
    assert loose.exit_code == 0 and "README.md" in loose.stderr and "not checked" in loose.stderr, loose.output
    # The card is signed: changed, both refuse it.
    (release / "README.md").write_text(CARD + "\nedited\n")
    assert _ms_verify(release, public, sig).returncode != 0
    r = _verify(release, "--key", str(public))
    assert r.exit_code == 1 and "README.md" in r.stderr and r.stderr.count("\n") == 1
    (release / "README.md").write_text(CARD)
    # A file neither the manifest nor the signature lists is still refused, and .git is ignored only at the root.
    (release / "entries" / ".gitignore").write_text("x\n")
    r = _verify(release, "--key", str(public))
    assert r.exit_code == 1 and "not part of the release: entries/.gitignore" in r.stderr


@needs_cli
def test_a_detached_oms_signature_is_given_with_oms_signature(release: Path, tmp_path: Path) -> None:
    private, public = _ec_keypair(tmp_path, "k", ec.SECP384R1())
    sig = tmp_path / "elsewhere" / "release.sig"
    sig.parent.mkdir()
    _ms_sign(release, private, sig)
    assert not (release / attest.OMS_NAME).exists()
    r = _verify(release, "--key", str(public), "--oms-signature", str(sig), "--json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["signature"]["oms_signature"] == str(sig)
    r = _verify(release, "--key", str(public))  # without it, the folder holds no signature
    assert r.exit_code == 1 and "unsigned" in r.stderr
    saved = _flip(release / "manifest.json")
    assert _verify(release, "--key", str(public), "--oms-signature", str(sig)).exit_code == 1
    (release / "manifest.json").write_bytes(saved)
    r = _verify(release, "--oms-signature", str(tmp_path / "missing.sig"))
    assert r.exit_code == 2 and "missing.sig" in r.stderr


@needs_cli
def test_two_signers_each_signature_says_which_key_verified_it(release: Path, tmp_path: Path) -> None:
    """The kvgraft bundle signed by key A, model.sig by key B. Was: either key alone failed, with no word
    of which signature holds for which key; now both keys are given and the result says which is whose."""
    private_a, public_a = keys.write_keypair(tmp_path / "a")
    private_b, public_b = _ec_keypair(tmp_path, "b", ec.SECP384R1())
    r = runner.invoke(app, ["sign", str(release), "--key", str(private_a)])
    assert r.exit_code == 0, r.output
    _ms_sign(release, private_b, release / attest.OMS_NAME)  # over the folder, release.sigstore.json included
    id_a, id_b = (keys.key_id(keys.load_public_key(p)) for p in (public_a, public_b))
    r = _verify(release, "--key", str(public_a), "--key", str(public_b), "--json")
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate(doc, "verify-result.v1.json", "verify --json")  # the schema knows the new members
    sigs = {s["file"]: s for s in doc["signature"]["signatures"]}
    assert sigs[str(release / attest.BUNDLE_NAME)]["key_id"] == id_a
    assert sigs[str(release / attest.OMS_NAME)]["key_id"] == id_b
    assert all(s["status"] == "verified" for s in sigs.values())
    text = _verify(release, "--key", str(public_b), "--key", str(public_a)).output
    assert f"{attest.BUNDLE_NAME} verified with key {id_a}" in text and f"{attest.OMS_NAME} verified with key {id_b}" in text
    for only, other in ((public_a, attest.OMS_NAME), (public_b, attest.BUNDLE_NAME)):
        r = _verify(release, "--key", str(only))
        assert r.exit_code == 1 and other in r.stderr and "--key" in r.stderr and r.stderr.count("\n") == 1, r.output
    _, public_c = keys.write_keypair(tmp_path / "c")
    r = _verify(release, "--key", str(public_a), "--key", str(public_b), "--key", str(public_c))
    assert r.exit_code == 1 and "verifies no signature" in r.stderr, r.output
    r = _verify(release)
    assert r.exit_code == 0 and r.stderr.count("not checked") >= 1


def test_oms_curves_and_hashes() -> None:
    """The hash follows the curve, as OMS (and Sigstore) define it: SHA-256, SHA-384, SHA-512."""
    from cryptography.hazmat.primitives import hashes

    for curve, digest in ((ec.SECP256R1(), hashes.SHA256()), (ec.SECP384R1(), hashes.SHA384()),
                          (ec.SECP521R1(), hashes.SHA512())):
        key = ec.generate_private_key(curve)
        sig = keys.sign(key, b"x")
        assert keys.verify(key.public_key(), sig, b"x") and not keys.verify(key.public_key(), sig, b"y")
        key.public_key().verify(sig, b"x", ec.ECDSA(digest))  # raises unless made with the curve's hash
    assert oms.IGNORE_PATHS  # the names the model_signing CLI records as ignored


@needs_cli
def test_a_file_beside_the_release_is_refused_when_the_oms_signature_listing_it_is_not_checked(
        release: Path, tmp_path: Path) -> None:
    """The bundle by an Ed25519 key (which OMS cannot use), model.sig by another signer listing a card: with
    only the Ed25519 key given, model.sig is left unchecked, so the card it lists is no part of anything
    verified and is refused; with the second signer's key too, it is accepted."""
    private_a, public_a = keys.write_keypair(tmp_path / "a", algorithm="ed25519")
    private_b, public_b = _ec_keypair(tmp_path, "b", ec.SECP256R1())
    assert runner.invoke(app, ["sign", str(release), "--key", str(private_a)]).exit_code == 0
    (release / "README.md").write_text(CARD)
    _ms_sign(release, private_b, release / attest.OMS_NAME)
    r = _verify(release, "--key", str(public_a))
    assert r.exit_code == 1 and "not part of the release: README.md" in r.stderr, r.output
    r = _verify(release, "--key", str(public_a), "--key", str(public_b), "--json")
    assert r.exit_code == 0 and json.loads(r.stdout)["signature"]["oms_beside_release"] == ["README.md"], r.output
