"""signing/attest.py's parsing and checks, each with its whole message (mutmut's attest survivors,
docs/mutation.md).

A bundle and a statement are built here with attest's own writers and this machine's keys, then one
member at a time is made wrong; each refusal is compared whole (a fragment match lets a wrapped or
re-cased message pass). No model, no network.
"""

from __future__ import annotations

import base64
import copy
import json
from pathlib import Path
from typing import Any

import pytest

from kvgraft.errors import InputError, VerificationError
from kvgraft.signing import attest, keys

from third_party import SIGSTORE_BUNDLES, needs_sigstore_bundles

W = "B"  # the `where` every message starts with


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Any, Any]:
    private, public = keys.write_keypair(tmp_path_factory.mktemp("k") / "k")
    return keys.load_private_key(private), keys.load_public_key(public)


@pytest.fixture(scope="module")
def other(tmp_path_factory: pytest.TempPathFactory) -> Any:
    _, public = keys.write_keypair(tmp_path_factory.mktemp("k") / "o")
    return keys.load_public_key(public)


def _manifest(version: int = 1) -> dict[str, Any]:
    m: dict[str, Any] = {"format_version": version, "root_digest": "r" * 64,
                         "model": {"spec": "s", "architecture": "A", "model_type": "t", "identity": {"sha256": "i"}},
                         "files": {"entries/b": {"sha256": "b" * 64}, "entries/a": {"sha256": "a" * 64}},
                         "entries": [{}, {}, {}]}
    if version == 2:
        m["index"] = {"entries": 9, "shards": [{"file": "index/0.json", "sha256": "c" * 64}],
                      "prefix": {"file": "index/prefix.json", "sha256": "d" * 64}}
    return m


def test_pae_and_statement() -> None:
    assert attest.pae("t/x", b"body!") == b"DSSEv1 3 t/x 5 body!"
    assert attest.pae("", b"") == b"DSSEv1 0  0 "
    s = attest.statement(_manifest(), "m" * 64, 123)
    assert s["_type"] == "https://in-toto.io/Statement/v1"
    assert s["predicateType"] == "https://kvgraft.dev/attestation/cache-release/v1"
    assert s["subject"] == [{"name": "manifest.json", "digest": {"sha256": "m" * 64}},
                            {"name": "entries/a", "digest": {"sha256": "a" * 64}},
                            {"name": "entries/b", "digest": {"sha256": "b" * 64}}]
    p = s["predicate"]
    assert p == {"release_format": p["release_format"], "format_version": 1,
                 "manifest": {"name": "manifest.json", "sha256": "m" * 64, "size": 123}, "root_digest": "r" * 64,
                 "model": {"spec": "s", "architecture": "A", "model_type": "t", "identity": {"sha256": "i"}},
                 "num_entries": 3, "num_files": 3, "kvgraft_version": p["kvgraft_version"]}
    two = attest.statement(_manifest(2), "m" * 64, 1)
    assert two["predicate"]["num_entries"] == 9 and two["predicate"]["num_files"] == 3
    assert attest.subject_files(_manifest(2)) == {"index/0.json": "c" * 64, "index/prefix.json": "d" * 64}
    no_prefix = _manifest(2)
    del no_prefix["index"]["prefix"]
    assert attest.subject_files(no_prefix) == {"index/0.json": "c" * 64}
    assert attest.subjects(s) == {"manifest.json": "m" * 64, "entries/a": "a" * 64, "entries/b": "b" * 64}
    assert attest.statement_bytes({"b": 1, "a": [2]}) == b'{"a":[2],"b":1}'


def _statement() -> dict[str, Any]:
    m = _manifest()
    m["root_digest"] = "f" * 64
    m["model"]["identity"] = {k: "9" * 64 for k in ("sha256", "weights_sha256", "tokenizer_sha256", "config_sha256")}
    s = attest.statement(m, "e" * 64, 10)
    return s


def _parse(doc: Any, payload_type: str = attest.PAYLOAD_TYPE) -> dict[str, Any]:
    return attest.parse_statement(payload_type, json.dumps(doc).encode(), W)


def _msg(call: Any) -> str:
    with pytest.raises((InputError, VerificationError)) as info:
        call()
    return str(info.value)


def test_parse_statement_refusals() -> None:
    good = _statement()
    assert _parse(good) == good
    assert _msg(lambda: _parse(good, "text/plain")) == \
        f"{W}: DSSE payloadType 'text/plain' is not 'application/vnd.in-toto+json'"
    assert _msg(lambda: _parse([1])) == f"{W}: statement is not a JSON object"
    assert _msg(lambda: _parse({**good, "_type": "x"})) == \
        f"{W}: statement _type 'x' is not 'https://in-toto.io/Statement/v1'"
    assert _msg(lambda: _parse({**good, "predicateType": "y"})) == (
        f"{W}: predicateType 'y' is not a kvgraft release attestation (https://kvgraft.dev/attestation/cache-release/v1)")
    assert _msg(lambda: _parse({**good, "subject": []})) == f"{W}: statement has no subjects"
    assert _msg(lambda: _parse({**good, "subject": {"a": 1}})) == f"{W}: statement has no subjects"
    assert _msg(lambda: _parse({**good, "subject": [good["subject"][0], "x"]})) == \
        f"{W}: statement subject 1: expected an object with name and digest"
    assert _msg(lambda: _parse({**good, "subject": [{"name": "a", "digest": "x"}]})) == \
        f"{W}: statement subject 0: expected an object with name and digest"
    twice = [good["subject"][0], good["subject"][1], good["subject"][1]]
    assert _msg(lambda: _parse({**good, "subject": twice})) == f"{W}: statement subject 2: 'entries/a' is listed twice"
    upper = [{"name": "a", "digest": {"sha256": "A" * 64}}]
    assert _msg(lambda: _parse({**good, "subject": upper})) == f"{W}: statement subject 0: 'a' has no lowercase hex sha256 digest"
    short = [{"name": "a", "digest": {"sha256": "a" * 63}}]
    assert _msg(lambda: _parse({**good, "subject": short})) == f"{W}: statement subject 0: 'a' has no lowercase hex sha256 digest"
    assert _msg(lambda: _parse({**good, "subject": [{"name": "a", "digest": {}}]})) == \
        f"{W}: statement subject 0: 'a' has no lowercase hex sha256 digest"
    assert _msg(lambda: _parse({**good, "subject": [{"name": "a", "digest": {"sha256": "a" * 64 + "\n"}}]})) == \
        f"{W}: statement subject 0: 'a' has no lowercase hex sha256 digest"



