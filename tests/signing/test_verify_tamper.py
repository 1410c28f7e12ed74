"""Every tamper of a key-signed release is rejected with one line naming what and where.

Also hostile input: unsafe names, symlinks, duplicate JSON keys, oversized documents, absurd shapes.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shutil
import struct
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft._internal import jsonio
from kvgraft.cli import app
from kvgraft.errors import Error, InputError, IntegrityError, VerificationError
from kvgraft.release import format as release_format
from kvgraft.release.records import entry_digest, root_digest
from kvgraft.signing import attest, keys, sign
from kvgraft.signing.policy import ALL, Everything, Scope, SignedByIdentity, SignedWithKeys, VerifyPolicy
from tests.verifying import verify_result

from release_factory import make_release, sign_as, unsign

runner = CliRunner()


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("keys") / "signer")


def _signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path], name: str, seed: int) -> Path:
    root = tmp_path_factory.mktemp(name) / "rel"
    make_release(root, entries=3, seed=seed)
    sign.sign_release(root, keys.load_private_key(keypair[0]))
    return root


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    return _signed(tmp_path_factory, keypair, "base", 1)


@pytest.fixture(scope="module")
def other_signed(tmp_path_factory: pytest.TempPathFactory, keypair: tuple[Path, Path]) -> Path:
    return _signed(tmp_path_factory, keypair, "other", 2)


@pytest.fixture
def rel(signed: Path, tmp_path: Path) -> Path:
    """A fresh copy of the signed release for one test to damage."""
    return Path(shutil.copytree(signed, tmp_path / "rel"))


def manifest_of(root: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((root / "manifest.json").read_text())
    return doc


def flip_bit(path: Path, offset: int, bit: int = 0) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 1 << bit
    path.write_bytes(bytes(data))


def fails(root: Path, kind: type[Error], *fragments: str, policy: VerifyPolicy | None = None,
          scope: Scope = ALL) -> str:
    """Verify must raise `kind`; its one-line message must contain every fragment."""
    with pytest.raises(kind) as info:
        verify_result(root, policy, scope)
    message = info.value.diagnostics()
    assert "\n" not in message
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"
    return message


def rewrite_bundle(root: Path, change: Any) -> None:
    path = root / attest.BUNDLE_NAME
    doc = json.loads(path.read_text())
    change(doc)
    path.write_text(json.dumps(doc))


def test_intact_release_verifies(rel: Path, keypair: tuple[Path, Path]) -> None:
    result = verify_result(rel, SignedWithKeys((keypair[1],)))
    assert result.signature.status == "verified"
    assert result.signature.key_id == keys.key_id(keys.load_public_key(keypair[1]))
    assert result.files == 4 and result.entries == 3 and result.tensors == 12
    assert result.root_digest == manifest_of(rel)["root_digest"]


def test_bit_flip_in_a_tensor_byte(rel: Path, keypair: tuple[Path, Path]) -> None:
    entry = manifest_of(rel)["entries"][1]
    t = entry["tensors"]["layer.1.values"]
    a, b = t["byte_range"]
    path = rel / entry["file"]
    flip_bit(path, (a + b) // 2, 3)
    actual = hashlib.sha256(path.read_bytes()[a:b]).hexdigest()
    fails(rel, IntegrityError, "entries/00001.safetensors", "'rec-001'", "'layer.1.values'", f"bytes [{a}, {b})",
          f"sha256 {actual}", f"the manifest says {t['sha256']}", policy=SignedWithKeys((keypair[1],)))


def test_bit_flip_in_a_tensor_byte_via_cli(rel: Path, keypair: tuple[Path, Path]) -> None:
    entry = manifest_of(rel)["entries"][2]
    a, b = entry["tensors"]["layer.0.keys"]["byte_range"]
    flip_bit(rel / entry["file"], a)
    result = runner.invoke(app, ["verify", str(rel), "--key", str(keypair[1])])
    assert result.exit_code == 1
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1
    assert "'layer.0.keys'" in lines[0] and f"[{a}, {b})" in lines[0] and "entries/00002.safetensors" in lines[0]


def test_bit_flip_in_the_safetensors_header(rel: Path, keypair: tuple[Path, Path]) -> None:
    path = rel / "entries/00000.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    at = data.index(b"rec-000", 8, 8 + n)  # the entry id in the header's __metadata__
    path.write_bytes(data[:at] + b"rec-00X" + data[at + 7:])
    fails(rel, IntegrityError, "entries/00000.safetensors", "every tensor matches", "header region [0,",
          policy=SignedWithKeys((keypair[1],)))


def test_renamed_tensor_in_the_safetensors_header(rel: Path, keypair: tuple[Path, Path]) -> None:
    path = rel / "entries/00000.safetensors"
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    at = data.index(b'"layer.0.keys"', 8, 8 + n)
    path.write_bytes(data[:at] + b'"layer.0.kezs"' + data[at + 14:])
    fails(rel, IntegrityError, "entries/00000.safetensors", "'rec-000'", "header region [0,",
          "tensor table no longer matches the manifest", policy=SignedWithKeys((keypair[1],)))


def test_bit_flip_in_the_manifest(rel: Path, keypair: tuple[Path, Path]) -> None:
    path = rel / "manifest.json"
    flip_bit(path, path.stat().st_size // 2, 1)
    fails(rel, IntegrityError, "manifest.json", "does not match the signed statement", policy=SignedWithKeys((keypair[1],)))


def test_bit_flip_in_the_bundle_payload(rel: Path, keypair: tuple[Path, Path]) -> None:
    def change(doc: dict[str, Any]) -> None:
        payload = bytearray(base64.b64decode(doc["dsseEnvelope"]["payload"]))
        payload[len(payload) // 2] ^= 0x01
        doc["dsseEnvelope"]["payload"] = base64.b64encode(bytes(payload)).decode()

    rewrite_bundle(rel, change)
    fails(rel, VerificationError, attest.BUNDLE_NAME, "DSSE signature does not verify with key",
          policy=SignedWithKeys((keypair[1],)))


def test_bit_flip_in_the_signature(rel: Path, keypair: tuple[Path, Path]) -> None:
    def change(doc: dict[str, Any]) -> None:
        sig = bytearray(base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"]))
        sig[-5] ^= 0x40
        doc["dsseEnvelope"]["signatures"][0]["sig"] = base64.b64encode(bytes(sig)).decode()

    rewrite_bundle(rel, change)
    fails(rel, VerificationError, attest.BUNDLE_NAME, "DSSE signature does not verify", policy=SignedWithKeys((keypair[1],)))


def test_file_removed(rel: Path, keypair: tuple[Path, Path]) -> None:
    (rel / "entries/00002.safetensors").unlink()
    fails(rel, IntegrityError, "missing entries/00002.safetensors", policy=SignedWithKeys((keypair[1],)))


def test_manifest_removed(rel: Path, keypair: tuple[Path, Path]) -> None:
    (rel / "manifest.json").unlink()
    fails(rel, IntegrityError, "manifest.json", "missing", "subject of the signed statement",
          policy=SignedWithKeys((keypair[1],)))


@pytest.mark.parametrize("name", ["entries/00003.safetensors", "notes.txt", ".hidden"])
def test_file_added(rel: Path, keypair: tuple[Path, Path], name: str) -> None:
    (rel / name).write_bytes(b"not part of it")
    fails(rel, IntegrityError, f"not part of the release: {name}", policy=SignedWithKeys((keypair[1],)))


def test_file_renamed(rel: Path, keypair: tuple[Path, Path]) -> None:
    os.rename(rel / "entries/00001.safetensors", rel / "entries/00001.safetensors.bak")
    fails(rel, IntegrityError, "missing entries/00001.safetensors", "not part of the release: entries/00001.safetensors.bak",
          policy=SignedWithKeys((keypair[1],)))


def test_file_truncated(rel: Path, keypair: tuple[Path, Path]) -> None:
    path = rel / "entries/00000.safetensors"
    size = path.stat().st_size
    os.truncate(path, size - 100)
    fails(rel, IntegrityError, "entries/00000.safetensors", f"{size - 100} bytes, the manifest says {size}", "truncated",
          policy=SignedWithKeys((keypair[1],)))


def test_files_swapped_between_entries(rel: Path, keypair: tuple[Path, Path]) -> None:
    a, b = rel / "entries/00000.safetensors", rel / "entries/00001.safetensors"
    assert a.stat().st_size == b.stat().st_size
    tmp = rel / "swap"
    os.rename(a, tmp)
    os.rename(b, a)
    os.rename(tmp, b)
    fails(rel, IntegrityError, "entries/00000.safetensors", "has the content of entries/00001.safetensors",
          "and 1 more files differ: entries/00001.safetensors", policy=SignedWithKeys((keypair[1],)))


def test_valid_signature_from_another_release(rel: Path, other_signed: Path, keypair: tuple[Path, Path]) -> None:
    shutil.copy(other_signed / attest.BUNDLE_NAME, rel / attest.BUNDLE_NAME)
    other_root = manifest_of(other_signed)["root_digest"]
    fails(rel, IntegrityError, "manifest.json", "does not match the signed statement",
          f"the statement attests the release with root digest {other_root}", policy=SignedWithKeys((keypair[1],)))


def test_unsigned_release_when_a_key_is_required(rel: Path, keypair: tuple[Path, Path]) -> None:
    unsign(rel)
    fails(rel, VerificationError, "release is unsigned", "--key", policy=SignedWithKeys((keypair[1],)))
    result = runner.invoke(app, ["verify", str(rel), "--key", str(keypair[1])])
    assert result.exit_code == 1 and "release is unsigned" in result.stderr


def test_unsigned_release_when_an_identity_is_required(rel: Path) -> None:
    unsign(rel)
    fails(rel, VerificationError, "release is unsigned", "--certificate-identity",
          policy=SignedByIdentity("someone@example.com", "https://github.com/login/oauth"))


def test_unsigned_release_without_a_requirement_passes_with_signature_not_checked(rel: Path) -> None:
    unsign(rel)
    result = verify_result(rel)
    assert result.signature.status == "not checked" and result.signature.bundle is None
    assert not result.statement


def test_wrong_key(rel: Path, tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    _, wrong = keys.write_keypair(tmp_path / "wrong")
    wrong_id = keys.key_id(keys.load_public_key(wrong))
    right_id = keys.key_id(keys.load_public_key(keypair[1]))
    fails(rel, VerificationError, f"does not verify with key {wrong_id}", f"the bundle names key {right_id}",
          policy=SignedWithKeys((wrong,)))
    result = runner.invoke(app, ["verify", str(rel), "--key", str(wrong)])
    assert result.exit_code == 1 and len(result.stderr.strip().splitlines()) == 1


def test_wrong_identity_for_a_key_signed_release(rel: Path) -> None:
    """Sigstore identity checks on real certificates are in test_sigstore_fixtures.py."""
    fails(rel, VerificationError, "signed with key", "not a Sigstore certificate",
          policy=SignedByIdentity("someone@example.com", "https://github.com/login/oauth"))


@pytest.mark.parametrize("deep", [False, True])
def test_a_signed_manifest_whose_tensor_digest_is_wrong_is_refused(tmp_path: Path, keypair: tuple[Path, Path],
                                                                   deep: bool) -> None:
    """A manifest re-signed (by whoever holds the key, with their own tools) with a wrong tensor sha256: file and
    header digests agree; the default pass hashes each tensor's range as it reads the file, `--deep` reads it again;
    `--entry` checks that entry's the same way."""
    root = tmp_path / "rel"
    make_release(root, entries=2, seed=3)
    manifest = manifest_of(root)
    entry = manifest["entries"][1]
    entry["tensors"]["layer.0.values"]["sha256"] = "0" * 64
    entry["digest"] = entry_digest(entry)
    manifest["root_digest"] = root_digest(manifest)
    jsonio.write_json(root / "manifest.json", manifest)
    sign_as(root, keypair[0])
    a, b = entry["tensors"]["layer.0.values"]["byte_range"]
    fails(root, IntegrityError, "entries/00001.safetensors", "'rec-001'", "'layer.0.values'", f"bytes [{a}, {b})",
          "the manifest says " + "0" * 64, policy=SignedWithKeys((keypair[1],)), scope=Everything(deep))
    for extra in (["--deep"] if deep else [], ["--entry", "rec-001"]):
        result = runner.invoke(app, ["verify", str(root), "--key", str(keypair[1]), *extra])
        assert result.exit_code == 1 and "'layer.0.values'" in result.stderr, result.output
    assert runner.invoke(app, ["verify", str(root), "--key", str(keypair[1]), "--entry", "rec-000"]).exit_code == 0


