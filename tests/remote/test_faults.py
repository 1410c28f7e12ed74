"""Faults of a real HTTP server on 127.0.0.1: each is a retry that succeeds or one line naming URL, entry and bytes.

None leaves a piece in the cache that did not hash to its name (`verified_pieces`), and none lets a byte
that failed its check be used.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import IntegrityError
from kvgraft.release import integrity
from kvgraft.release.format import Release
from kvgraft.remote.store import Settings
from kvgraft.signing.policy import verify_policy
from kvgraft.signing.verify import verified

from release_factory import make_release
from remote_servers import Fault, FolderServer, quiet, verified_pieces

runner = CliRunner()
CHUNK = 512  # bytes per range request here: an entry file of these tests is fetched as about ten ranges


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settings, "chunk", CHUNK)


def entry_of(rel: Path, eid: str) -> tuple[str, str, int]:
    """(file, sha256, size) of an entry's file."""
    r = Release.open(rel)
    e = r.entry(eid)
    meta = r.file_meta(e)
    return e["file"], meta["sha256"], meta["size"]


def verify(server: FolderServer, pub: Path, eid: str = "rec-002") -> tuple[int, str]:
    res = runner.invoke(app, ["verify", server.url("rel"), "--entry", eid, "--key", str(pub)])
    return res.exit_code, quiet(res.stderr)


def ranges_asked(server: FolderServer, file: str) -> list[str | None]:
    return [r.range for r in server.log if r.path.endswith("/" + file)]


def test_a_connection_dropped_mid_entry_is_resumed_after_the_bytes_received(http: FolderServer, rel: Path, pub: Path,
                                                                            private_cache: Path) -> None:
    file, sha, size = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", "drop", times=1, after=100))
    assert verify(http, pub) == (0, "")
    asked = ranges_asked(http, file)
    assert len(asked) == -(-size // CHUNK) + 1  # every range once, and the dropped one again
    first = asked[0]
    assert first is not None
    start = int(first.split("=")[1].split("-")[0])
    assert f"bytes={start + 100}-{first.split('-')[1]}" in asked[1:]  # resumed after the 100 bytes received
    assert sha in verified_pieces(private_cache)


def test_a_connection_dropped_on_every_try_is_one_line_and_a_later_run_resumes(http: FolderServer, rel: Path,
                                                                               pub: Path, private_cache: Path,
                                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settings, "chunk", 1 << 20)  # one range: the file
    file, sha, size = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", "drop", times=-1, after=300))
    code, line = verify(http, pub)
    assert code == 2 and "\n" not in line
    assert line.startswith(f"kvgraft: error: {http.url('rel')}/{file}: entry 'rec-002': bytes [0, {size}): the answer ended "
                           f"after 900 of {size} bytes")
    assert line.endswith("(3 tries)")
    assert sha not in verified_pieces(private_cache)
    http.faults.clear()
    http.log.clear()
    assert verify(http, pub) == (0, "")
    assert ranges_asked(http, file) == [f"bytes=900-{size - 1}"]  # resumed from the 900 bytes kept
    assert sha in verified_pieces(private_cache)


def test_other_bytes_for_a_range_are_refused_naming_the_tensor_and_nothing_is_cached(http: FolderServer, rel: Path,
                                                                                     pub: Path,
                                                                                     private_cache: Path) -> None:
    file, sha, _ = entry_of(rel, "rec-002")
    a, b = Release.open(rel).entry("rec-002")["tensors"]["layer.0.values"]["byte_range"]
    http.faults.append(Fault(f"/{file}", "corrupt", times=-1, at=a + 3))
    code, line = verify(http, pub)
    assert code == 1 and "\n" not in line
    assert f"{http.url('rel')}/{file}: entry 'rec-002': bytes [{a}, {b}) (tensor 'layer.0.values'): sha256 " in line
    assert "nothing was cached" in line
    assert sha not in verified_pieces(private_cache)
    assert not list((private_cache / "partial").glob("*"))


@pytest.mark.parametrize("kind", ["short-length", "long-length"])
def test_a_wrong_content_length_is_retried_and_the_bytes_checked(kind: str, http: FolderServer, rel: Path, pub: Path,
                                                                 private_cache: Path) -> None:
    file, sha, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", kind, times=1, by=40))
    assert verify(http, pub) == (0, "")
    assert sha in verified_pieces(private_cache)


def test_more_bytes_than_the_range_asked_for_are_refused(http: FolderServer, rel: Path, pub: Path,
                                                          private_cache: Path) -> None:
    file, sha, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", "extra", times=-1, by=7))
    code, line = verify(http, pub)
    assert code == 2 and "\n" not in line
    assert f"{http.url('rel')}/{file}: entry 'rec-002': bytes [" in line
    assert "the server sent more than the" in line
    assert sha not in verified_pieces(private_cache)


def test_5xx_answers_are_retried(http: FolderServer, rel: Path, pub: Path) -> None:
    file, _, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", "status", times=2, status=503))
    assert verify(http, pub) == (0, "")
    statuses = [r.status for r in http.log if r.path.endswith(file)]
    assert statuses[:2] == [503, 503] and set(statuses[2:]) == {206}


def test_5xx_on_every_try_is_one_line(http: FolderServer, rel: Path, pub: Path) -> None:
    file, _, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault("/index/", "status", times=-1, status=500))
    code, line = verify(http, pub)
    assert code == 2
    assert line.startswith(f"kvgraft: error: {http.url('rel')}/index/") and "HTTP 500" in line and line.endswith("(3 tries)")
    assert not [p for p in http.paths() if p.endswith(file)]  # the entry is not read before its index shard


