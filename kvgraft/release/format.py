"""The cache-release format: manifest model, digests, safe paths, reading and atomic writing.

Two layouts are read: format version 1 (one manifest.json holding every entry record) and version 2
(manifest.json lists index shards holding the records; kvgraft.release.index), which is what is
written. Reading imports no torch: `kvgraft verify` runs on CI machines without it.
"""

from __future__ import annotations

import contextlib
import datetime
import errno
import os
import shutil
import stat
import struct
import tempfile
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from kvgraft import __version__
from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import FormatVersionError, InputError, IntegrityError
from kvgraft.release import index as release_index
from kvgraft.release import safetensors_header as stfile
from kvgraft.release import sources
from kvgraft.release.records import MANIFEST, check_entry_record, entry_digest, root_digest, safe_path
from kvgraft.schema import CACHE_MANIFEST, CACHE_MANIFEST_V2, validate

if TYPE_CHECKING:
    from collections.abc import Iterator

    import torch

    from kvgraft.release.models import Draft, DType, Entry, FileMeta, Header, Manifest, ShardListing, Tensor

FORMAT = "kvgraft-cache-release"
FORMAT_VERSION = 2  # written; FORMAT_VERSIONS are read
FORMAT_VERSIONS = (1, 2)
# Files a release folder may keep beside its manifest that are no part of the release: its signatures
# (kvgraft.signing.attest.BUNDLE_NAME, kvgraft.signing.oms.OMS_NAME), which no part of release/ reads. Named
# here, in the folder's layout, because every reader of a folder skips them whatever its caller, and remote/
# (below signing/) fetches and copies them with the release.
SIDE_FILES = ("release.sigstore.json", "model.sig")
# A release kept in a git (or Hugging Face Hub) repository: the repository's metadata at the folder's root,
# which the model_signing CLI leaves out of what it signs, is no part of the release either.
REPOSITORY_METADATA = frozenset({".git", ".gitattributes", ".github", ".gitignore"})
ENTRIES_DIR = "entries"  # where ReleaseWriter puts the entry files
MAX_MANIFEST_BYTES = 256 * 1024 * 1024
CHECKED_HEADERS = 1024  # entries whose checked safetensors header an opened release remembers


def load_manifest(root: Path) -> Manifest:
    """Read, bound, parse (no duplicate keys), version-check and schema-validate a manifest."""
    path = safe_path(root, MANIFEST, "manifest")
    if (st := jsonio.stat_or_none(path, follow=True)) is None or not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: missing manifest (is {root} a cache release?)")
    return check_manifest(jsonio.loads_strict(jsonio.read_bounded(path, MAX_MANIFEST_BYTES, "a manifest"), str(path)),
                          path)


def check_manifest(doc: Any, path: Path) -> Manifest:
    """Version-check and schema-validate a parsed manifest (read from `path`)."""
    if not isinstance(doc, dict):
        raise InputError(f"{path}: manifest is not a JSON object")
    if doc.get("format") != FORMAT:
        raise FormatVersionError(f"{path}: not a kvgraft cache release (format {doc.get('format')!r})")
    if doc.get("format_version") not in FORMAT_VERSIONS:
        raise FormatVersionError(
            f"{path}: format version {doc.get('format_version')!r} is not supported; "
            f"this kvgraft {__version__} reads versions {', '.join(map(str, FORMAT_VERSIONS))}"
        )
    validate(doc, CACHE_MANIFEST if doc["format_version"] == 1 else CACHE_MANIFEST_V2, str(path))
    return cast("Manifest", doc)  # the schema holds what Manifest types


def check_commitments(root: Path, manifest: Manifest) -> None:
    """Internal consistency of a manifest: digests, references, bounds. No file bytes read (for
    format 2, no shard either: each shard is checked against the manifest when it is read)."""
    where = root / MANIFEST
    if manifest["format_version"] == 1:
        seen: set[str] = set()
        for entry in manifest["entries"]:
            eid = entry["id"]
            if eid in seen:
                raise InputError(f"{where}: entry id {eid!r} appears twice")
            seen.add(eid)
            check_entry_record(where, entry, manifest["files"], manifest["model"]["num_hidden_layers"])
    actual = root_digest(manifest)
    if actual != manifest["root_digest"]:
        raise IntegrityError(f"{where}: root_digest {manifest['root_digest']} does not match the manifest ({actual})")


