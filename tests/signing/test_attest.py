"""Keys, statements, DSSE envelopes and bundles; keygen/sign/verify through the CLI."""

from __future__ import annotations

import base64
import hashlib
import json
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519
from jsonschema import Draft202012Validator
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import ExistsError, InputError
from kvgraft.schema import schema_dir
from kvgraft.signing import attest, keys, sign
from kvgraft.signing.policy import Everything, SignedWithKeys
from tests.verifying import verify_result

from release_factory import release_fixtures

runner = CliRunner()


built, release = release_fixtures("built", "release", entries=2, seed=5)


def schema_validator(name: str) -> Draft202012Validator:
    schema = json.loads((schema_dir() / name).read_text())
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


def read_bundle_json(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / attest.BUNDLE_NAME).read_text())
    return doc


# ------------------------------------------------------------------------------------------------ keys


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_keygen_writes_pem_pairs(tmp_path: Path, algorithm: str) -> None:
    private, public = keys.write_keypair(tmp_path / "k", algorithm=algorithm)
    assert private.name == "k.key.pem" and public.name == "k.pub.pem"
    assert private.read_bytes().startswith(b"-----BEGIN PRIVATE KEY-----")
    assert public.read_bytes().startswith(b"-----BEGIN PUBLIC KEY-----")
    assert stat.S_IMODE(private.stat().st_mode) == 0o600
    key = keys.load_private_key(private)
    pub = keys.load_public_key(public)
    assert keys.algorithm_of(key) == algorithm == keys.algorithm_of(pub)
    if algorithm == "ecdsa-p256":
        assert isinstance(pub, ec.EllipticCurvePublicKey) and pub.curve.name == "secp256r1"
    else:
        assert isinstance(pub, ed25519.Ed25519PublicKey)
    assert keys.key_id(key) == keys.key_id(pub)
    sig = keys.sign(key, b"message")
    assert keys.verify(pub, sig, b"message") and not keys.verify(pub, sig, b"messagE")
    with pytest.raises(ExistsError):
        keys.write_keypair(tmp_path / "k", algorithm=algorithm)


def test_private_key_is_encrypted_with_a_passphrase(tmp_path: Path) -> None:
    private, public = keys.write_keypair(tmp_path / "enc", passphrase=b"correct horse")
    pem = private.read_bytes()
    assert pem.startswith(b"-----BEGIN ENCRYPTED PRIVATE KEY-----")
    assert keys.is_encrypted(private)
    with pytest.raises(keys.EncryptedKeyError, match="encrypted"):
        keys.load_private_key(private)
    with pytest.raises(InputError, match="wrong passphrase"):
        keys.load_private_key(private, b"battery staple")
    key = keys.load_private_key(private, b"correct horse")
    assert keys.key_id(key) == keys.key_id(keys.load_public_key(public))


def test_unusable_keys_are_refused(tmp_path: Path) -> None:
    private, _ = keys.write_keypair(tmp_path / "k")
    with pytest.raises(InputError, match="is a private key"):
        keys.load_public_key(private)
    junk = tmp_path / "junk.pem"
    junk.write_text("not a key")
    with pytest.raises(InputError, match="not a PEM"):
        keys.load_public_key(junk)
    # P-384 and P-521 are read (OMS allows them: tests/signing/test_oms_published.py); a curve OMS does not allow is not.
    k1 = ec.generate_private_key(ec.SECP256K1())
    other = tmp_path / "k1.pub.pem"
    other.write_bytes(k1.public_key().public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo))
    with pytest.raises(InputError, match="unsupported public key"):
        keys.load_public_key(other)
    with pytest.raises(InputError, match="not supported"):
        keys.generate("rsa")


# ----------------------------------------------------------------------------------- statement + DSSE


def test_pae_matches_the_dsse_spec_example() -> None:
    # https://github.com/secure-systems-lab/dsse/blob/v1.0.0/protocol.md (test vector)
    assert attest.pae("http://example.com/HelloWorld", b"hello world") == (
        b"DSSEv1 29 http://example.com/HelloWorld 11 hello world")
    assert attest.pae("", b"") == b"DSSEv1 0  0 "


