"""The indexed release layout (format version 2): entry records in index shards read one at a time, and a prefix index.

manifest.json holds the header (model, schedule, environment) and `index`: every shard's file, SHA-256,
size, entry ids and their token counts, and the prefix index's file and digest. The root digest covers all of it, so the
signed root binds each shard's bytes, hence each entry record (token ids, tensor digests, file digest).
Opening a release reads manifest.json only; a shard is read, hashed and checked against the manifest
the first time one of its entries is asked for (docs/release-format.md). Imports no torch.
"""

from __future__ import annotations

import bisect
import hashlib
import os
import struct
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, IntegrityError
from kvgraft.release import sources
from kvgraft.release.records import MANIFEST, check_entry_record, check_relpath, entry_digest, safe_path

if TYPE_CHECKING:
    from kvgraft.release.models import Entry, FileMeta, Manifest, PrefixListing, ShardListing

SHARD_FORMAT = "kvgraft-cache-index-shard"
INDEX_DIR = "index"
PREFIX_FILE = f"{INDEX_DIR}/prefix.bin"
# A shard closes at 64 records or at 256 KiB of them, whichever comes first: finding one entry parses one
# shard, and a record of a 48-layer model is ~20 KB (64 of them, 1.3 MB, took ~75 ms to read and parse; a
# sampled audit of 20 entries of a 100,000-entry release parsed 20 such shards before its first recompute).
# Smaller shards cost manifest and statement lines: 100,000 such entries make ~8,000 shards.
SHARD_ENTRIES = 64
SHARD_BYTES = 256 * 1024
# Refused at opening when the manifest states more (a shard is read whole: the bound is on memory).
MAX_SHARD_BYTES = 256 * 1024 * 1024
# Token-id block size of the prefix index: vLLM's default block; any serving block size is a
# multiple or is handled by rounding the matched length down.
BLOCK_TOKENS = 16
RECORD = struct.Struct("<32sII")  # chained block hash, entry ordinal, blocks
_CHAIN_SEED = b"kvgraft prefix index v1"
# The prefix index is never held whole (PrefixPages): one pass hashes it against the manifest and keeps
# each page's first hash and SHA-256 (64 bytes a page of 1,024 records, 40 KiB), and the CACHED_PAGES pages
# read last (10 MiB); a lookup that needs another page reads it again and checks its digest. Memory is
# then ~10 MiB + size / 640, whatever the manifest says; MAX_PREFIX_BYTES (refused at opening) bounds the
# time of that pass, about that of hashing one large entry file: 10^8 distinct blocks of 16 tokens (1.6
# billion tokens), far beyond the preprint's library (2.9 million tokens: ~180,000 records, 7 MB).
# `verify` first weighs the record count against the blocks its entries hold (Index.check_prefix).
MAX_PREFIX_BYTES = 4 * 1024 * 1024 * 1024
PAGE_RECORDS = 1024
CACHED_PAGES = 256


def _bounded(path: Path, size: int, limit: int, what: str) -> None:
    """Refuse, before anything is read, an index file the manifest says is larger than `limit`: the
    manifest's number is the attacker's (a sparse file of that size costs nothing to publish)."""
    if size > limit:
        raise InputError(f"{path}: the manifest says {size} bytes, above the {limit}-byte limit for {what}")


def _sized(have: int, want: int) -> str:
    return f"{have} bytes, the manifest says {want} ({'truncated' if have < want else 'grown'})"


def _open_sized(path: Path, size: int, what: str) -> int:
    """A descriptor of an index file whose size is the one the manifest states (else IntegrityError)."""
    if jsonio.stat_or_none(path) is None:
        raise IntegrityError(f"{path}: {what} is missing")
    fd = jsonio.open_regular(path, what)
    have = os.fstat(fd).st_size
    if have != size:
        os.close(fd)
        raise IntegrityError(f"{path}: {what}: {_sized(have, size)}")
    return fd


def shard_name(k: int) -> str:
    return f"{INDEX_DIR}/{k:05d}.json"


