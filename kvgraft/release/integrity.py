"""Release integrity: a release folder's files, sizes and digests against its manifest and what a signature lists.

Steps 2-7 of `kvgraft.signing.verify`'s docstring. Knows no signature format: the subjects a statement or
signature lists, and any further check of what it states, come from the caller. Imports no torch.
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import stat
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import Error, InputError, IntegrityError, VerificationError
from kvgraft.release import format as release_format
from kvgraft.release import safetensors_header as stfile
from kvgraft.release import sources
from kvgraft.release.format import (
    BUNDLE_NAME,
    MANIFEST,
    OMS_NAME,
    Release,
    check_commitments,
    check_relpath,
    safe_path,
    tensor_mismatch,
)
from kvgraft.release.hashing import hash_file, hash_ranges, pool

MAX_RELEASE_FILES = 1_000_000
# What a statement says about a release beyond its file digests, checked against the parsed manifest
# (manifest, its sha256, its size); raises VerificationError when they disagree.
ManifestCheck = Callable[[dict[str, Any], str, int], None]


@dataclass
class CheckedRelease:
    """A release whose files, sizes, digests and safetensors headers matched its manifest."""

    root: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    manifest_size: int
    files: dict[str, str]  # name -> sha256 of every file, manifest.json included
    bytes_hashed: int
    tensors: int
    tensors_rehashed: int
    release: Release
    beside: dict[str, str] = field(default_factory=dict)  # files outside the manifest a signature lists, their sha256
    ignored: list[str] = field(default_factory=list)  # files outside the manifest a signature says it ignores


def release_folder_files(root: Path) -> set[str]:
    """Every regular file under `root` as a release-relative name, except the two signature files and a
    repository's metadata at the root (release_format.REPOSITORY_METADATA: .git, .github, .gitattributes,
    .gitignore, the paths the model_signing CLI ignores), which is neither listed nor looked into.

    Symlinks and special files anywhere else in the folder are refused: a release holds plain files.
    """
    root = Path(root)
    found: set[str] = set()
    stack: list[tuple[Path, str]] = [(root, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            with os.scandir(folder) as it:
                items = list(it)
        except OSError as exc:
            raise InputError(f"{folder}: cannot list: {exc.strerror}") from None
        for item in items:
            rel = prefix + item.name
            if not prefix and item.name in release_format.REPOSITORY_METADATA:
                continue
            try:
                mode = item.stat(follow_symlinks=False).st_mode
            except FileNotFoundError:
                continue  # gone since the listing: a file the manifest lists is then reported missing
            except OSError as exc:  # e.g. a path longer than PATH_MAX
                raise InputError(f"{root / rel}: cannot read: {exc.strerror}") from None
            if stat.S_ISLNK(mode):
                raise InputError(f"{root / rel}: is a symlink; releases may not contain links")
            if stat.S_ISDIR(mode):
                stack.append((Path(item.path), rel + "/"))
            elif stat.S_ISREG(mode):
                if rel not in (BUNDLE_NAME, OMS_NAME):
                    found.add(rel)
                    if len(found) > MAX_RELEASE_FILES:
                        raise InputError(f"{root}: more than {MAX_RELEASE_FILES} files")
            else:
                raise InputError(f"{root / rel}: is not a regular file; releases hold only plain files")
    return found


def _locate(rel: Release, name: str, actual: str, expected: str, source: str, by_sha: dict[str, str]) -> str:
    """One line naming where a file whose sha256 mismatches differs: which tensor, or its header."""
    path = rel.root / name
    base = f"{path}: sha256 {actual} does not match the {source} ({expected})"
    other = by_sha.get(actual)
    if other is not None and other != name:
        return f"{base}: it has the content of {other} (files swapped or copied)"
    entries = [e for e in rel.iter_entries() if e["file"] == name] \
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


def _unsigned_manifest_limit(root: Path, present: set[str]) -> int:
    stored = 0
    for name in present:
        if name != MANIFEST:
            with contextlib.suppress(OSError):  # gone: reported as missing later
                stored += (root / name).lstat().st_blocks * 512  # allocated bytes: a sparse file adds nothing
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


def check_release(root: Path, **options: Any) -> CheckedRelease:
    """_check_release, read again when the folder at `root` was replaced while it was read (a failure
    then says nothing about either release); any other failure stands."""
    root = Path(root)
    for attempt in range(1, READS_ACROSS_A_REPLACE + 1):
        before = _folder_id(root)
        try:
            return _check_release(root, **options)
        except Error:
            if attempt == READS_ACROSS_A_REPLACE or before is None or _folder_id(root) == before:
                raise
    raise AssertionError("unreachable")


def _check_release(root: Path, *, subjects: dict[str, str] | None = None, source: str = "manifest",
                   deep: bool = False, signed: bool = False, attested_root: str | None = None,
                   check_claims: ManifestCheck | None = None, beside: dict[str, str] | None = None,
                   beside_source: str = "OMS signature", subjects_beside: bool = False,
                   every_file: bool = False, ignored: Sequence[str] = ()) -> CheckedRelease:
    """The release's bytes against `subjects` (if any) and the manifest (module docstring).

    `subjects`: name -> sha256 that a statement or signature lists, manifest.json included; `source`
    names it in messages ("signed statement", ...); `attested_root`: the root digest it attests.
    `check_claims` checks the rest of what it states once the manifest is parsed, before the folder.
    `signed`: its signature was verified, so the manifest it pins is as large as its signer made it;
    otherwise the manifest is refused unparsed when larger than its data warrants (_unsigned_manifest_limit).
    Raises IntegrityError when bytes differ, VerificationError when the statement and the manifest
    disagree, InputError for unusable input.

    `beside`: files outside the manifest (name -> sha256) that `beside_source` lists, such as a Hub
    card: present and hashed like the release's own, reported in CheckedRelease.beside. With
    `subjects_beside`, the names `subjects` lists beyond the manifest are such files (an OMS signature
    that is the statement). `every_file`: `subjects` names every file of the release (an OMS list), not
    manifest.json and the files the statement binds directly (format 2: the index files).
    `ignored`: paths (files, or folders and all under them) that `beside_source` says it leaves out
    (OMS `ignore_paths`): a file there is not refused as extra, and reported in CheckedRelease.ignored; it
    excuses nothing the manifest lists.
    """
    root = Path(root)
    jsonio.require_folder(root)
    present = release_folder_files(root)
    stmt_subjects = subjects
    manifest_path = root / MANIFEST

    # 2. the manifest file against the statement, before it is parsed. Its bytes are read once: the
    # bytes hashed are the bytes parsed.
    if stmt_subjects is not None:
        if MANIFEST not in stmt_subjects:
            raise VerificationError(f"{root}: the {source} does not list {MANIFEST} as a subject")
        if MANIFEST not in present:
            raise IntegrityError(f"{manifest_path}: missing ({MANIFEST} is a subject of the {source})")
    if MANIFEST not in present:
        raise InputError(f"{manifest_path}: missing manifest (is {root} a cache release?)")
    limit = release_format.MAX_MANIFEST_BYTES if signed else _unsigned_manifest_limit(root, present)
    doc, msha, msize = _read_manifest(manifest_path, limit, signed, stmt_subjects, source, attested_root)
    if (remote := sources.of(root)) is not None:
        # A release read from elsewhere: every file it lists, fetched and checked, once manifest.json matched.
        remote.fetch_all()
        present = release_folder_files(root)
    # Start hashing the files now, on the pool, while this thread validates the manifest. Only regular
    # files found inside the folder whose size already equals the one the manifest states are read, so
    # a grown (or sparse-extended) file costs nothing before it is refused. Results are used only after
    # every check passed.
    stop = threading.Event()
    prefetch = {name: pool().submit(hash_file, root / name, size, stop)
                for name, size in _files_to_prefetch(root, present, doc)}
    try:
        return _check(root, present, prefetch, check_claims, stmt_subjects, source, deep, doc, msha, msize, stop,
                      dict(beside or {}), beside_source if beside else source, subjects_beside, every_file,
                      tuple(ignored))
    finally:
        stop.set()  # after a failure, hashing that is under way ends at its next block instead of running on
        for future in prefetch.values():
            future.cancel()


def _read_manifest(manifest_path: Path, limit: int, signed: bool, subjects: dict[str, str] | None, source: str,
                   attested_root: str | None) -> tuple[Any, str, int]:
    """Step 2: manifest.json read once within `limit`, its bytes against the statement's subject, then
    parsed (the bytes hashed are the bytes parsed). Returns (parsed document, sha256, size)."""
    what = "a manifest" if signed else (f"an unsigned manifest ({limit // 2**20} MiB here: 1/{UNSIGNED_MANIFEST_RATIO} "
                                        f"of the stored data, at least {UNSIGNED_MANIFEST_FLOOR // 2**20} MiB)")
    data = jsonio.read_bounded(manifest_path, limit, what)
    msha, msize = sha256_hex(data), len(data)
    if subjects is not None and msha != subjects[MANIFEST]:
        theirs = f"; the statement attests the release with root digest {attested_root}" \
            if attested_root is not None else ""
        raise IntegrityError(f"{manifest_path}: sha256 {msha} does not match the {source} ({subjects[MANIFEST]})"
                             f"{theirs}")
    return jsonio.loads_strict(data, str(manifest_path)), msha, msize


def _statement_matches(root: Path, manifest: dict[str, Any], msha: str, msize: int,
                       stmt_subjects: dict[str, str] | None, source: str, check_claims: ManifestCheck | None,
                       lists_more: bool = False, rel: Release | None = None,
                       files: dict[str, dict[str, Any]] | None = None) -> Release:
    """Step 3's statement half: the subjects a statement lists are manifest.json and the files the
    manifest lists (format 2: its index files; `files`: these instead), with the same digests; then what
    else it claims. `lists_more`: the subjects may name further files (an OMS list names every file of
    the folder)."""
    rel = rel if rel is not None else Release(root, manifest)
    if stmt_subjects is not None:
        listed = files if files is not None else rel.subject_files()
        expected = {MANIFEST: msha, **{name: f["sha256"] for name, f in listed.items()}}
        for name in sorted(set(expected) if lists_more else set(stmt_subjects) | set(expected)):
            if stmt_subjects.get(name) != expected.get(name):
                raise VerificationError(
                    f"{root / name}: the {source} lists sha256 {stmt_subjects.get(name)} and the manifest "
                    f"{expected.get(name)}")
    if check_claims is not None:
        check_claims(manifest, msha, msize)
    return rel


def open_release(root: Path, *, subjects: dict[str, str] | None = None, source: str = "manifest",
                 signed: bool = False, attested_root: str | None = None,
                 check_claims: ManifestCheck | None = None, lists_more: bool = False) -> CheckedRelease:
    """What opening a release checks (docs/verification.md): manifest.json's bytes against the
    statement's subject, its content (schema, commitments: format 1 every record, format 2 the index)
    and the statement against it. Reads manifest.json only: no entry file, no index shard."""
    root = Path(root)
    jsonio.require_folder(root)
    manifest_path = root / MANIFEST
    if subjects is not None and MANIFEST not in subjects:
        raise VerificationError(f"{root}: the {source} does not list {MANIFEST} as a subject")
    st = jsonio.stat_or_none(manifest_path)
    if st is None:
        if subjects is not None:
            raise IntegrityError(f"{manifest_path}: missing ({MANIFEST} is a subject of the {source})")
        raise InputError(f"{manifest_path}: missing manifest (is {root} a cache release?)")
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        raise InputError(f"{manifest_path}: is a symlink; releases may not contain links")
    limit = release_format.MAX_MANIFEST_BYTES
    if not signed:
        # Weighed against the data as check_release does, listing the folder only for a manifest above
        # the floor (a format-2 manifest is far below it: ~30 bytes per entry).
        limit = UNSIGNED_MANIFEST_FLOOR
        with contextlib.suppress(OSError):
            if manifest_path.lstat().st_size > UNSIGNED_MANIFEST_FLOOR:
                limit = _unsigned_manifest_limit(root, release_folder_files(root))
    doc, msha, msize = _read_manifest(manifest_path, limit, signed, subjects, source, attested_root)
    manifest = release_format.check_manifest(doc, manifest_path)
    rel = _statement_matches(root, manifest, msha, msize, subjects, source, check_claims, lists_more)
    check_commitments(root, manifest)
    files = {MANIFEST: msha, **{n: f["sha256"] for n, f in rel.subject_files().items()}}
    return CheckedRelease(root, manifest, msha, msize, files, msize, 0, 0, rel)


@dataclass
class CheckedEntry:
    entry: dict[str, Any]
    bytes_hashed: int
    tensors: int


def check_entry(rel: Release, entry_id: str, *, deep: bool = False) -> CheckedEntry:
    """One entry's file: its size, SHA-256 (the one its record states, which the root digest binds),
    its safetensors header against the record's tensor table and, with `deep`, every tensor's digest."""
    entry = rel.entry(entry_id)
    meta = rel.file_meta(entry)
    path = rel.entry_file(entry)
    try:
        sha, size = hash_file(path, meta["size"])
    except EOFError:
        raise IntegrityError(f"{path}: entry {entry_id!r}: the file shrank while it was being verified") from None
    except IntegrityError as exc:
        raise IntegrityError(f"{exc}: entry {entry_id!r}") from None
    if sha != meta["sha256"]:
        raise IntegrityError(_locate(rel, entry["file"], sha, meta["sha256"], "manifest", {}))
    rel.tensor_layout(entry)
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


def check_index(rel: Release, each: Callable[[dict[str, Any]], None] | None = None) -> int:
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


def _files_to_prefetch(root: Path, present: set[str], doc: Any) -> list[tuple[str, int]]:
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return []  # check_manifest says why
    sizes: dict[str, int] = {}
    for name, meta in files.items():
        want = meta.get("size") if isinstance(meta, dict) else None
        if name not in present or name == MANIFEST or type(want) is not int:
            continue
        try:
            if (root / name).stat().st_size == want:
                sizes[name] = want
        except OSError:
            continue  # gone already: reported as missing by the checks
    return sorted(sizes.items(), key=lambda item: -item[1])


def _result(future: Future[tuple[str, int]], path: Path) -> tuple[str, int]:
    try:
        return future.result()
    except EOFError:
        raise IntegrityError(f"{path}: the file shrank while it was being verified") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


# Files hashed ahead of the one whose result is awaited: enough to keep the pool busy, never one future per
# file of the release (a future holds a lock and a condition: ~1 KB each, 100 MB at 100,000 entries).
HASH_WINDOW = 64


def _hashed_in_order(root: Path, names: list[str], files: dict[str, dict[str, Any]],
                     prefetch: dict[str, Future[tuple[str, int]]], stop: threading.Event) -> list[tuple[str, int]]:
    """(sha256, size) of each file of `names`, in order, at most HASH_WINDOW in flight beyond the prefetch."""
    results: list[tuple[str, int]] = []
    window: collections.deque[tuple[str, Future[tuple[str, int]]]] = collections.deque()
    for name in names:
        future = prefetch.get(name) or pool().submit(hash_file, root / name, files[name]["size"], stop)
        window.append((name, future))
        if len(window) >= HASH_WINDOW:
            done, first = window.popleft()
            results.append(_result(first, root / done))
    while window:
        done, first = window.popleft()
        results.append(_result(first, root / done))
    return results


def _check(root: Path, present: set[str], prefetch: dict[str, Future[tuple[str, int]]], check_claims: ManifestCheck | None,
           stmt_subjects: dict[str, str] | None, source: str, deep: bool, doc: Any, msha: str,
           msize: int, stop: threading.Event, beside: dict[str, str], beside_source: str,
           subjects_beside: bool, every_file: bool, ignored: tuple[str, ...]) -> CheckedRelease:
    manifest_path = root / MANIFEST

    # 3. manifest content, statement vs manifest; its digests (the costly part) after the cheap
    # checks of step 4, so that a huge manifest that does not describe this folder is refused sooner
    manifest = release_format.check_manifest(doc, manifest_path)
    rel = Release(root, manifest)
    if rel.index is not None:
        check_commitments(root, manifest)  # the root digest binds the shard digests about to be trusted
    # Format 2: every shard is read and checked against the manifest here (their bytes are hashed
    # again with the other files below, which also finds one that changed since).
    all_files = rel.all_files()
    expected = {MANIFEST: msha, **{name: f["sha256"] for name, f in all_files.items()}}
    if stmt_subjects is not None and subjects_beside:
        beside.update({n: d for n, d in stmt_subjects.items() if n not in expected})
        stmt_subjects = {n: d for n, d in stmt_subjects.items() if n in expected}
    # The release's own files are compared with the OMS list by the caller (format 2: a statement lists
    # the index files, OMS every file); what is left is beside the manifest.
    for name in [n for n in beside if n in expected]:
        del beside[name]
    for name in beside:
        check_relpath(name, f"{root}: the {beside_source}")
        if name.split("/")[0] in release_format.REPOSITORY_METADATA:
            raise VerificationError(f"{root / name}: the {beside_source} lists it beside the release, which ignores "
                                    f"it")
    _statement_matches(root, manifest, msha, msize, stmt_subjects, source, check_claims, rel=rel,
                       files=all_files if every_file else None)
    # The records are read as they are checked (rel.iter_entries), never all kept: memory stays that of
    # a few shards and the file list, whatever the number of entries.

    # 4. the folder: names, missing, extra, sizes
    for name in all_files:
        safe_path(root, name, "manifest file")
    missing = sorted((set(expected) | set(beside)) - present)
    extra = sorted(present - set(expected) - set(beside))
    excused = [n for n in extra if any(n == p or n.startswith(p + "/") for p in ignored)]
    extra = sorted(set(extra) - set(excused))

    @functools.cache
    def users() -> dict[str, list[str]]:  # which entries use which file: read only to name them in a failure
        found: dict[str, list[str]] = {}
        for entry in rel.iter_entries():
            found.setdefault(entry["file"], []).append(entry["id"])
        return found

    def of(name: str) -> str:
        ids = users().get(name, [])
        return f"entry {ids[0]!r}{f' and {len(ids) - 1} more' if len(ids) > 1 else ''}" if ids else ""

    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(f'{n} ({of(n)})' if of(n) else n for n in missing[:5])}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
        if extra:
            parts.append(f"not part of the release: {', '.join(extra[:5])}"
                         + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""))
        # Named by the first missing file's path when there is one: the line says where to look.
        head = root / missing[0] if missing else root
        raise IntegrityError(f"{head}: files differ from the {source}: {'; '.join(parts)}")
    names = sorted(all_files)
    paths = [root / n for n in names]
    for name, path in zip(names, paths, strict=True):
        st = jsonio.stat_or_none(path)
        if st is None:
            raise IntegrityError(f"{path}: missing (removed while the release was verified)")
        want, have = all_files[name]["size"], st.st_size
        if have != want:
            how = "truncated" if have < want else "grown"
            label = f": {of(name)}" if of(name) else ""
            raise IntegrityError(f"{path}{label}: {have} bytes, the manifest says {want} ({how})")

    for name in sorted(beside):
        safe_path(root, name, f"file the {beside_source} lists")
    if rel.index is None:
        check_commitments(root, manifest)

    blocks = rel.index.prefix_blocks(rel.token_counts()) if rel.index is not None else []

    # 5. every byte, once, across cores (format 1: most of it already hashed by the prefetch)
    results = _hashed_in_order(root, names, all_files, prefetch, stop)
    by_sha = {sha: n for n, sha in expected.items()}
    bad = [(n, sha) for n, (sha, _) in zip(names, results, strict=True) if sha != expected[n]]
    beside_digests = {n: _result(pool().submit(hash_file, root / n, None, stop), root / n) for n in sorted(beside)}
    for n, (sha, _) in beside_digests.items():
        if sha != beside[n]:
            raise IntegrityError(f"{root / n}: sha256 {sha} does not match the {beside_source} ({beside[n]}); it is "
                                 f"beside the release, outside its manifest")
    if bad:
        name, actual = bad[0]
        message = _locate(rel, name, actual, expected[name], source, by_sha)
        if len(bad) > 1:
            message += f" (and {len(bad) - 1} more files differ: {', '.join(n for n, _ in bad[1:4])})"
        raise IntegrityError(message)

    # The prefix index's records, which a lookup trusts to name an entry and a number of blocks it holds
    # (their count weighed against the entries' blocks before step 5 reads them).
    if rel.index is not None:
        rel.index.check_prefix(blocks)

    # 6. safetensors headers against the manifest's tensor tables
    tensors = 0
    for entry in rel.iter_entries():
        rel.tensor_layout(entry)
        tensors += len(entry["tensors"])

    # 7. optionally every tensor byte range against its own digest
    rehashed = rehashed_bytes = 0
    if deep:
        for entry in rel.iter_entries():
            table = entry["tensors"]
            order = sorted(table, key=lambda n: table[n]["byte_range"][0])
            path = root / entry["file"]
            got = hash_ranges(path, [(table[n]["byte_range"][0], table[n]["byte_range"][1]) for n in order])
            for n, sha in zip(order, got, strict=True):
                if sha != table[n]["sha256"]:
                    a, b = table[n]["byte_range"]
                    raise IntegrityError(tensor_mismatch(f"{path}: entry {entry['id']!r}", n, a, b, sha, table[n]["sha256"]))
            rehashed += len(order)
            rehashed_bytes += sum(t["byte_range"][1] - t["byte_range"][0] for t in table.values())

    hashed = msize + sum(size for _, size in results) + sum(size for _, size in beside_digests.values()) + rehashed_bytes
    files = {MANIFEST: msha, **{n: sha for n, (sha, _) in zip(names, results, strict=True)}}
    return CheckedRelease(root, manifest, msha, msize, files, hashed, tensors, rehashed, rel,
                          {n: sha for n, (sha, _) in beside_digests.items()}, excused)