def test_parse_statement_locates_an_unsafe_subject_name_and_a_predicate_schema_error() -> None:
    """attest parse_statement 45, 67 (the location of check_relpath's and the schema's message dropped);
    found by a full run of the attest group (outside the sample)."""
    good = _statement()
    assert _parse(good) == good  # control
    unsafe = [good["subject"][0], {"name": "../x", "digest": {"sha256": "a" * 64}}]
    assert _msg(lambda: _parse({**good, "subject": unsafe})) == \
        f"{W}: statement subject 1: unsafe file name '../x' (absolute, '..' or empty parts are refused)"
    assert _msg(lambda: _parse({**good, "subject": [{"name": 7, "digest": {"sha256": "a" * 64}}]})) == \
        f"{W}: statement subject 0: file name 7 is not a string"
    no_root = {k: v for k, v in good["predicate"].items() if k != "root_digest"}
    assert _msg(lambda: _parse({**good, "predicate": no_root})) == \
        f"{W}: statement predicate: schema error at $: 'root_digest' is a required property"
    assert _msg(lambda: _parse({**good, "predicate": {**good["predicate"], "num_files": -1}})) == \
        f"{W}: statement predicate: schema error at $.num_files: -1 is less than the minimum of 1"

def _bundle(pair: tuple[Any, Any]) -> dict[str, Any]:
    payload = attest.statement_bytes(_statement())
    sig = keys.sign(pair[0], attest.pae(attest.PAYLOAD_TYPE, payload))
    return attest.key_bundle(payload, sig, keys.key_id(pair[1]))


def _raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def test_key_bundle_and_its_parse(pair: tuple[Any, Any]) -> None:
    doc = _bundle(pair)
    kid = keys.key_id(pair[1])
    assert doc["mediaType"] == "application/vnd.dev.sigstore.bundle.v0.3+json"
    assert doc["verificationMaterial"] == {"publicKey": {"hint": kid}, "tlogEntries": []}
    assert doc["dsseEnvelope"]["payloadType"] == attest.PAYLOAD_TYPE and doc["dsseEnvelope"]["signatures"][0]["keyid"] == kid
    b = attest.parse_bundle(_raw(doc), W)
    assert (b.where, b.media_type, b.payload_type, b.keyid, b.key_hint, b.has_certificate) == (
        W, attest.BUNDLE_MEDIA_TYPE, attest.PAYLOAD_TYPE, kid, kid, False)
    assert b.payload == attest.statement_bytes(_statement()) and b.raw == _raw(doc) and b.material == doc["verificationMaterial"]
    assert b.signature == base64.b64decode(doc["dsseEnvelope"]["signatures"][0]["sig"])
    assert attest.verify_with_key(b, pair[1]) == kid
    assert attest.verify_with_any(b, [pair[1]]) == kid
    for media in attest.BUNDLE_MEDIA_TYPES:
        assert attest.parse_bundle(_raw({**doc, "mediaType": media}), W).media_type == media


def _edit(doc: dict[str, Any], path: list[Any], value: Any) -> dict[str, Any]:
    d = copy.deepcopy(doc)
    o = d
    for p in path[:-1]:
        o = o[p]
    if value is _DELETE:
        del o[path[-1]]
    else:
        o[path[-1]] = value
    return d


_DELETE = object()


