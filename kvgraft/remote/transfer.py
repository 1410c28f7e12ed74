"""Fetch one file of a remote release into the verified cache: byte ranges in parallel, retried, resumed, checked.

A piece (a file the signed chain binds by SHA-256 and size) is fetched as byte ranges of at most
Settings.chunk bytes, a few at a time, each into its own partial file under the cache. A try that ends
early (connection dropped, timeout, 5xx, short body) is retried after a pause, resuming after the last
byte received; a later process resumes the same way. Once every range is complete, the ranges are joined
and hashed: a piece whose SHA-256 is not the one expected is deleted with its partial files and the
error names the byte range that differs (the entry record's header and tensor digests locate it); only a
piece that matched is renamed into the cache. The size comes from the signed chain alone: a range is
asked for by its bounds and a body longer than asked for is refused.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import shutil
import stat
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, TextIO, TypeVar

from kvgraft.errors import IntegrityError
from kvgraft.remote.cache import Cache
from kvgraft.remote.store import FetchError, NotFound, Oversize, Refused, Store, Transient

if TYPE_CHECKING:
    from kvgraft.release.models import Entry

T = TypeVar("T")
FIRST_PAUSE = 0.2  # seconds before the second try; doubled for each further one, up to MAX_PAUSE
MAX_PAUSE = 5.0


class Meter:
    """Progress of long fetches on stderr: bytes, rate, time left. Silent for the first `after` seconds (a
    short fetch prints nothing) and for less than `least` bytes in all (a slow machine's small file would read
    "0.0 of 0.0 MiB"); then a line every `every` seconds, rewritten in place on a terminal."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, after: float = 2.0,
                 every: float | None = None, least: int = 2**20) -> None:
        self.label, self.total, self.done, self.least = label, total, 0, least
        self.stream = stream if stream is not None else sys.stderr
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)())
        self.after, self.every = after, every if every is not None else (0.5 if self.tty else 10.0)
        self.started = time.monotonic()
        self.shown_at: float | None = None
        self._lock = threading.Lock()

    def add(self, n: int) -> None:
        with self._lock:
            self.done += n
            now = time.monotonic()
            early = now - self.started < self.after or (self.shown_at is not None and now - self.shown_at < self.every)
            if early or self.total < self.least:
                return
            self.shown_at = now
            self._show(now)

    def line(self, now: float) -> str:
        elapsed = max(now - self.started, 1e-9)
        rate = self.done / elapsed
        left = f"{(self.total - self.done) / rate:.0f} s left" if rate > 0 else "time left unknown"
        return (f"kvgraft: fetching {self.label}: {self.done / 2**20:.1f} of {self.total / 2**20:.1f} MiB, "
                f"{rate / 2**20:.1f} MiB/s, {left}")

    def _show(self, now: float) -> None:
        self.stream.write(("\r" + self.line(now) + "\x1b[K") if self.tty else self.line(now) + "\n")
        self.stream.flush()

    def close(self) -> None:
        if self.shown_at is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()


def retrying(call: Callable[[], T], where: str, tries: int, *, deadline: float | None = None,
             stream: TextIO | None = None) -> T:
    """`call`, tried up to `tries` times while it fails with Transient and `deadline` (time.monotonic()) has not
    passed; then a FetchError naming `where`. Refused is not retried. After two seconds each retry is said on
    stderr, so that a wait on a slow or silent server is never silent."""
    pause, started = FIRST_PAUSE, time.monotonic()
    for attempt in range(1, tries + 1):
        try:
            return call()
        except Refused as exc:
            raise FetchError(f"{where}: {exc} (not retried: another try would get the same answer)") from None
        except Transient as exc:
            tried = f"{attempt} {'try' if attempt == 1 else 'tries'}"
            if deadline is not None and time.monotonic() + pause >= deadline:
                raise FetchError(f"{where}: {exc}; no complete answer before the fetch deadline "
                                 f"(KVGRAFT_FETCH_DEADLINE) ({tried})") from None
            if attempt == tries:
                raise FetchError(f"{where}: {exc} ({tried})") from None
            if time.monotonic() - started >= 2.0:
                out = stream if stream is not None else sys.stderr
                out.write(f"kvgraft: waiting for {where}: {exc}; try {attempt + 1} of {tries} in {pause:.1f} s\n")
                out.flush()
        time.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)
    raise AssertionError("unreachable")


def deadline_of(store: Store) -> float:
    """When a fetch from `store` that starts now must end (KVGRAFT_FETCH_DEADLINE)."""
    return time.monotonic() + float(getattr(getattr(store, "settings", None), "deadline", 3600.0))


