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
    assert b.payload == attest.statement_bytes(_statement()) and b.raw == _raw(doc) and b.doc == doc
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
    assert attest.verify_with_key(hinted, pair[1], also_hint="someone") == kid
    keyid = attest.parse_bundle(_raw(_edit(doc, ["dsseEnvelope", "signatures", 0, "keyid"], "zz")), W)
    assert _msg(lambda: attest.verify_with_key(keyid, pair[1])) == \
        f"{W}: dsseEnvelope keyid 'zz' names another key than {kid}, which verified it"
    assert _msg(lambda: attest.verify_with_any(b, [other], advice="; ADVICE")) == \
        f"{W}: DSSE signature does not verify with key {oid} (the bundle names key {kid}); ADVICE"
    assert attest.verify_with_any(b, [other, pair[1]]) == kid
    assert attest.verify_with_any(hinted, [other, pair[1]], also_hint=lambda k: "someone") == kid
    assert attest.verify_with_any(hinted, [pair[1]], also_hint=lambda k: "someone") == kid
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