def test_parse_bundle_refusals(pair: tuple[Any, Any]) -> None:
    doc = _bundle(pair)
    env, mat = ["dsseEnvelope"], ["verificationMaterial"]
    sig0 = [*env, "signatures", 0]
    cases = [
        (_raw([1]), f"{W}: not a Sigstore bundle (not a JSON object)"),
        (_raw({**doc, "extra": 1}), f"{W}: unknown member 'extra' (a Sigstore bundle v0.3 has none)"),
        (_raw({**doc, "mediaType": "x"}), f"{W}: not a Sigstore bundle (mediaType 'x')"),
        (_raw(_edit(doc, mat, _DELETE)), f"{W}: bundle has no verificationMaterial"),
        (_raw(_edit(doc, mat, [1])), f"{W}: bundle has no verificationMaterial"),
        (_raw(_edit(doc, [*mat, "zz"], 1)),
         f"{W}: verificationMaterial: unknown member 'zz' (a Sigstore bundle v0.3 has none)"),
        (_raw(_edit(doc, env, _DELETE)),
         f"{W}: bundle has no dsseEnvelope; a release attestation is a DSSE-signed statement"),
        (_raw({**doc, "messageSignature": {}}),
         f"{W}: bundle has no dsseEnvelope; a release attestation is a DSSE-signed statement"),
        (_raw(_edit(doc, [*env, "zz"], 1)), f"{W}: dsseEnvelope: unknown member 'zz' (a Sigstore bundle v0.3 has none)"),
        (_raw(_edit(doc, [*env, "payloadType"], 3)), f"{W}: dsseEnvelope.payloadType is missing"),
        (_raw(_edit(doc, [*env, "signatures"], [])), f"{W}: dsseEnvelope must carry exactly one signature (found 0)"),
        (_raw(_edit(doc, [*env, "signatures"], [{}, {}])),
         f"{W}: dsseEnvelope must carry exactly one signature (found 2)"),
        (_raw(_edit(doc, [*env, "signatures"], "x")), f"{W}: dsseEnvelope must carry exactly one signature (found 0)"),
        (_raw(_edit(doc, [*env, "signatures"], ["x"])),
         f"{W}: dsseEnvelope must carry exactly one signature (found 1)"),
        (_raw(_edit(doc, [*sig0, "zz"], 1)),
         f"{W}: dsseEnvelope.signatures[0]: unknown member 'zz' (a Sigstore bundle v0.3 has none)"),
        (_raw(_edit(doc, [*sig0, "sig"], 5)), f"{W}: dsseEnvelope.signatures[0].sig: expected a base64 string"),
        (_raw(_edit(doc, [*sig0, "sig"], "@@@@")), f"{W}: dsseEnvelope.signatures[0].sig: is not valid base64"),
        (_raw(_edit(doc, [*sig0, "sig"], "QQ")), f"{W}: dsseEnvelope.signatures[0].sig: is not valid base64"),
        (_raw(_edit(doc, [*sig0, "sig"], "QR==")),
         f"{W}: dsseEnvelope.signatures[0].sig: is not canonical base64 (padding, pad bits or alphabet)"),
        (_raw(_edit(doc, [*sig0, "sig"], "")), f"{W}: dsseEnvelope.signatures[0].sig is empty"),
        (_raw(_edit(doc, [*sig0, "keyid"], 7)), f"{W}: dsseEnvelope.signatures[0].keyid is not a string"),
        (_raw(_edit(doc, [*mat, "certificate"], {})),
         f"{W}: verificationMaterial needs exactly one of publicKey or a certificate"),
        (_raw(_edit(doc, [*mat, "publicKey"], _DELETE)),
         f"{W}: verificationMaterial needs exactly one of publicKey or a certificate"),
        (_raw(_edit(doc, [*mat, "publicKey"], {"hint": 3})),
         f"{W}: verificationMaterial.publicKey must be an object with a string hint"),
        (_raw(_edit(doc, [*mat, "publicKey"], "k")),
         f"{W}: verificationMaterial.publicKey must be an object with a string hint"),
        (_raw(_edit(doc, [*mat, "publicKey", "zz"], 1)),
         f"{W}: verificationMaterial.publicKey: unknown member 'zz' (a Sigstore bundle v0.3 has none)"),
        (_raw(_edit(doc, [*mat, "tlogEntries"], [{}])),
         f"{W}: a key-signed bundle carries transparency-log entries or timestamps that kvgraft does not verify"),
        (_raw(_edit(doc, [*mat, "timestampVerificationData"], {"x": 1})),
         f"{W}: a key-signed bundle carries transparency-log entries or timestamps that kvgraft does not verify"),
        (_raw(_edit(doc, [*env, "payload"], None)), f"{W}: dsseEnvelope.payload: expected a base64 string"),
    ]
    for raw, want in cases:
        assert _msg(lambda r=raw: attest.parse_bundle(r, W)) == want, want
    # No keyid is allowed; an empty timestamp member is nothing carried along.
    assert attest.parse_bundle(_raw(_edit(doc, [*sig0, "keyid"], _DELETE)), W).keyid is None
    assert attest.parse_bundle(_raw(_edit(doc, [*mat, "timestampVerificationData"], {})), W).key_hint is not None
    big = b" " * (attest.MAX_BUNDLE_BYTES + 1)
    assert _msg(lambda: attest.parse_bundle(big, W)) == \
        f"{W}: {attest.MAX_BUNDLE_BYTES + 1} bytes exceeds the {attest.MAX_BUNDLE_BYTES}-byte limit for a bundle"
    assert attest.MAX_BUNDLE_BYTES == 64 * 1024 * 1024
    at_limit = _raw(doc) + b" " * (attest.MAX_BUNDLE_BYTES - len(_raw(doc)))
    assert attest.parse_bundle(at_limit, W).keyid == keys.key_id(pair[1])


def test_verify_with_key_and_any(pair: tuple[Any, Any], other: Any) -> None:
    doc = _bundle(pair)
    kid, oid = keys.key_id(pair[1]), keys.key_id(other)
    b = attest.parse_bundle(_raw(doc), W)
    assert _msg(lambda: attest.verify_with_key(b, other)) == \
        f"{W}: DSSE signature does not verify with key {oid} (the bundle names key {kid})"
    no_hint = attest.parse_bundle(_raw(_edit(doc, ["verificationMaterial", "publicKey", "hint"], "")), W)
    assert _msg(lambda: attest.verify_with_key(no_hint, other)) == f"{W}: DSSE signature does not verify with key {oid}"
    assert attest.verify_with_key(no_hint, pair[1]) == kid
    hinted = attest.parse_bundle(_raw(_edit(doc, ["verificationMaterial", "publicKey", "hint"], "someone")), W)
    assert _msg(lambda: attest.verify_with_key(hinted, pair[1])) == \
        f"{W}: verificationMaterial.publicKey.hint 'someone' names another key than {kid}, which verified it"
    legacy = attest.parse_bundle(_raw(_edit(doc, ["verificationMaterial", "publicKey", "hint"],
                                            keys.der_fingerprint(pair[1]))), W)
    assert attest.verify_with_key(legacy, pair[1]) == kid  # the hint bundles signed before carry
    keyid = attest.parse_bundle(_raw(_edit(doc, ["dsseEnvelope", "signatures", 0, "keyid"], "zz")), W)
    assert _msg(lambda: attest.verify_with_key(keyid, pair[1])) == \
        f"{W}: dsseEnvelope keyid 'zz' names another key than {kid}, which verified it"
    assert _msg(lambda: attest.verify_with_any(b, [other], advice="; ADVICE")) == \
        f"{W}: DSSE signature does not verify with key {oid} (the bundle names key {kid}); ADVICE"
    assert attest.verify_with_any(b, [other, pair[1]]) == kid
    assert attest.verify_with_any(legacy, [other, pair[1]]) == kid
    assert attest.verify_with_any(legacy, [pair[1]]) == kid
    assert _msg(lambda: attest.verify_with_any(b, [other, other], advice="; A")) == \
        f"{W}: DSSE signature does not verify with any key given ({oid}, {oid}) (the bundle names key {kid}); A"
    assert _msg(lambda: attest.verify_with_any(no_hint, [other, other])) == \
        f"{W}: DSSE signature does not verify with any key given ({oid}, {oid})"
    cert = attest.Bundle(W, b"", {}, "m", attest.PAYLOAD_TYPE, b"p", b"s", None, None, True)
    keyless = (f"{W}: the release is signed keyless with a Sigstore certificate, not a key; verify it with "
               f"--certificate-identity and --certificate-oidc-issuer")
    assert _msg(lambda: attest.verify_with_key(cert, pair[1])) == keyless
    assert _msg(lambda: attest.verify_with_any(cert, [other, pair[1]])) == keyless


