"""verify.py's outputs and edge paths, each pinned (mutmut's verify survivors, docs/mutation.md).

What `kvgraft verify` says about a signature (SignatureStatus.describe), its --json document, the
predicate mismatch message, a key that cannot check an OMS-only release, an OMS signature beside an
Ed25519 bundle, and `verified()` on a path, on a Release changed after it was opened, and the headers
it hands back.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, IntegrityError, VerificationError
from kvgraft.release.format import Release
from kvgraft.release.records import MANIFEST
from kvgraft.results.verify import SignatureFile
from kvgraft.signing import attest, keys, oms, sign
from kvgraft.signing.policy import (
    OPEN,
    Entries,
    OwnOutput,
    SignatureNotChecked,
    SignedByIdentity,
    SignedWithKeys,
    scope_of,
    verify_policy,
)
from kvgraft.signing.verify import SignatureStatus, VerifiedRelease, failure, verified
from tests.verifying import verify_result

from release_factory import listed_digests, release_fixtures


@pytest.fixture(scope="module")
def ecdsa(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("k") / "ec")


@pytest.fixture(scope="module")
def ed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("k") / "ed", algorithm="ed25519")


base, rel = release_fixtures(entries=2, seed=9)


def _kid(public: Path) -> str:
    return keys.key_id(keys.load_public_key(public))


def test_describe_says_what_was_checked(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    assert verify_result(rel).signature.describe() == "not checked: the release is unsigned (no release.sigstore.json)"
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    assert verify_result(rel).signature.describe() == \
        "not checked: pass --key or --certificate-identity/--certificate-oidc-issuer"
    # Two signature files: which verified with which key.
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).signature.describe() == \
        f"verified: {attest.BUNDLE_NAME} verified with key {_kid(ecdsa[1])}; {attest.OMS_NAME} verified with key {_kid(ecdsa[1])}"
    (rel / attest.BUNDLE_NAME).unlink()
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    assert verify_result(rel).signature.describe() == \
        "not checked: an OpenSSF model signing signature (model.sig) is present; pass --key"
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).signature.describe() == \
        f"verified: key {_kid(ecdsa[1])}; OpenSSF model signing signature verified"
    sigstore = SignatureStatus("verified", "sigstore", bundle="b", identity="ci@example.org", issuer="https://issuer")
    assert sigstore.describe() == "verified: ci@example.org via https://issuer (Sigstore)"


def test_an_oms_signature_beside_an_ed25519_bundle_is_compared_not_checked(rel: Path, ecdsa: tuple[Path, Path],
                                                                            ed: tuple[Path, Path]) -> None:
    from kvgraft._internal.digest import sha256_hex

    signed = sign.sign_release(rel, keys.load_private_key(ed[0]))
    assert signed.oms is None and not (rel / attest.OMS_NAME).exists()  # OMS cannot use an Ed25519 key
    bundle_sha = sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha})
    status = verify_result(rel, SignedWithKeys((ed[1],))).signature
    assert (status.status, status.oms_verified, status.oms_signature) == ("verified", False, str(rel / attest.OMS_NAME))
    assert status.describe() == f"verified: {attest.BUNDLE_NAME} verified with key {_kid(ed[1])}; {attest.OMS_NAME} not checked"


def test_an_ed25519_key_cannot_vouch_for_an_oms_only_release(rel: Path, ecdsa: tuple[Path, Path],
                                                              ed: tuple[Path, Path]) -> None:
    """The key asked for must check the signature: an OMS-only release and a key OMS cannot use fail."""
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    with pytest.raises(VerificationError, match="an OMS signature is made with an ECDSA key"):
        verify_result(rel, SignedWithKeys((ed[1],)))


def test_verify_json_document(rel: Path) -> None:
    result = verify_result(rel)
    d = result.document().model_dump(mode="json", exclude_unset=True)
    assert d["release"] == str(rel) and d["warnings"] == result.warnings and d["warnings"]
    assert d["seconds"] == round(result.seconds, 6) and d["throughput_bytes_per_s"] == round(result.throughput, 1)
    assert isinstance(d["seconds"], float) and isinstance(d["throughput_bytes_per_s"], float)
    assert failure(rel / "x", "boom", 2).model_dump(mode="json", exclude_unset=True) == {
        "format": "kvgraft-verify-result", "format_version": 1, "kvgraft_version": d["kvgraft_version"],
        "ok": False, "exit_code": 2, "error": "boom", "release": str(rel / "x")}


def _resign(root: Path, private: Path, change: object) -> None:
    from kvgraft._internal.digest import sha256_hex

    data = (root / MANIFEST).read_bytes()
    stmt = attest.statement(json.loads(data), sha256_hex(data), len(data))
    change(stmt["predicate"])  # type: ignore[operator]
    payload = attest.statement_bytes(stmt)
    key = keys.load_private_key(private)
    sig = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    attest.write_bundle(root, json.dumps(attest.key_bundle(payload, sig, keys.key_id(key))).encode())
    (root / attest.OMS_NAME).unlink(missing_ok=True)


def test_predicate_mismatch_names_the_member_and_both_values(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    _resign(rel, ecdsa[0], lambda p: p.update(num_entries=7))
    with pytest.raises(VerificationError) as info:
        verify_result(rel, SignedWithKeys((ecdsa[1],)))
    assert str(info.value) == (f"{rel / MANIFEST}: the signed statement predicate's num_entries 7 does not match "
                               f"the manifest (2)")
    # A long or non-ASCII value: sorted keys, ASCII escapes, cut at 200 characters.
    _resign(rel, ecdsa[0], lambda p: p["model"].update(architecture="é" * 300))
    with pytest.raises(VerificationError) as info:
        verify_result(rel, SignedWithKeys((ecdsa[1],)))
    message = str(info.value)
    claimed = message.split("predicate's model ", 1)[1].split(" does not match", 1)[0]
    assert claimed == '{"architecture": "' + "\\u00e9" * 30 + '\\u...'  # 18 + 30 * 6 = 198, then 2 of the next
    model = json.loads((rel / MANIFEST).read_text())["model"]
    implied = {k: model[k] for k in ("spec", "architecture", "model_type", "identity")}
    cut = json.dumps(implied, sort_keys=True)[:200] + "..."
    assert message.endswith(f"does not match the manifest ({cut})")


def test_verified_on_a_path_carries_its_policy_and_its_check(rel: Path) -> None:
    opened = verified(str(rel), SignatureNotChecked())
    assert isinstance(opened, VerifiedRelease) and isinstance(opened.release, Release)
    assert opened.checked.scope == "open" and opened.root == rel and opened.policy == SignatureNotChecked()
    assert opened.manifest is opened.release.manifest
    again = verified(rel, SignatureNotChecked())  # nothing is remembered beside the verifier: checked again
    assert again.release is not opened.release and again.checked is not opened.checked
    # The headers verified are handed to the Release: reading an entry's layout works and reuses them.
    entry = opened.release.entries[0]
    assert set(opened.release.tensor_layout(entry)) == set(entry["tensors"])


def test_a_release_kvgraft_wrote_is_verified_as_its_own_output(rel: Path) -> None:
    own = verified(rel, OwnOutput("a test"))
    assert own.policy == OwnOutput("a test") and own.policy != SignatureNotChecked()
    assert not own.policy.checks_signature and own.checked.signature.status == "not checked"
    m = json.loads((rel / MANIFEST).read_text())
    m["entries"][0]["source"]["text"] = "edited"
    (rel / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match="digest"):  # its digests are checked all the same
        verified(rel, OwnOutput("a test"))


def test_policies_name_one_kind_each_and_refuse_what_means_nothing(tmp_path: Path) -> None:
    from kvgraft.errors import InputError
    from kvgraft.signing.policy import SignatureNotChecked, SignedByIdentity, SignedWithKeys, verify_policy

    key = tmp_path / "k.pub.pem"
    assert verify_policy() == SignatureNotChecked()
    assert verify_policy(key=key, more_keys=(key,)) == SignedWithKeys((key, key))
    assert verify_policy(identity="me", issuer="https://issuer") == SignedByIdentity("me", "https://issuer")
    assert verify_policy(key=key) != verify_policy(key=key, require_signature=True) != verify_policy()
    for given, message in [({"identity": "me"}, "must be given together"),
                           ({"more_keys": (key,)}, "more keys given without a first one"),
                           ({"key": key, "identity": "me", "issuer": "i"}, "not both"),
                           ({"require_signature": True}, "--require-signature needs --key")]:
        with pytest.raises(InputError, match=message):
            verify_policy(**given)  # type: ignore[arg-type]
    with pytest.raises(InputError, match="at least one --key"):
        SignedWithKeys(())
# --------------------------------------------------------------------------- argument errors, whole messages
# The older tests match a fragment (pytest.raises(match=...)); a message wrapped in other text or in
# another case still contains it. These compare the whole line (mutmut's verify survivors).

def _message(call: object) -> str:
    with pytest.raises((InputError, VerificationError, IntegrityError, ValueError)) as info:
        call()  # type: ignore[operator]
    return str(info.value)


def test_argument_errors_say_exactly_what_is_wrong(rel: Path, ecdsa: tuple[Path, Path], tmp_path: Path) -> None:
    both = "--certificate-identity/--certificate-oidc-issuer"
    assert _message(lambda: scope_of(entries=["e1"], sample=2)) == \
        "--sample and --entry exclude each other: a chosen subset bounds nothing"
    assert _message(lambda: scope_of(nonce="c0ffee")) == "--nonce draws a sample: pass --sample N too"
    assert _message(lambda: verify_result(tmp_path / "nowhere")) == \
        f"{tmp_path / 'nowhere'}: does not exist (expected a cache release)"
    assert _message(lambda: verify_policy(identity="ci@example.org")) == \
        "--certificate-identity and --certificate-oidc-issuer must be given together"
    assert _message(lambda: verify_policy(issuer="https://issuer")) == \
        "--certificate-identity and --certificate-oidc-issuer must be given together"
    assert _message(lambda: verify_result(rel, verify_policy(more_keys=(ecdsa[1],)))) == \
        "more keys given without a first one"
    assert _message(lambda: verify_policy(key=ecdsa[1], identity="ci@example.org", issuer="https://i")) == \
        f"give --key or {both}, not both"
    assert _message(lambda: verify_result(rel, verify_policy(require_signature=True))) == \
        f"--require-signature needs --key or {both} to check the signature with"
    assert _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],)))) == \
        f"{rel}: the release is unsigned (no {attest.BUNDLE_NAME}) but --key requires a signature"
    assert _message(lambda: verify_result(rel, SignedByIdentity("ci@example.org", "https://i"))) == \
        f"{rel}: the release is unsigned (no {attest.BUNDLE_NAME}) but --certificate-identity requires a signature"


def test_unsigned_and_unchecked_warnings_are_exact(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    result = verify_result(rel)
    assert result.warnings == [f"the release is unsigned (no {attest.BUNDLE_NAME}): only its bytes against its "
                               f"manifest were checked"]
    assert (result.statement, result.signature.status, result.scope) == (False, "not checked", "all")
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    result = verify_result(rel)
    assert result.warnings == ["the signature was not checked (no --key or Sigstore identity given); the statement "
                               "in the bundle was compared with the files"]
    assert result.statement is True
    sig = result.signature
    assert (sig.status, sig.method, sig.key_id, sig.bundle) == ("not checked", None, None, str(rel / attest.BUNDLE_NAME))
    assert sig.signatures[0] == SignatureFile(file=str(rel / attest.BUNDLE_NAME), kind="kvgraft",
                                              sha256=sha256_hex((rel / attest.BUNDLE_NAME).read_bytes()),
                                              status="not checked", key_id=None)
    keyed = verify_result(rel, SignedWithKeys((ecdsa[1],)))
    assert keyed.warnings == [] and keyed.signature.method == "key" and keyed.signature.key_id == _kid(ecdsa[1])
    assert keyed.policy == verify_policy(key=ecdsa[1])


def test_oms_only_release_unchecked_and_required(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    result = verify_result(rel)
    assert result.warnings == [f"the OpenSSF model signing signature ({attest.OMS_NAME}) was not checked (no --key "
                               f"given); its file list was compared with the files"]
    assert (result.signature.status, result.statement) == ("not checked", False)
    keyed = verify_result(rel, SignedWithKeys((ecdsa[1],)))
    assert keyed.warnings == [] and (keyed.signature.status, keyed.signature.method) == ("verified", "key")
    assert keyed.signature.key_id == _kid(ecdsa[1]) and keyed.signature.oms_verified
    # The same release opened (scope "open") and one entry checked against the OMS list.
    opened = verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN)
    assert opened.scope == "open" and opened.signature.status == "verified"


def test_a_key_that_verifies_no_signature_names_each(rel: Path, ecdsa: tuple[Path, Path], ed: tuple[Path, Path]) -> None:
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    with pytest.raises(VerificationError) as info:
        verify_result(rel, verify_policy(key=ecdsa[1], more_keys=(ed[1],)))
    assert str(info.value) == (f"{rel}: key {_kid(ed[1])} verifies no signature of the release "
                               f"({attest.BUNDLE_NAME}: key {_kid(ecdsa[1])}; {attest.OMS_NAME}: key {_kid(ecdsa[1])})")


def test_a_detached_oms_signature_beside_one_in_the_release_is_refused(rel: Path, ecdsa: tuple[Path, Path],
                                                                       tmp_path: Path) -> None:
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    other = tmp_path / "detached.sig"
    shutil.copy(rel / attest.OMS_NAME, other)
    assert _message(lambda: verify_result(rel, verify_policy(oms_signature=other))) == (
        f"{rel / attest.OMS_NAME}: the release holds an OMS signature and --oms-signature names another ({other}); "
        f"give one of them")
    # the controls: the release's own model.sig named, by its path or through a link, is the one read
    link = tmp_path / "link.sig"
    link.symlink_to(rel / attest.OMS_NAME)
    for named in (rel / attest.OMS_NAME, link):
        signature = verify_result(rel, verify_policy(key=ecdsa[1], oms_signature=named)).signature
        assert (signature.oms_signature, signature.oms_verified) == (str(rel / attest.OMS_NAME), True)


def test_describe_beside_and_present_wordings() -> None:
    s = SignatureStatus("verified", "key", bundle="b", key_id="k1", oms_signature="m", oms_verified=False,
                        oms_beside_release=["README.md", "a", "b", "c", "d", "e"])
    assert s.describe() == ("verified: key k1; OpenSSF model signing signature present; beside the release, signed by "
                            "the OMS signature only: README.md, a, b, c, d")
    s = SignatureStatus("verified", "key", bundle="b", key_id="k1", oms_signature="m", oms_verified=True)
    assert s.describe() == "verified: key k1; OpenSSF model signing signature verified"


def test_brief_cuts_at_200_and_escapes() -> None:
    from kvgraft.signing.attest import _brief

    exact = "a" * 198  # json.dumps adds the quotes: 200 characters, not cut
    assert _brief(exact) == json.dumps(exact) and len(_brief(exact)) == 200
    assert _brief("a" * 199) == json.dumps("a" * 199)[:200] + "..."
    assert _brief({"b": 1, "a": "é"}) == '{"a": "\\u00e9", "b": 1}'


def test_an_oms_signature_by_another_signer_beside_the_bundle(rel: Path, ecdsa: tuple[Path, Path],
                                                              tmp_path: Path) -> None:
    """Two signatures by two signers, one key given: the OMS signature does not verify, and the message says
    to give a key for each signer."""
    other = keys.write_keypair(tmp_path / "other")
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    bundle_sha = sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())
    oms.sign(rel, keys.load_private_key(other[0]), {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha})
    with pytest.raises(VerificationError) as info:
        verify_result(rel, SignedWithKeys((ecdsa[1],)))
    assert str(info.value).endswith(f"; the release has two signatures ({attest.BUNDLE_NAME} and {attest.OMS_NAME}): "
                                    f"give --key for each signer")
    both = verify_result(rel, verify_policy(key=ecdsa[1], more_keys=(other[1],)))
    assert [(s.kind, s.status, s.key_id) for s in both.signature.signatures] == [
        ("kvgraft", "verified", _kid(ecdsa[1])), ("oms", "verified", _kid(other[1]))]
    unchecked = verify_result(rel).signature.signatures
    assert [(s.kind, s.status, s.key_id) for s in unchecked] == [("kvgraft", "not checked", None),
                                                                          ("oms", "not checked", None)]


def test_verified_opens_and_the_document_names_its_scope(rel: Path) -> None:
    opened = verified(rel, SignatureNotChecked())
    assert opened.checked.scope == "open"
    d = verify_result(rel).document().model_dump(mode="json", exclude_unset=True)
    assert (d["scope"], d["checked_entries"], d["statement"], d["deep"]) == ("all", [], False, False)
    assert d["ok"] is True and d["exit_code"] == 0 and d["error"] is None
    entries = verify_result(rel, None, Entries((Release.open(rel).entries[1]["id"],))).document()
    assert "sample" not in entries.model_fields_set  # a sample's members only for a sample
    entries = entries.model_dump(mode="json", exclude_unset=True)
    assert entries["scope"] == "entries" and entries["checked_entries"] == [Release.open(rel).entries[1]["id"]]


def test_a_statement_signed_by_another_kvgraft_version_verifies(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    """The predicate's kvgraft_version is the signer's own: the one member not compared with the manifest."""
    _resign(rel, ecdsa[0], lambda p: p.update(kvgraft_version="0.0.1-elsewhere"))
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).signature.status == "verified"


def test_an_oms_only_release_and_the_wrong_key_gives_no_two_signer_advice(rel: Path, ecdsa: tuple[Path, Path],
                                                                           tmp_path: Path) -> None:
    other = keys.write_keypair(tmp_path / "other")
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    with pytest.raises(VerificationError) as info:
        verify_result(rel, SignedWithKeys((other[1],)))
    hint = _kid(ecdsa[1])
    assert str(info.value) == (f"{rel / attest.OMS_NAME}: DSSE signature does not verify with key {_kid(other[1])} "
                               f"(the bundle names key {hint})")  # no advice about two signers: there is one


def test_a_detached_oms_signature_is_read_from_where_it_is_named(rel: Path, ecdsa: tuple[Path, Path],
                                                                 tmp_path: Path) -> None:
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    detached = tmp_path / "detached.sig"
    (rel / attest.OMS_NAME).rename(detached)
    result = verify_result(rel, verify_policy(key=ecdsa[1], oms_signature=detached))
    assert result.signature.oms_signature == str(detached) and result.signature.oms_verified
    assert (result.signature.status, result.signature.key_id) == ("verified", _kid(ecdsa[1]))
    big = tmp_path / "big.sig"
    big.write_bytes(b" " * (attest.MAX_BUNDLE_BYTES + 1))
    assert _message(lambda: verify_result(rel, verify_policy(oms_signature=big))) == (
        f"{big}: {attest.MAX_BUNDLE_BYTES + 1} bytes exceeds the {attest.MAX_BUNDLE_BYTES}-byte limit for an OMS "
        f"signature")


# --------------------------------------------------------------------------- verify sample survivors (docs/mutation.md)


def test_a_signed_manifest_may_be_larger_than_an_unsigned_one(rel: Path, ecdsa: tuple[Path, Path],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Only a verified signature lifts the bound on manifest.json before parsing (1/64 of the data, at least a
    floor): the statement path (scope all) and the OMS-only path (scope open) both pass `signed` on. The floor
    (16 MiB) is lowered to 64 bytes after signing, so that this small manifest is over the unsigned bound."""
    from kvgraft.release import integrity

    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    monkeypatch.setattr(integrity, "UNSIGNED_MANIFEST_FLOOR", 64)
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).signature.status == "verified"
    with pytest.raises(InputError, match="limit for an unsigned manifest"):  # the control: nothing verified
        verify_result(rel)
    (rel / attest.BUNDLE_NAME).unlink()
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    assert verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN).signature.status == "verified"
    with pytest.raises(InputError, match="limit for an unsigned manifest"):
        verify_result(rel, None, OPEN)


