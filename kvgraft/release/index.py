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
import struct
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, IntegrityError
from kvgraft.release.records import MANIFEST, check_entry_record, check_relpath, safe_path

SHARD_FORMAT = "kvgraft-cache-index-shard"
INDEX_DIR = "index"
PREFIX_FILE = f"{INDEX_DIR}/prefix.bin"
# Entries per shard: finding one entry parses one shard, ~64 x 16-25 KB of JSON for a 30-48 layer
# model (1-2 MB, tens of ms); a 100,000-entry release has 1,563 shards listed in a ~3 MB manifest.
SHARD_ENTRIES = 64
MAX_SHARD_BYTES = 256 * 1024 * 1024
# Token-id block size of the prefix index: vLLM's default block; any serving block size is a
# multiple or is handled by rounding the matched length down.
BLOCK_TOKENS = 16
RECORD = struct.Struct("<32sII")  # chained block hash, entry ordinal, blocks
_CHAIN_SEED = b"kvgraft prefix index v1"
MAX_PREFIX_BYTES = 4 * 1024 * 1024 * 1024


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
    entries: list[dict[str, Any]]
    by_id: dict[str, dict[str, Any]]
    files: dict[str, dict[str, Any]]
    path: Path
    checked: set[str] = field(default_factory=set)

    def record(self, entry_id: str) -> dict[str, Any]:
        """An entry record, its own commitments checked (once)."""
        entry = self.by_id[entry_id]
        if entry_id not in self.checked:
            check_entry_record(self.path, entry, self.files)
            self.checked.add(entry_id)
        return entry


class Index:
    """A v2 manifest's index: which shard holds an entry, shards loaded and checked on demand.

    A shard's bytes are read once, hashed, and parsed from those same bytes; the parsed records are
    kept (a few shards at a time) because they are a function of bytes that matched the manifest.
    """

    CACHED_SHARDS = 16

    def __init__(self, root: Path, manifest: dict[str, Any]) -> None:
        self.root = root
        self.where = root / MANIFEST
        idx = manifest["index"]
        self.shards: list[dict[str, Any]] = idx["shards"]
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
        self.prefix_meta: dict[str, Any] | None = idx.get("prefix")
        if self.prefix_meta is not None:
            if check_relpath(self.prefix_meta["file"], f"{self.where}: prefix index") in names:
                raise InputError(f"{self.where}: the prefix index shares a file with a shard")
            if self.prefix_meta["size"] != self.prefix_meta["records"] * RECORD.size:
                raise InputError(f"{self.where}: prefix index of {self.prefix_meta['records']} records cannot be "
                                 f"{self.prefix_meta['size']} bytes")
        self._cache: OrderedDict[int, Shard] = OrderedDict()
        self._prefix: bytes | None = None
        self.bytes_read = 0  # index bytes read since opening (tests bound it)
        self.shards_read: list[int] = []  # the shards read since opening, in order (tests count them)

    # -------------------------------------------------------------------------------------- files

    def index_files(self) -> dict[str, dict[str, Any]]:
        """name -> {sha256, size} of every index file (the shards, the prefix index)."""
        files = {s["file"]: {"sha256": s["sha256"], "size": s["size"]} for s in self.shards}
        if self.prefix_meta is not None:
            files[self.prefix_meta["file"]] = {"sha256": self.prefix_meta["sha256"], "size": self.prefix_meta["size"]}
        return files

    def _read_checked(self, name: str, sha256: str, size: int, limit: int, what: str) -> bytes:
        path = safe_path(self.root, name, what)
        try:
            data = jsonio.read_bounded(path, max(limit, size), what)
        except InputError:
            if jsonio.stat_or_none(path) is None:
                raise IntegrityError(f"{path}: {what} is missing") from None
            raise
        self.bytes_read += len(data)
        if len(data) != size:
            how = "truncated" if len(data) < size else "grown"
            raise IntegrityError(f"{path}: {what}: {len(data)} bytes, the manifest says {size} ({how})")
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
        from kvgraft.schema import CACHE_INDEX_SHARD, validate

        self.shards_read.append(k)
        meta = self.shards[k]
        what = f"index shard {k}"
        data = self._read_checked(meta["file"], meta["sha256"], meta["size"], MAX_SHARD_BYTES, what)
        path = self.root / meta["file"]
        doc = jsonio.loads_strict(data, str(path))
        del data
        if not isinstance(doc, dict) or doc.get("format") != SHARD_FORMAT:
            raise InputError(f"{path}: not a kvgraft index shard")
        validate(doc, CACHE_INDEX_SHARD, str(path))
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
        if set(doc["files"]) != used:
            raise InputError(f"{path}: {what} lists files its entries do not use: {sorted(set(doc['files']) - used)[:3]}")
        shard = Shard(doc["entries"], {e["id"]: e for e in doc["entries"]}, doc["files"], path)
        self._cache[k] = shard
        while len(self._cache) > self.CACHED_SHARDS:
            self._cache.popitem(last=False)
        return shard

    def entry(self, entry_id: str) -> dict[str, Any] | None:
        k = self.owner.get(entry_id)
        return None if k is None else self.shard(k).record(entry_id)

    def file_meta(self, entry: dict[str, Any]) -> dict[str, Any]:
        k = self.owner.get(entry["id"])
        if k is None:
            raise InputError(f"{self.where}: no entry {entry['id']!r}")
        files = self.shard(k).files
        if entry["file"] not in files:
            raise InputError(f"{self.where}: entry {entry['id']!r}: file {entry['file']!r} is not listed")
        return dict(files[entry["file"]])

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

    def all_entries(self) -> Iterator[dict[str, Any]]:
        for k in range(len(self.shards)):
            shard = self.shard(k)
            for e in shard.entries:
                yield shard.record(e["id"])

    def all_files(self) -> dict[str, dict[str, Any]]:
        files: dict[str, dict[str, Any]] = {}
        for k in range(len(self.shards)):
            files.update(self.shard(k).files)
        return files

    # -------------------------------------------------------------------------------------- prefixes

    def check_prefix(self) -> None:
        """The prefix index's bytes against the manifest, without keeping them (unless they are kept already)."""
        m = self.prefix_meta
        if m is not None and self._prefix is None:
            self._read_checked(m["file"], m["sha256"], m["size"], MAX_PREFIX_BYTES, "prefix index")

    def prefix_records(self) -> bytes | None:
        if self.prefix_meta is None:
            return None
        if self._prefix is None:
            m = self.prefix_meta
            data = self._read_checked(m["file"], m["sha256"], m["size"], MAX_PREFIX_BYTES, "prefix index")
            self._prefix = data
        return self._prefix


