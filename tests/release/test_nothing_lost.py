"""Nothing lost, nothing half-written: a replaced release, refused writes and concurrent writers.

Each test pairs the failure it injects with what must survive: the previous artifact (or the new one,
complete) at the output path, one line naming the path and cause, and no leftover beside it.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from kvgraft._internal import jsonio
from kvgraft.errors import EXIT_BUSY, EXIT_INPUT, EXIT_IO, BusyError, IOFailure
from kvgraft.release.integrity import check_release
from kvgraft.signing.policy import SignedWithKeys
from tests.release_factory import make_release


def _root(out: Path) -> str:
    return str(jsonio.load_file(out / "manifest.json")["root_digest"])


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


def test_a_replaced_release_that_cannot_be_removed_is_named_and_cleared_by_the_next_write(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "rel"
    make_release(out, entries=2, seed=1)
    real_unlink = os.unlink

    def refuse(path: Any, *args: Any, **kwargs: Any) -> None:  # the old release's entry files only
        if str(path).endswith(".safetensors"):
            raise PermissionError(errno.EACCES, "Permission denied", str(path))
        real_unlink(path, *args, **kwargs)

    monkeypatch.setattr(os, "unlink", refuse)
    new = make_release(out, entries=2, seed=2, overwrite=True)
    monkeypatch.undo()
    err = capsys.readouterr().err
    leftovers = [n for n in _names(tmp_path) if n != "rel"]
    assert _root(out) == new["root_digest"] and check_release(out).files
    assert len(leftovers) == 1 and f"{tmp_path / leftovers[0]}" in err and "could not be removed" in err, (leftovers, err)
    make_release(out, entries=1, seed=3, overwrite=True)  # the next writer of rel clears it
    assert _names(tmp_path) == ["rel"]


def test_a_replace_whose_second_rename_fails_puts_the_previous_release_back(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the file system cannot swap in one step, the old release is moved aside and the new one moved in;
    when that second rename fails, the old release goes back: the output path is never left empty."""
    out = tmp_path / "rel"
    before = make_release(out, entries=2, seed=1)["root_digest"]

    def no_exchange(a: Path, b: Path) -> None:
        raise OSError(errno.EINVAL, "Invalid argument", str(b))

    real_replace = os.replace

    def failing(src: Any, dst: Any) -> None:
        if Path(dst) == out and Path(src).name.endswith(".partial"):
            raise OSError(errno.EIO, "Input/output error")
        real_replace(src, dst)

    monkeypatch.setattr(jsonio, "exchange", no_exchange)
    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(IOFailure, match=f"^{out}: cannot write: Input/output error \\(EIO\\)$"):
        make_release(out, entries=2, seed=2, overwrite=True)
    monkeypatch.undo()
    assert _root(out) == before and check_release(out).files and _names(tmp_path) == ["rel"]
    # The positive control: without the failure the same two-step path replaces the release.
    monkeypatch.setattr(jsonio, "exchange", no_exchange)
    after = make_release(out, entries=2, seed=2, overwrite=True)["root_digest"]
    assert after != before and _root(out) == after and _names(tmp_path) == ["rel"]


def test_readers_during_replaces_see_the_old_or_the_new_release(tmp_path: Path) -> None:
    out = tmp_path / "rel"
    roots = {make_release(out, entries=2, seed=0)["root_digest"]}
    seen: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def read() -> None:
        while not stop.is_set():
            try:
                seen.append(check_release(out).manifest["root_digest"])
            except Exception as exc:  # anything but a whole release, old or new, is a failure
                failures.append(f"{type(exc).__name__}: {exc}")

    reader = threading.Thread(target=read)
    reader.start()
    try:
        for seed in range(1, 9):
            roots.add(make_release(out, entries=2, seed=seed, overwrite=True)["root_digest"])
    finally:
        stop.set()
        reader.join()
    assert not failures, failures[:3]
    assert seen and set(seen) <= roots
    assert _names(tmp_path) == ["rel"]


_HOLD = """
import sys
from pathlib import Path
from kvgraft.release.format import ReleaseWriter
w = ReleaseWriter(Path(sys.argv[1]), overwrite=True)
print("held", flush=True)
sys.stdin.readline()
"""