def test_statement_lists_every_file_and_the_manifest(release: Path) -> None:
    key = keys.generate()
    signed = sign.sign_release(release, key)
    stmt = signed.statement
    assert stmt["_type"] == "https://in-toto.io/Statement/v1"
    assert stmt["predicateType"] == attest.PREDICATE_TYPE == "https://kvgraft.dev/attestation/cache-release/v1"
    files = sorted(p.relative_to(release).as_posix() for p in release.rglob("*")
                   if p.is_file() and p.name not in (attest.BUNDLE_NAME, attest.OMS_NAME))
    assert files == ["entries/00000.safetensors", "entries/00001.safetensors", "manifest.json"]
    listed = {s["name"]: s["digest"]["sha256"] for s in stmt["subject"]}
    assert listed == {f: hashlib.sha256((release / f).read_bytes()).hexdigest() for f in files}
    manifest = json.loads((release / "manifest.json").read_text())
    pred = stmt["predicate"]
    assert pred["manifest"] == {"name": "manifest.json", "sha256": listed["manifest.json"],
                                "size": (release / "manifest.json").stat().st_size}
    assert pred["root_digest"] == manifest["root_digest"]
    assert pred["model"]["identity"] == manifest["model"]["identity"]
    assert pred["num_entries"] == 2 and pred["num_files"] == 3
    errors = list(schema_validator("release-attestation-predicate.v1.json").iter_errors(pred))
    assert errors == []
    # the payload is the canonical JSON of the statement
    payload = base64.b64decode(read_bundle_json(release)["dsseEnvelope"]["payload"])
    assert payload == attest.statement_bytes(stmt)
    assert json.loads(payload) == stmt


def test_key_bundle_is_a_sigstore_bundle_v03_with_a_public_key_hint(release: Path) -> None:
    key = keys.generate()
    sign.sign_release(release, key)
    doc = read_bundle_json(release)
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert doc["verificationMaterial"] == {"publicKey": {"hint": keys.key_id(key)}, "tlogEntries": []}
    assert doc["dsseEnvelope"]["payloadType"] == "application/vnd.in-toto+json"
    assert doc["dsseEnvelope"]["signatures"][0]["keyid"] == keys.key_id(key)
    # Sigstore's own bundle model (sigstore-python's protobuf-specs types) reads it
    from sigstore_models.bundle.v1 import Bundle

    parsed = Bundle.from_json((release / attest.BUNDLE_NAME).read_bytes())
    assert parsed.verification_material.public_key is not None
    assert parsed.verification_material.public_key.hint == keys.key_id(key)
    assert parsed.dsse_envelope is not None and parsed.dsse_envelope.payload_type == attest.PAYLOAD_TYPE
    assert stat.S_IMODE((release / attest.BUNDLE_NAME).stat().st_mode) == 0o644


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_independent_dsse_check_with_cryptography_only(release: Path, tmp_path: Path, algorithm: str) -> None:
    """The DSSE signature verifies from the bundle JSON alone, following the DSSE spec, without kvgraft code."""
    private, public = keys.write_keypair(tmp_path / "k", algorithm=algorithm)
    sign.sign_release(release, keys.load_private_key(private))

    # --- from here on: json, base64, hashlib and cryptography only ---
    bundle = json.loads((release / "release.sigstore.json").read_bytes())
    envelope = bundle["dsseEnvelope"]
    payload_type = envelope["payloadType"]
    payload = base64.b64decode(envelope["payload"])
    (signature_entry,) = envelope["signatures"]
    signature = base64.b64decode(signature_entry["sig"])

    def pae(type_: str, body: bytes) -> bytes:  # DSSE v1 PAE, re-implemented from the spec
        t = type_.encode("utf-8")
        return b"DSSEv1" + b" " + str(len(t)).encode() + b" " + t + b" " + str(len(body)).encode() + b" " + body

    pub = serialization.load_pem_public_key(public.read_bytes())
    if isinstance(pub, ec.EllipticCurvePublicKey):
        pub.verify(signature, pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
    else:
        assert isinstance(pub, ed25519.Ed25519PublicKey)
        pub.verify(signature, pae(payload_type, payload))
    with pytest.raises(InvalidSignature):
        if isinstance(pub, ec.EllipticCurvePublicKey):
            pub.verify(signature, pae(payload_type, payload + b" "), ec.ECDSA(hashes.SHA256()))
        else:
            pub.verify(signature, pae(payload_type, payload + b" "))

    statement = json.loads(payload)
    assert payload_type == "application/vnd.in-toto+json"
    assert statement["_type"] == "https://in-toto.io/Statement/v1"
    for subject in statement["subject"]:
        assert hashlib.sha256((release / subject["name"]).read_bytes()).hexdigest() == subject["digest"]["sha256"]
    pem = pub.public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    assert bundle["verificationMaterial"]["publicKey"]["hint"] == hashlib.sha256(pem).hexdigest()


# --------------------------------------------------------------------------------------------- library


@pytest.mark.parametrize("algorithm", ["ecdsa-p256", "ed25519"])
def test_sign_then_verify(release: Path, tmp_path: Path, algorithm: str) -> None:
    private, public = keys.write_keypair(tmp_path / "k", algorithm=algorithm)
    signed = sign.sign_release(release, keys.load_private_key(private))
    assert signed.bundle == release / attest.BUNDLE_NAME
    result = verify_result(release, SignedWithKeys((public,)))
    assert result.signature.status == "verified" and result.signature.method == "key"
    assert result.signature.key_id == signed.signer
    assert result.statement and result.files == 3 and result.entries == 2 and result.tensors == 8
    total = sum((release / n).stat().st_size for n in ("manifest.json", "entries/00000.safetensors",
                                                        "entries/00001.safetensors"))
    assert result.bytes_hashed == total
    deep = verify_result(release, SignedWithKeys((public,)), Everything(deep=True))
    tensor_bytes = sum(t["byte_range"][1] - t["byte_range"][0]
                       for e in json.loads((release / "manifest.json").read_text())["entries"] for t in e["tensors"].values())
    assert deep.deep and deep.bytes_hashed == total + tensor_bytes


def test_resigning_replaces_the_bundle(release: Path) -> None:
    first, second = keys.generate(), keys.generate("ed25519")
    sign.sign_release(release, first)
    sign.sign_release(release, second)  # the old bundle is not a release file
    assert read_bundle_json(release)["verificationMaterial"]["publicKey"]["hint"] == keys.key_id(second)


def test_a_statement_with_another_predicate_type_is_refused(release: Path, tmp_path: Path) -> None:
    private, public = keys.write_keypair(tmp_path / "k")
    key = keys.load_private_key(private)
    stmt = sign.release_statement(release)
    stmt["predicateType"] = "https://slsa.dev/provenance/v1"
    payload = attest.statement_bytes(stmt)
    bundle = attest.key_bundle(payload, keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload)), keys.key_id(key))
    (release / attest.BUNDLE_NAME).write_text(json.dumps(bundle))
    from kvgraft.errors import VerificationError

    with pytest.raises(VerificationError, match="is not a kvgraft release attestation"):
        verify_result(release, SignedWithKeys((public,)))