def test_a_stall_times_out_with_a_clear_message(http: FolderServer, rel: Path, pub: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGRAFT_REMOTE_TIMEOUT", "0.3")
    file, _, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", "stall", times=-1, after=10, seconds=30))
    started = time.monotonic()
    code, line = verify(http, pub)
    assert code == 2
    assert f"{http.url('rel')}/{file}: entry 'rec-002': bytes [" in line
    assert "no data for 0.3 s (timed out) (3 tries)" in line
    assert time.monotonic() - started < 20  # the stalled server would hold each try for 30 s


def test_a_redirect_is_followed(http: FolderServer, rel: Path, pub: Path) -> None:
    http.folders["moved"] = rel
    file, _, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/rel/{file}", "redirect", times=-1, to=f"/moved/{file}"))
    assert verify(http, pub) == (0, "")
    assert next(r.status for r in http.log if r.path == f"/rel/{file}") == 302
    assert [r for r in http.log if r.path == f"/moved/{file}"]


def test_a_404_for_one_entry_names_it_and_the_others_still_verify(http: FolderServer, rel: Path, pub: Path) -> None:
    file, _, _ = entry_of(rel, "rec-002")
    http.faults.append(Fault(f"/{file}", "missing", times=-1))
    code, line = verify(http, pub)
    assert code == 1
    assert line == f"kvgraft: error: {http.url('rel')}/{file}: entry 'rec-002': missing on the server (HTTP 404)"
    assert verify(http, pub, "rec-001") == (0, "")


def test_a_server_without_ranges_is_read_whole(http: FolderServer, rel: Path, pub: Path, private_cache: Path) -> None:
    http.ranges = False
    _, sha, _ = entry_of(rel, "rec-002")
    assert verify(http, pub) == (0, "")
    assert sha in verified_pieces(private_cache)


def test_a_release_changed_on_the_server_after_its_manifest_was_read(http: FolderServer, rel: Path, pub: Path,
                                                                     tmp_path: Path, private_cache: Path) -> None:
    checked = verified(http.url("rel"), verify_policy(key=pub))
    newer = tmp_path / "newer"
    make_release(newer, entries=5, format_version=2, shard_entries=2, tokens=20, seed=7)
    shutil.rmtree(rel)
    shutil.copytree(newer, rel)
    with pytest.raises(IntegrityError) as caught:
        integrity.check_entry(checked.release, "rec-002")
    line = caught.value.diagnostics()
    assert line.startswith(f"{http.url('rel')}/index/00001.json: index shard 1: sha256 ")
    assert "did the release change on the server after its manifest was read?" in line
    assert len(verified_pieces(private_cache)) == 0