def _oms_signed_indexed(root: Path, private: Path) -> Release:
    """A format-2 release signed with OMS alone, its list naming every file (the entry files too)."""
    from release_factory import make_release

    make_release(root, entries=3, seed=41, format_version=2, shard_entries=2)
    assert oms.sign(root, keys.load_private_key(private), listed_digests(root)) is not None
    return Release.open(root)


def test_an_oms_only_indexed_release_opens_with_its_key(tmp_path: Path, ecdsa: tuple[Path, Path]) -> None:
    """Opening compares the files it reads (manifest.json and the index) with the OMS list, and may not refuse
    the entry files the list names as well."""
    root = tmp_path / "r2"
    opened = _oms_signed_indexed(root, ecdsa[0])
    assert opened.entry("rec-002")["file"] not in opened.subject_files()  # the list names more than opening reads
    result = verify_result(root, SignedWithKeys((ecdsa[1],)), OPEN)
    assert (result.scope, result.signature.status) == ("open", "verified")


def test_an_entry_checked_against_an_oms_list_that_names_another_digest_is_refused(
        tmp_path: Path, ecdsa: tuple[Path, Path]) -> None:
    """Format 2: opening reads only the index, so `--entry` is where the OMS list's digest of that entry's file
    is compared with the manifest's."""
    root = tmp_path / "r2"
    opened = _oms_signed_indexed(root, ecdsa[0])
    entry = opened.entry("rec-002")
    manifest_sha = opened.file_meta(entry)["sha256"]
    oms.sign(root, keys.load_private_key(ecdsa[0]), {**listed_digests(root), entry["file"]: "0" * 64})  # signed again
    assert _message(lambda: verify_result(root, SignedWithKeys((ecdsa[1],)), Entries(("rec-002",)))) == (
        f"{root / attest.OMS_NAME}: the OpenSSF model signing signature lists {entry['file']} (entry 'rec-002') "
        f"with sha256 {'0' * 64}, the manifest {manifest_sha}")
    # the control: an entry of another file, listed with its own digest, checks
    other = next(e["id"] for e in opened.entries if e["file"] != entry["file"])
    assert verify_result(root, SignedWithKeys((ecdsa[1],)), Entries((other,))).checked_entries == [other]