def read_small(store: Store, name: str, limit: int, what: str) -> bytes | None:
    """A whole file of unknown size (manifest.json, a signature), at most `limit` bytes; None when absent. The
    answer must be as long as the server announced: a cut one is retried, never taken as the whole file."""
    chunks: list[bytes] = []
    deadline = deadline_of(store)

    def once() -> None:
        chunks.clear()
        store.get(name, 0, limit + 1, chunks.append, complete=True, deadline=deadline)

    try:
        retrying(once, f"{store.shown(name)}: {what}", store_tries(store), deadline=deadline)
    except NotFound:
        return None
    except Oversize:
        raise FetchError(f"{store.shown(name)}: {what} is larger than {limit} bytes") from None
    data = b"".join(chunks)
    if len(data) > limit:
        raise FetchError(f"{store.shown(name)}: {what} is larger than {limit} bytes")
    return data


def store_tries(store: Store) -> int:
    return int(getattr(getattr(store, "settings", None), "tries", 5))


def _ranges(size: int, chunk: int) -> list[tuple[int, int]]:
    return [(a, min(a + chunk, size)) for a in range(0, size, chunk)]


def _fill(store: Store, name: str, part: Path, start: int, end: int, what: str, meter: Meter | None,
          deadline: float, whole: int | None = None) -> None:
    """Bytes [start, end) of `name` into the file `part`, resuming after what it already holds. `whole`: see
    Store.get (the part then holds the file up to `whole` when the server sent it all)."""
    where = f"{store.shown(name)}: {what}: bytes [{start}, {end})"

    def once() -> None:
        try:
            st = part.lstat()
        except FileNotFoundError:
            st = None
        if st is not None and not stat.S_ISREG(st.st_mode):  # not what a fetch leaves: a folder, a link
            shutil.rmtree(part) if stat.S_ISDIR(st.st_mode) else part.unlink()
            st = None
        have = st.st_size if st is not None else 0
        if have > max(end, whole or 0) - start:  # a partial file longer than its range: not ours to trust
            part.unlink()
            have = 0
        if have >= end - start:
            return
        with open(part, "ab") as f:
            def sink(block: bytes) -> None:
                f.write(block)
                if meter is not None:
                    meter.add(len(block))

            got = store.get(name, start + have, end, sink, whole=whole, deadline=deadline)
        if have + got < end - start:
            raise Transient(f"the answer ended after {have + got} of {end - start} bytes (connection closed or a "
                            f"wrong Content-Length)")

    try:
        retrying(once, where, store_tries(store), deadline=deadline)
    except NotFound as exc:
        raise IntegrityError(f"{store.shown(name)}: {what}: missing on the server ({exc})") from None
    except Oversize as exc:
        raise FetchError(f"{where}: {exc}") from None


def _parts(entry: Entry | None, size: int) -> list[tuple[int, int, str, str]]:
    """(start, end, sha256, label) of the byte ranges an entry record binds: its safetensors header, its tensors."""
    if entry is None or not isinstance(entry.get("tensors"), dict):
        return []
    tensors = entry["tensors"]
    out = [(int(t["byte_range"][0]), int(t["byte_range"][1]), str(t["sha256"]), f"tensor {n!r}")
           for n, t in tensors.items()]
    if entry.get("header_sha256"):
        out.append((0, min((a for a, _, _, _ in out), default=size), str(entry["header_sha256"]), "safetensors header"))
    return sorted(out)


def _locate(path: Path, entry: Entry | None, size: int) -> str | None:
    """'bytes [a, b) (tensor ...): sha256 X, the record says Y' for the first bound range that differs."""
    with open(path, "rb") as f:
        for a, b, want, label in _parts(entry, size):
            f.seek(a)
            got = hashlib.sha256(f.read(b - a)).hexdigest()
            if got != want:
                return f"bytes [{a}, {b}) ({label}): sha256 {got}, the signed record says {want}"
    return None


def fetch_piece(store: Store, cache: Cache, name: str, sha256: str, size: int, what: str, *,
                entry: Entry | None = None, link: Path | None = None, meter: Meter | None = None) -> Path:
    """The cached piece of `name`, fetched and checked first unless the cache holds it intact; with `link`,
    also hard-linked (else copied) there while the piece's lock is held, so that no eviction comes between.
    A cached piece that no longer hashes to its name (changed, or replaced by a link) is evicted and fetched
    once more. `meter`: the progress this fetch adds to (default: its own, shown when the fetch is long)."""
    with cache.lock(sha256):
        piece = cache.has(sha256, size)
        if piece is not None and not cache.intact(sha256, size):
            cache.discard(sha256)
            sys.stderr.write(f"kvgraft: note: {piece}: the cached piece of {store.shown(name)} no longer matched its "
                             f"SHA-256; evicted from the cache and fetched again\n")
            piece = None
        if piece is None:
            piece = _fetch_locked(store, cache, name, sha256, size, what, entry, meter)
            cache.added += size
        if link is not None:
            place(piece, link)
    return piece


