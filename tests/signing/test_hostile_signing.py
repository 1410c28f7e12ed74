"""Hostile releases (the indexed format): their signatures.

- a certificate whose SubjectAlternativeName does not parse is a row's problem in `inspect`, not exit 70.
- files a verified OpenSSF model signing signature says it ignores (`model_signing sign --ignore-paths`)
  are not refused as extra, as `model_signing verify` accepts them; nothing else is.
- one key id (the SHA-256 of the public key PEM) in keygen, sign, inspect and verify, for both signature
  files, whoever made model.sig.
"""

from __future__ import annotations

import base64
import datetime
import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtensionOID
from test_oms_published import _ec_keypair, _model_signing, _ms_sign, _ms_verify, needs_cli
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.schema import validate
from kvgraft.signing import attest, keys, sign

from release_factory import make_release

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile-signing") / "rel"
    make_release(root, entries=2, seed=3, format_version=2)
    return root


@pytest.fixture
def release(built: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(built, tmp_path / "rel"))


def _json(*args: str) -> dict[str, Any]:
    r = runner.invoke(app, [*args, "--json"])
    assert r.exit_code == 0, r.output
    doc: dict[str, Any] = json.loads(r.stdout)
    return doc


# ------------------------------------------------------------------------------------ 4: a malformed SAN