def test_entries_checked_count_their_tensors_and_bytes(rel: Path) -> None:
    m = json.loads((rel / MANIFEST).read_text())
    ids = [e["id"] for e in m["entries"]]
    opened = verify_result(rel, None, OPEN)
    both = verify_result(rel, None, Entries(tuple(ids)))
    files = {e["file"] for e in m["entries"]}
    assert both.bytes_hashed == opened.bytes_hashed + sum((rel / f).stat().st_size for f in files)
    assert both.tensors == opened.tensors + sum(len(e["tensors"]) for e in m["entries"])
    assert both.tensors > opened.tensors


def test_an_oms_list_not_checked_but_naming_a_file_the_release_lacks_is_refused(
        rel: Path, ecdsa: tuple[Path, Path], ed: tuple[Path, Path]) -> None:
    """Beside an Ed25519 bundle the OMS signature is not checked, so the files it lists are not taken as part of
    the release; its whole list is still compared with the release's files."""
    sign.sign_release(rel, keys.load_private_key(ed[0]))
    bundle_sha = sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())
    listed = {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha}
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {**listed, "extra.bin": "1" * 64})
    assert _message(lambda: verify_result(rel, SignedWithKeys((ed[1],)))) == (
        f"{rel / attest.OMS_NAME}: the OpenSSF model signing signature lists other files or digests than the "
        f"release has (extra.bin)")
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed)  # the control: the same list without it
    assert verify_result(rel, SignedWithKeys((ed[1],))).signature.status == "verified"