@dataclass
class Release:
    """An opened release: a checked manifest; entry records (format 2: their index shard) and entry
    bytes are read and checked on demand."""

    root: Path
    manifest: Manifest
    source: sources.Source | None = field(default=None, compare=False)  # where its files come from (None: in place)
    # entry id -> (its tensor table, header bytes that passed tensor_layout against it, their layout)
    # (the most recent CHECKED_HEADERS entries: a pass over every entry, as verify makes, keeps no more)
    _checked_headers: OrderedDict[str, tuple[Any, bytes, dict[str, stfile.TensorInfo]]] = field(
        default_factory=OrderedDict, repr=False, compare=False)
    _index: release_index.Index | None = field(default=None, repr=False, compare=False)
    _by_id: dict[str, Entry] | None = field(default=None, repr=False, compare=False)
    _prefix: release_index.PrefixTable | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.manifest["format_version"] == 2 and self._index is None:
            self._index = release_index.Index(self.root, self.manifest, self.source)

    @classmethod
    def open(cls, root: Path | str, source: sources.Source | None = None) -> Release:
        root = Path(root)
        jsonio.require_folder(root)
        manifest = load_manifest(root)
        check_commitments(root, manifest)
        return cls(root, manifest, source)

    @property
    def format_version(self) -> int:
        return int(self.manifest["format_version"])

    @property
    def index(self) -> release_index.Index | None:
        """The format-2 index (None for a format-1 release)."""
        return self._index

    @property
    def num_entries(self) -> int:
        return self._index.count if self._index is not None else len(self.manifest["entries"])

    def entry_ids(self) -> list[str]:
        """Every entry id in release order, without reading any entry record."""
        if self._index is not None:
            return self._index.ids()
        return [e["id"] for e in self.manifest["entries"]]

    def token_counts(self) -> list[int]:
        """Every entry's num_tokens in release order, without reading any entry record (format 2: from the
        manifest's per-shard counts; a manifest without them has each shard read for them)."""
        if self._index is not None:
            return self._index.token_counts()
        return [int(e["num_tokens"]) for e in self.manifest["entries"]]

    @property
    def entries(self) -> list[Entry]:
        """Every entry record (format 2: every shard is read and checked, and every record kept: cost and
        memory grow with the index; `iter_entries`, `entry_ids` and `token_counts` do not keep them)."""
        if self._index is not None:
            return [e.copy() for e in self._index.all_entries()]
        return list(self.manifest["entries"])

    def iter_entries(self) -> Iterator[Entry]:
        """Every entry record in release order, each checked, one shard held at a time (format 2)."""
        if self._index is not None:
            return (e.copy() for e in self._index.all_entries())
        return (e.copy() for e in self.manifest["entries"])

    def entry(self, entry_id: str) -> Entry:
        if self._index is not None:
            found = self._index.entry(entry_id)
        else:
            if self._by_id is None:
                self._by_id = {e["id"]: e for e in self.manifest["entries"]}
            found = self._by_id.get(entry_id)
        if found is not None:
            return found.copy()
        known = ", ".join(self.entry_ids()[:10])
        raise InputError(f"{self.root}: no entry {entry_id!r} (entries: {known})")

    def records(self, ids: Sequence[str]) -> list[Entry]:
        """The records of `ids`, in that order, read in release order: format 2 reads each shard once however
        few it keeps (a sample's ids come in draw order), with one garbage collection after them, not one
        per shard parsed."""
        if self._index is None:
            return [self.entry(i) for i in ids]
        owner = self._index.owner
        with jsonio.collector_paused():
            found = {i: self.entry(i) for i in sorted(set(ids), key=lambda i: owner.get(i, -1))}
        return [found[i] for i in ids]

    def file_meta(self, entry: Entry) -> FileMeta:
        """{sha256, size} of an entry's file, as the manifest (format 2: its shard) states it."""
        if self._index is not None:
            return self._index.file_meta(entry["id"], entry["file"])
        meta: FileMeta = self.manifest["files"][entry["file"]]
        return meta.copy()

    def subject_files(self) -> dict[str, FileMeta]:
        """The files a statement lists beside manifest.json: format 1 every file, format 2 the index
        files (the shards bind the entry files)."""
        if self._index is not None:
            return self._index.index_files()
        return dict(self.manifest["files"])

    def all_files(self) -> dict[str, FileMeta]:
        """Every file of the release but manifest.json, with its {sha256, size} (format 2: reads every shard)."""
        if self._index is not None:
            return {**self._index.index_files(), **self._index.all_files()}
        return dict(self.manifest["files"])

    def flat(self) -> Manifest:
        """The release as one format-1-shaped document (header, entries, their files, root digest)."""
        if self._index is None:
            return self.manifest
        flat = self.manifest.copy()
        del flat["index"]
        flat["entries"], flat["files"] = self.entries, self._index.all_files()
        return flat

    def prefix_table(self) -> release_index.PrefixTable:
        """Longest-prefix lookups by chained block hashes (format 2: the signed prefix index)."""
        if self._prefix is None:
            idx = self._index
            pages = idx.prefix_pages() if idx is not None else None
            if idx is not None and pages is not None:
                assert idx.prefix_meta is not None
                self._prefix = release_index.PrefixTable(int(idx.prefix_meta["block_tokens"]), pages, where=str(
                    pages.path))
            else:
                self._prefix = release_index.PrefixTable.from_entries(self.entries)
        return self._prefix

    def longest_prefix(self, token_ids: list[int], block_tokens: int | None = None) -> tuple[Entry, int] | None:
        """(entry, n): the entry whose first n token ids are the first n of `token_ids`, n the longest
        multiple of the index's block size (and of `block_tokens`, when given) any entry offers.

        The hit's token ids are compared with the entry record's, which the root digest binds: a
        hash collision or a tampered prefix index cannot graft another prefix.
        """
        table = self.prefix_table()
        hit = table.longest(token_ids)
        if hit is None:
            return None
        ordinal, blocks = hit
        if ordinal >= self.num_entries:
            raise IntegrityError(f"{table.where}: the record of the prompt's first {blocks} blocks names entry ordinal "
                                 f"{ordinal}; the release has {self.num_entries} entries")
        eid = self._index.id_at(ordinal) if self._index is not None else self.manifest["entries"][ordinal]["id"]
        entry = self.entry(eid)
        n = blocks * table.block_tokens
        if block_tokens is not None:
            n = n // block_tokens * block_tokens
        if n == 0:
            return None
        if entry["token_ids"][:n] != list(token_ids[:n]):
            raise IntegrityError(f"{self.root}: prefix index: entry {eid!r} does not start with the prompt's "
                                 f"first {n} tokens (the index names it)")
        return entry, n

    def entry_file(self, entry: Entry) -> Path:
        if self.source is not None and self.source.remote:  # read from elsewhere: the file arrives checked
            meta = self.file_meta(entry)
            self.source.fetch(entry["file"], meta["sha256"], meta["size"], f"entry {entry['id']!r}", entry)
        path = safe_path(self.root, entry["file"], f"entry {entry['id']!r}")
        if (st := jsonio.stat_or_none(path, follow=True)) is None or not stat.S_ISREG(st.st_mode):
            raise IntegrityError(f"{path}: entry {entry['id']!r}: file is missing")
        return path

    def tensor_layout(self, entry: Entry, fd: int | None = None) -> dict[str, stfile.TensorInfo]:
        """The file's safetensors header, checked against the manifest's tensor table.

        With `fd`, the header is read from that open file, the one the caller then reads tensors from.
        Header bytes identical to ones that already passed this check (for this entry, in this opened
        release) are not parsed again: the check is a function of those bytes and the manifest.
        """
        path = self.entry_file(entry)
        expected_size = self.file_meta(entry)["size"]
        size, n, raw = stfile.read_raw_header(path, fd)
        if size != expected_size:
            raise IntegrityError(f"{path}: entry {entry['id']!r}: {size} bytes, manifest says {expected_size}")
        tensors = entry["tensors"]
        seen = self._checked_headers.get(entry["id"])
        if seen is not None and (seen[0] is tensors or seen[0] == tensors) and seen[1] == raw:
            self._checked_headers.move_to_end(entry["id"])
            return seen[2]
        want_header = entry.get("header_sha256")
        if want_header is not None:
            # The header's exact bytes are bound by the record: with the tensor digests and the check
            # below that the tensors fill the rest of the file, every byte of the file is checked.
            actual = sha256_hex(struct.pack("<Q", n) + raw)
            if actual != want_header:
                raise IntegrityError(f"{path}: entry {entry['id']!r}: safetensors header bytes [0, {8 + n}): sha256 "
                                     f"{actual}, the manifest says {want_header}")
        parsed, _ = stfile.parse_header(path, size, n, raw)
        if set(parsed) != set(tensors):
            extra = sorted(set(parsed) - set(tensors))
            missing = sorted(set(tensors) - set(parsed))
            raise IntegrityError(f"{path}: entry {entry['id']!r}: tensors differ from the manifest "
                                 f"(missing {missing}, unexpected {extra})")
        for name, t in tensors.items():
            info = parsed[name]
            if (info.dtype, list(info.shape), [info.start, info.end]) != (t["dtype"], t["shape"], t["byte_range"]):
                raise IntegrityError(
                    f"{path}: entry {entry['id']!r} tensor {name!r}: header says {info.dtype} {list(info.shape)} "
                    f"bytes [{info.start}, {info.end}), manifest says {t['dtype']} {t['shape']} bytes {t['byte_range']}")
        if want_header is not None:
            at = 8 + n
            for info in sorted(parsed.values(), key=lambda i: (i.start, i.end)):
                if info.start != at:
                    break
                at = info.end
            if at != size:
                raise IntegrityError(f"{path}: entry {entry['id']!r}: bytes [{at}, {size}) belong to no tensor")
        self._checked_headers[entry["id"]] = (tensors, raw, parsed)
        if len(self._checked_headers) > CHECKED_HEADERS:
            self._checked_headers.popitem(last=False)
        return parsed


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class ReleaseWriter:
    """Builds a release in a temp folder beside the target and renames it into place.

    An interrupted capture leaves at most a hidden temp folder, never a release. Writes format 2
    (`format_version=1`: the single-manifest layout, for tests and tools that need one). With
    `keep_entries=False` (format 2 only) the records are not kept in memory once their shard is
    written, and `finish` returns manifest.json's document alone.
    """

    def __init__(self, out: Path, *, overwrite: bool = False, format_version: int = FORMAT_VERSION,
                 shard_entries: int = release_index.SHARD_ENTRIES, shard_bytes: int | None = None,
                 keep_entries: bool = True) -> None:
        if format_version not in FORMAT_VERSIONS:
            raise ValueError(f"format version {format_version}")
        if not keep_entries and format_version == 1:
            raise ValueError("a format-1 manifest holds every entry")
        self.out = Path(out)
        # Held until finish or abort: a second writer of the same release is refused (exit 8).
        self._lock = jsonio.OutputLock(self.out).__enter__()
        try:
            jsonio.refuse_existing(self.out, overwrite)
            with self._refused():
                self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".partial", dir=self.out.parent))
                self.tmp.chmod(0o755)
                (self.tmp / "entries").mkdir()
        except BaseException:
            self._lock.release()
            raise
        self.format_version = format_version
        self.keep_entries = keep_entries
        self.shard_entries = shard_entries
        self.shard_bytes = release_index.SHARD_BYTES if shard_bytes is None else shard_bytes
        self.entries: list[Entry] = []  # every record (kept), or the current shard's
        self.files: dict[str, FileMeta] = {}
        self.count = 0
        self.tokens = 0
        self._ids: set[str] = set()
        self._shard: list[Entry] = []
        self._shard_bytes = 0  # the current shard's records, as canonical JSON
        self._shard_files: dict[str, FileMeta] = {}
        self._shards: list[ShardListing] = []
        self._prefix = release_index.PrefixWriter()
        if format_version == 2:
            with self._refused():
                (self.tmp / release_index.INDEX_DIR).mkdir()

    def _refused(self) -> contextlib.AbstractContextManager[None]:
        """A refused write (disk full, I/O error, read-only) is IOFailure naming the release, not a file of its
        hidden temp folder (gone once the writer aborts)."""
        return jsonio.writing(self.out, always=True)

    def _entry_name(self) -> str:
        # Entry files are spread over folders of 1,000 so that no folder lists 10^5 names.
        n = self.count
        return f"{ENTRIES_DIR}/{n:05d}.safetensors" if n < 100_000 and self.format_version == 1 else \
            f"{ENTRIES_DIR}/{n // 1000:05d}/{n % 1000:03d}.safetensors"

    def add_entry(self, entry: Draft, tensors: dict[str, torch.Tensor]) -> Entry:
        """Write one entry's tensors; fill in file, tensor table and digest; return the entry."""
        from safetensors.torch import save

        contiguous = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        return self.add_entry_file(entry, save(contiguous, metadata={"kvgraft_entry": entry["id"]}))

    def add_entry_file(self, draft: Draft, data: bytes) -> Entry:
        """Write one entry's safetensors file as given; fill in file, tensor table (each tensor's
        SHA-256 over its stored bytes) and digest; return the entry. Imports no torch."""
        if draft["id"] in self._ids:
            raise InputError(f"{self.out}: entry id {draft['id']!r} appears twice")
        rel = self._entry_name()
        path = self.tmp / rel
        with self._refused():
            path.parent.mkdir(exist_ok=True)
            path.write_bytes(data)  # made durable by finish, all files at once
        header, _ = stfile.read_header(path)
        view = memoryview(data)
        tensors: dict[str, Tensor] = {
            name: {"dtype": cast("DType", info.dtype), "shape": list(info.shape), "sha256": sha256_hex(view[info.start:info.end]),
                   "byte_range": [info.start, info.end]}
            for name, info in sorted(header.items())
        }
        entry = cast("Entry", {**draft, "file": rel, "tensors": tensors})  # and its digest, below
        if self.format_version == 2:
            (n,) = struct.unpack_from("<Q", data, 0)
            entry["header_sha256"] = sha256_hex(view[:8 + n])
        entry["digest"] = entry_digest(entry)
        self._add_record(entry, rel, {"sha256": sha256_hex(data), "size": len(data)})
        return entry

    def _add_record(self, entry: Entry, rel: str, meta: FileMeta) -> None:
        self._ids.add(entry["id"])
        if self.keep_entries:
            self.entries.append(entry)
            self.files[rel] = meta
        if self.format_version == 2:
            self._prefix.add(self.count, entry["token_ids"])
            self._shard.append(entry)
            self._shard_files[rel] = meta
            self._shard_bytes += len(jsonio.canonical(entry))
            if len(self._shard) >= self.shard_entries or self._shard_bytes >= self.shard_bytes:
                self._flush_shard()
        self.count += 1
        self.tokens += int(entry["num_tokens"])

    def _flush_shard(self) -> None:
        if not self._shard:
            return
        name = release_index.shard_name(len(self._shards))
        doc = {"format": release_index.SHARD_FORMAT, "format_version": 2, "entries": self._shard,
               "files": self._shard_files}
        data = jsonio.canonical(doc)
        with self._refused():
            (self.tmp / name).write_bytes(data)  # made durable by finish
        # The token counts beside the ids: a sample is drawn and bounded from the manifest alone.
        self._shards.append({"file": name, "sha256": sha256_hex(data), "size": len(data),
                             "ids": [e["id"] for e in self._shard],
                             "num_tokens": [int(e["num_tokens"]) for e in self._shard]})
        self._shard, self._shard_files, self._shard_bytes = [], {}, 0

    def finish(self, header: Header) -> Manifest:
        """Write manifest.json (format 2: the last shard and the prefix index first), fsync, rename the
        folder into place; return the release as one document (Release.flat's shape) unless the
        writer keeps no entries (then manifest.json's document)."""
        base = {"format": FORMAT, "format_version": self.format_version, "kvgraft_version": __version__,
                "created": now_utc(), **header}
        if self.format_version == 1:
            # Typed once complete: its root digest is computed over the rest, then added.
            manifest = cast("Manifest", {**base, "entries": self.entries, "files": self.files})
            manifest["root_digest"] = root_digest(manifest)
            validate(manifest, CACHE_MANIFEST, str(self.out / MANIFEST))
        else:
            self._flush_shard()
            prefix = self._prefix.data()
            with self._refused():
                (self.tmp / release_index.PREFIX_FILE).write_bytes(prefix)
            index = {"entries": self.count, "tokens": self.tokens, "shards": self._shards,
                     "prefix": {"file": release_index.PREFIX_FILE, "sha256": sha256_hex(prefix), "size": len(prefix),
                                "block_tokens": self._prefix.block_tokens,
                                "records": len(prefix) // release_index.RECORD.size}}
            manifest = cast("Manifest", {**base, "index": index})
            manifest["root_digest"] = root_digest(manifest)
            validate(manifest, CACHE_MANIFEST_V2, str(self.out / MANIFEST))
        # One flush of the file system before the release appears, instead of an fsync per entry file
        # (6 ms each on a 2-vCPU VM's virtio disk: 10 minutes for 100,000 entries); then the manifest.
        with self._refused():
            (self.tmp / MANIFEST).write_bytes(jsonio.json_bytes(manifest))
            os.sync()
        self._publish()
        if self.format_version == 2 and self.keep_entries:
            flat = manifest.copy()
            del flat["index"]
            flat["entries"], flat["files"] = self.entries, self.files
            return flat
        return manifest

    def _publish(self) -> None:
        """Put the finished release at `out`: in one step (readers see the old release or the new one,
        never neither), or where the file system cannot swap, in two with the old one put back if the
        second fails. Once the new release is in place nothing raises: a step after it that fails (the
        old release's removal, the folder's flush) is a warning naming the path, not an error over a
        complete release."""
        replaced = jsonio.stat_or_none(self.out) is not None
        with self._refused():
            if not replaced:
                os.replace(self.tmp, self.out)
            else:
                try:
                    jsonio.exchange(self.tmp, self.out)  # self.tmp now holds the previous release
                except OSError as exc:
                    if exc.errno not in (errno.EINVAL, errno.ENOSYS, errno.ENOTSUP):
                        raise
                    old = self.tmp.with_suffix(".old")
                    os.replace(self.out, old)
                    try:
                        os.replace(self.tmp, self.out)
                    except OSError:
                        os.replace(old, self.out)
                        raise
                    self.tmp = old
        if replaced:
            try:
                jsonio.remove_tree(self.tmp)
            except OSError as exc:
                jsonio.warn(f"{self.out}: written and in place, but the release it replaced could not be removed "
                            f"from {self.tmp} ({exc.filename}: {exc.strerror}); delete it, or the next write of "
                            f"{self.out.name} will")
        try:
            jsonio.fsync_dir(self.out.parent)
        except OSError as exc:
            jsonio.warn(f"{self.out}: written and in place, but its folder could not be flushed to disk: {exc.strerror}")
        self._lock.release()

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
        self._lock.release()