class PrefixTable:
    """Longest block-aligned prefix of any entry: one lookup per prompt block, by chained hashes.

    Backed by a v2 release's sorted prefix records (binary search in the verified bytes), or built in
    memory from a v1 manifest's token ids. A hit is a candidate only: the caller compares the token ids
    of the entry record (bound by the root digest) before grafting (`match` does).
    """

    def __init__(self, block_tokens: int, records: bytes | None = None,
                 table: dict[bytes, tuple[int, int]] | None = None) -> None:
        self.block_tokens = block_tokens
        self._records = records
        self._n = len(records) // RECORD.size if records is not None else 0
        self._table = table

    @classmethod
    def from_entries(cls, entries: Sequence[dict[str, Any]], block_tokens: int = BLOCK_TOKENS) -> PrefixTable:
        w = PrefixWriter(block_tokens)
        for i, e in enumerate(entries):
            w.add(i, e["token_ids"])
        return cls(block_tokens, table=w.records)

    def _get(self, h: bytes) -> tuple[int, int] | None:
        if self._table is not None:
            return self._table.get(h)
        assert self._records is not None
        lo, hi = 0, self._n
        rec = self._records
        while lo < hi:
            mid = (lo + hi) // 2
            key = rec[mid * RECORD.size: mid * RECORD.size + 32]
            if key < h:
                lo = mid + 1
            elif key > h:
                hi = mid
            else:
                _, ordinal, k = RECORD.unpack_from(rec, mid * RECORD.size)
                return ordinal, k
        return None

    def longest(self, token_ids: Sequence[int]) -> tuple[int, int] | None:
        """(entry ordinal, blocks) of the longest block-aligned prefix of `token_ids` some entry starts with.

        Chained hashes make a miss at block j a miss for every longer prefix, so the walk stops there.
        """
        best = None
        for h in chain_hashes(token_ids, self.block_tokens):
            hit = self._get(h)
            if hit is None:
                break
            best = hit
        return best