# --------------------------------------------------------------------------- verify sample B survivors (docs/mutation.md)


def test_an_identity_policy_keeps_its_detached_oms_signature(tmp_path: Path) -> None:
    sig = tmp_path / "detached.sig"
    policy = verify_policy(identity="ci@example.org", issuer="https://issuer", oms_signature=sig)
    assert (type(policy).__name__, policy.oms_signature) == ("SignedByIdentity", sig)
    assert verify_policy(identity="ci@example.org", issuer="https://issuer").oms_signature is None


def test_a_bundle_another_signer_made_beside_an_oms_signature_says_to_give_a_key_for_each(
        rel: Path, ecdsa: tuple[Path, Path], tmp_path: Path) -> None:
    other = keys.write_keypair(tmp_path / "other")
    sign.sign_release(rel, keys.load_private_key(other[0]))
    bundle_sha = sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha})
    message = _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],))))
    assert message.startswith(f"{rel / attest.BUNDLE_NAME}: ") and message.endswith(
        f"; the release has two signatures ({attest.BUNDLE_NAME} and {attest.OMS_NAME}): give --key for each signer")
    assert verify_result(rel, verify_policy(key=ecdsa[1], more_keys=(other[1],))).signature.oms_verified


def test_a_file_beside_the_release_listed_by_a_verified_oms_signature_is_accepted(
        rel: Path, ecdsa: tuple[Path, Path]) -> None:
    """A Hub card beside the release: the kvgraft statement does not list it, the verified OMS signature does."""
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    (rel / "README.md").write_text("# a model card\n")
    listed = {**listed_digests(rel), attest.BUNDLE_NAME: sha256_hex((rel / attest.BUNDLE_NAME).read_bytes()),
              "README.md": sha256_hex((rel / "README.md").read_bytes())}
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed)
    result = verify_result(rel, SignedWithKeys((ecdsa[1],)))
    assert result.signature.oms_beside_release == ["README.md"]
    (rel / "README.md").write_text("# another card\n")  # the control: the card is checked against the list
    assert "README.md" in _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],))))