def test_read_and_write_bundle(pair: tuple[Any, Any], tmp_path: Path) -> None:
    raw = _raw(_bundle(pair))
    path = attest.write_bundle(tmp_path, raw)
    assert path == tmp_path / attest.BUNDLE_NAME and path.read_bytes() == raw
    assert attest.read_bundle(path).where == str(path)
    path.unlink()
    (tmp_path / "elsewhere").write_bytes(raw)
    path.symlink_to(tmp_path / "elsewhere")
    assert _msg(lambda: attest.write_bundle(tmp_path, raw)) == f"{path}: is a symlink; releases may not contain links"


def test_a_digest_with_a_trailing_newline_is_refused(tmp_path: Path) -> None:
    """`^...$` with re.match accepts "<64 hex>\\n" ($ matches before a final newline): both parsers refuse it.
    Found by this file's statement test; fixed with fullmatch in attest.py and oms.py."""
    from kvgraft.signing import oms

    good = _statement()
    bad = [{"name": "a", "digest": {"sha256": "a" * 64 + "\n"}}]
    assert _msg(lambda: _parse({**good, "subject": bad})) == f"{W}: statement subject 0: 'a' has no lowercase hex sha256 digest"
    private, public = keys.write_keypair(tmp_path / "ec")
    path = oms.sign(tmp_path, keys.load_private_key(private), {"a.bin": "a" * 64 + "\n"})
    assert path is not None
    assert _msg(lambda: oms.read(path, [keys.load_public_key(public)], "")) == \
        f"{path}: resource 0: expected a name, algorithm sha256 and a lowercase hex digest"
    fine = oms.sign(tmp_path, keys.load_private_key(private), {"a.bin": "a" * 64})
    assert fine is not None and oms.read(fine, [keys.load_public_key(public)], "")[0] == {"a.bin": "a" * 64}


# ------------------------------------------------------------------ the sampled mutmut survivors
# attest and signing groups of `mutation/run.py --sample 100` (docs/mutation.md): each test names the
# mutants it kills.


def test_a_bundle_with_a_certificate_chain_alone_is_keyless(pair: tuple[Any, Any]) -> None:
    """Older bundles (v0.1, v0.2) carry `x509CertificateChain` instead of `certificate`: keyless either way
    (attest parse_bundle 120, 121: the member's name misspelt)."""
    doc = _edit(_bundle(pair), ["verificationMaterial", "publicKey"], _DELETE)
    for member in ("x509CertificateChain", "certificate"):
        keyless = attest.parse_bundle(_raw(_edit(doc, ["verificationMaterial", member], {})), W)
        assert (keyless.has_certificate, keyless.key_hint) == (True, None), member
    # control: neither member and no key is refused
    assert _msg(lambda: attest.parse_bundle(_raw(doc), W)) == \
        f"{W}: verificationMaterial needs exactly one of publicKey or a certificate"


