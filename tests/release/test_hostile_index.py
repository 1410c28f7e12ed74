"""Hostile releases: the indexed format (format 2). The manifest's numbers are the attacker's (an
unsigned release, or one re-signed with the attacker's key k3 and verified with `--key k3`): an index file's size
is bounded by kvgraft, not by what the manifest says, before anything is read; the prefix index is never held
whole; every prefix record is checked by `verify`, and a bad one met by a lookup is an IntegrityError."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from test_hostile_sizes import _one_line
from typer.testing import CliRunner

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.cli import app
from kvgraft.errors import InputError, IntegrityError
from kvgraft.release import index as release_index
from kvgraft.release import integrity
from kvgraft.release.format import Release
from kvgraft.release.records import MANIFEST, root_digest
from kvgraft.signing import keys

from release_factory import make_many, make_release, sign_as

runner = CliRunner()
ENTRIES, TOKENS = 5, 40  # two blocks of 16 an entry: ten prefix records


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("hostile-index")
    private, public = keys.write_keypair(folder / "k3")
    make_release(folder / "rel", entries=ENTRIES, tokens=TOKENS, seed=31, format_version=2, shard_entries=2)
    sign_as(folder / "rel", private)
    return folder / "rel", private, public


@pytest.fixture
def rel(built: tuple[Path, Path, Path], tmp_path: Path) -> Path:
    return Path(shutil.copytree(built[0], tmp_path / "rel"))


def cli(*args: Any) -> Any:
    return runner.invoke(app, [str(a) for a in args])


def _manifest(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Edit manifest.json and recompute its root digest: what the attacker publishes."""
    m = json.loads((root / MANIFEST).read_text())
    change(m)
    m["root_digest"] = root_digest(m)
    (root / MANIFEST).write_text(json.dumps(m))


def _index_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The index files read from here on (whole, or hashed by verify), by name."""
    seen: list[str] = []

    def named(path: Any) -> None:
        if "/index/" in str(path):
            seen.append(str(path))

    real_bounded, real_fd, real_hash = jsonio.read_bounded, jsonio.read_fd_bounded, integrity.hash_file

    def bounded(path: Path, *a: Any) -> bytes:
        named(path)
        return real_bounded(path, *a)

    def by_fd(fd: int, *a: Any) -> bytes:
        named(os.readlink(f"/proc/self/fd/{fd}"))
        return real_fd(fd, *a)

    def hashed(path: Path, *a: Any) -> Any:
        named(path)
        return real_hash(path, *a)

    monkeypatch.setattr(jsonio, "read_bounded", bounded)
    monkeypatch.setattr(jsonio, "read_fd_bounded", by_fd)
    monkeypatch.setattr(integrity, "hash_file", hashed)
    pages = getattr(release_index, "PrefixPages", None)  # absent before the fix: the file was read whole
    if pages is not None:
        real_scan = pages.scan

        def scan(self: Any, *a: Any) -> None:
            named(self.path)
            real_scan(self, *a)

        monkeypatch.setattr(pages, "scan", scan)
    return seen


# ------------------------------------------------------------------ 1. index file sizes bounded before reading


def test_the_control_reads_and_verifies_under_k3(built: tuple[Path, Path, Path], rel: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The intact release re-signed with k3 verifies with --key k3 and inspects; the counter sees the index read."""
    reads = _index_reads(monkeypatch)
    r = cli("verify", rel, "--key", built[2])
    assert r.exit_code == 0, r.output
    assert cli("inspect", rel, "rec-004").exit_code == 0
    assert str(rel / release_index.shard_name(0)) in reads and str(rel / release_index.PREFIX_FILE) in reads