def _pad_manifest(root: Path) -> None:
    """The same manifest document with other bytes (a trailing space): only its digest can tell."""
    (root / MANIFEST).write_bytes((root / MANIFEST).read_bytes() + b" ")


def test_opening_compares_manifest_json_with_what_signed_it_and_says_which(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    signed_sha = sha256_hex((rel / MANIFEST).read_bytes())
    attests = f"; the statement attests the release with root digest {json.loads((rel / MANIFEST).read_text())['root_digest']}"
    assert verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN).scope == "open"  # the control: intact, it opens
    _pad_manifest(rel)
    now = sha256_hex((rel / MANIFEST).read_bytes())
    assert _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN)) == (
        f"{rel / MANIFEST}: sha256 {now} does not match the signed statement ({signed_sha}){attests}")
    assert _message(lambda: verify_result(rel, None, OPEN)) == (
        f"{rel / MANIFEST}: sha256 {now} does not match the statement (signature not checked) ({signed_sha}){attests}")


def test_opening_an_oms_only_release_compares_manifest_json_with_the_oms_list(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    listed_sha = sha256_hex((rel / MANIFEST).read_bytes())
    assert verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN).signature.oms_verified  # the control
    _pad_manifest(rel)
    now = sha256_hex((rel / MANIFEST).read_bytes())
    assert _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN)) == (
        f"{rel / MANIFEST}: sha256 {now} does not match the OMS signature ({listed_sha})")