# ------------------------------------------------------------------------------------------- hostile


def _rename_entry_file(root: Path, new: str) -> None:
    """Point entry 0 and the files table at `new` with consistent digests (an unsigned, hostile manifest)."""
    manifest = manifest_of(root)
    old = manifest["entries"][0]["file"]
    manifest["files"][new] = manifest["files"].pop(old)
    manifest["entries"][0]["file"] = new
    manifest["entries"][0]["digest"] = entry_digest(manifest["entries"][0])
    manifest["root_digest"] = root_digest(manifest)
    jsonio.write_json(root / "manifest.json", manifest)
    unsign(root)


@pytest.mark.parametrize("name", ["../outside.safetensors", "/etc/passwd", "entries/../../x.safetensors"])
def test_manifest_names_with_dotdot_or_absolute_paths_are_refused(rel: Path, name: str) -> None:
    _rename_entry_file(rel, name)
    message = fails(rel, InputError)
    assert "files" in message or "unsafe" in message
    assert runner.invoke(app, ["verify", str(rel)]).exit_code == 2


@pytest.mark.parametrize("name", ["../manifest.json", "/abs/file", "entries//x", "a/./b"])
def test_statement_subject_names_with_dotdot_or_absolute_paths_are_refused(
        rel: Path, keypair: tuple[Path, Path], name: str) -> None:
    manifest = manifest_of(rel)
    raw = (rel / "manifest.json").read_bytes()
    stmt = attest.statement(manifest, hashlib.sha256(raw).hexdigest(), len(raw))
    stmt["subject"].append({"name": name, "digest": {"sha256": "a" * 64}})
    _write_signed_statement(rel, attest.statement_bytes(stmt), keypair[0])
    fails(rel, InputError, "unsafe file name", repr(name), policy=SignedWithKeys((keypair[1],)))


