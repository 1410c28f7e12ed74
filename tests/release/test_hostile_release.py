"""Hostile releases: no traceback, crash signal, hang or spoofed line; nothing grafted from a
release `kvgraft verify` refuses; strict bundles; every predicate member checked against the manifest."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft._internal import jsonio
from kvgraft.cli import app
from kvgraft.errors import InputError, IntegrityError, VerificationError
from kvgraft.inference import capture, graft
from kvgraft.release import hashing
from kvgraft.release.records import entry_digest, root_digest
from kvgraft.render.text import plain
from kvgraft.signing import attest, keys, sign
from kvgraft.signing.policy import SignatureNotChecked, SignedWithKeys, verify_policy
from kvgraft.signing.verify import verified
from tests.verifying import verify_result

from release_factory import as_format_1, make_release, unsign

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]
KVGRAFT = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]


@pytest.fixture(scope="module")
def signed_built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("signed")
    private, public = keys.write_keypair(folder / "k")
    make_release(folder / "rel", entries=2, heads=4, seed=13)
    sign.sign_release(folder / "rel", keys.load_private_key(private))
    return folder / "rel", public


@pytest.fixture
def signed(signed_built: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    root, public = signed_built
    return Path(shutil.copytree(root, tmp_path / "rel")), public


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def redigest(root: Path, name: str) -> None:
    """After changing `name`'s bytes, rewrite every digest that covers it (tensors, entry, file, root),
    as an attacker without the signing key can: only the signature bundle is left stale."""
    from kvgraft.release import safetensors_header as stfile

    manifest = json.loads((root / "manifest.json").read_text())
    path = root / name
    header, _ = stfile.read_header(path)
    data = path.read_bytes()
    for entry in manifest["entries"]:
        if entry["file"] == name:
            for tname, t in entry["tensors"].items():
                t["sha256"] = hashlib.sha256(data[header[tname].start:header[tname].end]).hexdigest()
            entry["digest"] = entry_digest(entry)
    manifest["files"][name] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    manifest["root_digest"] = root_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")


# ----------------------------------------------------------------------------- 1. plain-text errors


@pytest.mark.parametrize("name", ["[/x]", "[bold]x", "ok\nkvgraft: verified OK", "\x1b[31mred\x1b[0m", "a\u202eb"])
def test_attacker_names_are_printed_as_plain_text_on_one_line(signed: tuple[Path, Path], name: str) -> None:
    root, public = signed
    (root / name).parent.mkdir(exist_ok=True)  # "[/x]" is the file "x]" in a folder "["
    (root / name).write_bytes(b"extra")
    for as_json in (False, True):
        r = cli("verify", str(root), "--key", str(public), *(["--json"] if as_json else []))
        assert r.exit_code == 1, r.output
        assert "Traceback" not in r.output and "MarkupError" not in r.output
        lines = r.stderr.splitlines()
        assert len(lines) == 1 and lines[0].startswith("kvgraft: error: "), lines
        assert "\x1b" not in r.output and "\u202e" not in r.output
        if name.startswith("["):
            assert name in lines[0]  # shown as written, not interpreted
        if as_json:
            doc = json.loads(r.stdout)
            assert doc["exit_code"] == r.exit_code and doc["ok"] is False


def test_plain_escapes_control_and_format_characters() -> None:


    assert plain("a\nb\x1b[0m\u202ec d") == "a\\x0ab\\x1b[0m\\u202ec d"


# ---------------------------------------------------------------------- 2. truncation while hashing

_TRUNCATE_DURING_HASH = """
import hashlib, os, sys
from pathlib import Path
import kvgraft.release.hashing as h
target = Path(sys.argv[1])
real = hashlib.sha256
class Cutting:
    def __init__(self, data=b""):
        self.inner, self.calls = real(data), 0
    def update(self, data):
        self.calls += 1
        if self.calls == 2:
            os.truncate(target, 4096)  # the file shrinks while it is being hashed
        self.inner.update(data)
    def hexdigest(self):
        return self.inner.hexdigest()