def test_opening_checks_the_statements_predicate_and_a_signed_manifests_bound(
        rel: Path, ecdsa: tuple[Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    _resign(rel, ecdsa[0], lambda p: p.update(num_entries=7))
    assert _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN)) == (
        f"{rel / MANIFEST}: the signed statement predicate's num_entries 7 does not match the manifest (2)")
    _resign(rel, ecdsa[0], lambda p: None)  # the control: the true predicate opens
    from kvgraft.release import integrity

    monkeypatch.setattr(integrity, "UNSIGNED_MANIFEST_FLOOR", 64)  # this manifest is now over the unsigned bound
    assert verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN).signature.status == "verified"
    assert "limit for an unsigned manifest" in _message(lambda: verify_result(rel, None, OPEN))


# --------------------------------------------------------------------------- verify sample C survivors (docs/mutation.md)


def test_a_keyless_release_verified_by_identity_says_sigstore(rel: Path, ecdsa: tuple[Path, Path],
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The identity path of verify, without the network: the release's bundle carries a certificate
    (so it is keyless), and Sigstore's own verification (tested on real bundles in test_sigstore_fixtures.py
    and test_signing_bite.py) is replaced by one that hands back the envelope's payload as verified."""
    import base64

    from kvgraft.signing import verify as verify_module
    from kvgraft.signing.sigstore import SigstoreVerified

    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    (rel / attest.OMS_NAME).unlink()
    bundle = json.loads((rel / attest.BUNDLE_NAME).read_text())
    bundle["verificationMaterial"] = {"certificate": {"rawBytes": base64.b64encode(b"not a real one").decode()},
                                      "tlogEntries": []}
    (rel / attest.BUNDLE_NAME).write_text(json.dumps(bundle))
    asked: list[tuple[str, str]] = []

    def sigstore_says_yes(artifact: object, raw: bytes, *, identity: str, issuer: str, **_: object) -> SigstoreVerified:
        asked.append((identity, issuer))
        envelope = json.loads(raw)["dsseEnvelope"]
        return SigstoreVerified(identity, issuer, envelope["payloadType"], base64.b64decode(envelope["payload"]))

    monkeypatch.setattr(verify_module, "verify_sigstore_bundle", sigstore_says_yes)
    status = verify_result(rel, SignedByIdentity("ci@example.org", "https://issuer")).signature
    assert asked == [("ci@example.org", "https://issuer")]
    assert (status.status, status.method, status.identity, status.issuer) == (
        "verified", "sigstore", "ci@example.org", "https://issuer")
    assert status.describe() == "verified: ci@example.org via https://issuer (Sigstore)"
    # the control: the same bundle checked with a key is refused as keyless, before any signature check
    assert _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],)))) == (
        f"{rel / attest.BUNDLE_NAME}: the release is signed keyless with a Sigstore certificate, not a key; "
        f"verify it with --certificate-identity and --certificate-oidc-issuer")