def _certificate(san: x509.ExtensionType) -> bytes:
    key = ec.generate_private_key(ec.SECP256R1())
    start = datetime.datetime(2025, 1, 1, tzinfo=datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(x509.Name([])).issuer_name(x509.Name([]))
            .public_key(key.public_key()).serial_number(1).not_valid_before(start)
            .not_valid_after(start + datetime.timedelta(minutes=10)).add_extension(san, critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def _certificate_bundle(root: Path, der: bytes) -> None:
    """release.sigstore.json carrying this certificate and a statement of the release (its signature is junk:
    nothing here checks it)."""
    payload = attest.statement_bytes(sign.release_statement(root))
    doc = {"mediaType": attest.BUNDLE_MEDIA_TYPE,
           "verificationMaterial": {"certificate": {"rawBytes": base64.b64encode(der).decode()}, "tlogEntries": []},
           "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": attest.PAYLOAD_TYPE,
                            "signatures": [{"sig": base64.b64encode(b"\x01" * 64).decode()}]}}
    (root / attest.BUNDLE_NAME).write_text(json.dumps(doc))


def test_a_certificate_whose_san_does_not_parse_is_a_problem_inspect_shows(release: Path) -> None:
    """Was: exit 70, "internal error: ValueError: error parsing asn1 value"."""
    good = x509.SubjectAlternativeName([x509.RFC822Name("signer@example.org")])
    _certificate_bundle(release, _certificate(good))
    row = _json("inspect", str(release))["signatures"][0]
    assert row["signer"] == "signer@example.org" and "problem" not in row  # control: a SAN that parses is named
    bad = x509.UnrecognizedExtension(ExtensionOID.SUBJECT_ALTERNATIVE_NAME, b"\x30\x03\x86\x05a")  # length past the end
    _certificate_bundle(release, _certificate(bad))
    doc = _json("inspect", str(release))
    validate(doc, "inspect-result.v1.json", "inspect --json")
    row = doc["signatures"][0]
    assert (row["method"], row["signer"], row["verified"]) == ("sigstore", None, False)
    assert row["problem"].startswith("certificate cannot be read: error parsing asn1 value")
    text = runner.invoke(app, ["inspect", str(release)])
    assert text.exit_code == 0 and "certificate cannot be read" in text.stdout, text.output
    r = runner.invoke(app, ["verify", str(release)])  # verify reads the same bundle (the statement only)
    assert r.exit_code == 0, r.output


# ------------------------------------------------------------------ 9: a signed ignore list is honoured


CARD = "# A KV-cache release\n"


def _ms_sign_ignoring(root: Path, private: Path, *ignored: Path) -> Path:
    """RELEASE/model.sig made by `model_signing sign key --ignore-paths P ...`."""
    sig = root / attest.OMS_NAME
    extra = [a for p in ignored for a in ("--ignore-paths", str(p))]
    made = _model_signing("sign", "key", "--private_key", str(private), "--signature", str(sig), *extra, str(root))
    assert made.returncode == 0, made.stdout + made.stderr
    return sig


@needs_cli
def test_files_a_verified_oms_signature_ignores_are_not_refused(release: Path, tmp_path: Path) -> None:
    """Was: `model_signing verify` passed and `kvgraft verify --key` exited 1, "not part of the release: README.md"."""
    private, public = _ec_keypair(tmp_path, "k", ec.SECP256R1())
    (release / "README.md").write_text(CARD)
    (release / "docs").mkdir()
    (release / "docs" / "notes.txt").write_text("notes\n")
    sig = _ms_sign_ignoring(release, private, release / "README.md", release / "docs")
    predicate = json.loads(base64.b64decode(json.loads(sig.read_text())["dsseEnvelope"]["payload"]))["predicate"]
    assert {"README.md", "docs"} <= set(predicate["serialization"]["ignore_paths"])  # what the signature says
    assert "README.md" not in {r["name"] for r in predicate["resources"]}
    assert _ms_verify(release, public, sig).returncode == 0
    r = runner.invoke(app, ["verify", str(release), "--key", str(public), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate(doc, "verify-result.v1.json", "verify --json")
    assert doc["signature"]["oms_verified"] is True
    assert doc["signature"]["oms_ignored"] == ["README.md", "docs/notes.txt"]
    assert any("README.md" in w and "no signature covers" in w for w in doc["warnings"])
    r = runner.invoke(app, ["verify", str(release), "--key", str(public)])
    assert r.exit_code == 0 and ("  ignored      2 files the OMS signature says it ignores, not hashed, covered by no "
                                 "signature: README.md, docs/notes.txt") in r.stdout, r.output  # the text output names them
    # What it does not ignore is still refused, as model_signing refuses it.
    (release / "NOTES.md").write_text("x\n")
    assert _ms_verify(release, public, sig).returncode != 0
    r = runner.invoke(app, ["verify", str(release), "--key", str(public)])
    assert r.exit_code == 1 and "not part of the release: NOTES.md" in r.stderr and r.stderr.count("\n") == 1, r.output


@needs_cli
def test_an_ignore_list_is_not_honoured_from_an_oms_signature_left_unchecked(release: Path, tmp_path: Path) -> None:
    """The bundle by an Ed25519 key (OMS cannot use it), model.sig by another signer ignoring README.md: with only
    the Ed25519 key given, model.sig is not checked, so what it says it ignores excuses nothing."""
    private_a, public_a = keys.write_keypair(tmp_path / "a", algorithm="ed25519")
    private_b, public_b = _ec_keypair(tmp_path, "b", ec.SECP256R1())
    assert runner.invoke(app, ["sign", str(release), "--key", str(private_a)]).exit_code == 0
    (release / "README.md").write_text(CARD)
    _ms_sign_ignoring(release, private_b, release / "README.md")
    r = runner.invoke(app, ["verify", str(release), "--key", str(public_a)])
    assert r.exit_code == 1 and "not part of the release: README.md" in r.stderr, r.output
    r = runner.invoke(app, ["verify", str(release), "--key", str(public_a), "--key", str(public_b)])
    assert r.exit_code == 0, r.output  # control: checked, its ignore list holds


# ------------------------------------------------------------------------------------- 11: one key id


def _key_ids(text: str) -> set[str]:
    return set(re.findall(r"\b[0-9a-f]{64}\b", text))


def test_one_key_id_in_keygen_sign_inspect_and_verify(release: Path, tmp_path: Path) -> None:
    """Was: inspect said model.sig "names key 9fa9602a..." (its hint: SHA-256 of the PEM) and verify called the
    same key "a6b84dae..." (SHA-256 of the DER)."""
    made = runner.invoke(app, ["keygen", "--out", str(tmp_path / "k")])
    assert made.exit_code == 0, made.output
    (kid,) = _key_ids(made.stdout)
    assert f"key id {kid}: {keys.KEY_ID_IS}" in made.stdout
    signed = runner.invoke(app, ["sign", str(release), "--key", str(tmp_path / "k.key.pem")])
    assert signed.exit_code == 0, signed.output
    assert f"signer key {kid} ({keys.KEY_ID_IS})" in signed.stdout
    named = {s["file"]: s["signer"] for s in _json("inspect", str(release))["signatures"]}
    assert named == {attest.BUNDLE_NAME: kid, attest.OMS_NAME: kid}
    shown = runner.invoke(app, ["inspect", str(release)], env={"COLUMNS": "300"})
    assert shown.stdout.count(f"key {kid} ({keys.KEY_ID_IS})") == 2, shown.stdout
    checked = _json("verify", str(release), "--key", str(tmp_path / "k.pub.pem"))["signature"]
    assert checked["key_id"] == kid and {s["key_id"] for s in checked["signatures"]} == {kid}


@needs_cli
def test_a_model_sig_made_by_model_signing_names_the_key_verify_names(release: Path, tmp_path: Path) -> None:
    private, public = _ec_keypair(tmp_path, "k", ec.SECP384R1())
    _ms_sign(release, private, release / attest.OMS_NAME)
    (row,) = _json("inspect", str(release))["signatures"]
    checked = _json("verify", str(release), "--key", str(public))["signature"]
    assert row["signer"] == checked["key_id"] == keys.key_id(keys.load_public_key(public))


def test_a_bundle_signed_with_the_older_der_hint_still_verifies(release: Path, tmp_path: Path) -> None:
    """Bundles kvgraft signed before name their key by the SHA-256 of its DER form: still accepted, reported
    under the one key id."""
    private, public = keys.write_keypair(tmp_path / "k")
    key = keys.load_private_key(private)
    payload = attest.statement_bytes(sign.release_statement(release))
    signature = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    legacy = keys.der_fingerprint(key)
    assert legacy != keys.key_id(key)
    attest.write_bundle(release, json.dumps(attest.key_bundle(payload, signature, legacy)).encode())
    checked = _json("verify", str(release), "--key", str(public))["signature"]
    assert checked["key_id"] == keys.key_id(key)
