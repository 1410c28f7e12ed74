"""A local folder standing for a remote release: its manifest and signatures now, every other file when first read.

Opening a remote release reads manifest.json and the signature files (release.sigstore.json, model.sig)
into a new folder under the cache's mirrors/. The mirror is the release's source
(kvgraft.release.sources.Source): when a reader of the release is about to open an index shard, the prefix
index or an entry's file, `fetch` brings that file into the verified cache (kvgraft.remote.transfer:
checked against the SHA-256 and size that the manifest, or the shard record it already checked, states)
and hard-links it into the folder. The readers then check the file as they check any local release, so
the signature, the manifest, the index and the entry bytes are verified by the same code for both.
An error raised while the mirror is open is named by the location, not the folder (`Source.name`, on leaving
the `with` block that holds the mirror); leaving it also removes the folder and keeps the cache within its limit.

`fetch_all` (verifying everything) brings every file the manifest lists. Where the location can be listed
(S3), files beside the listed ones are brought too, so that the check refuses them as it would locally;
over HTTP a folder cannot be listed, and the note it returns says so.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING

from kvgraft.errors import InputError
from kvgraft.release import sources
from kvgraft.release.format import MAX_MANIFEST_BYTES, REPOSITORY_METADATA, SIDE_FILES, Release, check_commitments, load_manifest
from kvgraft.release.records import MANIFEST, safe_path
from kvgraft.remote import hub
from kvgraft.remote.cache import Cache
from kvgraft.remote.location import Location
from kvgraft.remote.store import FetchError, HttpStore, S3Store, Settings, Store
from kvgraft.remote.subset import MAX_SUBSET_BYTES, SUBSET_NAME
from kvgraft.remote.transfer import Meter, fetch_piece, read_small

if TYPE_CHECKING:
    from kvgraft.release.models import Entry, FileMeta

MAX_SIGNATURE_BYTES = 64 * 1024 * 1024  # kvgraft.signing.attest.MAX_BUNDLE_BYTES: what the verifier reads at most
MAX_BESIDE_BYTES = 256 * 1024 * 1024  # a file beside the release on a listed location (a Hub card)
# The cache's size limit is enforced (one listing of the cache) after this many bytes were added to it,
# and when the mirror is closed (at the end of a command): not after each piece, which would list the cache once per entry.
EVICT_EVERY = 256 * 1024 * 1024


class Mirror(sources.Source):
    """A remote release's local folder (module docstring): the source of a release at an http(s)://, hf:// or
    s3:// location, its files read through `store` (one class per kind of store) into `cache`."""

    remote = True

    def __init__(self, loc: Location, store: Store, cache: Cache, notes: list[str]) -> None:
        self.loc, self.store, self._cache = loc, store, cache
        base = cache.root / "mirrors"
        base.mkdir(parents=True, exist_ok=True)
        super().__init__(Path(tempfile.mkdtemp(prefix="rel-", dir=base)), loc.url)
        self.notes = list(notes)
        # Held until closed: `kvgraft cache prune` removes only mirrors whose lock is free.
        self._lock_fd = os.open(f"{self.root}.lock", os.O_RDWR | os.O_CREAT, 0o644)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX)
        self._placed: set[str] = set()
        self._guard = threading.Lock()

    @property
    def cache(self) -> Path:
        return self._cache.root

    def close(self) -> None:
        """Remove the folder (the pieces stay in the cache) and keep the cache within its limit."""
        if self._lock_fd < 0:
            return
        shutil.rmtree(self.root, ignore_errors=True)
        with contextlib.suppress(OSError):
            os.unlink(f"{self.root}.lock")
        os.close(self._lock_fd)
        self._lock_fd = -1
        if self._cache.added:
            self._cache.evict()

    # ------------------------------------------------------------------------------------------ opening

    def open(self) -> None:
        """manifest.json, the signature files and a pulled subset's list, read at once (all but the first may be absent)."""
        wanted = [(MANIFEST, MAX_MANIFEST_BYTES, "the manifest"),
                  *[(name, MAX_SIGNATURE_BYTES, "a signature") for name in SIDE_FILES],
                  (SUBSET_NAME, MAX_SUBSET_BYTES, "a subset list")]
        with ThreadPoolExecutor(max_workers=len(wanted), thread_name_prefix="kvgraft-open") as ex:
            got = list(ex.map(lambda w: read_small(self.store, w[0], w[1], w[2]), wanted))
        if got[0] is None:
            raise FetchError(f"{self.store.shown(MANIFEST)}: not found: is {self.loc.url} a kvgraft cache release?")
        for (name, _, _), data in zip(wanted, got, strict=True):
            if data is not None:
                (self.root / name).write_bytes(data)

    # ------------------------------------------------------------------------------------------ files

    def fetch(self, name: str, sha256: str, size: int, what: str, entry: Entry | None = None,
              meter: Meter | None = None) -> None:
        if name in self._placed:
            return
        if name in (MANIFEST, *SIDE_FILES, SUBSET_NAME):  # read at opening, never replaced by a listed file
            raise InputError(f"{self.store.shown(name)}: {what}: the manifest lists {name} as a file of the release")
        target = safe_path(self.root, name, what)
        fetch_piece(self.store, self._cache, name, sha256, size, what, entry=entry, link=target, meter=meter)
        with self._guard:
            self._placed.add(name)
            evict = self._cache.added >= EVICT_EVERY
        if evict:
            self._cache.evict()

    def fetch_all(self) -> None:
        """Every file the manifest lists, a few at a time; then files beside them where the location is listed."""
        manifest = load_manifest(self.root)
        check_commitments(self.root, manifest)
        rel = Release(self.root, manifest)
        index = rel.index.index_files() if rel.index is not None else {}
        self._many([(n, m, None) for n, m in index.items()], "the index")
        users = {e["file"]: e for e in rel.entries}
        files = rel.all_files()
        self._many([(n, m, users.get(n)) for n, m in files.items() if n not in index], "the entries")
        listed = self.store.list()
        if listed is None:
            self.notes.append(f"{self.loc.url} cannot be listed over HTTP: files on the server beside those the "
                              f"manifest lists were not looked for")
            return
        for name in listed:
            top = name.split("/")[0]
            if name in files or name in (MANIFEST, *SIDE_FILES, SUBSET_NAME) or top in REPOSITORY_METADATA:
                continue
            data = read_small(self.store, name, MAX_BESIDE_BYTES, "a file beside the release")
            if data is not None:
                path = safe_path(self.root, name, "a file beside the release")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)

    def _many(self, files: list[tuple[str, FileMeta, Entry | None]], label: str) -> None:
        if not files:
            return
        meter = Meter(f"{label} of {self.loc.url} ({len(files)} files)", sum(int(m["size"]) for _, m, _ in files))

        def one(item: tuple[str, FileMeta, Entry | None]) -> None:
            name, meta, entry = item
            what = f"entry {entry['id']!r}" if entry is not None else name
            self.fetch(name, meta["sha256"], int(meta["size"]), what, entry, meter)

        parallel = int(getattr(getattr(self.store, "settings", None), "parallel", 4))
        try:
            with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kvgraft-fetch-all") as ex:
                futures = [ex.submit(one, f) for f in files]
                try:
                    for future in futures:
                        future.result()
                except BaseException:
                    ex.shutdown(cancel_futures=True)
                    raise
        finally:
            meter.close()


def open_store(loc: Location, settings: Settings | None = None) -> tuple[Store, list[str]]:
    """The store reading `loc`'s files, and what to say about it (the commit a Hub revision resolved to)."""
    settings = settings or Settings.from_env()
    if loc.kind == "s3":
        return S3Store(loc.bucket, loc.prefix, display=loc.url, settings=settings), []
    if loc.kind == "hf":
        return hub.open_store(loc, settings)
    return HttpStore(loc.target or loc.url, display=loc.url, headers=hub.headers_for(loc.target or loc.url),
                     settings=settings), []


def open_mirror(loc: Location, cache: Cache | None = None) -> Mirror:
    """The mirror of the release at `loc`, its manifest and signatures read; whoever opens it closes it
    (`with open_mirror(...) as mirror:`)."""
    cache = cache or Cache()
    cache.ready()
    store, notes = open_store(loc)
    mirror = Mirror(loc, store, cache, notes)
    try:
        mirror.open()
    except BaseException:
        mirror.close()
        raise
    return mirror
