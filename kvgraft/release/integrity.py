"""Release integrity: a release folder's files, sizes and digests against its manifest and an external listing.

Steps 2-7 of `kvgraft.signing.verify`'s docstring. Knows files and digests, not who lists them or why: an
external listing of the release's files (`Listing`, and `Beside` for files kept beside the manifest's) comes
from the caller, which names it in messages (its label) and says what it means. Imports no torch.

A check of everything (`check_release`) runs in the documented order, one named step each (`_check`): the
manifest file (2), its content and the listing against it (3), list the files, compare the folder, sizes (4),
digests (5), the prefix index, headers (6), tensors (7). It streams (format 2): files are listed, sized and
hashed a shard at a time, and the folder is compared with them by counting; names are compared only to say
what differs.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import functools
import hashlib
import os
import stat
import threading
from array import array
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import Error, InputError, IntegrityError, VerificationError
from kvgraft.release import format as release_format
from kvgraft.release import index as release_index
from kvgraft.release import safetensors_header as stfile
from kvgraft.release import sources
from kvgraft.release.format import SIDE_FILES, Release, check_commitments
from kvgraft.release.hashing import hash_file, hash_file_ranges, hash_ranges, pool
from kvgraft.release.records import MANIFEST, check_relpath, safe_path, tensor_mismatch

if TYPE_CHECKING:
    from kvgraft.release.models import Entry, FileMeta, Manifest, Tensor

MAX_RELEASE_FILES = 1_000_000
# What a listing says about a release beyond its file digests, checked against the parsed manifest
# (manifest, its sha256, its size); raises VerificationError when they disagree.
ManifestCheck = Callable[["Manifest", str, int], None]


@dataclass(frozen=True)
class Listing:
    """An external listing of a release's files: the digests that pin manifest.json and the files it binds.

    `files`: name -> sha256, manifest.json included. `label` names it in messages ("the {label} lists ...").
    `every_file`: it names every file of the release, not only manifest.json and the files the manifest binds
    directly (Release.subject_files: format 1 every file, format 2 the index files); it is then compared file
    by file as step 4 lists them. `keeps_beside` (with `every_file`): what it names beyond the release's files
    lies beside the release, checked as `Beside` files are; otherwise such a name is refused.
    `vouched`: its maker was verified, so the manifest it pins may be as large as they made it; otherwise the
    manifest is refused unparsed when larger than its data warrants (_unsigned_manifest_limit).
    `manifest_note`: what the listing says the release is, added to the message when manifest.json's digest
    differs from the listed one. `also`: what else it states, checked against the parsed manifest in step 3
    (before the folder, so a lying listing costs no hashing); raises VerificationError when they disagree.
    """

    files: Mapping[str, str]
    label: str
    every_file: bool = False
    keeps_beside: bool = False
    vouched: bool = False
    manifest_note: str = ""
    also: ManifestCheck | None = None


@dataclass(frozen=True)
class Beside:
    """What may lie in a release folder beside its manifest's files, as an external listing (`label` in
    messages) names it.

    `files`: name -> sha256 of files kept beside the release (a Hub card): present and hashed like the
    release's own, reported in CheckedRelease.beside (a name the manifest lists is the release's own).
    `excused`: paths (files, or folders and all under them) that the listing leaves out: a file there is not
    refused as extra, and is reported in CheckedRelease.ignored; it excuses nothing the manifest lists.
    """

    label: str
    files: Mapping[str, str] = field(default_factory=dict)
    excused: tuple[str, ...] = ()


@dataclass
class CheckedRelease:
    """A release whose files, sizes, digests and safetensors headers matched its manifest."""

    root: Path
    manifest: Manifest
    manifest_sha256: str
    manifest_size: int
    files: dict[str, str]  # name -> sha256 of every file, manifest.json included (format 2: see keep_files)
    bytes_hashed: int
    tensors: int
    tensors_rehashed: int
    release: Release
    beside: dict[str, str] = field(default_factory=dict)  # files outside the manifest (Beside.files), their sha256
    ignored: list[str] = field(default_factory=list)  # files outside the manifest in the paths Beside excuses
    count: int = 0  # the release's files checked, manifest.json included (format 2: more than `files` holds)


def _walk(root: Path) -> Iterator[tuple[str, os.stat_result]]:
    """(release-relative name, lstat) of every regular file under `root`, except the files a release keeps
    beside its manifest that are no part of it (release_format.SIDE_FILES) and a repository's metadata at the
    root (release_format.REPOSITORY_METADATA: .git, .github, .gitattributes, .gitignore, the paths the
    model_signing CLI ignores), which is neither listed nor looked into.

    Symlinks and special files anywhere else in the folder are refused: a release holds plain files.
    """
    root = Path(root)
    stack: list[tuple[Path, str]] = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except OSError as exc:
            raise jsonio.unreadable(folder, exc, "list") from None
        for item in items:
            rel = prefix + item.name
            if not prefix and item.name in release_format.REPOSITORY_METADATA:
                continue
            try:
                st = item.stat(follow_symlinks=False)
            except FileNotFoundError:
                continue  # gone since the listing: a file the manifest lists is then reported missing
            except OSError as exc:  # e.g. a path longer than PATH_MAX
                raise jsonio.unreadable(root / rel, exc) from None
            if stat.S_ISLNK(st.st_mode):
                raise InputError(f"{root / rel}: is a symlink; releases may not contain links")
            if stat.S_ISDIR(st.st_mode):
                stack.append((Path(item.path), rel + "/"))
            elif stat.S_ISREG(st.st_mode):
                if rel not in SIDE_FILES:
                    yield rel, st
            else:
                raise InputError(f"{root / rel}: is not a regular file; releases hold only plain files")


def release_folder_files(root: Path) -> set[str]:
    """Every regular file under `root` as a release-relative name (_walk says which, and what is refused)."""
    found: set[str] = set()
    for rel, _ in _walk(root):
        found.add(rel)
        if len(found) > MAX_RELEASE_FILES:
            raise InputError(f"{root}: more than {MAX_RELEASE_FILES} files")
    return found


@dataclass
class _Folder:
    """One walk of a release folder, streamed: what `verify` needs of it kept as counts, not names."""

    files: int  # regular files (_walk), manifest.json included
    stored: int  # bytes allocated to them, manifest.json excepted (a sparse file adds nothing)
    manifest: bool  # manifest.json is one of them
    under_ignored: list[str]  # those in the paths excused (Beside.excused)


def _scan(root: Path, ignored: Sequence[str] = ()) -> _Folder:
    files = stored = 0
    has_manifest = False
    under: list[str] = []
    for rel, st in _walk(root):
        files += 1
        if files > MAX_RELEASE_FILES:
            raise InputError(f"{root}: more than {MAX_RELEASE_FILES} files")
        if rel == MANIFEST:
            has_manifest = True
        else:
            stored += st.st_blocks * 512
            if _is_under(rel, ignored):
                under.append(rel)
    return _Folder(files, stored, has_manifest, under)


def _is_under(name: str, paths: Sequence[str]) -> bool:
    return any(name == p or name.startswith(p + "/") for p in paths)


def _locate(rel: Release, name: str, actual: str, expected: str, source: str, by_sha: dict[str, str],
            known: list[Entry] | None = None) -> str:
    """One line naming where a file whose sha256 mismatches differs: which tensor, or its header. `known`: the
    entries of that file, when the caller holds them (a pulled subset lacks the other entries' shards)."""
    path = rel.root / name
    base = f"{path}: sha256 {actual} does not match the {source} ({expected})"
    other = by_sha.get(actual)
    if other is not None and other != name:
        return f"{base}: it has the content of {other} (files swapped or copied)"
    entries = known if known is not None else [e for e in rel.iter_entries() if e["file"] == name] \
        if name.startswith("entries/") or rel.index is None else []
    if not entries:
        return base
    try:
        header, _ = stfile.read_header(path)
    except InputError as exc:
        return f"{base}: entry {entries[0]['id']!r}: the safetensors header is damaged ({exc})"
    st = jsonio.stat_or_none(path)
    data_start = min((t.start for t in header.values()), default=st.st_size if st is not None else 0)
    for entry in entries:
        tensors = entry["tensors"]
        try:
            rel.tensor_layout(entry)
        except (IntegrityError, InputError):
            return (f"{base}: entry {entry['id']!r}: the safetensors header region [0, {data_start}) differs "
                    f"(its tensor table no longer matches the manifest)")
        order = sorted(tensors, key=lambda n: tensors[n]["byte_range"][0])
        digests = hash_ranges(path, [(tensors[n]["byte_range"][0], tensors[n]["byte_range"][1]) for n in order])
        for n, got in zip(order, digests, strict=True):
            t = tensors[n]
            if got != t["sha256"]:
                a, b = t["byte_range"]
                where = f"{path}: entry {entry['id']!r}"
                return (f"{tensor_mismatch(where, n, a, b, got, t['sha256'])} "
                        f"(file sha256 {actual}, {source} says {expected})")
    return (f"{base}: entry {entries[0]['id']!r}: every tensor matches; the safetensors header region "
            f"[0, {data_start}) differs")


# An unsigned manifest (or one whose signature was not checked) is bounded by the data it describes
# before it is parsed: parsing costs about 9 bytes of memory and 50 ns per manifest byte, and nothing
# else stops a hostile one short of MAX_MANIFEST_BYTES. Real manifests are ~1/10,000 of their tensor
# bytes (token ids and tensor tables against the KV states of every token); 1/64 leaves a wide margin.
UNSIGNED_MANIFEST_FLOOR = 16 * 1024 * 1024
UNSIGNED_MANIFEST_RATIO = 64


def _unsigned_manifest_limit(stored: int) -> int:
    """`stored`: the bytes allocated to the release's files but manifest.json (_Folder.stored)."""
    return min(release_format.MAX_MANIFEST_BYTES, max(UNSIGNED_MANIFEST_FLOOR, stored // UNSIGNED_MANIFEST_RATIO))


# A release replaced while it is read (ReleaseWriter swaps the folder in one step) reads partly old,
# partly new: that fails its digests, and is read again, up to this many times in all.
READS_ACROSS_A_REPLACE = 3


def _folder_id(root: Path) -> tuple[int, int, int] | None:
    """What tells one folder at `root` from the next: its inode and the time it last changed (a rename
    changes it). The inode alone is not enough: a replaced release's folder is removed, and the folder of
    the write after next may get its inode number back (seen: a read across two replaces judged as a
    read of one folder)."""
    st = jsonio.stat_or_none(root, follow=True)
    return None if st is None else (st.st_dev, st.st_ino, st.st_ctime_ns)


def check_release(root: Path, listing: Listing | None = None, *, beside: Beside | None = None, deep: bool = False,
                  keep_files: bool = False, source: sources.Source | None = None) -> CheckedRelease:
    """_check_release, read again when the folder at `root` was replaced while it was read (a failure
    then says nothing about either release); any other failure stands."""
    root = Path(root)
    for attempt in range(1, READS_ACROSS_A_REPLACE + 1):
        before = _folder_id(root)
        try:
            return _check_release(root, listing=listing, beside=beside, deep=deep, keep_files=keep_files, source=source)
        except Error:
            if attempt == READS_ACROSS_A_REPLACE or before is None or _folder_id(root) == before:
                raise
    raise AssertionError("unreachable")


@dataclass
class _Run:
    """One check of everything (_check_release) as its steps hand it on: what was asked, and what was read."""

    root: Path
    listing: Listing | None
    label: str  # what the files are compared against, in messages: the listing's label, else "manifest"
    beside: dict[str, str]  # files beside the release: Beside.files (step 4 drops the release's own, adds keeps_beside's)
    beside_label: str  # what names them in messages: Beside.label, else `label`
    excused: tuple[str, ...]  # Beside.excused
    deep: bool
    keep_files: bool
    folder: _Folder
    source: sources.Source | None = None  # where the files come from (a remote one fetches them)
    doc: Any = None  # step 2: manifest.json parsed, its sha256 and size
    msha: str = ""
    msize: int = 0
    prefetch: dict[str, tuple[list[tuple[int, int]], Future[_Digests]]] = field(default_factory=dict)
    stop: threading.Event = field(default_factory=threading.Event)


def _check_release(root: Path, *, listing: Listing | None = None, beside: Beside | None = None, deep: bool = False,
                   keep_files: bool = False, source: sources.Source | None = None) -> CheckedRelease:
    """The release's bytes against `listing` (if any), `beside` (if any) and the manifest (module docstring).

    Raises IntegrityError when bytes differ, VerificationError when the listing and the manifest disagree,
    InputError for unusable input. `deep`: step 7, every tensor's digest.
    `keep_files`: CheckedRelease.files lists every file's digest (format 2: otherwise the manifest's and the
    index files', so that memory does not grow with the entries; a signer and a listing of every file need them all).
    """
    root = Path(root)
    jsonio.require_folder(root)
    label = listing.label if listing is not None else "manifest"
    named = dict(beside.files) if beside is not None else {}
    excused = beside.excused if beside is not None else ()
    run = _Run(root, listing, label, named, beside.label if beside is not None and named else label, tuple(excused),
               deep, keep_files, _scan(root, excused), source)
    _read_manifest_file(run)
    # Start hashing the files now, on the pool, while this thread validates the manifest. Only regular
    # files found inside the folder whose size already equals the one the manifest states are read, so
    # a grown (or sparse-extended) file costs nothing before it is refused. Results are used only after
    # every check passed.
    run.prefetch = {name: (ranges, pool().submit(hash_file_ranges, root / name, size, ranges, run.stop))
                    for name, size, ranges in _files_to_prefetch(root, run.doc)}
    try:
        return _check(run)
    finally:
        run.stop.set()  # after a failure, hashing that is under way ends at its next block instead of running on
        for _, future in run.prefetch.values():
            future.cancel()


def _listing_names_manifest(root: Path, listing: Listing | None) -> None:
    """Step 2's start: a listing names manifest.json (it pins the rest through it)."""
    if listing is not None and MANIFEST not in listing.files:
        raise VerificationError(f"{root}: the {listing.label} does not list {MANIFEST} as a subject")


def _missing_manifest(root: Path, listing: Listing | None) -> Error:
    """Step 2: what a folder without manifest.json is: damaged when a listing names it, else no release."""
    if listing is not None:
        return IntegrityError(f"{root / MANIFEST}: missing ({MANIFEST} is a subject of the {listing.label})")
    return InputError(f"{root / MANIFEST}: missing manifest (is {root} a cache release?)")


def _read_manifest_file(run: _Run) -> None:
    """Step 2 of a check of everything: manifest.json present and read once against the listing (_read_manifest),
    within the limit the listing allows; a release read from elsewhere is then fetched, every file it lists
    checked as it arrives, and the folder counted again."""
    _listing_names_manifest(run.root, run.listing)
    if not run.folder.manifest:
        raise _missing_manifest(run.root, run.listing)
    vouched = run.listing is not None and run.listing.vouched
    limit = release_format.MAX_MANIFEST_BYTES if vouched else _unsigned_manifest_limit(run.folder.stored)
    run.doc, run.msha, run.msize = _read_manifest(run.root / MANIFEST, limit, run.listing)
    if run.source is not None and run.source.remote:
        run.source.fetch_all()
        run.folder = _scan(run.root, run.excused)


def _read_manifest(manifest_path: Path, limit: int, listing: Listing | None) -> tuple[Any, str, int]:
    """Step 2: manifest.json read once within `limit`, its bytes against the listing's digest, then
    parsed (the bytes hashed are the bytes parsed). Returns (parsed document, sha256, size)."""
    vouched = listing is not None and listing.vouched
    what = "a manifest" if vouched else (f"an unsigned manifest ({limit // 2**20} MiB here: 1/{UNSIGNED_MANIFEST_RATIO} "
                                         f"of the stored data, at least {UNSIGNED_MANIFEST_FLOOR // 2**20} MiB)")
    data = jsonio.read_bounded(manifest_path, limit, what)
    msha, msize = sha256_hex(data), len(data)
    if listing is not None and msha != listing.files[MANIFEST]:
        note = f"; {listing.manifest_note}" if listing.manifest_note else ""
        raise IntegrityError(f"{manifest_path}: sha256 {msha} does not match the {listing.label} "
                             f"({listing.files[MANIFEST]}){note}")
    return jsonio.loads_strict(data, str(manifest_path)), msha, msize


def _listing_matches(rel: Release, msha: str, msize: int, listing: Listing | None, *, every_later: bool) -> None:
    """Step 3's listing half: the listing names manifest.json and the files the manifest binds directly
    (Release.subject_files), with the same digests, and no other file unless it names every file; then what
    else it states (Listing.also). `every_later`: a listing of every file is compared in step 4 instead."""
    if listing is None:
        return
    if not (listing.every_file and every_later):
        expected = {MANIFEST: msha, **{name: f["sha256"] for name, f in rel.subject_files().items()}}
        for name in sorted(set(expected) if listing.every_file else set(listing.files) | set(expected)):
            if listing.files.get(name) != expected.get(name):
                raise VerificationError(f"{rel.root / name}: the {listing.label} lists sha256 "
                                        f"{listing.files.get(name)} and the manifest {expected.get(name)}")
    if listing.also is not None:
        listing.also(rel.manifest, msha, msize)


def open_release(root: Path, listing: Listing | None = None, source: sources.Source | None = None) -> CheckedRelease:
    """What opening a release checks (docs/verification.md): manifest.json's bytes against the
    listing's digest, its content (schema, commitments: format 1 every record, format 2 the index)
    and the listing against it. Reads manifest.json only: no entry file, no index shard."""
    root = Path(root)
    jsonio.require_folder(root)
    manifest_path = root / MANIFEST
    _listing_names_manifest(root, listing)
    st = jsonio.stat_or_none(manifest_path)
    if st is None:
        raise _missing_manifest(root, listing)
    if stat.S_ISLNK(st.st_mode):
        raise InputError(f"{manifest_path}: is a symlink; releases may not contain links")
    limit = release_format.MAX_MANIFEST_BYTES
    if listing is None or not listing.vouched:
        # Weighed against the data as check_release does, listing the folder only for a manifest above
        # the floor (a format-2 manifest is far below it: ~30 bytes per entry).
        limit = UNSIGNED_MANIFEST_FLOOR
        with contextlib.suppress(OSError):
            if manifest_path.lstat().st_size > UNSIGNED_MANIFEST_FLOOR:
                limit = _unsigned_manifest_limit(_scan(root).stored)
    doc, msha, msize = _read_manifest(manifest_path, limit, listing)
    manifest = release_format.check_manifest(doc, manifest_path)
    rel = Release(root, manifest, source)
    _listing_matches(rel, msha, msize, listing, every_later=False)
    check_commitments(root, manifest)
    files = {MANIFEST: msha, **{n: f["sha256"] for n, f in rel.subject_files().items()}}
    return CheckedRelease(root, manifest, msha, msize, files, msize, 0, 0, rel, count=len(files))


@dataclass
class CheckedEntry:
    entry: Entry
    bytes_hashed: int
    tensors: int


def check_entry(rel: Release, entry_id: str, *, deep: bool = False) -> CheckedEntry:
    """One entry's file: its size, SHA-256 (the one its record states, which the root digest binds) and,
    in the same pass, every tensor's; its safetensors header against the record's tensor table; with
    `deep`, every tensor's digest read again."""
    entry = rel.entry(entry_id)
    meta = rel.file_meta(entry)
    path = rel.entry_file(entry)
    table = entry["tensors"]
    names = sorted(table, key=lambda n: table[n]["byte_range"][0])
    try:
        spans = [(table[n]["byte_range"][0], table[n]["byte_range"][1]) for n in names]
        sha, size, parts = hash_file_ranges(path, meta["size"], spans)
    except EOFError:
        raise IntegrityError(f"{path}: entry {entry_id!r}: the file shrank while it was being verified") from None
    except IntegrityError as exc:
        raise IntegrityError(f"{exc}: entry {entry_id!r}") from None
    if sha != meta["sha256"]:
        raise IntegrityError(_locate(rel, entry["file"], sha, meta["sha256"], "manifest", {}, known=[entry]))
    rel.tensor_layout(entry)
    for n, digest in zip(names, parts, strict=True):
        if digest != table[n]["sha256"]:
            a, b = table[n]["byte_range"]
            raise IntegrityError(tensor_mismatch(f"{path}: entry {entry_id!r}", n, a, b, digest, table[n]["sha256"]))
    hashed = size
    if deep:
        table = entry["tensors"]
        order = sorted(table, key=lambda n: table[n]["byte_range"][0])
        got = hash_ranges(path, [(table[n]["byte_range"][0], table[n]["byte_range"][1]) for n in order])
        for n, digest in zip(order, got, strict=True):
            if digest != table[n]["sha256"]:
                a, b = table[n]["byte_range"]
                raise IntegrityError(tensor_mismatch(f"{path}: entry {entry_id!r}", n, a, b, digest, table[n]["sha256"]))
            hashed += table[n]["byte_range"][1] - table[n]["byte_range"][0]
    return CheckedEntry(entry, hashed, len(entry["tensors"]))


def check_index(rel: Release, each: Callable[[Entry], None] | None = None) -> int:
    """Every index shard read, hashed and checked against the manifest, every record against its own
    commitments, one shard held at a time, and the prefix index's bytes (format 1: the manifest holds the
    records, checked when it was opened). `each(record)` runs on every record while its shard is held (what
    it reads of that entry reads no shard again). Returns the index bytes read."""
    before = rel.index.bytes_read if rel.index is not None else 0
    tokens: list[int] = []
    for entry in rel.iter_entries():
        tokens.append(int(entry["num_tokens"]))
        if each is not None:
            each(entry)
    if rel.index is None:
        return 0
    # The prefix index as `verify` of everything checks it: its record count against the entries' blocks
    # (before it is read), its digest, and each record.
    rel.index.check_prefix(rel.index.prefix_blocks(tokens))
    return rel.index.bytes_read - before


def _files_to_prefetch(root: Path, doc: Any) -> list[tuple[str, int, list[tuple[int, int]]]]:
    """The files to hash while the manifest is checked, each with the byte ranges the manifest's records
    (format 1) give its tensors, hashed in the same pass; unchecked yet, so only what is well-formed."""
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return []  # check_manifest says why
    sizes: dict[str, int] = {}
    for name, meta in files.items():
        want = meta.get("size") if isinstance(meta, dict) else None
        if not isinstance(name, str) or name == MANIFEST or type(want) is not int:
            continue
        try:
            check_relpath(name, "")  # unchecked yet: read only what is inside the folder (the walk refused links)
            st = (root / name).lstat()
            if stat.S_ISREG(st.st_mode) and st.st_size == want:
                sizes[name] = want
        except InputError:
            continue  # check_manifest says why
        except OSError:
            continue  # gone already: reported as missing by the checks
    ranges: dict[str, list[tuple[int, int]]] = {}
    entries = doc.get("entries")
    for entry in entries if isinstance(entries, list) else ():
        table = entry.get("tensors") if isinstance(entry, dict) else None
        name = entry.get("file") if isinstance(entry, dict) else None
        if not isinstance(table, dict) or name not in sizes:
            continue
        for t in table.values():
            span = t.get("byte_range") if isinstance(t, dict) else None
            if isinstance(span, list) and len(span) == 2 and all(type(x) is int for x in span):
                ranges.setdefault(name, []).append((span[0], span[1]))
    return sorted(((n, size, ranges.get(n, [])) for n, size in sizes.items()), key=lambda item: -item[1])


_T = TypeVar("_T")
_Digests = tuple[str, int, list[str]]  # a file's sha256 and size, and its tensors' sha256 (hash_file_ranges)


def _result(future: Future[_T], path: Path) -> _T:
    try:
        return future.result()
    except EOFError:
        raise IntegrityError(f"{path}: the file shrank while it was being verified") from None
    except OSError as exc:
        raise jsonio.unreadable(path, exc) from None


# Files hashed ahead of the one whose result is awaited: enough to keep the pool busy, never one future per
# file of the release (a future holds a lock and a condition: ~1 KB each, 100 MB at 100,000 entries).
HASH_WINDOW = 64

_Files = list[tuple[str, "FileMeta"]]


def _groups(rel: Release) -> Iterator[tuple[_Files, Callable[[], Iterable[Entry]]]]:
    """The release's files but manifest.json ({sha256, size} each) with the entry records that use them, a
    group at a time: format 1 one group; format 2 the index files, then each shard's (one shard held at a
    time). The records are read only when asked for."""
    if rel.index is None:
        yield list(rel.manifest["files"].items()), rel.iter_entries
        return
    index = rel.index
    yield list(index.index_files().items()), tuple
    for k in range(len(index.shards)):
        shard = index.shard(k)
        yield list(shard.files.items()), functools.partial(_records, shard)


def _records(shard: release_index.Shard) -> Iterator[Entry]:
    return (shard.record(e["id"]).copy() for e in shard.entries)


def _release_files(rel: Release) -> Iterator[tuple[str, FileMeta]]:
    return (item for files, _ in _groups(rel) for item in files)


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


@dataclass
class _Listed:
    """Step 4's pass over the files the release lists: what it found, in memory that does not grow with them."""

    keys: array[int] = field(default_factory=lambda: array("Q"))  # _name_key of each, sorted: counts distinct names
    missing: int = 0
    wrong_size: tuple[str, int, int] | None = None  # the first file of another size: name, have, want

    def distinct(self) -> int:
        keys = self.keys
        return sum(1 for i in range(len(keys)) if i == 0 or keys[i] != keys[i - 1])

    def holds(self, name: str) -> bool:
        """Whether `name` may be one of the files listed (a 64-bit digest matches: rarely a false yes)."""
        key = _name_key(name)
        i = bisect.bisect_left(self.keys, key)
        return i < len(self.keys) and self.keys[i] == key


def _list(run: _Run, rel: Release, every: Mapping[str, str] | None, unlisted: dict[str, str]) -> _Listed:
    """Every file the release lists: a safe name, present, of the size stated; against `every` (a listing
    of every file) when given. Names in `unlisted` and the files beside the release are taken out of them as
    they are met."""
    root, source, beside = run.root, run.label, run.beside
    listed = _Listed()
    for name, meta in _release_files(rel):
        path = safe_path(root, name, "manifest file")
        if every is not None and every.get(name) != meta["sha256"]:
            raise VerificationError(f"{path}: the {source} lists sha256 {every.get(name)} and the manifest "
                                    f"{meta['sha256']}")
        unlisted.pop(name, None)
        beside.pop(name, None)
        listed.keys.append(_name_key(name))
        st = jsonio.stat_or_none(path)
        if st is None or not stat.S_ISREG(st.st_mode):
            listed.missing += 1
        elif st.st_size != meta["size"] and listed.wrong_size is None:
            listed.wrong_size = (name, st.st_size, meta["size"])
    listed.keys = array("Q", sorted(listed.keys))
    return listed


def _users(rel: Release, names: Sequence[str]) -> dict[str, str]:
    """Which entries use each of these files, to name them in a failure: one pass over every record
    (failures only); a file no entry uses is absent."""
    ids: dict[str, list[str]] = {}
    wanted = set(names)
    for e in rel.iter_entries():
        if e["file"] in wanted:
            ids.setdefault(e["file"], []).append(e["id"])
    return {n: f"entry {i[0]!r}{f' and {len(i) - 1} more' if len(i) > 1 else ''}" for n, i in ids.items()}


def _folder_differs(run: _Run, rel: Release) -> tuple[list[str], int]:
    """The folder's names against the release's, exactly (sets of names: run when the counts disagreed).
    Raises IntegrityError naming what is missing and extra; returns the extra files in the excused paths, and
    how many distinct files the release lists beside manifest.json."""
    root, beside, ignored, source = run.root, run.beside, run.excused, run.label
    present = release_folder_files(root)
    expected = {MANIFEST} | {name for name, _ in _release_files(rel)}
    missing = sorted((expected | set(beside)) - present)
    extra = sorted(present - expected - set(beside))
    excused = [n for n in extra if _is_under(n, ignored)]
    extra = sorted(set(extra) - set(excused))
    if missing or extra:
        users = _users(rel, missing[:5])

        def named(n: str) -> str:
            return f"{n} ({users[n]})" if n in users else n

        parts = []
        if missing:
            parts.append(f"missing {', '.join(named(n) for n in missing[:5])}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
        if extra:
            parts.append(f"not part of the release: {', '.join(extra[:5])}"
                         + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""))
        # Named by the first missing file's path when there is one: the line says where to look.
        head = root / missing[0] if missing else root
        raise IntegrityError(f"{head}: files differ from the {source}: {'; '.join(parts)}")
    return excused, len(expected) - 1


@dataclass
class _Hashed:
    """Steps 5-7 as they stream: totals, and the first failure of each step (raised in step order at the end)."""

    bytes: int = 0
    tensors: int = 0
    rehashed: int = 0
    rehashed_bytes: int = 0
    bad: list[tuple[str, str, str]] = field(default_factory=list)  # the first 4 files that differ: name, got, want
    bad_count: int = 0
    header: Error | None = None
    tensor: str | None = None
    digests: dict[str, str] = field(default_factory=dict)  # name -> sha256 of the files kept (CheckedRelease.files)


# A tensor whose digest is checked in its file's pass: the entry, the tensor, its byte range, its sha256.
_Tensor = tuple[str, str, int, int, str]


def _hash_all(run: _Run, rel: Release) -> _Hashed:
    """Step 5, every file's bytes once across cores, at most HASH_WINDOW in flight beyond the prefetch, and in
    the same pass every tensor's byte range against its digest; step 6, each entry's safetensors header
    against its record; step 7 with `deep`, every tensor's digest read again. A shard at a time: memory does
    not grow with the entries. Kept (_Hashed.digests): every file's digest with `keep_files` or format 1,
    else those manifest.json binds directly (format 2: the index files)."""
    root, prefetch, stop, deep = run.root, run.prefetch, run.stop, run.deep
    kept = None if run.keep_files or rel.index is None else set(rel.subject_files())
    out = _Hashed()
    window: collections.deque[tuple[str, str, Future[_Digests], list[_Tensor], list[int]]] = collections.deque()

    def settle() -> None:
        name, want, future, tensors, at = window.popleft()
        sha, size, parts = _result(future, root / name)
        out.bytes += size
        if kept is None or name in kept:
            out.digests[name] = sha
        if sha != want:
            out.bad_count += 1
            if len(out.bad) < 4:
                out.bad.append((name, sha, want))
        elif out.tensor is None:
            for (eid, n, a, b, stated), i in zip(tensors, at, strict=True):
                if parts[i] != stated:
                    out.tensor = tensor_mismatch(f"{root / name}: entry {eid!r}", n, a, b, parts[i], stated)
                    break

    for files, records in _groups(rel):
        entries = list(records())  # the shard is held: its records cost no read
        tensors: dict[str, list[_Tensor]] = {}
        for entry in entries:
            for n, t in entry["tensors"].items():
                a, b = t["byte_range"]
                tensors.setdefault(entry["file"], []).append((str(entry["id"]), n, a, b, t["sha256"]))
        for name, meta in files:
            spans = [(a, b) for _, _, a, b, _ in tensors.get(name, ())]
            ahead = prefetch.get(name)
            if ahead is not None and set(spans) <= set(ahead[0]):
                place = {span: i for i, span in enumerate(ahead[0])}
                future, at = ahead[1], [place[span] for span in spans]
            else:
                future = pool().submit(hash_file_ranges, root / name, meta["size"], spans, stop)
                at = list(range(len(spans)))
            window.append((name, meta["sha256"], future, tensors.get(name, []), at))
            if len(window) >= HASH_WINDOW:
                settle()
        for entry in entries:
            try:
                rel.tensor_layout(entry)
            except Error as exc:
                out.header = out.header or exc
                continue
            out.tensors += len(entry["tensors"])
            if deep and out.tensor is None:
                out.tensor = _rehash(root, entry["id"], entry["file"], entry["tensors"], out)
    while window:
        settle()
    return out


def _rehash(root: Path, eid: str, file: str, table: dict[str, Tensor], out: _Hashed) -> str | None:
    """Step 7 for one entry (its file and tensor table): every tensor's bytes against its digest; the failure's
    one line, or None."""
    order = sorted(table, key=lambda n: table[n]["byte_range"][0])
    path = root / file
    got = hash_ranges(path, [(table[n]["byte_range"][0], table[n]["byte_range"][1]) for n in order])
    for n, sha in zip(order, got, strict=True):
        if sha != table[n]["sha256"]:
            a, b = table[n]["byte_range"]
            return tensor_mismatch(f"{path}: entry {eid!r}", n, a, b, sha, table[n]["sha256"])
    out.rehashed += len(order)
    out.rehashed_bytes += sum(t["byte_range"][1] - t["byte_range"][0] for t in table.values())
    return None


def _check(run: _Run) -> CheckedRelease:
    """Steps 3-7 of a check of everything, one named function each, in the documented order (module docstring);
    the first failure raises. The records are read a shard at a time as they are checked (format 2), never all
    kept: memory is the manifest's and a few shards', whatever the number of entries."""
    rel = _open_manifest(run)  # 3
    listed = _list_files(run, rel)  # 4
    _check_beside_names(run)
    excused, distinct = _compare_folder(run, rel, listed)
    _check_sizes(run.root, rel, listed)
    blocks = _before_the_bytes(run, rel)
    done = _hash_all(run, rel)  # 5-7, streamed: their failures are raised below, in step order
    beside = _check_beside_digests(run)  # 5
    _check_digests(run, rel, done)
    _check_prefix_index(rel, blocks)
    _check_headers_and_tensors(done)  # 6, 7
    hashed = run.msize + done.bytes + sum(size for _, size in beside.values()) + done.rehashed_bytes
    files = {MANIFEST: run.msha, **dict(sorted(done.digests.items()))}
    return CheckedRelease(run.root, rel.manifest, run.msha, run.msize, files, hashed, done.tensors, done.rehashed, rel,
                          {n: sha for n, (sha, _) in beside.items()}, excused, 1 + distinct)


def _open_manifest(run: _Run) -> Release:
    """Step 3: the manifest's content (schema; format 2: the root digest binding the shard digests about to be
    trusted), then the listing against it (_listing_matches; a listing of every file waits for step 4)."""
    manifest = release_format.check_manifest(run.doc, run.root / MANIFEST)
    rel = Release(run.root, manifest, run.source)
    if rel.index is not None:
        check_commitments(run.root, manifest)
    _listing_matches(rel, run.msha, run.msize, run.listing, every_later=True)
    return rel


def _list_files(run: _Run, rel: Release) -> _Listed:
    """Step 4, list the files: every file the release lists, in one pass (_list), against a listing of every
    file when there is one; what that listing names beyond them then lies beside the release (keeps_beside),
    or is refused."""
    listing = run.listing
    every = listing.files if listing is not None and listing.every_file else None
    unlisted = {n: d for n, d in (every or {}).items() if n != MANIFEST}
    listed = _list(run, rel, every, unlisted)
    if unlisted and listing is not None and listing.keeps_beside:
        run.beside.update(unlisted)
    elif unlisted:
        name = min(unlisted)
        raise VerificationError(f"{run.root / name}: the {run.label} lists sha256 {unlisted[name]} and the manifest "
                                f"None")
    return listed


def _check_beside_names(run: _Run) -> None:
    """Step 4, the files beside the release: safe names, none in the repository metadata the walk leaves out."""
    for name in run.beside:
        check_relpath(name, f"{run.root}: the {run.beside_label}")
        if name.split("/")[0] in release_format.REPOSITORY_METADATA:
            raise VerificationError(f"{run.root / name}: the {run.beside_label} lists it beside the release, which "
                                    f"ignores it")


def _compare_folder(run: _Run, rel: Release, listed: _Listed) -> tuple[list[str], int]:
    """Step 4, compare the folder: the walk counted its files; with every file listed present, equal counts
    mean no other file is there. A count that differs (or a rare digest collision of two names) asks the exact
    comparison (_folder_differs, which raises naming them). Returns the excused files found, and how many
    distinct files the release lists beside manifest.json."""
    root, beside = run.root, run.beside
    excused = [n for n in run.folder.under_ignored if n not in beside and not listed.holds(n)]
    distinct = listed.distinct()
    beside_present = all((st := jsonio.stat_or_none(root / n)) is not None and stat.S_ISREG(st.st_mode)
                         for n in beside)
    if listed.missing or not beside_present or run.folder.files != 1 + distinct + len(beside) + len(excused):
        return _folder_differs(run, rel)
    return excused, distinct


def _check_sizes(root: Path, rel: Release, listed: _Listed) -> None:
    """Step 4, sizes: the first file of another size than the manifest states, with the entries using it."""
    if listed.wrong_size is None:
        return
    name, have, want = listed.wrong_size
    users = _users(rel, [name]).get(name, "")
    raise IntegrityError(f"{root / name}{f': {users}' if users else ''}: {have} bytes, the manifest says {want} "
                         f"({'truncated' if have < want else 'grown'})")


def _before_the_bytes(run: _Run, rel: Release) -> list[int]:
    """The end of steps 3-4, before a byte is weighed: each file beside the release a path inside the folder;
    format 1's entry and root digests (format 2's were checked in step 3); the prefix index's record count
    against the entries' blocks (format 2: returned, its records checked after step 5)."""
    for name in sorted(run.beside):
        safe_path(run.root, name, f"file the {run.beside_label} lists")
    if rel.index is None:
        check_commitments(run.root, rel.manifest)
        return []
    return rel.index.prefix_blocks(rel.token_counts())


def _check_beside_digests(run: _Run) -> dict[str, tuple[str, int]]:
    """Step 5 for the files beside the release: each hashed, against the digest its listing gives.
    Returns name -> (sha256, size)."""
    root, beside = run.root, run.beside
    digests = {n: _result(pool().submit(hash_file, root / n, None, run.stop), root / n) for n in sorted(beside)}
    for n, (sha, _) in digests.items():
        if sha != beside[n]:
            raise IntegrityError(f"{root / n}: sha256 {sha} does not match the {run.beside_label} ({beside[n]}); it is "
                                 f"beside the release, outside its manifest")
    return digests


def _check_digests(run: _Run, rel: Release, done: _Hashed) -> None:
    """Step 5, digests: the first file whose bytes differ from the manifest's digest, located to its tensor or
    header (_locate), with how many more differ."""
    if not done.bad:
        return
    name, actual, stated = done.bad[0]
    by_sha = {meta["sha256"]: n for n, meta in _release_files(rel)} | {run.msha: MANIFEST}
    message = _locate(rel, name, actual, stated, run.label, by_sha)
    if done.bad_count > 1:
        message += f" (and {done.bad_count - 1} more files differ: {', '.join(n for n, _, _ in done.bad[1:4])})"
    raise IntegrityError(message)


def _check_prefix_index(rel: Release, blocks: list[int]) -> None:
    """The prefix index (format 2, after step 5): its records, which a lookup trusts to name an entry and a
    number of blocks it holds (their count was weighed against the entries' blocks before step 5 read them)."""
    if rel.index is not None:
        rel.index.check_prefix(blocks)


def _check_headers_and_tensors(done: _Hashed) -> None:
    """Steps 6 and 7: the first entry whose safetensors header differs from its record, then (deep) the first
    tensor whose bytes differ from its digest."""
    if done.header is not None:
        raise done.header
    if done.tensor is not None:
        raise IntegrityError(done.tensor)