def test_a_shard_larger_than_the_limit_is_refused_unread(built: tuple[Path, Path, Path], rel: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix: a sparse index/00000.json of 1.5 GiB with its size and digest in the manifest made verify and inspect
    peak at 3.1 GB (3 GiB: exit 70); the read used max(limit, size). The manifest's size is now refused at opening,
    before any index file is read (exit 2)."""
    shard = rel / release_index.shard_name(0)
    size = release_index.MAX_SHARD_BYTES + 1
    os.truncate(shard, size)  # sparse: nothing on disk
    _manifest(rel, lambda m: m["index"]["shards"][0].update(size=size, sha256="0" * 64))
    sign_as(rel, built[1])
    reads = _index_reads(monkeypatch)
    want = (f"kvgraft: error: {shard}: the manifest says {size} bytes, above the {release_index.MAX_SHARD_BYTES}-byte "
            "limit for an index shard")
    for args in (("verify", rel), ("verify", rel, "--key", built[2]), ("inspect", rel), ("inspect", rel, "rec-000")):
        assert _one_line(cli(*args), 2) == want, args
    assert reads == []


def test_a_prefix_index_larger_than_the_limit_is_refused_at_opening(rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    prefix = rel / release_index.PREFIX_FILE
    records = release_index.MAX_PREFIX_BYTES // release_index.RECORD.size + 1
    size = records * release_index.RECORD.size
    os.truncate(prefix, size)
    _manifest(rel, lambda m: m["index"]["prefix"].update(size=size, records=records))
    reads = _index_reads(monkeypatch)
    with pytest.raises(InputError) as info:
        Release.open(rel)
    assert str(info.value) == (f"{prefix}: the manifest says {size} bytes, above the {release_index.MAX_PREFIX_BYTES}"
                               "-byte limit for a prefix index")
    assert reads == []


def test_verify_weighs_the_prefix_records_against_the_entries_blocks_before_reading(
        built: tuple[Path, Path, Path], rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix: a sparse 1.5 GiB prefix.bin made `run --prefix` (which verifies first) use 3.5 GB. A record is one
    entry's block: more records than the entries hold blocks is refused before the file is hashed or read."""
    prefix = rel / release_index.PREFIX_FILE
    records = ENTRIES * (TOKENS // release_index.BLOCK_TOKENS) + 1
    os.truncate(prefix, records * release_index.RECORD.size)
    data = prefix.read_bytes()
    _manifest(rel, lambda m: m["index"]["prefix"].update(size=len(data), records=records, sha256=sha256_hex(data)))
    sign_as(rel, built[1])
    reads = _index_reads(monkeypatch)
    line = _one_line(cli("verify", rel, "--key", built[2]), 2)
    assert line == (f"kvgraft: error: {prefix}: prefix index: the manifest says {records} records; the entries' token "
                    f"ids hold {records - 1} blocks of 16 (a record is one of them)")
    assert str(prefix) not in reads and str(rel / release_index.shard_name(0)) in reads


def test_prefix_lookups_hold_pages_of_the_prefix_index_not_the_file(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """The prefix index is hashed in one pass and searched a page at a time: what stays in memory is bounded by the
    page cache, not by the file (a 1.5 GiB file once took 3.5 GB). Every lookup still finds its entry, and a
    page changed after the pass is refused when it is read again."""
    root = tmp_path / "many"
    make_many(root, entries=64, tokens=3200)  # 200 blocks an entry: 12,800 records, 512,000 bytes
    monkeypatch.setattr(release_index, "CACHED_PAGES", 2, raising=False)
    prefix = root / release_index.PREFIX_FILE
    size = prefix.stat().st_size
    rel = Release.open(root)
    tracemalloc.start()
    try:
        table = rel.prefix_table()
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < size / 2, (peak, size)
    assert rel.index is not None
    for eid in ("rec-000", "rec-033", "rec-063"):
        ids = rel.entry(eid)["token_ids"]
        hit = rel.longest_prefix(ids)
        assert hit is not None and (hit[0]["id"], hit[1]) == (eid, 3200)
        assert table.longest(ids[:17]) == (int(eid[4:]), 1)
    pages = rel.index.prefix_pages()
    assert pages is not None and rel.index.bytes_read > 2 * size  # pages were read again, not kept
    held = pages._cache
    assert 0 < len(held) <= 2 and sum(map(len, held.values())) < size / 4
    far = next(p for p in range(len(pages.keys)) if p not in held)
    with prefix.open("r+b") as f:
        f.seek(far * pages.PAGE + 5)
        f.write(b"\xff")
    wanted = pages.keys[far] + b"\0"  # a hash on that page
    with pytest.raises(IntegrityError, match=f"bytes \\[{far * pages.PAGE}, .*changed since they were checked"):
        pages.find(wanted)


# ------------------------------------------------------------------ 2. every prefix record checked


def _records(root: Path, change: Callable[[list[list[Any]]], None]) -> None:
    """Rewrite prefix.bin's records ([hash, ordinal, blocks], sorted as written) and the manifest's digest."""
    prefix = root / release_index.PREFIX_FILE
    rows = [list(r) for r in release_index.RECORD.iter_unpack(prefix.read_bytes())]
    change(rows)
    data = b"".join(release_index.RECORD.pack(*r) for r in rows)
    prefix.write_bytes(data)
    _manifest(root, lambda m: m["index"]["prefix"].update(sha256=sha256_hex(data), size=len(data), records=len(rows)))


def _every(field: int, value: int) -> Callable[[list[list[Any]]], None]:
    def change(rows: list[list[Any]]) -> None:
        for r in rows:
            r[field] = value
    return change


def _swap(rows: list[list[Any]]) -> None:
    rows[3], rows[4] = rows[4], rows[3]


def _twice(rows: list[list[Any]]) -> None:
    rows[5] = [rows[4][0], *rows[5][1:]]


@pytest.mark.parametrize(("change", "record", "what"), [
    (_every(1, ENTRIES), 0, f"entry ordinal {ENTRIES}, the release has {ENTRIES} entries"),
    (_every(2, 0), 0, "0 blocks, entry 'rec-00"),
    (_every(2, 3), 0, "3 blocks, entry 'rec-00"),
    (_swap, 4, "its chain hash is not above the previous record's (records are sorted strictly)"),
    (_twice, 5, "its chain hash is not above the previous record's"),
], ids=["ordinal", "no-blocks", "more-blocks", "unsorted", "duplicate"])
def test_verify_checks_every_prefix_record(built: tuple[Path, Path, Path], rel: Path,
                                           change: Callable[[list[list[Any]]], None], record: int, what: str) -> None:
    """Before the fix: every record naming entry ordinal 5 of a 5-entry release passed `verify --key k3` (exit 0), then
    `run --prefix --key k3` ended in IndexError (exit 70). verify now checks each record's ordinal, block count and
    order, naming the record and its bytes."""
    _records(rel, change)
    sign_as(rel, built[1])
    line = _one_line(cli("verify", rel, "--key", built[2]), 1)
    size = release_index.RECORD.size
    assert line.startswith(f"kvgraft: error: {rel / release_index.PREFIX_FILE}: prefix index record {record} (bytes "
                           f"[{record * size}, {(record + 1) * size})): {what}"), line


@pytest.mark.parametrize(("change", "what"), [
    (_every(1, ENTRIES), f"the record of the prompt's first 2 blocks names entry ordinal {ENTRIES}; the release has "
                         f"{ENTRIES} entries"),
    (_every(1, 2**32 - 1), f"the record of the prompt's first 2 blocks names entry ordinal {2**32 - 1}; the release "
                           f"has {ENTRIES} entries"),
    (_every(2, 0), "the record of the prompt's first 1 blocks says 0 blocks"),
    (_every(2, 7), "the record of the prompt's first 1 blocks says 7 blocks"),
], ids=["ordinal", "ordinal-max", "no-blocks", "more-blocks"])
def test_a_bad_record_met_by_a_lookup_is_an_integrity_error(rel: Path, change: Callable[[list[list[Any]]], None],
                                                            what: str) -> None:
    """Without verify (the library's lookup), a record naming no entry or another block count than the chain hash
    it is found by is refused as tampering, never an IndexError; the control: the intact index finds the entry."""
    ids = Release.open(rel).entry("rec-002")["token_ids"]
    hit = Release.open(rel).longest_prefix(ids)
    assert hit is not None and (hit[0]["id"], hit[1]) == ("rec-002", 32)
    _records(rel, change)
    with pytest.raises(IntegrityError) as info:
        Release.open(rel).longest_prefix(ids)
    assert str(info.value) == f"{rel / release_index.PREFIX_FILE}: {what}"


def test_records_of_the_writer_pass_the_record_checks(rel: Path) -> None:
    """The checks' positive control beside the damaged cases: a re-packed copy of the written records verifies,
    and a record's block count below its entry's (a shorter prefix of it) is accepted."""
    def shorter(rows: list[list[Any]]) -> None:
        two = next(r for r in rows if r[2] == 2)
        two[2] = 1
    _records(rel, lambda rows: None)
    assert integrity.check_release(rel).release.num_entries == ENTRIES
    _records(rel, shorter)
    assert integrity.check_release(rel).release.num_entries == ENTRIES


# ------------------------------------------------------------------ 3. inspect's work and output bounded


@pytest.fixture
def console_rows(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Rows handed to rich tables (what rendering costs grow with) and characters made printable, from here on."""
    from rich.table import Table

    from kvgraft.cli import inspection as cli_inspection

    counts = [0, 0]
    real_row, real_plain = Table.add_row, cli_inspection.plain

    def add_row(self: Table, *cells: Any, **kw: Any) -> None:
        counts[0] += 1
        real_row(self, *cells, **kw)

    def plain(text: object) -> str:
        counts[1] += len(str(text))
        return real_plain(text)

    monkeypatch.setattr(Table, "add_row", add_row)
    monkeypatch.setattr(cli_inspection, "plain", plain)
    return counts


def _inspect(*args: Any) -> Any:
    r = runner.invoke(app, ["inspect", *map(str, args)], env={"COLUMNS": "200"})
    assert r.exit_code == 0, r.output
    return r


def _json(*args: Any) -> tuple[dict[str, Any], int]:
    from test_attest import schema_validator

    r = _inspect(*args, "--json")
    doc: dict[str, Any] = json.loads(r.stdout)
    assert list(schema_validator("inspect-result.v1.json").iter_errors(doc)) == []
    return doc, len(r.stdout)


def test_inspect_shows_a_bounded_part_of_an_entry_with_countless_layers_and_tensors(
        tmp_path: Path, console_rows: list[int], monkeypatch: pytest.MonkeyPatch) -> None:
    """Before the fix: an entry of 10,000 layers took 20 s to inspect, 300,000 layers or 200,000 tensors no answer in 120 s:
    every row went through rich. The page shows SHOWN_ROWS of each and says how many more; --json lists DETAIL_ROWS
    and the totals (both set small here, so that the release stays small). The control: an ordinary entry beside it
    is shown whole."""
    from kvgraft import inspection
    from kvgraft.cli import inspection as cli_inspection

    import rewrite

    shown, listed = 8, 20
    monkeypatch.setattr(cli_inspection, "SHOWN_ROWS", shown, raising=False)
    monkeypatch.setattr(inspection, "DETAIL_ROWS", listed, raising=False)
    many = listed + 3 * shown
    root, control = tmp_path / "rel", tmp_path / "ctl"
    make_release(root, entries=2, seed=32)
    make_release(control, entries=2, seed=32)

    def crowd(m: dict[str, Any]) -> None:
        m["model"]["num_hidden_layers"] = many  # a layer map names each of the model's layers
        for e in m["entries"]:
            e["layers"] = [{"index": i, "kind": "full", "keys": "layer.0.keys", "values": "layer.0.values"}
                           for i in range(many)]
        e = m["entries"][0]
        t = e["tensors"]["layer.0.keys"]
        e["tensors"].update({f"extra.{i:05d}": dict(t) for i in range(many)})

    rewrite.manifest(root, crowd)
    small = _inspect(control, "rec-001")
    assert console_rows[0] == 2 + 4 and "more layers" not in small.stdout  # two layers, four tensors: all shown
    console_rows[0] = 0
    page = _inspect(root, "rec-000")
    assert console_rows[0] == 2 * shown
    assert f"layers ({many:,})" in page.stdout and f"tensors ({many + 4:,})" in page.stdout
    assert f"… {many - shown:,} more layers not shown" in page.stdout
    assert f"… {many + 4 - shown:,} more tensors" in page.stdout
    # the control's lines, with `shown` rows in place of its 2 and 4, and the two "more" lines
    assert len(page.stdout.splitlines()) == len(small.stdout.splitlines()) + 2 * shown - 6 + 2
    doc, _ = _json(root, "rec-000")
    e = doc["entry"]
    assert (len(e["layers"]), e["layers_total"], len(e["tensors"]), e["tensors_total"]) == \
        (listed, many, listed, many + 4)
    assert [t["byte_range"][0] for t in e["tensors"]] == sorted(t["byte_range"][0] for t in e["tensors"])


def test_inspect_cuts_every_long_string_of_a_release(tmp_path: Path, console_rows: list[int]) -> None:
    """Before the fix: a 20 MB `answer` gave no answer in 120 s (printed whole, where `text` is cut at 2,000 characters), 2 MB
    of newlines took 70 s, and the summary page 1-17 s. Every string of the release is cut before it is shown or
    written as JSON: text and answer at DETAIL_TEXT_CHARS (flagged), the others at FIELD_CHARS, free-form members at
    FIELD_VALUES values. What is made printable and what is printed stay bounded, not proportional to the release."""
    from kvgraft import inspection
    from kvgraft._internal.digest import digest_json

    import rewrite

    big = 50 * inspection.DETAIL_TEXT_CHARS
    root = tmp_path / "rel"
    make_release(root, entries=2, seed=33)

    def long_strings(m: dict[str, Any]) -> None:
        e = m["entries"][0]
        e["answer"] = "Q" * big
        e["source"]["text"] = "\n" * big
        e["source"]["sha256"] = digest_json(e["source"]["text"])
        e["meta"] = {"notes": ["n" * (inspection.DETAIL_TEXT_CHARS // 5)] * (inspection.DETAIL_TEXT_CHARS // 10), "k" * big: 1}
        m["model"]["spec"] = "s" * big
        extra = "\x1b" * (inspection.DETAIL_TEXT_CHARS // 5)
        m["environment"].update({f"extra{i}": extra for i in range(inspection.DETAIL_TEXT_CHARS // 8)})
        m["environment"]["platform"] = "\n" * big

    rewrite.manifest(root, long_strings)
    bound = 10 * inspection.DETAIL_TEXT_CHARS  # each hostile member alone is 50 times that
    for args in ((root,), (root, "rec-000")):
        console_rows[1] = 0
        shown = _inspect(*args)
        assert console_rows[1] < 2 * bound and len(shown.stdout) < 4 * bound, (args, console_rows[1], len(shown.stdout))
    assert "…(cut for display)" in shown.stdout and shown.stdout.count("Q") == inspection.DETAIL_TEXT_CHARS
    # JSON: a free-form member holds at most FIELD_VALUES strings of FIELD_CHARS, 6 characters each as \u escapes
    member = 6 * inspection.FIELD_VALUES * (inspection.FIELD_CHARS + 1)
    page, size = _json(root)
    assert size < 2 * member
    assert page["model"]["spec"] == "s" * inspection.FIELD_CHARS + "…"
    env = page["environment"]
    assert env["platform"] == "\n" * inspection.FIELD_CHARS + "…" and env["torch"] and env["python"]
    assert len(env) <= inspection.FIELD_VALUES + 1 and env["…"].endswith(" more")
    detail, size = _json(root, "rec-000")
    assert size < 2 * member + 2 * bound
    e = detail["entry"]
    assert (e["answer"], e["answer_truncated"]) == ("Q" * inspection.DETAIL_TEXT_CHARS, True)
    assert (len(e["source"]["text"]), e["source"]["truncated"]) == (inspection.DETAIL_TEXT_CHARS, True)
    assert len(json.dumps(e["meta"])) < bound
    control, _ = _json(root, "rec-001")
    assert "answer" not in control["entry"] and control["entry"]["source"]["truncated"] is False