def _write_signed_statement(root: Path, payload: bytes, private: Path) -> None:
    key = keys.load_private_key(private)
    sig = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    bundle = attest.key_bundle(payload, sig, keys.key_id(key))
    (root / attest.BUNDLE_NAME).write_text(json.dumps(bundle))


def test_symlinked_entry_file_is_refused(rel: Path, tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    path = rel / "entries/00000.safetensors"
    outside = tmp_path / "outside.safetensors"
    shutil.move(path, outside)
    path.symlink_to(outside)  # same bytes, but through a link
    fails(rel, InputError, "entries/00000.safetensors", "symlink", policy=SignedWithKeys((keypair[1],)))


def test_symlinked_folder_and_bundle_are_refused(rel: Path, tmp_path: Path, keypair: tuple[Path, Path]) -> None:
    (rel / "extra-link").symlink_to(tmp_path)
    fails(rel, InputError, "extra-link", "symlink", policy=SignedWithKeys((keypair[1],)))
    (rel / "extra-link").unlink()
    bundle = rel / attest.BUNDLE_NAME
    shutil.move(bundle, tmp_path / "b.json")
    bundle.symlink_to(tmp_path / "b.json")
    fails(rel, InputError, attest.BUNDLE_NAME, "symlink", policy=SignedWithKeys((keypair[1],)))


def test_duplicate_keys_in_the_manifest_are_refused(rel: Path) -> None:
    unsign(rel)
    path = rel / "manifest.json"
    text = path.read_text()
    path.write_text(text.replace('"format": ', '"format": "kvgraft-cache-release", "format": ', 1))
    fails(rel, InputError, "manifest.json", "duplicate key 'format'")


def test_duplicate_keys_in_the_bundle_are_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    path = rel / attest.BUNDLE_NAME
    text = path.read_text()
    path.write_text(text.replace('"mediaType": ', '"mediaType": "x", "mediaType": ', 1))
    fails(rel, InputError, attest.BUNDLE_NAME, "duplicate key 'mediaType'", policy=SignedWithKeys((keypair[1],)))
    assert runner.invoke(app, ["verify", str(rel), "--key", str(keypair[1])]).exit_code == 2


def test_duplicate_keys_in_the_signed_statement_are_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    payload = json.loads(base64.b64decode(json.loads((rel / attest.BUNDLE_NAME).read_text())["dsseEnvelope"]["payload"]))
    text = json.dumps(payload)
    dup = text.replace('"predicateType": ', f'"predicateType": "{attest.PREDICATE_TYPE}", "predicateType": ', 1)
    _write_signed_statement(rel, dup.encode(), keypair[0])
    fails(rel, InputError, "statement", "duplicate key 'predicateType'", policy=SignedWithKeys((keypair[1],)))


def test_bundle_size_is_bounded_before_reading(rel: Path, keypair: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(attest, "MAX_BUNDLE_BYTES", 512)
    fails(rel, InputError, attest.BUNDLE_NAME, "exceeds the 512-byte limit", policy=SignedWithKeys((keypair[1],)))


def test_manifest_size_is_bounded_before_reading(rel: Path, keypair: tuple[Path, Path],
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(release_format, "MAX_MANIFEST_BYTES", 1024)
    fails(rel, InputError, "manifest.json", "exceeds the 1024-byte limit", policy=SignedWithKeys((keypair[1],)))
    unsign(rel)
    fails(rel, InputError, "manifest.json", "exceeds the 1024-byte limit")


def test_manifest_tensor_shapes_are_bounded_by_the_schema(rel: Path) -> None:
    manifest = manifest_of(rel)
    entry = manifest["entries"][0]
    entry["tensors"]["layer.0.keys"]["shape"] = [1, 2, 3, 2**41]
    entry["digest"] = entry_digest(entry)
    manifest["root_digest"] = root_digest(manifest)
    jsonio.write_json(rel / "manifest.json", manifest)
    unsign(rel)
    fails(rel, InputError, "manifest.json", "schema error", "shape")


def test_safetensors_header_with_an_absurd_shape_is_refused_without_allocating(rel: Path) -> None:
    header = json.dumps({"layer.0.keys": {"dtype": "F32", "shape": [2**21, 2**21], "data_offsets": [0, 16]}}).encode()
    hostile = struct.pack("<Q", len(header)) + header + bytes(16)
    path = rel / "entries/00000.safetensors"
    path.write_bytes(hostile)
    manifest = manifest_of(rel)
    manifest["files"]["entries/00000.safetensors"] = {"sha256": hashlib.sha256(hostile).hexdigest(), "size": len(hostile)}
    manifest["root_digest"] = root_digest(manifest)
    jsonio.write_json(rel / "manifest.json", manifest)
    unsign(rel)
    fails(rel, InputError, "entries/00000.safetensors", "'layer.0.keys'", "exceeds the bound")


def test_signing_refuses_a_damaged_release(rel: Path, keypair: tuple[Path, Path]) -> None:
    flip_bit(rel / "entries/00001.safetensors", 200)
    before = (rel / attest.BUNDLE_NAME).read_bytes()
    with pytest.raises(IntegrityError, match=re.escape("entries/00001.safetensors")):
        sign.sign_release(rel, keys.load_private_key(keypair[0]))
    assert (rel / attest.BUNDLE_NAME).read_bytes() == before
    result = runner.invoke(app, ["sign", str(rel), "--key", str(keypair[0])])
    assert result.exit_code == 1