# ------------------------------------------------------------------------------------------------- CLI


def test_cli_keygen_sign_verify(release: Path, tmp_path: Path) -> None:
    env = {"KVGRAFT_TEST_PASSPHRASE": "s3cret"}
    r = runner.invoke(app, ["keygen", "--out", str(tmp_path / "ci"), "--passphrase-env", "KVGRAFT_TEST_PASSPHRASE"], env=env)
    assert r.exit_code == 0, r.output
    assert "encrypted" in r.stdout
    private, public = tmp_path / "ci.key.pem", tmp_path / "ci.pub.pem"
    assert keys.is_encrypted(private)

    r = runner.invoke(app, ["sign", str(release), "--key", str(private)])  # encrypted, no passphrase, no tty
    assert r.exit_code == 2 and "encrypted" in r.stderr
    r = runner.invoke(app, ["sign", str(release), "--key", str(private), "--passphrase-env", "KVGRAFT_TEST_PASSPHRASE"],
                      env=env)
    assert r.exit_code == 0, r.output
    assert (release / attest.BUNDLE_NAME).is_file()

    r = runner.invoke(app, ["verify", str(release), "--key", str(public)])
    assert r.exit_code == 0, r.output
    assert "verified" in r.stdout and keys.key_id(keys.load_public_key(public)) in r.stdout

    r = runner.invoke(app, ["verify", str(release)])
    assert r.exit_code == 0 and "not checked" in r.stdout