def test_a_second_writer_is_refused_and_a_killed_writer_leaves_no_stuck_lock(tmp_path: Path) -> None:
    out = tmp_path / "rel"
    before = make_release(out, entries=1, seed=1)["root_digest"]
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD, str(out)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(BusyError, match="another process is writing it now") as info:
            make_release(out, entries=1, seed=2, overwrite=True)
        assert info.value.exit_code == EXIT_BUSY
        assert _root(out) == before
    finally:
        holder.kill()  # SIGKILL: no cleanup runs in the holder
        holder.wait()
    assert any(n.endswith(".partial") for n in _names(tmp_path))  # what the killed writer left
    after = make_release(out, entries=1, seed=2, overwrite=True)["root_digest"]
    assert after != before and _names(tmp_path) == ["rel"]


def test_a_journal_held_by_one_audit_is_refused_to_another(tmp_path: Path) -> None:
    from kvgraft.execution.journal import Journal

    path = tmp_path / "j.jsonl"
    first = Journal.open(path, {"r": 1}, {"a", "b"})
    first.record("a", {"ok": True})
    with pytest.raises(BusyError, match="another audit is writing this journal now"):
        Journal.open(path, {"r": 1}, {"a", "b"})
    first.close()
    again = Journal.open(path, {"r": 1}, {"a", "b"})  # the control: once closed, it resumes
    assert again.done == {"a": {"ok": True}}
    again.remove()
    assert _names(tmp_path) == []


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_a_refused_atomic_write_names_the_path_and_keeps_the_previous_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    path = tmp_path / "report.json"
    jsonio.write_json(path, {"v": 1})

    def refuse(fd: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", refuse)
    with pytest.raises(IOFailure) as info:
        jsonio.write_json(path, {"v": 2})
    monkeypatch.undo()
    assert str(info.value) == f"{path}: cannot write: {os.strerror(code)} ({errno.errorcode[code]})"
    assert info.value.exit_code == EXIT_IO
    assert jsonio.load_file(path) == {"v": 1} and _names(tmp_path) == ["report.json"]


def test_an_infinite_difference_is_infinity_not_the_largest_float() -> None:
    import torch

    from kvgraft.recompute.compare import diff_tensors
    from kvgraft.recompute.noise import judge

    stored, fresh = torch.tensor([1.0, float("inf")]), torch.tensor([1.0, 2.0])
    assert diff_tensors(stored, fresh).max_abs == float("inf")
    assert judge(stored, fresh, torch.tensor(1e-3)).max_excess == float("inf")
    # The control: a finite difference stays the number it is.
    assert diff_tensors(torch.tensor([1.0, 4.0]), fresh).max_abs == 2.0


def test_a_recompute_result_with_an_infinite_difference_is_written_as_infinity_and_valid(
        tiny_lm: Any, tmp_path: Path) -> None:
    import json

    from kvgraft.audit.checks import seal
    from kvgraft.inference import capture
    from kvgraft.recompute import audit as recompute
    from kvgraft.schema import validate
    from kvgraft.signing.policy import SignatureNotChecked
    from kvgraft.signing.verify import verified
    from tests import rewrite

    lm = tiny_lm("llama")
    rel = tmp_path / "rel"
    capture.capture(lm, [("t", {"id": "a", "text": "The train travels 60 km per hour for 3 hours."})], rel,
                    probe_tokens=2)
    rewrite._single(rel)
    name = sorted(json.loads((rel / "manifest.json").read_text())["entries"][0]["tensors"])[0]
    rewrite.element(rel, 0, name, 0, lambda _old: float("inf"))
    result = seal("recompute", recompute.audit(verified(rel, SignatureNotChecked()), lm))
    path = tmp_path / "r.json"
    jsonio.write_json(path, result)
    text = path.read_text()
    assert "1.7976931348623157e+308" not in text and '"max_abs": "Infinity"' in text
    validate(jsonio.load_file(path), "recompute-result.v1.json", str(path))
    assert jsonio.canonical(result) == jsonio.canonical(jsonio.load_file(path))  # digests agree with the file


@pytest.mark.parametrize("failing", ["model.sig", "release.sigstore.json"])
def test_a_sign_whose_write_is_refused_leaves_a_release_that_verifies_with_one_key(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, failing: str) -> None:
    """sign writes two files, the bundle and model.sig (which names the bundle's digest): a refused write of
    either leaves the previous signature whole, never a new bundle beside an old model.sig (which verifies
    with no key)."""
    from kvgraft.signing import keys
    from kvgraft.signing.sign import sign_release
    from tests.verifying import verify_result

    rel = tmp_path / "rel"
    make_release(rel, entries=2, format_version=2)
    (old_key, old_pub), (new_key, new_pub) = keys.write_keypair(tmp_path / "a"), keys.write_keypair(tmp_path / "b")
    sign_release(rel, keys.load_private_key(old_key))
    old_sig = (rel / "model.sig").read_bytes()
    previous = {name: (rel / name).read_bytes() for name in ("model.sig", "release.sigstore.json")}
    real = jsonio.write_atomic

    def refuse(path: Path, data: bytes, mode: int = 0o644, **kw: Any) -> None:  # the new signature's, not the put-back
        if path.name == failing and data != previous[failing]:
            raise IOFailure(f"{path}: cannot write: No space left on device (ENOSPC)")
        real(path, data, mode, **kw)

    monkeypatch.setattr(jsonio, "write_atomic", refuse)
    with pytest.raises(IOFailure):
        sign_release(rel, keys.load_private_key(new_key))
    monkeypatch.undo()
    verify_result(rel, SignedWithKeys((old_pub,)))  # the previous signature whole, model.sig included
    assert (rel / "model.sig").read_bytes() == old_sig
    assert sorted(p.name for p in rel.iterdir() if p.name.startswith(".")) == []
    sign_release(rel, keys.load_private_key(new_key))  # the control: unrefused, the new key signs
    verify_result(rel, SignedWithKeys((new_pub,)))


def test_a_sign_leaves_nothing_inside_the_release_at_any_moment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Its lock and the signature files' temp files lie beside the release: a kill at any point leaves the folder
    as it was or signed, which verifies. Each fsync and rename (a temp file exists at each) looks inside."""
    from kvgraft.signing import keys
    from kvgraft.signing.sign import sign_release
    from tests.verifying import verify_result

    rel = tmp_path / "rel"
    make_release(rel, entries=2, format_version=2)
    private, public = keys.write_keypair(tmp_path / "k")
    inside: list[str] = []
    beside: list[str] = []
    real_replace, real_fsync = os.replace, os.fsync

    def look() -> None:
        inside.extend(n for n in os.listdir(rel) if n.startswith("."))
        beside.extend(n for n in os.listdir(tmp_path) if n.startswith(".rel."))

    def replace(src: Any, dst: Any) -> None:
        look()
        real_replace(src, dst)

    def fsync(fd: int) -> None:
        look()
        real_fsync(fd)

    monkeypatch.setattr(os, "replace", replace)
    monkeypatch.setattr(os, "fsync", fsync)
    sign_release(rel, keys.load_private_key(private))
    monkeypatch.undo()
    assert inside == []
    assert any(n.endswith(".tmp") for n in beside) and ".rel.lock" in beside  # where they were: the control
    verify_result(rel, SignedWithKeys((public,)))
    assert _names(tmp_path) == ["k.key.pem", "k.pub.pem", "rel"]


_HOLD_LOCK = """
import sys
from pathlib import Path
from kvgraft._internal.jsonio import OutputLock
with OutputLock(Path(sys.argv[1])):
    print("held", flush=True)
    sys.stdin.readline()
"""


def test_a_sign_and_a_capture_of_one_release_exclude_each_other(tmp_path: Path) -> None:
    """Two signs of one release at once could leave one's bundle beside the other's model.sig (which verifies
    with neither key); a capture replacing it meanwhile, a signature of the release it replaced. Both take the
    release's lock: a second writer is refused at once (exit 8), and a killed holder leaves none stuck."""
    from kvgraft.signing import keys
    from kvgraft.signing.sign import sign_release
    from tests.verifying import verify_result

    rel = tmp_path / "rel"
    make_release(rel, entries=1, format_version=2)
    private, public = keys.write_keypair(tmp_path / "k")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    holder = subprocess.Popen([sys.executable, "-c", _HOLD_LOCK, str(rel)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, env=env)
    try:
        assert holder.stdout is not None and holder.stdout.readline() == b"held\n"
        with pytest.raises(BusyError, match="another process is writing it now") as info:
            sign_release(rel, keys.load_private_key(private))
        assert info.value.exit_code == EXIT_BUSY
        assert not (rel / "release.sigstore.json").exists()
        with pytest.raises(BusyError):
            make_release(rel, entries=1, seed=3, format_version=2, overwrite=True)
    finally:
        holder.kill()
        holder.wait()
    sign_release(rel, keys.load_private_key(private))  # the control: the lock gone with its holder
    verify_result(rel, SignedWithKeys((public,)))


def test_a_release_on_another_file_system_than_its_parent_is_signed_from_inside(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rename cannot cross file systems (EXDEV): a release folder that is a mount point gets its signature's
    temp file inside, as before, and is signed whole."""
    from kvgraft.signing import keys
    from kvgraft.signing.sign import sign_release
    from tests.verifying import verify_result

    rel = tmp_path / "rel"
    make_release(rel, entries=1, format_version=2)
    private, public = keys.write_keypair(tmp_path / "k")
    real_replace = os.replace
    crossed: list[str] = []

    def replace(src: Any, dst: Any) -> None:
        if Path(src).parent != Path(dst).parent:
            crossed.append(Path(dst).name)
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    sign_release(rel, keys.load_private_key(private))
    monkeypatch.undo()
    assert sorted(crossed) == ["model.sig", "release.sigstore.json"]
    verify_result(rel, SignedWithKeys((public,)))
    assert _names(tmp_path) == ["k.key.pem", "k.pub.pem", "rel"]


def _read_only(folder: Path, command: str) -> subprocess.CompletedProcess[str]:
    """`command` in a private mount namespace where `folder` is a read-only bind mount of itself."""
    script = f"mount --bind {folder} {folder} && mount -o remount,ro,bind {folder} && {command}"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    return subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True, env=env, check=False)


@pytest.mark.skipif(os.geteuid() != 0, reason="a read-only bind mount in a private namespace needs root")
def test_read_only_outputs_are_one_line_naming_the_path(tmp_path: Path) -> None:
    """Found before any work (jsonio.check_writable): unusable input, exit 2. A write the system refuses
    once the work has begun is exit 7 (the injection tests)."""
    from kvgraft.signing import keys
    from tests.verifying import verify_result

    rel, keydir = tmp_path / "rel", tmp_path / "keys"
    make_release(rel, entries=2, format_version=2)
    keydir.mkdir()
    private, public = keys.write_keypair(tmp_path / "a")
    kvgraft = f"{sys.executable} -c 'from kvgraft.cli import entrypoint; entrypoint()'"
    control = _read_only(keydir, f"! touch {keydir / 'probe'}")
    assert control.returncode == 0, control.stderr  # the namespace and the read-only mount work here
    signed = _read_only(rel, f"{kvgraft} sign {rel} --key {private}")
    made = _read_only(keydir, f"{kvgraft} keygen --out {keydir / 'k'}")
    for done, path in ((signed, rel / "release.sigstore.json"), (made, keydir / "k")):
        assert done.returncode == EXIT_INPUT, done.stderr
        assert done.stderr.strip() == f"kvgraft: error: {path}: cannot write it: Read-only file system ({path.parent})"
    assert _names(keydir) == [] and not (rel / "release.sigstore.json").exists()
    check_release(rel)
    # The control: writable, the same command signs.
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    done = subprocess.run(["sh", "-c", f"{kvgraft} sign {rel} --key {private}"], capture_output=True, env=env, check=False)
    assert done.returncode == 0, done.stderr
    verify_result(rel, SignedWithKeys((public,)))


def test_a_keygen_whose_public_key_write_is_refused_keeps_the_previous_pair(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.signing import keys

    private, public = keys.write_keypair(tmp_path / "k")
    old = private.read_bytes(), public.read_bytes()
    real = jsonio.write_atomic

    def refuse(path: Path, data: bytes, mode: int = 0o644) -> None:
        if path == public and data != old[1]:
            raise IOFailure(f"{path}: cannot write: Input/output error (EIO)")
        real(path, data, mode)

    monkeypatch.setattr(jsonio, "write_atomic", refuse)
    with pytest.raises(IOFailure):
        keys.write_keypair(tmp_path / "k", overwrite=True)
    monkeypatch.undo()
    assert (private.read_bytes(), public.read_bytes()) == old and _names(tmp_path) == ["k.key.pem", "k.pub.pem"]
    assert private.stat().st_mode & 0o777 == 0o600


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EIO, errno.EDQUOT])
def test_a_writability_probe_the_system_fails_is_exit_7_not_unusable_input(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int) -> None:
    """check_writable's probe (an unnamed temp file, else a named one) refused by a full disk, a failing device or
    a quota (no inode left: both opens fail) is a refused write, exit 7 naming the errno; a read-only folder or a
    missing permission stays unusable input, exit 2 (test above). Was exit 2 for every errno (the inject campaign's
    pyopen fails one open at a time, which TemporaryFile's fallback absorbs: found by reading)."""
    from typer.testing import CliRunner

    from kvgraft.cli import app

    def refused(*args: Any, **kwargs: Any) -> Any:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(jsonio.tempfile, "TemporaryFile", refused)
    r = CliRunner().invoke(app, ["keygen", "--out", str(tmp_path / "k")])
    assert r.exit_code == EXIT_IO, r.output
    assert r.stderr.strip() == f"kvgraft: error: {tmp_path / 'k'}: cannot write: {os.strerror(code)} ({errno.errorcode[code]})"
    assert _names(tmp_path) == []
