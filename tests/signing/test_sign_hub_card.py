"""`kvgraft sign` on a folder holding a Hugging Face card (README.md beside manifest.json).

Was: "files differ from the manifest: not part of the release: README.md", where `model_signing sign`
signs the card. Now an ECDSA key signs it as model_signing does (model.sig lists every file of the folder;
release.sigstore.json binds the release itself), and a key or a signing that writes no model.sig (Ed25519,
keyless) refuses it before writing anything, since `kvgraft verify` with that signer refuses a file no
verified signature lists.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import InputError
from kvgraft.schema import validate
from kvgraft.signing import attest, keys, sign

from release_factory import make_release

runner = CliRunner()
CARD = "---\nlibrary_name: kvgraft\n---\n# A KV-cache release\n"
MODEL_SIGNING = shutil.which("model_signing") or str(Path(sys.executable).parent / "model_signing")


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("hub-card")
    make_release(folder / "rel", entries=2, seed=35)
    return folder / "rel"


@pytest.fixture
def release(built: Path, tmp_path: Path) -> Path:
    copy = Path(shutil.copytree(built, tmp_path / "rel"))
    (copy / "README.md").write_text(CARD)
    return copy


def _payload(path: Path) -> Any:
    return json.loads(base64.b64decode(json.loads(path.read_text())["dsseEnvelope"]["payload"]))


def test_an_ecdsa_key_signs_the_card_in_model_sig_and_verify_reports_it(release: Path, tmp_path: Path) -> None:
    private, public = keys.write_keypair(tmp_path / "k")
    r = runner.invoke(app, ["sign", str(release), "--key", str(private)])
    assert r.exit_code == 0, r.output
    assert "beside README.md" in r.output and "signed by model.sig only" in r.output  # the signer sees what it signed
    listed = {x["name"]: x["digest"] for x in _payload(release / attest.OMS_NAME)["predicate"]["resources"]}
    assert "README.md" in listed and attest.BUNDLE_NAME in listed  # every file of the folder, as model_signing
    subjects = {s["name"] for s in _payload(release / attest.BUNDLE_NAME)["subject"]}
    assert "README.md" not in subjects and "manifest.json" in subjects  # the statement binds the release itself
    r = runner.invoke(app, ["verify", str(release), "--key", str(public), "--require-signature", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    validate(doc, "verify-result.v1.json", "verify --json")
    assert doc["signature"]["oms_verified"] is True and doc["signature"]["oms_beside_release"] == ["README.md"]
    assert doc["warnings"] == []
    # The card is authenticated: edited after signing, it is refused, named, in one line.
    (release / "README.md").write_text(CARD + "edited\n")
    r = runner.invoke(app, ["verify", str(release), "--key", str(public)])
    assert r.exit_code == 1 and r.stderr.count("\n") == 1, r.output
    assert f"{release / 'README.md'}: sha256" in r.stderr and "model.sig" in r.stderr


@pytest.mark.skipif(not Path(MODEL_SIGNING).exists(), reason="model_signing CLI not installed")
def test_model_signing_verifies_the_card_kvgraft_signed(release: Path, tmp_path: Path) -> None:
    private, public = keys.write_keypair(tmp_path / "k")
    assert runner.invoke(app, ["sign", str(release), "--key", str(private)]).exit_code == 0

    def ms_verify() -> subprocess.CompletedProcess[str]:
        return subprocess.run([MODEL_SIGNING, "verify", "key", "--signature", str(release / attest.OMS_NAME),
                               "--public_key", str(public), str(release)], capture_output=True, text=True, timeout=300)

    assert ms_verify().returncode == 0
    (release / "README.md").write_text(CARD + "edited\n")
    assert ms_verify().returncode != 0  # the control: the card is what it signed


def test_an_ed25519_key_refuses_the_card_before_writing_anything(release: Path, tmp_path: Path) -> None:
    private, public = keys.write_keypair(tmp_path / "e", algorithm="ed25519")
    r = runner.invoke(app, ["sign", str(release), "--key", str(private)])
    assert r.exit_code == 2 and r.stderr.count("\n") == 1, r.output
    assert r.stderr.startswith(f"kvgraft: error: {release / 'README.md'}: beside the release, outside its manifest")
    assert "ed25519 key writes no OpenSSF model signing signature (model.sig)" in r.stderr
    assert "sign with an ECDSA key" in r.stderr and "move the file out of the folder" in r.stderr
    assert not (release / attest.BUNDLE_NAME).exists() and not (release / attest.OMS_NAME).exists()
    # The control: without the card the same key signs, and verify passes.
    (release / "README.md").unlink()
    assert runner.invoke(app, ["sign", str(release), "--key", str(private)]).exit_code == 0
    assert runner.invoke(app, ["verify", str(release), "--key", str(public)]).exit_code == 0


def test_an_ed25519_key_refuses_a_card_beside_an_earlier_signature_and_keeps_it(release: Path, tmp_path: Path) -> None:
    """A card added to a signed release: re-signing with Ed25519 refuses, and the earlier signatures stay."""
    private, _ = keys.write_keypair(tmp_path / "k")
    (release / "README.md").unlink()
    assert runner.invoke(app, ["sign", str(release), "--key", str(private)]).exit_code == 0
    before = {n: (release / n).read_bytes() for n in (attest.BUNDLE_NAME, attest.OMS_NAME)}
    (release / "docs").mkdir()
    (release / "docs" / "card.md").write_text(CARD)
    (release / "README.md").write_text(CARD)
    ed, _ = keys.write_keypair(tmp_path / "e", algorithm="ed25519")
    r = runner.invoke(app, ["sign", str(release), "--key", str(ed)])
    assert r.exit_code == 2 and f"{release / 'README.md'} (+1 more): beside the release" in r.stderr, r.output
    assert {n: (release / n).read_bytes() for n in before} == before


def test_keyless_signing_refuses_the_card_before_any_network(release: Path) -> None:
    with pytest.raises(InputError, match=r"README\.md: beside the release, outside its manifest; keyless signing "
                                         r"writes no OpenSSF model signing signature"):
        sign.sign_release_sigstore(release, staging=True, identity_token="not-a-token")
    assert not (release / attest.BUNDLE_NAME).exists()


def test_a_stray_file_among_the_entries_is_refused_not_signed(release: Path, tmp_path: Path) -> None:
    """Only paths outside the release's own (manifest.json, entries/, index/) count as beside it: a file
    among the entry files is damage or a leftover, refused by name; the control: the card alone signs."""
    private, _ = keys.write_keypair(tmp_path / "k")
    stray = release / "entries" / "stray.bin"
    stray.write_bytes(b"x")
    with pytest.raises(Exception, match=r"not part of the release: entries/stray\.bin"):
        sign.sign_release(release, keys.load_private_key(private))
    assert not (release / attest.BUNDLE_NAME).exists() and not (release / attest.OMS_NAME).exists()
    stray.unlink()
    assert sign.sign_release(release, keys.load_private_key(private)).beside == ("README.md",)
