"""The cache of verified pieces: content-addressed, one fetch for two fetchers at once, a size limit kept by
evicting the least recently used pieces no reader links, `kvgraft cache ls|prune`."""

from __future__ import annotations

import hashlib
import json
import os
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import InputError
from kvgraft.release.format import Release
from kvgraft.remote.cache import Cache, parse_size
from kvgraft.remote.store import HttpStore
from kvgraft.remote.transfer import fetch_piece

from remote_servers import Fault, FolderServer, verified_pieces

runner = CliRunner()


def put(cache: Cache, data: bytes, used: float) -> str:
    sha = hashlib.sha256(data).hexdigest()
    tmp = cache.root / "tmp-piece"
    tmp.parent.mkdir(parents=True, exist_ok=True)
    tmp.write_bytes(data)
    os.utime(cache.store(sha, tmp), (used, used))
    return sha


def test_eviction_removes_the_least_recently_used_pieces_no_reader_links(tmp_path: Path) -> None:
    cache = Cache(tmp_path / "c", limit=250)
    old, linked, new = (put(cache, bytes([i]) * 100, used) for i, used in ((1, 1000.0), (2, 2000.0), (3, 3000.0)))
    (cache.root / "mirrors" / "rel-x").mkdir(parents=True)
    os.link(cache.piece(linked), cache.root / "mirrors" / "rel-x" / "a-mirror-holds-it")
    os.link(cache.piece(old), tmp_path / "a-link-elsewhere")  # keeps nothing from eviction
    assert [p.sha256 for p in cache.evict()] == [old]  # 300 bytes > 250: the oldest goes
    assert [p.sha256 for p in cache.evict(0)] == [new]  # the linked one stays, however old
    assert {p.sha256 for p in cache.pieces()} == {linked}


def test_sizes_are_read_in_the_units_people_write() -> None:
    assert parse_size("20GiB", "x") == 20 * 2**30 and parse_size("500MB", "x") == 500 * 10**6
    assert parse_size("1024", "x") == 1024
    with pytest.raises(InputError, match="not a size"):
        parse_size("lots", "KVGRAFT_CACHE_LIMIT")