def test_cli_verify_json_matches_its_schema(release: Path, tmp_path: Path) -> None:
    validator = schema_validator("verify-result.v1.json")
    private, public = keys.write_keypair(tmp_path / "k")
    sign.sign_release(release, keys.load_private_key(private))
    r = runner.invoke(app, ["verify", str(release), "--key", str(public), "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert list(validator.iter_errors(doc)) == []
    assert doc["ok"] is True and doc["signature"]["status"] == "verified" and doc["files"] == 3

    (release / "entries/00001.safetensors").write_bytes(b"x")
    r = runner.invoke(app, ["verify", str(release), "--key", str(public), "--json"])
    assert r.exit_code == 1
    doc = json.loads(r.stdout)
    assert list(validator.iter_errors(doc)) == []
    assert doc["ok"] is False and doc["exit_code"] == 1 and "entries/00001.safetensors" in doc["error"]
    assert "entries/00001.safetensors" in r.stderr

    r = runner.invoke(app, ["verify", str(tmp_path / "nowhere"), "--json"])
    assert r.exit_code == 2
    doc = json.loads(r.stdout)
    assert list(validator.iter_errors(doc)) == [] and doc["exit_code"] == 2


def test_cli_argument_errors_exit_2(release: Path, tmp_path: Path) -> None:
    private, public = keys.write_keypair(tmp_path / "k")
    assert runner.invoke(app, ["sign", str(release)]).exit_code == 2
    assert runner.invoke(app, ["sign", str(release), "--key", str(private), "--sigstore"]).exit_code == 2
    assert runner.invoke(app, ["sign", str(release), "--key", str(private), "--staging"]).exit_code == 2
    r = runner.invoke(app, ["verify", str(release), "--certificate-identity", "a@b.c"])
    assert r.exit_code == 2 and "together" in r.stderr
    r = runner.invoke(app, ["verify", str(release), "--key", str(public), "--certificate-identity", "a@b.c",
                            "--certificate-oidc-issuer", "https://x"])
    assert r.exit_code == 2 and "not both" in r.stderr
    r = runner.invoke(app, ["verify", str(release), "--key", str(tmp_path / "missing.pem")])
    assert r.exit_code == 2 and "missing.pem" in r.stderr
    assert runner.invoke(app, ["keygen", "--out", str(tmp_path / "x"), "--algorithm", "rsa"]).exit_code == 2
    assert runner.invoke(app, ["keygen", "--out", str(tmp_path / "k")]).exit_code == 5  # exists


def test_keyless_signing_wiring_without_network(release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`sign --sigstore` needs Fulcio, Rekor and an OIDC token; here they are fakes, to check the wiring:
    the ambient credential is used, sigstore's real in-toto Statement model accepts our statement bytes
    unchanged, and the bundle sigstore returns is written to release.sigstore.json."""
    import sigstore.models
    import sigstore.oidc
    import sigstore.sign
    from sigstore.dsse import Statement

    seen: dict[str, Any] = {}

    class FakeBundle:
        def to_json(self) -> str:
            return '{"fake": "bundle"}'

    class FakeSigner:
        def sign_dsse(self, stmt: Statement) -> FakeBundle:
            seen["payload"] = stmt._contents
            seen["pae"] = stmt._pae()
            return FakeBundle()

    class FakeContext:
        @contextmanager
        def signer(self, token: Any, *, cache: bool = True) -> Iterator[FakeSigner]:
            seen["token"] = token
            yield FakeSigner()

    class FakeToken:
        def __init__(self, raw: str, client_id: str = "sigstore") -> None:
            self.raw, self.identity = raw, "ci@example.com"

    monkeypatch.setattr(sigstore.models.ClientTrustConfig, "staging", classmethod(lambda cls, offline=False: object()))
    monkeypatch.setattr(sigstore.sign.SigningContext, "from_trust_config", classmethod(lambda cls, config: FakeContext()))
    monkeypatch.setattr(sigstore.oidc, "detect_credential", lambda client_id="sigstore": "ambient-jwt")
    monkeypatch.setattr(sigstore.oidc, "IdentityToken", FakeToken)

    signed = sign.sign_release_sigstore(release, staging=True)
    assert seen["token"].raw == "ambient-jwt" and signed.signer == "ci@example.com"
    assert seen["payload"] == attest.statement_bytes(signed.statement)
    assert seen["pae"] == attest.pae(attest.PAYLOAD_TYPE, seen["payload"])
    assert (release / attest.BUNDLE_NAME).read_text() == '{"fake": "bundle"}'


def test_keyless_signing_failure_is_one_line(release: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import sigstore.models
    from sigstore.errors import Error as SigstoreError

    def offline(cls: Any, offline: bool = False) -> Any:
        raise SigstoreError("Failed to refresh TUF metadata.\nno network")

    monkeypatch.setattr(sigstore.models.ClientTrustConfig, "production", classmethod(offline))
    with pytest.raises(InputError, match="Sigstore signing failed") as info:
        sign.sign_release_sigstore(release)
    assert "\n" not in info.value.diagnostics()
    assert not (release / attest.BUNDLE_NAME).exists()