def test_opening_a_bundle_signed_release_names_the_oms_signature_it_did_not_read(rel: Path,
                                                                                 ecdsa: tuple[Path, Path]) -> None:
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    opened = verify_result(rel, SignedWithKeys((ecdsa[1],)), OPEN).signature
    assert (opened.oms_signature, opened.oms_verified) == (str(rel / attest.OMS_NAME), False)
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).signature.oms_verified  # the control: verifying everything reads it


def test_a_second_key_that_verifies_nothing_names_a_signature_no_key_could_check(
        rel: Path, ecdsa: tuple[Path, Path], ed: tuple[Path, Path], tmp_path: Path) -> None:
    """Two Ed25519 keys: one verifies the bundle, neither can check the OMS signature (it needs ECDSA)."""
    ed2 = keys.write_keypair(tmp_path / "ed2", algorithm="ed25519")
    sign.sign_release(rel, keys.load_private_key(ed[0]))
    bundle_sha = sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha})
    assert _message(lambda: verify_result(rel, verify_policy(key=ed[1], more_keys=(ed2[1],)))) == (
        f"{rel}: key {_kid(ed2[1])} verifies no signature of the release ({attest.BUNDLE_NAME}: key {_kid(ed[1])}; "
        f"{attest.OMS_NAME}: not checked)")
    assert verify_result(rel, SignedWithKeys((ed[1],))).signature.status == "verified"  # the control: the one key alone


