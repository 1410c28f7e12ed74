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
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, TextIO, TypeVar

from kvgraft.errors import IntegrityError
from kvgraft.remote.cache import Cache
from kvgraft.remote.store import FetchError, NotFound, Oversize, Store, Transient

T = TypeVar("T")
FIRST_PAUSE = 0.2  # seconds before the second try; doubled for each further one, up to MAX_PAUSE
MAX_PAUSE = 5.0


class Meter:
    """Progress of long fetches on stderr: bytes, rate, time left. Silent for the first `after` seconds (a
    short fetch prints nothing); then a line every `every` seconds, rewritten in place on a terminal."""

    def __init__(self, label: str, total: int, *, stream: TextIO | None = None, after: float = 2.0,
                 every: float | None = None) -> None:
        self.label, self.total, self.done = label, total, 0
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
            if now - self.started < self.after or (self.shown_at is not None and now - self.shown_at < self.every):
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


def retrying(call: Callable[[], T], where: str, tries: int) -> T:
    """`call`, tried up to `tries` times while it fails with Transient; then a FetchError naming `where`."""
    pause = FIRST_PAUSE
    for attempt in range(1, tries + 1):
        try:
            return call()
        except Transient as exc:
            if attempt == tries:
                raise FetchError(f"{where}: {exc} ({tries} {'try' if tries == 1 else 'tries'})") from None
        time.sleep(pause)
        pause = min(pause * 2, MAX_PAUSE)
    raise AssertionError("unreachable")


def read_small(store: Store, name: str, limit: int, what: str) -> bytes | None:
    """A whole file of unknown size (manifest.json, a signature), at most `limit` bytes; None when absent."""
    chunks: list[bytes] = []

    def once() -> None:
        chunks.clear()
        store.get(name, 0, limit + 1, chunks.append)

    try:
        retrying(once, f"{store.shown(name)}: {what}", store_tries(store))
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


def _fill(store: Store, name: str, part: Path, start: int, end: int, what: str, meter: Meter | None) -> None:
    """Bytes [start, end) of `name` into the file `part`, resuming after what it already holds."""
    where = f"{store.shown(name)}: {what}: bytes [{start}, {end})"

    def once() -> None:
        have = part.stat().st_size if part.exists() else 0
        if have > end - start:  # a partial file longer than its range: not ours to trust
            part.unlink()
            have = 0
        if have == end - start:
            return
        with open(part, "ab") as f:
            def sink(block: bytes) -> None:
                f.write(block)
                if meter is not None:
                    meter.add(len(block))

            got = store.get(name, start + have, end, sink)
        if have + got < end - start:
            raise Transient(f"the answer ended after {have + got} of {end - start} bytes (connection closed or a "
                            f"wrong Content-Length)")

    try:
        retrying(once, where, store_tries(store))
    except NotFound as exc:
        raise IntegrityError(f"{store.shown(name)}: {what}: missing on the server ({exc})") from None
    except Oversize as exc:
        raise FetchError(f"{where}: {exc}") from None


def _parts(entry: dict[str, Any] | None, size: int) -> list[tuple[int, int, str, str]]:
    """(start, end, sha256, label) of the byte ranges an entry record binds: its safetensors header, its tensors."""
    if entry is None or not isinstance(entry.get("tensors"), dict):
        return []
    tensors = entry["tensors"]
    out = [(int(t["byte_range"][0]), int(t["byte_range"][1]), str(t["sha256"]), f"tensor {n!r}")
           for n, t in tensors.items()]
    if entry.get("header_sha256"):
        out.append((0, min((a for a, _, _, _ in out), default=size), str(entry["header_sha256"]), "safetensors header"))
    return sorted(out)


def _locate(path: Path, entry: dict[str, Any] | None, size: int) -> str | None:
    """'bytes [a, b) (tensor ...): sha256 X, the record says Y' for the first bound range that differs."""
    with open(path, "rb") as f:
        for a, b, want, label in _parts(entry, size):
            f.seek(a)
            got = hashlib.sha256(f.read(b - a)).hexdigest()
            if got != want:
                return f"bytes [{a}, {b}) ({label}): sha256 {got}, the signed record says {want}"
    return None