def test_read_bundle_names_a_bundle_in_its_refusals(pair: tuple[Any, Any], tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """attest read_bundle 7 (the `what` of the bounded read dropped)."""
    raw = _raw(_bundle(pair))
    path = attest.write_bundle(tmp_path, raw)
    assert attest.read_bundle(path).raw == raw  # control
    monkeypatch.setattr(attest, "MAX_BUNDLE_BYTES", len(raw) - 1)
    assert _msg(lambda: attest.read_bundle(path)) == \
        f"{path}: {len(raw)} bytes exceeds the {len(raw) - 1}-byte limit for a bundle"
    path.unlink()
    path.mkdir()
    assert _msg(lambda: attest.read_bundle(path)) == f"{path}: not a regular file; refusing to read a bundle from it"


def test_private_key_refusals_are_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keys load_private_key 7 (\"PRIVATE KEY\" in the read's messages), 14 (the passphrase-given message
    dropped), 16 (`and` -> `or`: a junk file read with a passphrase called a wrong passphrase)."""
    from cryptography.hazmat.primitives import serialization

    plain, _ = keys.write_keypair(tmp_path / "plain")
    assert keys.algorithm_of(keys.load_private_key(plain)) == "ecdsa-p256"  # control
    assert _msg(lambda: keys.load_private_key(plain, b"pw")) == \
        f"{plain}: the key is not encrypted but a passphrase was given"
    junk = tmp_path / "junk.key.pem"
    junk.write_bytes(b"not a key\n")
    with pytest.raises(ValueError) as raised:  # what cryptography says of it, quoted in kvgraft's message
        serialization.load_pem_private_key(junk.read_bytes(), password=None)
    detail = " ".join(str(raised.value).split())
    assert _msg(lambda: keys.load_private_key(junk)) == f"{junk}: not a PEM private key ({detail})"
    assert _msg(lambda: keys.load_private_key(junk, b"pw")) == f"{junk}: not a PEM private key ({detail})"
    enc, _ = keys.write_keypair(tmp_path / "enc", passphrase=b"right")
    assert _msg(lambda: keys.load_private_key(enc, b"wrong")) == \
        f"{enc}: cannot decrypt the private key (wrong passphrase?)"
    missing = tmp_path / "missing.key.pem"
    assert _msg(lambda: keys.load_private_key(missing)) == \
        f"{missing}: cannot read: No such file or directory"
    monkeypatch.setattr(keys, "MAX_KEY_BYTES", 10)
    size = plain.stat().st_size
    assert _msg(lambda: keys.load_private_key(plain)) == f"{plain}: {size} bytes exceeds the 10-byte limit for a private key"


def _oms_file(tmp_path: Path, stmt: Any, payload_type: str = attest.PAYLOAD_TYPE) -> Path:
    """A model.sig carrying `stmt` (unsigned: oms.read without keys parses it without verifying)."""
    payload = stmt if isinstance(stmt, bytes) else json.dumps(stmt).encode()
    doc = {"mediaType": attest.BUNDLE_MEDIA_TYPE, "verificationMaterial": {"publicKey": {"hint": "h"}, "tlogEntries": []},
           "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": payload_type,
                            "signatures": [{"sig": base64.b64encode(b"sig").decode()}]}}
    path = tmp_path / attest.OMS_NAME
    path.write_bytes(_raw(doc))
    return path


def test_oms_statement_whole() -> None:
    """oms statement 31 (`allow_symlinks` misspelt: kvgraft never reads it, the model_signing CLI does)."""
    from kvgraft._internal.digest import sha256_hex
    from kvgraft.signing import oms

    s = oms.statement(Path("/x/rel"), {"b.bin": "b" * 64, "a.bin": "a" * 64})
    assert s == {
        "_type": "https://in-toto.io/Statement/v1",
        "subject": [{"name": "rel", "digest": {"sha256": sha256_hex(bytes.fromhex("a" * 64 + "b" * 64))}}],
        "predicateType": "https://model_signing/signature/v1.0",
        "predicate": {
            "serialization": {"method": "files", "hash_type": "sha256", "allow_symlinks": False,
                              "ignore_paths": [".git", ".gitignore", ".github", "model.sig", ".gitattributes"]},
            "resources": [{"name": "a.bin", "algorithm": "sha256", "digest": "a" * 64},
                          {"name": "b.bin", "algorithm": "sha256", "digest": "b" * 64}]}}


def test_oms_read_refusals_are_exact(pair: tuple[Any, Any], other: Any, tmp_path: Path,
                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """oms read 1 (advice default), 10 (the bounded read's `what`), 43 (payloadType message), 46 (the
    statement's JSON error location), 49 (`or` -> `and` in the statement-type check), 64 (predicateType
    message), 116 (`or` -> `and`: another algorithm accepted), 132 (a resource name's error location)."""
    from kvgraft.signing import oms

    good = oms.statement(tmp_path, {"a.bin": "a" * 64})
    path = _oms_file(tmp_path, good)
    assert oms.read(path, None)[:2] == ({"a.bin": "a" * 64}, None)  # control: parsed, no key given

    def refusal(stmt: Any, payload_type: str = attest.PAYLOAD_TYPE) -> str:
        return _msg(lambda: oms.read(_oms_file(tmp_path, stmt, payload_type), None))

    assert refusal(good, "text/plain") == f"{path}: DSSE payloadType 'text/plain' is not 'application/vnd.in-toto+json'"
    assert refusal(b"[1,") == f"{path}: statement: invalid JSON: Expecting value: line 1 column 4 (char 3)"
    assert refusal({**good, "_type": "https://in-toto.io/Statement/v0.1"}) == f"{path}: not an in-toto Statement v1"
    assert refusal([good]) == f"{path}: not an in-toto Statement v1"
    assert refusal({**good, "predicateType": "p"}) == \
        f"{path}: predicateType 'p' is not 'https://model_signing/signature/v1.0'"
    res = good["predicate"]["resources"]

    def with_resource(**change: Any) -> dict[str, Any]:
        return {**good, "predicate": {**good["predicate"], "resources": [{**res[0], **change}]}}

    assert refusal(with_resource(algorithm="sha512")) == \
        f"{path}: resource 0: expected a name, algorithm sha256 and a lowercase hex digest"
    assert refusal(with_resource(name="../a.bin")) == \
        f"{path}: resource 0: unsafe file name '../a.bin' (absolute, '..' or empty parts are refused)"
    # a signed one: the wrong key's message ends with no advice unless given
    private = tmp_path / "k"
    private.mkdir()
    signed = oms.sign(private, pair[0], {"a.bin": "a" * 64})
    assert signed is not None and oms.read(signed, [pair[1]])[1] == keys.key_id(pair[1])  # control
    assert _msg(lambda: oms.read(signed, [other])) == (
        f"{signed}: DSSE signature does not verify with key {keys.key_id(other)} "
        f"(the bundle names key {keys.key_id(pair[1])})")
    size = signed.stat().st_size
    monkeypatch.setattr(attest, "MAX_BUNDLE_BYTES", size - 1)
    assert _msg(lambda: oms.read(signed, None)) == \
        f"{signed}: {size} bytes exceeds the {size - 1}-byte limit for an OMS signature"


@pytest.fixture
def private_xdg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore writes its embedded trust root under the XDG folders: keep them per test."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg-cache"))
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg-data"))