h.hashlib = type("M", (), {"sha256": staticmethod(Cutting)})
from kvgraft.cli import entrypoint
sys.argv = ["kvgraft", "verify", sys.argv[2]]
entrypoint()
"""


def test_a_file_truncated_while_it_is_hashed_is_exit_1_naming_it_not_a_signal(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    make_release(root, entries=1, layers=4, heads=8, tokens=512, head_dim=64, seed=2)  # one 8 MiB entry
    entry = next((root / "entries").iterdir())
    r = subprocess.run([sys.executable, "-c", _TRUNCATE_DURING_HASH, str(entry), str(root)], capture_output=True,
                       text=True, timeout=120, cwd=REPO)
    assert r.returncode == 1, (r.returncode, r.stderr)  # was -7 (SIGBUS) or 70 (EOFError from mmap)
    assert r.stderr.count("\n") == 1 and "Traceback" not in r.stderr
    assert str(entry) in r.stderr and ("shrank" in r.stderr or "(truncated)" in r.stderr)


def test_hashing_maps_nothing(tmp_path: Path) -> None:
    """No file-backed mapping anywhere in hashing: a mapping is what turns a truncation into SIGBUS."""
    assert "mmap" not in Path(hashing.__file__).read_text()
    f = tmp_path / "f"
    f.write_bytes(os.urandom(3 * hashing.READ_BLOCK + 17))
    assert hashing.hash_file(f) == (hashlib.sha256(f.read_bytes()).hexdigest(), f.stat().st_size)


def test_hashing_stops_when_its_caller_no_longer_needs_it(tmp_path: Path) -> None:
    """After a verification failed, prefetch hashing ends at its next block (the process does not
    wait for background threads to read the rest of a large release before it exits)."""
    import threading

    f = tmp_path / "f"
    f.write_bytes(bytes(4 * hashing.READ_BLOCK))
    stop = threading.Event()
    stop.set()
    with pytest.raises(hashing.Stopped):
        hashing.hash_file(f, stop=stop)


# -------------------------------------------------------------------------- 3. bounded JSON readers


@pytest.mark.parametrize("text", [b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000 + b"1" + b"}" * 100_000,
                                  b'{"a": 1e999}', b'{"a": -1e999}', b'{"a": 1152921504606846976}',
                                  b'{"a": 1180591620717411303424}', b'{"a": "\\ud800"}', b'{"\\udfff": 1}',
                                  b"[" * 65 + b"]" * 65])
def test_strict_json_refuses_depth_overflow_big_integers_and_lone_surrogates(text: bytes) -> None:
    with pytest.raises(InputError, match="where: invalid JSON"):
        jsonio.loads_strict(text, "where")


def test_strict_json_keeps_what_is_valid() -> None:
    doc = jsonio.loads_strict(b'{"a": [9007199254740991, -9007199254740991, 1.5e300, "\\ud83d\\ude00"]}', "w")
    assert doc == {"a": [2**53 - 1, -(2**53 - 1), 1.5e300, "\U0001f600"]}
    assert jsonio.loads_strict(b"[" * 64 + b"]" * 64, "w") is not None


def _nested(text: str) -> str:
    return text.replace('"token_ids": [', '"token_ids": [' + "[" * 100_000 + "]" * 100_000 + ", ", 1)


# Each in a member the schema accepts, so that only the strict parser stands between it and a digest
# (canonical JSON, RFC 8785) that cannot be computed: exit 70 before.
@pytest.mark.parametrize(("edit", "message"), [
    (_nested, "nested deeper than 64"),
    (lambda t: t.replace('"token_ids": [', '"token_ids": [1152921504606846976, ', 1), "I-JSON range"),
    (lambda t: t.replace('"token_ids": [', '"token_ids": [1180591620717411303424, ', 1), "I-JSON range"),
    (lambda t: t.replace('"text": "', '"text": "\\ud800', 1), "lone UTF-16 surrogate"),
])
def test_hostile_json_in_an_unsigned_manifest_is_exit_2(signed: tuple[Path, Path], edit: Any, message: str) -> None:
    root, _ = signed
    unsign(root)  # signed, the manifest's digest is refused before it is parsed
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_text(edit(text))
    r = cli("verify", str(root), "--json")
    assert r.exit_code == 2 and message in r.stderr, r.output
    assert json.loads(r.stdout)["exit_code"] == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.output


@pytest.mark.parametrize(("value", "message"), [("1e999", "non-finite"), ("-1e999", "non-finite"),
                                                ("1180591620717411303424", "I-JSON range"),
                                                ('"\\ud800"', "lone UTF-16 surrogate"),
                                                ("[" * 100_000 + "]" * 100_000, "nested deeper than 64")])
def test_hostile_json_in_a_bundle_is_exit_2(signed: tuple[Path, Path], value: str, message: str) -> None:
    root, public = signed
    path = root / attest.BUNDLE_NAME
    text = path.read_text()
    path.write_text(text.replace('"tlogEntries": []', f'"tlogEntries": [{value}]', 1))
    r = cli("verify", str(root), "--key", str(public), "--json")
    assert r.exit_code == 2 and message in r.stderr, r.output
    assert json.loads(r.stdout)["exit_code"] == 2 and r.stderr.count("\n") == 1 and "Traceback" not in r.output


def test_deeply_nested_entry_header_in_a_signed_release_is_exit_1_naming_the_file(signed: tuple[Path, Path]) -> None:
    root, public = signed
    path = sorted((root / "entries").iterdir())[0]
    size = path.stat().st_size
    assert size > 2100  # deeper than the interpreter's recursion limit
    # Same size, so only the digest differs; the damage locator then parses this header.
    path.write_bytes((size - 8).to_bytes(8, "little") + b"[" * (size - 8))
    r = cli("verify", str(root), "--key", str(public))
    assert r.exit_code == 1, r.output
    assert str(path) in r.stderr and "nested deeper than 64" in r.stderr and r.stderr.count("\n") == 1


# ---------------------------------------------------------------------------------- 4. special files


def test_a_fifo_in_place_of_the_bundle_is_refused_without_blocking(signed: tuple[Path, Path]) -> None:
    root, public = signed
    unsign(root)
    os.mkfifo(root / attest.BUNDLE_NAME)
    started = time.monotonic()
    r = subprocess.run([*KVGRAFT, "verify", str(root), "--key", str(public)], capture_output=True, text=True,
                       timeout=60, cwd=REPO)
    assert time.monotonic() - started < 60
    assert r.returncode == 2 and "not a regular file" in r.stderr and r.stderr.count("\n") == 1


def test_read_bounded_refuses_a_fifo_before_opening_it(tmp_path: Path) -> None:
    os.mkfifo(tmp_path / "f")
    with pytest.raises(InputError, match="not a regular file"):
        jsonio.read_bounded(tmp_path / "f", 100, "JSON")  # would block in open() forever


# ------------------------------------------------------------------------- 5. sizes before hashing


@pytest.mark.parametrize("signed_by_key", [True, False])
def test_a_sparse_grown_entry_file_is_refused_without_reading_it(signed: tuple[Path, Path], signed_by_key: bool,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: all 3 GiB hashed before the sizes were compared; now nothing of it is read, signed or not."""
    root, public = signed
    path = sorted((root / "entries").iterdir())[0]
    size = path.stat().st_size
    os.truncate(path, size + 3 * 2**30)  # sparse: 3 GiB that cost nothing to make
    read: list[int] = []
    real = os.preadv

    def counting(fd: int, buffers: Any, offset: int) -> int:
        n = real(fd, buffers, offset)
        read.append(n)
        return n

    monkeypatch.setattr(os, "preadv", counting)
    grown = rf"{path.name}: entry 'rec-000': {size + 3 * 2**30} bytes, the manifest says {size} \(grown\)"
    with pytest.raises(IntegrityError, match=grown):
        verify_result(root, verify_policy(key=public if signed_by_key else None))
    hashing.pool().submit(lambda: None).result()  # let a block under way finish
    time.sleep(0.2)
    assert sum(read) < 2**20, sum(read)  # the other (small) entry files only