def fetch_piece(store: Store, cache: Cache, name: str, sha256: str, size: int, what: str, *,
                entry: dict[str, Any] | None = None, link: Path | None = None, meter: Meter | None = None) -> Path:
    """The cached piece of `name`, fetched and checked first unless the cache holds it; with `link`, also
    hard-linked (else copied) there while the piece's lock is held, so that no eviction comes between.
    `meter`: the progress this fetch adds to (default: its own, shown when the fetch is long)."""
    with cache.lock(sha256):
        piece = cache.has(sha256, size)
        if piece is None:
            piece = _fetch_locked(store, cache, name, sha256, size, what, entry, meter)
            cache.added += size
        if link is not None:
            place(piece, link)
    return piece


def place(piece: Path, link: Path, *, hard: bool = True) -> None:
    """`piece` at `link`: a hard link (pieces are never written in place), else, or unless `hard`, a copy."""
    link.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        if os.path.samefile(piece, link):
            return
        link.unlink()
    try:
        if not hard:
            raise OSError("a copy was asked for")
        os.link(piece, link)
    except OSError:  # another file system, or one without hard links
        shutil.copyfile(piece, link)


def _fetch_locked(store: Store, cache: Cache, name: str, sha256: str, size: int, what: str,
                  entry: dict[str, Any] | None, shared: Meter | None) -> Path:
    work = cache.partial(sha256, size)
    work.mkdir(parents=True, exist_ok=True)
    settings = getattr(store, "settings", None)
    chunk = int(getattr(settings, "chunk", 16 * 2**20)) if store.ranges else max(size, 1)
    ranges = _ranges(size, chunk)
    fill = [(work / f"{a:016d}", a, b) for a, b in ranges]
    resumed = sum(p.stat().st_size for p, _, _ in fill if p.exists())  # received by an earlier try
    meter = shared or Meter(store.shown(name), size)
    meter.add(resumed)
    try:
        parallel = min(int(getattr(settings, "parallel", 4)), len(fill))
        if parallel <= 1:
            for part, a, b in fill:
                _fill(store, name, part, a, b, what, meter)
        else:
            with ThreadPoolExecutor(max_workers=parallel, thread_name_prefix="kvgraft-fetch") as ex:
                futures = [ex.submit(_fill, store, name, part, a, b, what, meter) for part, a, b in fill]
                try:
                    for future in futures:
                        future.result()
                except BaseException:
                    ex.shutdown(cancel_futures=True)  # the ranges not started yet are not fetched for nothing
                    raise
    finally:
        if shared is None:
            meter.close()
    h = hashlib.sha256()
    if len(fill) == 1:  # one range: its file is the piece, hashed in place
        tmp = fill[0][0]
        with open(tmp, "rb") as f:
            while block := f.read(8 * 2**20):
                h.update(block)
    else:
        fd, tmp_name = tempfile.mkstemp(prefix=f".{sha256}.", suffix=".check", dir=work)
        tmp = Path(tmp_name)
        with os.fdopen(fd, "wb") as out:
            for part, _, _ in fill:
                with open(part, "rb") as f:
                    while block := f.read(8 * 2**20):
                        h.update(block)
                        out.write(block)
    got = h.hexdigest()
    if got != sha256:
        where = _locate(tmp, entry, size) or f"sha256 {got}, the release states {sha256}"
        shutil.rmtree(work, ignore_errors=True)  # bytes that failed their check are kept nowhere
        why = "" if entry is not None else " (did the release change on the server after its manifest was read?)"
        raise IntegrityError(f"{store.shown(name)}: {what}: {where}; the server sent other bytes than the release "
                             f"signed{why}; nothing was cached")
    piece = cache.store(sha256, tmp)
    shutil.rmtree(work, ignore_errors=True)
    return piece
