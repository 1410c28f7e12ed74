"""One verification per release: `kvgraft run` of a signed release enters kvgraft.signing.verify at most twice, and a
verification looks at and reads each signature file (release.sigstore.json, model.sig, a detached model.sig named with
--oms-signature) at most once."""

from __future__ import annotations

import os
import shutil
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest
from typer.testing import CliRunner

import kvgraft.signing.verify as verify_module
from kvgraft.cli import app
from kvgraft.errors import VerificationError
from kvgraft.signing import keys, sign
from kvgraft.signing.attest import BUNDLE_NAME, OMS_NAME
from kvgraft.signing.policy import ALL, OPEN, SignedWithKeys
from kvgraft.signing.verify import verify

SIGNATURES = (BUNDLE_NAME, OMS_NAME)


@pytest.fixture(scope="module")
def signed(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A release of one entry signed with an ECDSA key (release.sigstore.json and model.sig): (release, key, other)."""
    from kvgraft.inference import capture

    base = tmp_path_factory.mktemp("verify-once")
    capture.capture(tiny_lm("llama"), [("t", {"id": "e1", "text": "Mia has 3 apples."})], base / "rel", probe_tokens=0)
    private, public = keys.write_keypair(base / "signer")
    sign.sign_release(base / "rel", keys.load_private_key(private))
    assert {BUNDLE_NAME, OMS_NAME} <= set(os.listdir(base / "rel"))
    _, other = keys.write_keypair(base / "other")
    return base / "rel", public, other


@contextmanager
def calls_into_verify() -> Iterator[list[str]]:
    """The functions of kvgraft/signing/verify.py called from outside it, in order (a profile hook)."""
    here, entered = verify_module.__file__, []

    def hook(frame: FrameType, event: str, _arg: Any) -> None:
        if event == "call" and frame.f_code.co_filename == here and (
                frame.f_back is None or frame.f_back.f_code.co_filename != here):
            entered.append(frame.f_code.co_name)

    sys.setprofile(hook)
    try:
        yield entered
    finally:
        sys.setprofile(None)


@contextmanager
def signature_file_use(monkeypatch: pytest.MonkeyPatch) -> Iterator[Counter[tuple[Path, str]]]:
    """(signature file's path, "looked at" or "read") -> how often: every stat and every open of a file named as a
    signature file is (release.sigstore.json, model.sig), wherever it lies."""
    seen: Counter[tuple[Path, str]] = Counter()

    def counted(real: Callable[..., Any], how: str) -> Callable[..., Any]:
        def call(path: Any, *args: Any, **kwargs: Any) -> Any:
            named = Path(os.fsdecode(path)) if isinstance(path, str | bytes | os.PathLike) else None
            if named is not None and named.name in SIGNATURES:
                seen[(named, how)] += 1
            return real(path, *args, **kwargs)
        return call

    for fn, how in (("stat", "looked at"), ("lstat", "looked at"), ("open", "read")):
        monkeypatch.setattr(os, fn, counted(getattr(os, fn), how))
    yield seen
    monkeypatch.undo()


def test_kvgraft_run_enters_verify_at_most_twice_and_reads_each_signature_once(
        signed: tuple[Path, Path, Path], tiny_dir: Callable[[str], Path], monkeypatch: pytest.MonkeyPatch) -> None:
    rel, public, _ = signed
    args = ["run", str(rel), "--model", str(tiny_dir("llama")), "-n", "2", "--key", str(public), "--entry", "e1",
            "--prompt", " How many?", "--json"]
    with signature_file_use(monkeypatch) as seen, calls_into_verify() as entered:
        res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    assert len(entered) <= 2, entered
    assert entered[0] == "verified"
    assert max(seen.values()) == 1, seen
    assert seen[(rel / BUNDLE_NAME, "read")] == 1  # the signature checked (model.sig: looked at; the bundle binds every byte)


@pytest.mark.parametrize("scope", [OPEN, ALL], ids=["open", "all"])
def test_one_verification_reads_each_signature_file_once(signed: tuple[Path, Path, Path], scope: Any,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    rel, public, _ = signed
    with signature_file_use(monkeypatch) as seen:
        verify(rel, SignedWithKeys((public,)), scope).close()
    assert max(seen.values()) == 1, seen
    assert seen[(rel / OMS_NAME, "read")] == (1 if scope is ALL else 0)


def test_a_refusal_reads_each_signature_file_once(signed: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    """A key that verifies neither signature: the advice that names the other signature reads model.sig once."""
    rel, _, other = signed
    with signature_file_use(monkeypatch) as seen, pytest.raises(VerificationError):
        verify(rel, SignedWithKeys((other,)), ALL)
    assert seen[(rel / BUNDLE_NAME, "read")] == 1 and seen[(rel / OMS_NAME, "read")] == 1, seen
    assert max(seen.values()) == 1, seen


@pytest.mark.parametrize("scope", [OPEN, ALL], ids=["open", "all"])
def test_a_detached_oms_signature_is_looked_at_and_read_once(signed: tuple[Path, Path, Path], scope: Any,
                                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """model.sig kept outside the release and named (--oms-signature): checked with the key, looked at once, read once;
    the release's own model.sig, absent, looked for once."""
    rel, public, _ = signed
    copy, detached = tmp_path / "rel", tmp_path / "elsewhere" / OMS_NAME
    shutil.copytree(rel, copy)
    detached.parent.mkdir()
    (copy / OMS_NAME).rename(detached)
    with signature_file_use(monkeypatch) as seen, verify(copy, SignedWithKeys((public,), oms_signature=detached),
                                                         scope) as checked:
        signature = checked.checked.signature
    assert signature.oms_signature == str(detached) and signature.oms_verified
    assert seen[(detached, "looked at")] == 1 and seen[(detached, "read")] == 1, seen
    assert seen[(copy / OMS_NAME, "looked at")] == 1 and seen[(copy / OMS_NAME, "read")] == 0, seen
    assert max(seen.values()) == 1, seen