def test_an_oversized_unsigned_manifest_is_refused_before_it_is_parsed(signed: tuple[Path, Path],
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.release import integrity

    root, _ = signed
    unsign(root)
    text = (root / "manifest.json").read_bytes()
    # valid JSON that describes the same release (trailing whitespace), far beyond 1/64 of its data
    (root / "manifest.json").write_bytes(text + b" " * (integrity.UNSIGNED_MANIFEST_FLOOR + 1))
    parsed: list[str] = []
    monkeypatch.setattr(jsonio, "loads_strict", lambda data, where: parsed.append(where))
    with pytest.raises(InputError, match="exceeds the 16777216-byte limit for an unsigned manifest"):
        verify_result(root)
    assert parsed == []


# --------------------------------------------------------------------- 6. one verification path


@pytest.fixture
def captured(tiny_lm: Callable[[str], Any], tmp_path: Path) -> tuple[Path, Path, Any]:
    lm = tiny_lm("llama")
    root = tmp_path / "cap"
    capture.capture(lm, [("t", {"id": "e", "text": "one two three four five six seven eight"})], root, probe_tokens=0)
    as_format_1(root)  # the attacks below rewrite a single manifest (test_scale_release: the indexed layout's)
    private, public = keys.write_keypair(tmp_path / "k")
    sign.sign_release(root, keys.load_private_key(private))
    return root, public, lm


def _zero_first_tensor(root: Path) -> str:
    from kvgraft.release import safetensors_header as stfile

    manifest = json.loads((root / "manifest.json").read_text())
    name = manifest["entries"][0]["file"]
    header, _ = stfile.read_header(root / name)
    first = min(header.values(), key=lambda t: t.start)
    data = bytearray((root / name).read_bytes())
    data[first.start:first.end] = bytes(first.end - first.start)
    (root / name).write_bytes(bytes(data))
    redigest(root, name)
    return name


def test_graft_refuses_what_verify_refuses_zeroed_tensor_with_stale_bundle(captured: tuple[Path, Path, Any]) -> None:
    root, public, lm = captured
    _zero_first_tensor(root)
    assert cli("verify", str(root)).exit_code == 1  # the stale bundle's statement no longer matches
    for call in (lambda: graft.load_cache(verified(root, SignatureNotChecked()), "e", lm, force=True),
                 lambda: graft.run(verified(root, SignatureNotChecked()), "e", lm, "x", max_new_tokens=1, force=True),
                 lambda: graft.load_cache(verified(root, SignedWithKeys((public,))), "e", lm)):
        with pytest.raises((IntegrityError, VerificationError)):
            call()


def test_graft_refuses_a_changed_safetensors_metadata_with_stale_bundle(captured: tuple[Path, Path, Any]) -> None:
    root, _, lm = captured
    name = json.loads((root / "manifest.json").read_text())["entries"][0]["file"]
    data = (root / name).read_bytes()
    assert b'"kvgraft_entry":"e"' in data
    (root / name).write_bytes(data.replace(b'"kvgraft_entry":"e"', b'"kvgraft_entry":"f"'))
    redigest(root, name)
    assert cli("verify", str(root)).exit_code == 1
    with pytest.raises((IntegrityError, VerificationError)):
        graft.load_cache(verified(root, SignatureNotChecked()), "e", lm)


def test_kvgraft_run_refuses_before_loading_a_model(captured: tuple[Path, Path, Any]) -> None:
    root, _, _ = captured
    _zero_first_tensor(root)
    r = cli("run", str(root), "--entry", "e", "--model", "/nonexistent-model")
    # Exit 1 with the verification failure: before, the release opened fine (its digests are
    # consistent) and the run went on to load the model (exit 2 here, a graft with a real model).
    assert r.exit_code == 1, r.output
    assert "statement" in r.stderr and "nonexistent" not in r.stderr and r.stderr.count("\n") == 1


def test_require_signature(captured: tuple[Path, Path, Any]) -> None:
    root, public, lm = captured
    assert graft.load_cache(verified(root, verify_policy(key=public, require_signature=True)), "e", lm) is not None
    with pytest.raises(InputError, match="--require-signature needs --key"):
        graft.load_cache(verified(root, verify_policy(require_signature=True)), "e", lm)
    unsign(root)
    with pytest.raises(VerificationError, match="unsigned"):
        graft.load_cache(verified(root, verify_policy(key=public, require_signature=True)), "e", lm)
    # Without a key: an unsigned release grafts, with a recorded warning.
    restored = graft.restore(verified(root, SignatureNotChecked()), "e", lm)
    assert any("unsigned" in w for w in restored.warnings)
    r = cli("verify", str(root), "--require-signature", "--key", str(public), "--json")
    assert r.exit_code == 1 and json.loads(r.stdout)["exit_code"] == 1


def test_recompute_audit_verifies_the_release(captured: tuple[Path, Path, Any]) -> None:
    from kvgraft.recompute import audit as recompute

    root, _, lm = captured
    _zero_first_tensor(root)
    with pytest.raises((IntegrityError, VerificationError)):
        recompute.audit(verified(root, SignatureNotChecked()), lm)


# ------------------------------------------------------------------------------- 7. strict bundles


def _edit_bundle(root: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    path = root / attest.BUNDLE_NAME
    doc = json.loads(path.read_text())
    edit(doc)
    path.write_text(json.dumps(doc, indent=2))


def _noncanonical(doc: dict[str, Any]) -> None:
    """The same signed bytes under another base64 text: a set pad bit, else the URL-safe alphabet."""
    alphabet = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    env = doc["dsseEnvelope"]
    for holder, field in ((env["signatures"][0], "sig"), (env, "payload")):
        text = holder[field]
        if text.endswith("="):
            body = text.rstrip("=")
            holder[field] = body[:-1] + alphabet[alphabet.index(body[-1]) ^ 1] + text[len(body):]
            assert base64.b64decode(holder[field]) == base64.b64decode(text)
            return
    for holder, field in ((env["signatures"][0], "sig"), (env, "payload")):
        text = holder[field]
        if "+" in text or "/" in text:
            holder[field] = text.replace("+", "-").replace("/", "_")
            return
    raise AssertionError("no field to re-encode")


@pytest.mark.parametrize(("edit", "code", "message"), [
    (lambda d: d.update(extra=1), 2, "unknown member 'extra'"),
    (lambda d: d["dsseEnvelope"].update(note="x"), 2, "unknown member 'note'"),
    (lambda d: d["dsseEnvelope"]["signatures"][0].update(x=1), 2, "unknown member 'x'"),
    (lambda d: d["verificationMaterial"]["publicKey"].update(rawBytes="AA=="), 2, "unknown member 'rawBytes'"),
    (_noncanonical, 1, "base64"),
    (lambda d: d["dsseEnvelope"]["signatures"][0].update(keyid="someone-else"), 1, "names another key"),
    (lambda d: d["verificationMaterial"]["publicKey"].update(hint="0" * 64), 1, "names another key"),
])
def test_bundle_fields_outside_the_signature_are_not_malleable(signed: tuple[Path, Path], edit: Any, code: int,
                                                               message: str) -> None:
    root, public = signed
    _edit_bundle(root, edit)
    r = cli("verify", str(root), "--key", str(public), "--json")
    assert r.exit_code == code and message in r.stderr, r.output
    assert json.loads(r.stdout)["exit_code"] == code


def test_the_accepted_bundle_digest_is_reported(signed: tuple[Path, Path]) -> None:
    root, public = signed
    r = cli("verify", str(root), "--key", str(public), "--json")
    assert r.exit_code == 0, r.output
    want = hashlib.sha256((root / attest.BUNDLE_NAME).read_bytes()).hexdigest()
    assert json.loads(r.stdout)["signature"]["bundle_sha256"] == want


# --------------------------------------------------------------------------- 8. statement vs manifest


@pytest.mark.parametrize(("member", "change"), [
    ("num_entries", lambda p: p.update(num_entries=p["num_entries"] + 1)),
    ("num_files", lambda p: p.update(num_files=p["num_files"] + 1)),
    ("model", lambda p: p["model"].update(architecture="GPT2LMHeadModel")),
    ("model", lambda p: p["model"].update(model_type="gpt2")),
])
def test_every_predicate_member_must_match_the_manifest(signed: tuple[Path, Path], tmp_path: Path, member: str,
                                                        change: Callable[[dict[str, Any]], None]) -> None:
    root, _ = signed
    private, public = keys.write_keypair(tmp_path / "other")
    stmt = sign.release_statement(root)
    change(stmt["predicate"])
    payload = attest.statement_bytes(stmt)
    key = keys.load_private_key(private)
    sig = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    bundle = attest.key_bundle(payload, sig, keys.key_id(key))
    attest.write_bundle(root, json.dumps(bundle).encode())
    (root / attest.OMS_NAME).unlink()  # the signer's OpenSSF signature would fail first with this key
    with pytest.raises(VerificationError, match=f"predicate's {member} "):
        verify_result(root, SignedWithKeys((public,)))