FICLONE = 0x40049409  # Linux ioctl: the copy shares the source's blocks until either is written (btrfs, XFS)


def place(piece: Path, link: Path, *, hard: bool = True) -> None:
    """`piece` at `link`: a hard link (pieces are never written in place), else, or unless `hard`, a copy of
    its own (a reflink where the file system makes one), which may be changed without touching the cache."""
    link.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if os.path.samefile(piece, link):
            return
        link.unlink()
    if hard:
        with contextlib.suppress(OSError):  # another file system, or one without hard links: a copy
            os.link(piece, link)
            return
    with open(piece, "rb") as src, open(link, "xb") as dst:
        try:
            import fcntl

            fcntl.ioctl(dst.fileno(), FICLONE, src.fileno())
        except OSError:
            shutil.copyfileobj(src, dst, 8 * 2**20)


def _fetch_locked(store: Store, cache: Cache, name: str, sha256: str, size: int, what: str,
                  entry: Entry | None, shared: Meter | None) -> Path:
    work = cache.partial(sha256, size)
    work.mkdir(parents=True, exist_ok=True)
    deadline = deadline_of(store)
    meter = shared or Meter(store.shown(name), size)
    try:
        tmp, got, resumed = _receive(store, work, name, size, what, meter, deadline)
        if got != sha256 and resumed:  # bytes an earlier process left under partial/ may be the culprit
            shutil.rmtree(work, ignore_errors=True)
            work.mkdir(parents=True, exist_ok=True)
            tmp, got, _ = _receive(store, work, name, size, what, meter, deadline)
    finally:
        if shared is None:
            meter.close()
    if got != sha256:
        where = _locate(tmp, entry, size) or f"sha256 {got}, the release states {sha256}"
        shutil.rmtree(work, ignore_errors=True)  # bytes that failed their check are kept nowhere
        why = "" if entry is not None else " (did the release change on the server after its manifest was read?)"
        raise IntegrityError(f"{store.shown(name)}: {what}: {where}; the server sent other bytes than the release "
                             f"signed{why}; nothing was cached")
    piece = cache.store(sha256, tmp)
    shutil.rmtree(work, ignore_errors=True)
    return piece


def _receive(store: Store, work: Path, name: str, size: int, what: str, meter: Meter,
             deadline: float) -> tuple[Path, str, int]:
    """Every range of `name` into `work`, then joined: (the joined file, its SHA-256, bytes resumed from `work`)."""
    settings = getattr(store, "settings", None)
    chunk = int(getattr(settings, "chunk", 16 * 2**20)) if store.ranges else max(size, 1)
    ranges = _ranges(size, chunk)
    first = work / f"{0:016d}"
    held = first.lstat().st_size if first.is_file() and not first.is_symlink() else 0
    if len(ranges) > 1 and store.ranges:
        # The first range alone: a server that answers it with the whole file (no ranges) is read to the end,
        # once, rather than once per range.
        _fill(store, name, first, 0, ranges[0][1], what, meter, deadline, whole=size)
        if not store.ranges:
            ranges = [(0, size)]
    fill = [(work / f"{a:016d}", a, b) for a, b in ranges]
    # what an earlier process left (the first range's as it was before the probe above)
    resumed = held + sum(p.lstat().st_size for p, _, _ in fill[1:] if p.is_file() and not p.is_symlink())
    meter.add(resumed)
    parallel = min(int(getattr(settings, "parallel", 4)), len(fill))
    if parallel <= 1:
        for part, a, b in fill:
            _fill(store, name, part, a, b, what, meter, deadline)
    else:
        with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kvgraft-fetch") as ex:
            futures = [ex.submit(_fill, store, name, part, a, b, what, meter, deadline) for part, a, b in fill]
            try:
                for future in futures:
                    future.result()
            except BaseException:
                ex.shutdown(cancel_futures=True)  # the ranges not started yet are not fetched for nothing
                raise
    h = hashlib.sha256()
    if len(fill) == 1:  # one range: its file is the piece, hashed in place
        tmp = fill[0][0]
        with open(tmp, "rb") as f:
            while block := f.read(8 * 2**20):
                h.update(block)
    else:
        fd, tmp_name = tempfile.mkstemp(prefix=".joined.", suffix=".check", dir=work)
        tmp = Path(tmp_name)
        with os.fdopen(fd, "wb") as out:
            for part, _, _ in fill:
                with open(part, "rb") as f:
                    while block := f.read(8 * 2**20):
                        h.update(block)
                        out.write(block)
    return tmp, h.hexdigest(), resumed