# --------------------------------------------------------------------------- verify sample D survivors (docs/mutation.md)


def test_entries_checked_deep_hash_each_tensor_again(rel: Path) -> None:
    m = json.loads((rel / MANIFEST).read_text())
    entry = m["entries"][0]
    plain = verify_result(rel, None, Entries((entry["id"],)))
    deep = verify_result(rel, None, Entries((entry["id"],), deep=True))
    ranges = sum(t["byte_range"][1] - t["byte_range"][0] for t in entry["tensors"].values())
    assert deep.bytes_hashed == plain.bytes_hashed + ranges and ranges > 0


def test_the_json_document_rounds_seconds_to_the_microsecond(rel: Path) -> None:
    import dataclasses

    result = dataclasses.replace(verify_result(rel), seconds=0.12345678)
    assert result.document().seconds == 0.123457


def test_require_signature_on_an_oms_only_release(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    keyed = verify_result(rel, verify_policy(key=ecdsa[1], require_signature=True))
    assert keyed.signature.status == "verified"
    assert _message(lambda: verify_result(rel, verify_policy(require_signature=True))) == (
        "--require-signature needs --key or --certificate-identity/--certificate-oidc-issuer to check the signature "
        "with")


def test_an_oms_only_release_verified_whole_lifts_the_unsigned_bound(rel: Path, ecdsa: tuple[Path, Path],
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.release import integrity

    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    monkeypatch.setattr(integrity, "UNSIGNED_MANIFEST_FLOOR", 64)
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).signature.oms_verified
    assert "limit for an unsigned manifest" in _message(lambda: verify_result(rel))  # the control


def test_a_beside_file_that_differs_names_the_oms_signature_file(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    sign.sign_release(rel, keys.load_private_key(ecdsa[0]))
    (rel / "README.md").write_text("# a model card\n")
    listed_sha = sha256_hex((rel / "README.md").read_bytes())
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {
        **listed_digests(rel), attest.BUNDLE_NAME: sha256_hex((rel / attest.BUNDLE_NAME).read_bytes()),
        "README.md": listed_sha})
    (rel / "README.md").write_text("# another card\n")
    now = sha256_hex((rel / "README.md").read_bytes())
    assert _message(lambda: verify_result(rel, SignedWithKeys((ecdsa[1],)))) == (
        f"{rel / 'README.md'}: sha256 {now} does not match the OMS signature ({attest.OMS_NAME}) ({listed_sha}); it is "
        f"beside the release, outside its manifest")


def test_an_oms_list_of_other_files_names_three_of_them(rel: Path, ecdsa: tuple[Path, Path],
                                                        ed: tuple[Path, Path]) -> None:
    sign.sign_release(rel, keys.load_private_key(ed[0]))
    listed = {**listed_digests(rel), attest.BUNDLE_NAME: sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())}
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {**listed, **{f"x{i}.bin": "1" * 64 for i in range(4)}})
    assert _message(lambda: verify_result(rel, SignedWithKeys((ed[1],)))).endswith(
        "lists other files or digests than the release has (x0.bin, x1.bin, x2.bin)")


def test_files_beside_listed_only_by_an_unchecked_oms_signature_are_a_warning(rel: Path, ecdsa: tuple[Path, Path]) -> None:
    oms.sign(rel, keys.load_private_key(ecdsa[0]), listed_digests(rel))
    (rel / "README.md").write_text("# card\n")
    card = sha256_hex((rel / "README.md").read_bytes())
    oms.sign(rel, keys.load_private_key(ecdsa[0]), {**listed_digests(rel), "README.md": card})
    result = verify_result(rel)
    assert "files beside the release, listed only by the OMS signature (not checked): README.md" in result.warnings
    assert verify_result(rel, SignedWithKeys((ecdsa[1],))).warnings == []  # the control: checked, nothing to warn of
