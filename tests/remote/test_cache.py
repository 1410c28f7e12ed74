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
from kvgraft.remote import mirror
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
    assert runner.invoke(app, ["verify", http.url("rel"), "--entry", "rec-000", "--key", str(pub)]).exit_code == 0
    listed = json.loads(runner.invoke(app, ["cache", "ls", "--json"]).stdout)
    assert listed["cache"] == str(private_cache) and len(listed["pieces"]) == 2
    assert all(p["in_use"] for p in listed["pieces"])  # the verify's mirror still links them (same process)
    kept = runner.invoke(app, ["cache", "prune", "--all"])
    assert kept.exit_code == 0 and "0 pieces evicted" in kept.stdout and "0 stale mirror" in kept.stdout
    mirror.close_all()  # what the end of that process does
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

    quiet, loud = io.StringIO(), io.StringIO()
    Meter("https://example.org/rel/entries/a", 8 * 2**20, stream=quiet).add(2**20)  # within its first 2 s
    meter = Meter("https://example.org/rel/entries/a", 8 * 2**20, stream=loud, after=0, every=0)
    meter.add(2 * 2**20)
    meter.add(2 * 2**20)
    lines = loud.getvalue().splitlines()
    assert quiet.getvalue() == ""
    assert len(lines) == 2 and lines[1].startswith("kvgraft: fetching https://example.org/rel/entries/a: 4.0 of 8.0 MiB, ")
    assert lines[1].endswith(" s left") and " MiB/s, " in lines[1]