@pytest.mark.usefixtures("private_xdg")
def test_trust_root_refusals_are_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore sigstore_verifier 10, 15 (the bounded read's `what`: JSON), 61 (the pydantic detail cut
    at 300 characters, not 301). No network: each refusal comes before any trust root is fetched."""
    from sigstore.models import TrustedRoot

    from kvgraft.signing import sigstore

    path = tmp_path / "root.json"
    path.write_text(json.dumps({"mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
                                "tlogs": "x", "certificateAuthorities": 5, "ctlogs": [1, 2]}))
    with pytest.raises(ValueError) as raised:  # pydantic's own account of the file
        TrustedRoot.from_file(str(path))
    detail = " ".join(str(raised.value).split())
    assert len(detail) > 301  # so that the cut shows
    trust = sigstore.SigstoreTrust(trusted_root=path)
    assert _msg(lambda: sigstore.sigstore_verifier(trust)) == \
        f"{path}: not a valid Sigstore trust root: {detail[:300]}"
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"mediaType": "x"}))
    assert _msg(lambda: sigstore.sigstore_verifier(sigstore.SigstoreTrust(trusted_root=other))) == \
        f"{other}: not a Sigstore trusted root or client trust config (mediaType 'x')"
    other.write_text(json.dumps({"mediaType": 3}))  # not a string: the same one line, no traceback
    assert _msg(lambda: sigstore.sigstore_verifier(sigstore.SigstoreTrust(trusted_root=other))) == \
        f"{other}: not a Sigstore trusted root or client trust config (mediaType 3)"
    monkeypatch.setattr(sigstore, "MAX_TRUST_BYTES", 10)
    size = path.stat().st_size
    assert _msg(lambda: sigstore.sigstore_verifier(trust)) == f"{path}: {size} bytes exceeds the 10-byte limit for JSON"
    folder = tmp_path / "dir.json"
    folder.mkdir()
    assert _msg(lambda: sigstore.sigstore_verifier(sigstore.SigstoreTrust(trusted_root=folder))) == \
        f"{folder}: not a regular file; refusing to read JSON from it"


@pytest.mark.usefixtures("private_xdg")
def test_a_bundle_whose_certificate_is_not_der_is_refused_whole() -> None:
    """sigstore verify_sigstore_bundle 20 (the ValueError branch's detail: str(None)). sigstore-python
    wraps pydantic errors in InvalidBundle but lets cryptography's ValueError for a certificate that is not
    DER through; both are unusable input, refused before any trust root is loaded."""
    from cryptography.x509 import load_der_x509_certificate

    from kvgraft.signing.sigstore import verify_sigstore_bundle

    bundle = {"mediaType": "application/vnd.dev.sigstore.bundle.v0.3+json",
              "verificationMaterial": {"certificate": {"rawBytes": base64.b64encode(b"\0\0\0").decode()},
                                       "tlogEntries": []},
              "messageSignature": {"messageDigest": {"algorithm": "SHA2_256", "digest": base64.b64encode(bytes(32)).decode()},
                                   "signature": base64.b64encode(b"s").decode()}}
    with pytest.raises(ValueError) as raised:
        load_der_x509_certificate(b"\0\0\0")
    detail = " ".join(str(raised.value).split())
    assert _msg(lambda: verify_sigstore_bundle(b"x", _raw(bundle), identity="i", issuer="o", where=W)) == \
        f"{W}: not a valid Sigstore bundle: {detail[:300]}"
    # control: a bundle pydantic refuses takes the InvalidBundle branch, with sigstore's own wording
    from sigstore.models import Bundle, InvalidBundle

    del bundle["verificationMaterial"]
    with pytest.raises(InvalidBundle) as invalid:
        Bundle.from_json(_raw(bundle))
    detail = " ".join(str(invalid.value).split())
    assert detail.startswith("failed to load bundle: 1 validation error for Bundle verificationMaterial Field required")
    assert _msg(lambda: verify_sigstore_bundle(b"x", _raw(bundle), identity="i", issuer="o", where=W)) == \
        f"{W}: not a valid Sigstore bundle: {detail[:300]}"


@needs_sigstore_bundles
@pytest.mark.usefixtures("private_xdg")
def test_a_real_message_signature_bundle_has_no_payload_type() -> None:
    """sigstore verify_sigstore_bundle 30 (payload_type starting as "" instead of None): a message-signature
    bundle verifies with neither payload nor payload type; a DSSE bundle has both (the control)."""
    from kvgraft.signing.sigstore import SigstoreTrust, verify_sigstore_bundle

    staging = SigstoreTrust(staging=True, offline=True)
    result = verify_sigstore_bundle((SIGSTORE_BUNDLES / "bundle.txt").read_bytes(),
                                    (SIGSTORE_BUNDLES / "bundle.txt.sigstore").read_bytes(), identity="a@tny.town",
                                    issuer="https://github.com/login/oauth", trust=staging)
    assert (result.identity, result.payload_type, result.payload) == ("a@tny.town", None, None)
    beacon = ("https://github.com/sigstore-conformance/extremely-dangerous-public-oidc-beacon/.github/workflows/"
              "extremely-dangerous-oidc-beacon.yml@refs/heads/main")
    dsse = verify_sigstore_bundle(None, (SIGSTORE_BUNDLES / "a.dsse.staging-rekor-v2.txt.sigstore.json").read_bytes(),
                                  identity=beacon, issuer="https://token.actions.githubusercontent.com", trust=staging)
    assert dsse.payload_type == attest.PAYLOAD_TYPE and dsse.payload is not None


# -------------------------------------------- a full run of the signing group (outside the sample)


def test_algorithm_of_names_every_curve() -> None:
    """keys algorithm_of 4-6 (the fallback for a curve without a short name dropped)."""
    from cryptography.hazmat.primitives.asymmetric import ec, ed25519

    assert keys.algorithm_of(ed25519.Ed25519PrivateKey.generate()) == "ed25519"
    for curve, name in ((ec.SECP256R1(), "ecdsa-p256"), (ec.SECP384R1(), "ecdsa-p384"), (ec.SECP521R1(), "ecdsa-p521"),
                        (ec.SECP256K1(), "ecdsa-secp256k1")):
        key = ec.generate_private_key(curve)
        assert (keys.algorithm_of(key), keys.algorithm_of(key.public_key())) == (name, name)


@pytest.mark.usefixtures("private_xdg")
def test_sigstore_bundle_refusals_before_sigstore_are_exact(monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore verify_sigstore_bundle 1, 2 (the default `where`), 3, 4 (the size bound: `>=`, its message),
    7 (the JSON error's location), 11 (not an object), 17 (pydantic's detail cut at 300, not 301)."""
    from sigstore.models import Bundle, InvalidBundle

    from kvgraft.signing.sigstore import verify_sigstore_bundle

    def refusal(raw: bytes) -> str:
        return _msg(lambda: verify_sigstore_bundle(b"x", raw, identity="i", issuer="o"))

    assert refusal(b"[1]") == "bundle: not a Sigstore bundle (not a JSON object)"
    assert refusal(b"{") == "bundle: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    many = _raw({"mediaType": "x", "verificationMaterial": {"publicKey": 1, "tlogEntries": "t"}, "messageSignature": 2})
    with pytest.raises(InvalidBundle) as invalid:
        Bundle.from_json(many)
    detail = " ".join(str(invalid.value).split())
    assert len(detail) > 301
    assert refusal(many) == f"bundle: not a valid Sigstore bundle: {detail[:300]}"
    monkeypatch.setattr(attest, "MAX_BUNDLE_BYTES", 3)
    assert refusal(b"[1]") == "bundle: not a Sigstore bundle (not a JSON object)"  # at the limit: read
    assert refusal(b"[10]") == "bundle: 4 bytes exceeds the 3-byte limit for a bundle"


class _Verifier:
    """Stands in for sigstore's Verifier once its checks passed (they are tested on real bundles in
    test_sigstore_fixtures.py): what kvgraft does with the verified payload is the check here."""

    def __init__(self, payload: bytes) -> None:
        self.payload = payload

    def verify_dsse(self, bundle: Any, policy: Any) -> tuple[str, bytes]:
        return attest.PAYLOAD_TYPE, self.payload

    def verify_artifact(self, artifact: Any, bundle: Any, policy: Any) -> None:
        return None


@needs_sigstore_bundles
@pytest.mark.usefixtures("private_xdg")
def test_a_verified_dsse_statement_must_list_the_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore verify_sigstore_bundle 69-88 (the artifact-in-subjects check after a DSSE bundle verified:
    the file's digest, the statement's subjects); 42 (a message-signature bundle without its artifact).
    sigstore's own verification is replaced by _Verifier (no real DSSE fixture lists an artifact we
    have); the bundles are real, so sigstore-python parses them as it would."""
    from kvgraft._internal.digest import sha256_hex
    from kvgraft.signing import sigstore

    raw = (SIGSTORE_BUNDLES / "a.dsse.staging-rekor-v2.txt.sigstore.json").read_bytes()
    art = b"the artifact\n"
    file = tmp_path / "a.bin"
    file.write_bytes(art)
    listed = {"subject": [{"name": "x", "digest": "not an object"}, "junk", {"name": "a", "digest": {"sha256": sha256_hex(art)}}]}

    def check(artifact: bytes | Path | None, stmt: Any) -> Any:
        payload = stmt if isinstance(stmt, bytes) else json.dumps(stmt).encode()
        monkeypatch.setattr(sigstore, "sigstore_verifier", lambda trust: _Verifier(payload))
        return sigstore.verify_sigstore_bundle(artifact, raw, identity="i", issuer="o")

    for artifact in (art, file, None):  # the artifact's bytes, its file (hashed by kvgraft), none
        result = check(artifact, listed)
        assert (result.identity, result.issuer, result.payload_type, result.payload) == (
            "i", "o", attest.PAYLOAD_TYPE, json.dumps(listed).encode()), artifact
    other = sha256_hex(b"other")
    refused = f"bundle: the artifact's sha256 {other} is not a subject of the signed statement"
    assert _msg(lambda: check(b"other", listed)) == refused
    assert _msg(lambda: check(tmp_path / "missing", listed)) == f"{tmp_path / 'missing'}: cannot read: No such file or directory"
    for stmt in ({}, {"subject": []}, [listed], {"SUBJECT": listed["subject"]}):
        assert _msg(lambda s=stmt: check(b"other", s)) == refused, stmt
    assert check(None, {}).payload == b"{}"  # no artifact: nothing to look up
    assert _msg(lambda: check(art, b"{")) == \
        "bundle: statement: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    message = (SIGSTORE_BUNDLES / "bundle.txt.sigstore").read_bytes()
    monkeypatch.setattr(sigstore, "sigstore_verifier", lambda trust: _Verifier(b""))
    assert _msg(lambda: sigstore.verify_sigstore_bundle(None, message, identity="i", issuer="o")) == \
        "bundle: a message-signature bundle is verified against its artifact; none given"
    assert sigstore.verify_sigstore_bundle(art, message, identity="i", issuer="o").payload is None  # control


def test_key_file_refusals_are_exact(tmp_path: Path) -> None:
    """keys generate 10, public_pem 3, write_keypair 15 (overwrite dropped), is_encrypted 5/8/9 and
    load_public_key 3/6/7 (the read's `what`), load_public_key 16/17 (cryptography's detail),
    load_private_key 27 and _supported_private 1/3 (a private key on a curve kvgraft does not sign with)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    assert _msg(lambda: keys.generate("rsa")) == "--algorithm 'rsa': not supported; choose one of ecdsa-p256, ed25519"
    private, public = keys.write_keypair(tmp_path / "k")
    key = keys.load_private_key(private)
    assert keys.public_pem(key) == keys.public_pem(key.public_key()) == public.read_bytes()
    again = keys.write_keypair(tmp_path / "k", overwrite=True)  # replaced, not refused
    assert again == (private, public) and keys.load_public_key(public) is not None
    missing = tmp_path / "missing.pem"
    assert _msg(lambda: keys.is_encrypted(missing)) == f"{missing}: cannot read: No such file or directory"
    assert keys.is_encrypted(private) is False  # control
    assert _msg(lambda: keys.load_public_key(missing)) == f"{missing}: cannot read: No such file or directory"
    junk = tmp_path / "junk.pub.pem"
    junk.write_bytes(b"not a key\n")
    with pytest.raises(ValueError) as raised:
        serialization.load_pem_public_key(junk.read_bytes())
    assert _msg(lambda: keys.load_public_key(junk)) == \
        f"{junk}: not a PEM public key ({' '.join(str(raised.value).split())})"
    k1 = tmp_path / "k1.key.pem"
    k1.write_bytes(keys.private_pem(ec.generate_private_key(ec.SECP256K1())))
    assert _msg(lambda: keys.load_private_key(k1)) == \
        f"{k1}: unsupported private key type; kvgraft signs with ECDSA P-256, P-384 or P-521, or Ed25519"