def chain_seed(block_tokens: int) -> bytes:
    return hashlib.sha256(_CHAIN_SEED + struct.pack("<Q", block_tokens)).digest()


def chain_next(previous: bytes, block: Sequence[int]) -> bytes:
    """The chained hash after one more block: SHA-256(previous hash || token ids as little-endian u64)."""
    return hashlib.sha256(previous + struct.pack(f"<{len(block)}Q", *block)).digest()


def chain_hashes(token_ids: Sequence[int], block_tokens: int) -> Iterator[bytes]:
    """The chained hash of the first k full blocks, for k = 1, 2, ... (a partial last block has none)."""
    h = chain_seed(block_tokens)
    for start in range(0, len(token_ids) - block_tokens + 1, block_tokens):
        h = chain_next(h, token_ids[start:start + block_tokens])
        yield h


@dataclass
class PrefixWriter:
    """Collects (chain hash -> first entry ordinal with that prefix, blocks) while entries are written."""

    block_tokens: int = BLOCK_TOKENS
    records: dict[bytes, tuple[int, int]] = field(default_factory=dict)

    def add(self, ordinal: int, token_ids: Sequence[int]) -> None:
        for k, h in enumerate(chain_hashes(token_ids, self.block_tokens), start=1):
            self.records.setdefault(h, (ordinal, k))

    def data(self) -> bytes:
        return b"".join(RECORD.pack(h, o, k) for h, (o, k) in sorted(self.records.items()))


@dataclass
class Shard:
    entries: list[Entry]
    by_id: dict[str, Entry]
    files: dict[str, FileMeta]
    path: Path
    num_layers: int  # the manifest's model's: each record's layer map is checked against it
    canonical: dict[str, bytes] = field(default_factory=dict)  # by id: a record's canonical JSON, no digest
    checked: set[str] = field(default_factory=set)

    def record(self, entry_id: str) -> Entry:
        """An entry record, its own commitments checked (once)."""
        entry = self.by_id[entry_id]
        if entry_id not in self.checked:
            known = self.canonical.pop(entry_id, None)
            check_entry_record(self.path, entry, self.files, self.num_layers,
                               digest=entry_digest if known is None else lambda _: sha256_hex(known))
            self.checked.add(entry_id)
        return entry