def test_two_fetchers_of_one_piece_fetch_it_once(http: FolderServer, rel: Path, private_cache: Path) -> None:
    r = Release.open(rel)
    entry = r.entry("rec-001")
    meta = r.file_meta(entry)
    http.faults.append(Fault(f"/{entry['file']}", "slow", times=1, seconds=0.5))  # both wait on the first answer
    store, cache = HttpStore(http.url("rel")), Cache()
    got: list[Path] = []

    def fetch() -> None:  # each call takes the lock through a file description of its own, as a process does
        got.append(fetch_piece(store, cache, entry["file"], meta["sha256"], meta["size"], "entry 'rec-001'"))

    threads = [threading.Thread(target=fetch) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 2 and got[0] == got[1]
    assert len([p for p in http.paths() if p.endswith(entry["file"])]) == 1
    assert verified_pieces(private_cache) == [meta["sha256"]]


def test_cache_ls_and_prune(http: FolderServer, pub: Path, private_cache: Path) -> None:
    from kvgraft.signing.policy import Entries, SignedWithKeys
    from kvgraft.signing.verify import verify

    with verify(http.url("rel"), SignedWithKeys((pub,)), Entries(("rec-000",))) as checked:
        assert checked.origin.cache == private_cache
        listed = json.loads(runner.invoke(app, ["cache", "ls", "--json"]).stdout)
        assert listed["cache"] == str(private_cache) and len(listed["pieces"]) == 2
        assert all(p["in_use"] for p in listed["pieces"])  # the open release's mirror links them
        kept = runner.invoke(app, ["cache", "prune", "--all"])
        assert kept.exit_code == 0 and "0 pieces evicted" in kept.stdout and "0 stale mirror" in kept.stdout
        mirror = checked.root
    assert not mirror.exists()  # closed with the release that opened it
    pruned = runner.invoke(app, ["cache", "prune", "--all"])
    assert pruned.exit_code == 0 and "2 pieces evicted" in pruned.stdout
    assert verified_pieces(private_cache) == []
    assert "0 pieces" in runner.invoke(app, ["cache", "ls"]).stdout


def test_prune_removes_what_a_crashed_process_left(private_cache: Path) -> None:
    cache = Cache()
    stale = cache.root / "mirrors" / "rel-gone"
    stale.mkdir(parents=True)
    (stale / "manifest.json").write_text("{}")
    (cache.partial("a" * 64, 10) / "0000000000000000").parent.mkdir(parents=True)
    assert cache.prune_stale() == (1, 1)
    assert not stale.exists() and not list((cache.root / "partial").iterdir())


def test_a_long_fetch_prints_bytes_rate_and_time_left_and_a_short_one_nothing() -> None:
    import io

    from kvgraft.remote.transfer import Meter

    quiet, small, loud = io.StringIO(), io.StringIO(), io.StringIO()
    Meter("https://example.org/rel/entries/a", 8 * 2**20, stream=quiet).add(2**20)  # within its first 2 s
    Meter("https://example.org/rel/index/00001.json", 2**20 - 1, stream=small, after=0, every=0).add(2**19)
    meter = Meter("https://example.org/rel/entries/a", 8 * 2**20, stream=loud, after=0, every=0)
    meter.add(2 * 2**20)
    meter.add(2 * 2**20)
    lines = loud.getvalue().splitlines()
    assert quiet.getvalue() == "" and small.getvalue() == ""  # under 1 MiB in all: nothing, however slow
    assert len(lines) == 2 and lines[1].startswith("kvgraft: fetching https://example.org/rel/entries/a: 4.0 of 8.0 MiB, ")
    assert lines[1].endswith(" s left") and " MiB/s, " in lines[1]


def _verify(http: FolderServer, pub: Path, eid: str = "rec-002") -> tuple[int, str]:
    res = runner.invoke(app, ["verify", http.url("rel"), "--entry", eid, "--key", str(pub)])
    assert not list((Cache().root / "mirrors").glob("rel-*/")), "the command ended: its mirror is removed"
    return res.exit_code, res.stderr


def _entry_piece(rel: Path, cache: Path, eid: str = "rec-002") -> tuple[Path, str]:
    r = Release.open(rel)
    e = r.entry(eid)
    sha = r.file_meta(e)["sha256"]
    return cache / "pieces" / sha[:2] / sha, e["file"]


@pytest.mark.parametrize("damage", ["flipped byte", "symlink to the right bytes"])
def test_a_damaged_cached_piece_is_evicted_fetched_again_and_named(damage: str, http: FolderServer, rel: Path,
                                                                   pub: Path, private_cache: Path,
                                                                   tmp_path: Path) -> None:
    assert _verify(http, pub) == (0, "")
    piece, file = _entry_piece(rel, private_cache)
    good = piece.read_bytes()
    piece.chmod(0o644)
    if damage == "flipped byte":
        piece.write_bytes(good[:50] + bytes([good[50] ^ 1]) + good[51:])
    else:
        (tmp_path / "elsewhere").write_bytes(good)
        piece.unlink()
        piece.symlink_to(tmp_path / "elsewhere")
    http.log.clear()
    code, err = _verify(http, pub)
    assert code == 0, err
    assert err.strip() == (f"kvgraft: note: {piece}: the cached piece of {http.url('rel')}/{file} no longer matched "
                           f"its SHA-256; evicted from the cache and fetched again")
    assert [r for r in http.log if r.path.endswith(file)]  # fetched once more
    assert not piece.is_symlink() and piece.read_bytes() == good
    assert (tmp_path / "elsewhere").exists() or damage == "flipped byte"  # a link's target is not ours to delete


def test_junk_left_in_partial_is_not_blamed_on_the_server(http: FolderServer, rel: Path, pub: Path,
                                                          private_cache: Path) -> None:
    r = Release.open(rel)
    e = r.entry("rec-002")
    meta = r.file_meta(e)
    work = Cache().partial(meta["sha256"], meta["size"])
    work.mkdir(parents=True)
    (work / f"{0:016d}").write_bytes(b"junk an earlier process left" * 3)
    code, err = _verify(http, pub)
    assert (code, err) == (0, "")
    assert meta["sha256"] in verified_pieces(private_cache)


def test_pulled_files_are_copies_and_prune_bounds_every_piece(http: FolderServer, rel: Path, pub: Path,
                                                              private_cache: Path, tmp_path: Path) -> None:
    out = tmp_path / "subset"
    assert runner.invoke(app, ["pull", http.url("rel"), "--entry", "rec-002", "--out", str(out)]).exit_code == 0
    assert not list((private_cache / "mirrors").iterdir()), "the command ended: its mirror (and lock) removed"
    piece, file = _entry_piece(rel, private_cache)
    pulled = out / file
    assert not os.path.samefile(piece, pulled) and piece.stat().st_nlink == 1
    pulled.chmod(0o644)
    pulled.write_bytes(b"edited by its owner")
    assert hashlib.sha256(piece.read_bytes()).hexdigest() == piece.name  # the cache's bytes are untouched
    os.link(piece, tmp_path / "a-link-elsewhere")  # a link outside the cache's mirrors keeps nothing
    res = runner.invoke(app, ["cache", "prune", "--all"])
    assert res.exit_code == 0 and verified_pieces(private_cache) == [], res.stdout


def test_the_cache_limit_applies_when_a_process_ends_without_a_prune(http: FolderServer, pub: Path,
                                                                     private_cache: Path) -> None:
    import subprocess
    import sys

    env = {**os.environ, "KVGRAFT_CACHE_LIMIT": "1"}
    cli = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]
    done = subprocess.run([*cli, "verify", http.url("rel"), "--entry", "rec-002", "--key", str(pub)], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert [r for r in http.log if "/entries/" in r.path]  # something was fetched and cached
    assert verified_pieces(private_cache) == []  # and evicted at the end: 1 byte holds no piece