def test_oms_read_structure_refusals_are_exact(pair: tuple[Any, Any], tmp_path: Path) -> None:
    """oms read 24 (one key given alone, not in a list), 74-77 and 84 (one subject and a predicate),
    89, 90, 104 (the serialization), 110 (resources not a list), 142 (a resource listed twice)."""
    from kvgraft.signing import oms

    folder = tmp_path / "rel"
    folder.mkdir()
    signed = oms.sign(folder, pair[0], {"a.bin": "a" * 64})
    assert signed is not None and oms.read(signed, pair[1])[1] == keys.key_id(pair[1])  # one key, not a list
    good = oms.statement(tmp_path, {"a.bin": "a" * 64})
    path = _oms_file(tmp_path, good)
    assert oms.read(path, None)[0] == {"a.bin": "a" * 64}  # control

    def refusal(stmt: Any) -> str:
        return _msg(lambda: oms.read(_oms_file(tmp_path, stmt), None))

    shape = f"{path}: an OMS statement has one subject and a predicate"
    subject = good["subject"][0]
    for bad in ({**good, "predicate": []}, {**good, "subject": subject}, {**good, "subject": [subject, subject]},
                {**good, "subject": []}, {**good, "subject": ["s"]}, {**good, "subject": [{**subject, "digest": "d"}]}):
        assert refusal(bad) == shape, bad
    serial = good["predicate"]["serialization"]
    for other in ({**serial, "hash_type": "sha512"}, {**serial, "method": "shards"}, "files"):
        assert refusal({**good, "predicate": {**good["predicate"], "serialization": other}}) == \
            f"{path}: only the OMS 'files' serialization with sha256 is read (found {other!r:.200})", other
    assert refusal({**good, "predicate": {**good["predicate"], "resources": {}}}) == f"{path}: predicate.resources is not a list"
    twice = good["predicate"]["resources"] * 2
    assert refusal({**good, "predicate": {**good["predicate"], "resources": twice}}) == f"{path}: a resource is listed twice"