class Index:
    """A v2 manifest's index: which shard holds an entry, shards loaded and checked on demand.

    A shard's bytes are read once, hashed, and parsed from those same bytes; the parsed records are
    kept (a few shards at a time) because they are a function of bytes that matched the manifest.
    """

    # A parsed shard of 1.3 MB (64 records x 48 layers) holds ~8 MB of Python objects: a few are kept, and the
    # records handed out by id (with their file listings) a few more, so that an audit's later reads of the
    # entries it chose (the entry's bytes, its graft) never parse a shard again.
    CACHED_SHARDS = 4
    CACHED_RECORDS = 64

    def __init__(self, root: Path, manifest: Manifest, source: sources.Source | None = None) -> None:
        self.root = root
        self.source = source
        self.where = root / MANIFEST
        self.num_layers = int(manifest["model"]["num_hidden_layers"])
        idx = manifest["index"]
        self.shards: list[ShardListing] = idx["shards"]
        self.owner: dict[str, int] = {}
        self.starts: list[int] = []
        names: set[str] = set()
        count = 0
        listed_tokens = 0  # the token counts the manifest lists (num_tokens, per shard)
        for k, shard in enumerate(self.shards):
            name = check_relpath(shard["file"], f"{self.where}: index shard {k}")
            if not name.startswith(f"{INDEX_DIR}/") or name in names or name == PREFIX_FILE:
                raise InputError(f"{self.where}: index shard {k}: file {name!r} is not a distinct file under {INDEX_DIR}/")
            names.add(name)
            _bounded(root / name, shard["size"], MAX_SHARD_BYTES, "an index shard")
            if "num_tokens" in shard:
                if len(shard["num_tokens"]) != len(shard["ids"]):
                    raise InputError(f"{self.where}: index shard {k}: {len(shard['num_tokens'])} token counts for "
                                     f"{len(shard['ids'])} entries")
                listed_tokens += sum(shard["num_tokens"])
            self.starts.append(count)
            self.owner.update(dict.fromkeys(shard["ids"], k))  # C speed: 100,000 ids in a few ms
            count += len(shard["ids"])
        if len(self.owner) != count:
            seen: set[str] = set()
            for eid in (e for s in self.shards for e in s["ids"]):
                if eid in seen:
                    raise InputError(f"{self.where}: entry id {eid!r} appears twice")
                seen.add(eid)
        if count != idx["entries"]:
            raise InputError(f"{self.where}: index says {idx['entries']} entries, its shards list {count}")
        if all("num_tokens" in s for s in self.shards) and listed_tokens != idx["tokens"]:
            raise InputError(f"{self.where}: index says {idx['tokens']} tokens, its shards' token counts sum to "
                             f"{listed_tokens}")
        self.count = count
        self.prefix_meta: PrefixListing | None = idx.get("prefix")
        if self.prefix_meta is not None:
            if check_relpath(self.prefix_meta["file"], f"{self.where}: prefix index") in names:
                raise InputError(f"{self.where}: the prefix index shares a file with a shard")
            if self.prefix_meta["size"] != self.prefix_meta["records"] * RECORD.size:
                raise InputError(f"{self.where}: prefix index of {self.prefix_meta['records']} records cannot be "
                                 f"{self.prefix_meta['size']} bytes")
            _bounded(root / self.prefix_meta["file"], self.prefix_meta["size"], MAX_PREFIX_BYTES, "a prefix index")
        self._cache: OrderedDict[int, Shard] = OrderedDict()
        self._records: OrderedDict[str, tuple[Entry, FileMeta]] = OrderedDict()
        self._prefix: PrefixPages | None = None
        self._shard_bytes = 0
        self.shards_read: list[int] = []  # the shards read since opening, in order (tests count them)

    @property
    def bytes_read(self) -> int:
        """Index bytes read since opening (tests bound it)."""
        return self._shard_bytes + (self._prefix.bytes_read if self._prefix is not None else 0)

    # -------------------------------------------------------------------------------------- files

    def index_files(self) -> dict[str, FileMeta]:
        """name -> {sha256, size} of every index file (the shards, the prefix index)."""
        files: dict[str, FileMeta] = {s["file"]: {"sha256": s["sha256"], "size": s["size"]} for s in self.shards}
        if self.prefix_meta is not None:
            files[self.prefix_meta["file"]] = {"sha256": self.prefix_meta["sha256"], "size": self.prefix_meta["size"]}
        return files

    def _read_checked(self, name: str, sha256: str, size: int, what: str) -> bytes:
        """A file's bytes, of the size the manifest states (bounded at opening), checked against its digest;
        a file of another size is refused unread."""
        if self.source is not None:  # a release read from elsewhere: the file arrives checked
            self.source.fetch(name, sha256, size, what)
        path = safe_path(self.root, name, what)
        fd = _open_sized(path, size, what)
        try:
            data = jsonio.read_fd_bounded(fd, size)  # one byte more shows it grew since
        except OSError as exc:
            raise jsonio.unreadable(path, exc) from None
        finally:
            os.close(fd)
        self._shard_bytes += len(data)
        if len(data) != size:
            raise IntegrityError(f"{path}: {what}: {_sized(len(data), size)} (changed while it was read)")
        actual = sha256_hex(data)
        if actual != sha256:
            raise IntegrityError(f"{path}: {what}: sha256 {actual} does not match the manifest ({sha256})")
        return data

    # -------------------------------------------------------------------------------------- shards

    def shard(self, k: int) -> Shard:
        cached = self._cache.get(k)
        if cached is not None:
            self._cache.move_to_end(k)
            return cached
        from kvgraft.release.models import decode_shard

        self.shards_read.append(k)
        meta = self.shards[k]
        what = f"index shard {k}"
        data = self._read_checked(meta["file"], meta["sha256"], meta["size"], what)
        path = self.root / meta["file"]
        # One typed pass (kvgraft.release.models): as strict as jsonio.loads_strict and the shard's schema.
        with jsonio.collector_paused(len(data) > 65536):
            doc, canonical = decode_shard(data, str(path))
        del data
        ids = [e["id"] for e in doc["entries"]]
        if ids != meta["ids"]:
            raise IntegrityError(f"{path}: {what} holds entries {ids[:3]}..., the manifest lists {meta['ids'][:3]}...")
        listed = meta.get("num_tokens")
        if listed is not None:
            # The manifest's counts drew and bounded samples without this shard: they must be its records'.
            for e, n in zip(doc["entries"], listed, strict=True):
                if e["num_tokens"] != n:
                    raise IntegrityError(f"{path}: {what}: entry {e['id']!r} has {e['num_tokens']} tokens, the "
                                         f"manifest lists {n}")
        # Each record's own commitments (its digest, token-id digest, references) are checked when the
        # record is first asked for (Shard.record): the shard's digest already binds its bytes, and
        # finding one entry then costs one record's checks, not 64.
        used = {entry["file"] for entry in doc["entries"]}
        if unlisted := sorted(used - set(doc["files"])):
            raise InputError(f"{path}: {what} does not list files its entries use: {unlisted[:3]}")
        if set(doc["files"]) != used:
            raise InputError(f"{path}: {what} lists files its entries do not use: {sorted(set(doc['files']) - used)[:3]}")
        shard = Shard(doc["entries"], {e["id"]: e for e in doc["entries"]}, doc["files"], path, self.num_layers, canonical)
        self._cache[k] = shard
        while len(self._cache) > self.CACHED_SHARDS:
            self._cache.popitem(last=False)
        return shard

    def entry(self, entry_id: str) -> Entry | None:
        kept = self._records.get(entry_id)
        if kept is not None:
            self._records.move_to_end(entry_id)
            return kept[0]
        k = self.owner.get(entry_id)
        if k is None:
            return None
        shard = self.shard(k)
        record = shard.record(entry_id)
        self._records[entry_id] = (record, shard.files[record["file"]])  # Index.shard checked it is listed
        while len(self._records) > self.CACHED_RECORDS:
            self._records.popitem(last=False)
        return record

    def file_meta(self, eid: str, file: str) -> FileMeta:
        """{sha256, size} of `file` as the shard holding entry `eid` lists it."""
        k = self.owner.get(eid)
        if k is None:
            raise InputError(f"{self.where}: no entry {eid!r}")
        kept = self._records.get(eid)
        if kept is not None and kept[0]["file"] == file:
            return kept[1].copy()
        files = self.shard(k).files
        if file not in files:
            raise InputError(f"{self.where}: entry {eid!r}: file {file!r} is not listed")
        return files[file].copy()

    def ids(self) -> list[str]:
        return [eid for s in self.shards for eid in s["ids"]]

    def token_counts(self) -> list[int]:
        """Every entry's num_tokens in release order: from the manifest, which lists them per shard (the
        writer's `num_tokens`); a shard it lists without them (a release written before they were) is read."""
        counts: list[int] = []
        for k, s in enumerate(self.shards):
            listed = s.get("num_tokens")
            if listed is None:
                shard = self.shard(k)
                listed = [int(shard.record(e["id"])["num_tokens"]) for e in shard.entries]
            counts.extend(listed)
        return counts

    def id_at(self, ordinal: int) -> str:
        k = bisect.bisect_right(self.starts, ordinal) - 1
        ids: list[str] = self.shards[k]["ids"]
        return ids[ordinal - self.starts[k]]

    def all_entries(self) -> Iterator[Entry]:
        # The collector paused for the whole pass, not a shard at a time: each resume would walk the last
        # shard's tens of thousands of new objects (~15% of reading it), and the records hold no cycles.
        with jsonio.collector_paused():
            for k in range(len(self.shards)):
                shard = self.shard(k)
                for e in shard.entries:
                    yield shard.record(e["id"])

    def all_files(self) -> dict[str, FileMeta]:
        files: dict[str, FileMeta] = {}
        for k in range(len(self.shards)):
            files.update(self.shard(k).files)
        return files

    # -------------------------------------------------------------------------------------- prefixes

    def prefix_pages(self) -> PrefixPages | None:
        """The prefix index, hashed against the manifest in one pass (on first use), read a page at a time."""
        if self.prefix_meta is None:
            return None
        if self._prefix is None:
            pages = self._new_pages()
            pages.scan()
            self._prefix = pages
        return self._prefix

    def _new_pages(self) -> PrefixPages:
        m = self.prefix_meta
        assert m is not None
        if self.source is not None:
            self.source.fetch(m["file"], m["sha256"], m["size"], "prefix index")
        return PrefixPages(safe_path(self.root, m["file"], "prefix index"), m["size"], m["sha256"])

    def prefix_blocks(self, tokens: Sequence[int]) -> list[int]:
        """The blocks of the prefix index's size each entry holds, given every entry's num_tokens in order
        (Release.token_counts); the manifest's record count is refused, before the file is read, when above
        their sum (a record is one entry's block, each chain hash kept once)."""
        m = self.prefix_meta
        if m is None:
            return []
        bt = int(m["block_tokens"])
        blocks = [int(n) // bt for n in tokens]
        if m["records"] > sum(blocks):
            raise InputError(f"{self.root / m['file']}: prefix index: the manifest says {m['records']} records; the "
                             f"entries' token ids hold {sum(blocks)} blocks of {bt} (a record is one of them)")
        return blocks

    def check_prefix(self, blocks: list[int]) -> None:
        """What `verify` checks of the prefix index beyond its digest, given `prefix_blocks`: each record names
        an entry (its ordinal below the count) and a number of blocks, at least one, that the entry's token
        ids hold, and the records are sorted strictly by hash (the binary search needs it)."""
        if self.prefix_meta is None:
            return
        pages = self._new_pages()
        bt = int(self.prefix_meta["block_tokens"])
        last = b""

        def check(at: int, page: bytes) -> None:
            nonlocal last
            for i, (h, ordinal, k) in enumerate(RECORD.iter_unpack(page)):
                if h <= last or ordinal >= len(blocks) or not 1 <= k <= blocks[ordinal]:
                    a = at + i * RECORD.size
                    what = ("its chain hash is not above the previous record's (records are sorted strictly)"
                            if h <= last else f"entry ordinal {ordinal}, the release has {len(blocks)} entries"
                            if ordinal >= len(blocks) else
                            f"{k} blocks, entry {self.id_at(ordinal)!r} holds {blocks[ordinal]} blocks of {bt} tokens")
                    raise IntegrityError(f"{pages.path}: prefix index record {a // RECORD.size} (bytes "
                                         f"[{a}, {a + RECORD.size})): {what}")
                last = h

        pages.scan(check)
        self._prefix = pages


def search(records: bytes, h: bytes) -> tuple[int, int] | None:
    """(entry ordinal, blocks) of the record for chain hash `h` in sorted records, or None."""
    lo, hi = 0, len(records) // RECORD.size
    while lo < hi:
        mid = (lo + hi) // 2
        key = records[mid * RECORD.size: mid * RECORD.size + 32]
        if key < h:
            lo = mid + 1
        elif key > h:
            hi = mid
        else:
            _, ordinal, k = RECORD.unpack_from(records, mid * RECORD.size)
            return ordinal, k
    return None


class PrefixPages:
    """A prefix index file read a page at a time (MAX_PREFIX_BYTES says why): `scan` hashes it against the
    manifest once, keeping each page's first hash and digest; `find` reads the one page a hash can be on,
    checked against that digest, so what is searched is what was hashed."""

    PAGE = PAGE_RECORDS * RECORD.size
    WHAT = "prefix index"

    def __init__(self, path: Path, size: int, sha256: str) -> None:
        self.path, self.size, self.sha256 = path, size, sha256
        self.keys: list[bytes] = []  # each page's first chain hash
        self.digests: list[bytes] = []  # each page's SHA-256
        self._cache: OrderedDict[int, bytes] = OrderedDict()
        self.bytes_read = 0

    def _read(self, fd: int, p: int) -> bytes:
        at = p * self.PAGE
        n = min(self.PAGE, self.size - at)
        page = os.pread(fd, n, at)
        self.bytes_read += len(page)
        if len(page) != n:
            raise IntegrityError(f"{self.path}: {self.WHAT}: {_sized(at + len(page), self.size)} (changed since opening)")
        self._cache[p] = page
        while len(self._cache) > CACHED_PAGES:
            self._cache.popitem(last=False)
        return page

    def scan(self, check: Callable[[int, bytes], None] | None = None) -> None:
        """Hash every page (`check(offset, page)` sees each) and compare with the manifest's digest."""
        whole = hashlib.sha256()
        fd = _open_sized(self.path, self.size, self.WHAT)
        try:
            for p in range(-(-self.size // self.PAGE)):
                page = self._read(fd, p)
                whole.update(page)
                self.keys.append(page[:32])
                self.digests.append(hashlib.sha256(page).digest())
                if check is not None:
                    check(p * self.PAGE, page)
            if os.pread(fd, 1, self.size):
                raise IntegrityError(f"{self.path}: {self.WHAT}: grew while it was read")
        except OSError as exc:
            raise jsonio.unreadable(self.path, exc) from None
        finally:
            os.close(fd)
        if whole.hexdigest() != self.sha256:
            raise IntegrityError(f"{self.path}: {self.WHAT}: sha256 {whole.hexdigest()} does not match the manifest "
                                 f"({self.sha256})")

    def page(self, p: int) -> bytes:
        cached = self._cache.get(p)
        if cached is not None:
            self._cache.move_to_end(p)
            return cached
        fd = _open_sized(self.path, self.size, self.WHAT)
        try:
            page = self._read(fd, p)
        except OSError as exc:
            raise jsonio.unreadable(self.path, exc) from None
        finally:
            os.close(fd)
        if hashlib.sha256(page).digest() != self.digests[p]:
            del self._cache[p]
            raise IntegrityError(f"{self.path}: {self.WHAT}: bytes [{p * self.PAGE}, {p * self.PAGE + len(page)}) "
                                 "changed since they were checked against the manifest")
        return page

    def find(self, h: bytes) -> tuple[int, int] | None:
        p = bisect.bisect_right(self.keys, h) - 1
        return None if p < 0 else search(self.page(p), h)


class PrefixTable:
    """Longest block-aligned prefix of any entry: one lookup per prompt block, by chained hashes.

    Backed by a v2 release's sorted prefix records (binary search in the verified bytes), or built in
    memory from a v1 manifest's token ids. A hit is a candidate only: the caller compares the token ids
    of the entry record (bound by the root digest) before grafting (`match` does).
    """

    def __init__(self, block_tokens: int, records: bytes | PrefixPages | None = None,
                 table: dict[bytes, tuple[int, int]] | None = None, where: str = "prefix index") -> None:
        self.block_tokens = block_tokens
        self._records = records
        self._table = table
        self.where = where

    @classmethod
    def from_entries(cls, entries: Sequence[Entry], block_tokens: int = BLOCK_TOKENS) -> PrefixTable:
        w = PrefixWriter(block_tokens)
        for i, e in enumerate(entries):
            w.add(i, e["token_ids"])
        return cls(block_tokens, table=w.records)

    def _get(self, h: bytes) -> tuple[int, int] | None:
        if self._table is not None:
            return self._table.get(h)
        if isinstance(self._records, PrefixPages):
            return self._records.find(h)
        assert self._records is not None
        return search(self._records, h)

    def longest(self, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """(entry ordinal, blocks) of the longest block-aligned prefix of `token_ids` some entry starts with.

        Chained hashes make a miss at block j a miss for every longer prefix, so the walk stops there. The
        record of the chain hash of j blocks must say j blocks (another count is a tampered index).
        """
        best = None
        for j, h in enumerate(chain_hashes(token_ids, self.block_tokens), start=1):
            hit = self._get(h)
            if hit is None:
                break
            if hit[1] != j:
                raise IntegrityError(f"{self.where}: the record of the prompt's first {j} blocks says {hit[1]} blocks")
            best = hit
        return best