def test_oms_signature_file_is_indented_json(pair: tuple[Any, Any], tmp_path: Path) -> None:
    """oms sign 5, 7, 12, 62, 64, 65 (the indent of the payload and of model.sig): the file is written as
    documented, 2-space indented JSON with a final newline, payload included."""
    from kvgraft.signing import oms

    path = oms.sign(tmp_path, pair[0], {"a.bin": "a" * 64})
    assert path is not None
    text = path.read_text()
    doc = json.loads(text)
    assert text == json.dumps(doc, indent=2) + "\n"
    payload = base64.b64decode(doc["dsseEnvelope"]["payload"])
    assert payload == (json.dumps(oms.statement(tmp_path, {"a.bin": "a" * 64}), indent=2) + "\n").encode()


@pytest.mark.usefixtures("private_xdg")
def test_trust_root_choices_and_load_failures_are_exact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """sigstore sigstore_verifier 2-4 (both roots given), 18, 21 (the trust file's JSON error location),
    24-33 (a trust file without a mediaType, or not an object), 49-57 (sigstore's own load failure and
    the --offline hint). The failure is sigstore.errors.Error raised by a patched Verifier.production
    (the real one fails like this when its TUF refresh cannot reach the network)."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.verify import Verifier

    from kvgraft.signing import sigstore

    def load(**trust: Any) -> str:
        return _msg(lambda: sigstore.sigstore_verifier(sigstore.SigstoreTrust(**trust)))

    path = tmp_path / "root.json"
    assert load(trusted_root=path, staging=True) == "give --trusted-root or --staging, not both"
    path.write_text("{")
    assert load(trusted_root=path) == \
        f"{path}: invalid JSON: Expecting property name enclosed in double quotes: line 1 column 2 (char 1)"
    for doc in ({}, [1]):
        path.write_text(json.dumps(doc))
        assert load(trusted_root=path) == f"{path}: not a Sigstore trusted root or client trust config (mediaType '')", doc

    def unreachable(cls: Any, offline: bool = False) -> Any:
        raise SigstoreError("TUF refresh failed:\n  no network")

    monkeypatch.setattr(Verifier, "production", classmethod(unreachable))
    assert load() == ("cannot load the Sigstore trusted root: TUF refresh failed: no network (pass --offline to use "
                      "the embedded trusted root)")
    assert load(offline=True) == "cannot load the Sigstore trusted root: TUF refresh failed: no network"


def test_a_key_of_an_unknown_algorithm_and_the_size_bound(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """keys load_private_key 25 (cryptography's UnsupportedAlgorithm message dropped), _read_pem 4 (`>`
    -> `>=`: a key file of exactly MAX_KEY_BYTES refused)."""
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives import serialization

    # PKCS#8 PrivateKeyInfo {version 0, algorithm OID 1.2.3.4, an empty key}: well-formed DER, unknown key type
    der = bytes.fromhex("3011" "020100" "3005" "06032a0304" "0405" "0403000000")
    unknown = tmp_path / "unknown.key.pem"
    unknown.write_bytes(b"-----BEGIN PRIVATE KEY-----\n" + base64.encodebytes(der) + b"-----END PRIVATE KEY-----\n")
    with pytest.raises(UnsupportedAlgorithm) as raised:
        serialization.load_pem_private_key(unknown.read_bytes(), password=None)
    assert _msg(lambda: keys.load_private_key(unknown)) == f"{unknown}: unsupported key: {raised.value}"
    private, _ = keys.write_keypair(tmp_path / "k")
    size = private.stat().st_size
    monkeypatch.setattr(keys, "MAX_KEY_BYTES", size)
    assert keys.algorithm_of(keys.load_private_key(private)) == "ecdsa-p256"  # exactly at the bound: read
    monkeypatch.setattr(keys, "MAX_KEY_BYTES", size - 1)
    assert _msg(lambda: keys.load_private_key(private)) == \
        f"{private}: {size} bytes exceeds the {size - 1}-byte limit for a private key"
