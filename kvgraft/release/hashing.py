"""SHA-256 of files, byte ranges and canonical JSON: streamed in large blocks, across cores.

`hashlib` releases the GIL on large updates and `os.preadv` releases it while reading, so a
thread pool gives real parallelism across files and tensors without processes.
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import os
import threading
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor, wait
from functools import lru_cache
from pathlib import Path

from kvgraft._internal.cores import cores
from kvgraft._internal.jsonio import open_regular
from kvgraft.errors import IntegrityError

BLOCK = 8 * 1024 * 1024
# Below this many bytes one thread reads and hashes alone: handing the GIL back and forth between
# threads cost more than the second core saved (measured: 0.68 vs 0.40 ms for 60 tensors, 360 KiB).
PARALLEL_MIN_BYTES = 1024 * 1024


@lru_cache(maxsize=1)
def pool() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=cores(), thread_name_prefix="kvgraft-hash")


# Per-thread read buffer: small enough to stay in the core's cache between the copy and the hash.
READ_BLOCK = 1024 * 1024
_local = threading.local()


def _read_buffer() -> memoryview:
    buf: memoryview | None = getattr(_local, "buf", None)
    if buf is None:
        buf = _local.buf = memoryview(bytearray(READ_BLOCK))
    return buf


class Stopped(Exception):
    """Hashing was stopped by its caller (who no longer needs the digest)."""


def _hash_fd(fd: int, path: Path, start: int, end: int, stop: threading.Event | None = None,
             ranges: Sequence[tuple[int, int]] = ()) -> tuple[str, list[str]]:
    """SHA-256 of bytes [start, end) of an open file, read with pread into a reused buffer; and of each of
    `ranges` (inside [start, end)) from the same reads, so that a file's tensors cost no read of their own.

    Not through a memory mapping: a file truncated while mapped turns the next access into SIGBUS,
    which kills the process; a short read here is an EOFError the caller reports against the file.
    """
    h = hashlib.sha256()
    parts = [hashlib.sha256() for _ in ranges]
    if end <= start:
        return h.hexdigest(), [p.hexdigest() for p in parts]
    size = os.fstat(fd).st_size
    if end > size:
        raise EOFError(f"{path}: file ends at byte {size}, expected data up to {end}")
    with contextlib.suppress(OSError, AttributeError):  # advice only
        os.posix_fadvise(fd, start, end - start, os.POSIX_FADV_SEQUENTIAL)
    buf = _read_buffer()
    # The ranges by start; `active` holds those the current block may overlap (tensors do not overlap, but a
    # hostile table may: each range is fed its own bytes whatever the others are).
    order = sorted(range(len(ranges)), key=lambda i: ranges[i][0])
    nxt = 0
    active: list[int] = []
    pos = start
    while pos < end:
        if stop is not None and stop.is_set():
            raise Stopped(str(path))
        n = os.preadv(fd, [buf[: min(READ_BLOCK, end - pos)]], pos)
        if n == 0:
            raise EOFError(f"{path}: file ends at byte {pos}, expected data up to {end}")
        block = buf[:n]
        h.update(block)
        if ranges:
            while nxt < len(order) and ranges[order[nxt]][0] < pos + n:
                active.append(order[nxt])
                nxt += 1
            for i in active:
                a, b = ranges[i]
                lo, hi = max(a, pos), min(b, pos + n)
                if lo < hi:
                    parts[i].update(block[lo - pos: hi - pos])
            active = [i for i in active if ranges[i][1] > pos + n]
        pos += n
    return h.hexdigest(), [p.hexdigest() for p in parts]


def _hash_range(path: Path, start: int, end: int) -> str:
    """SHA-256 of bytes [start, end) of a regular file."""
    fd = open_regular(path)
    try:
        return _hash_fd(fd, path, start, end)[0]
    finally:
        os.close(fd)


def hash_file(path: Path, expected_size: int | None = None, stop: threading.Event | None = None) -> tuple[str, int]:
    """(sha256 hex, size) of a whole file, streamed. With `expected_size`, a file of another size is
    not read at all (an IntegrityError names both sizes): a grown file costs nothing to refuse.
    Setting `stop` ends it early (Stopped): a verification that already failed does not wait for it."""
    sha, size, _ = hash_file_ranges(path, expected_size, (), stop)
    return sha, size


def hash_file_ranges(path: Path, expected_size: int | None, ranges: Sequence[tuple[int, int]],
                     stop: threading.Event | None = None) -> tuple[str, int, list[str]]:
    """hash_file, and the SHA-256 of each [start, end) of `ranges` from the same pass (a range reaching past
    the end of the file hashes the bytes there are)."""
    fd = open_regular(path)
    try:
        size = os.fstat(fd).st_size
        if expected_size is not None and size != expected_size:
            how = "truncated" if size < expected_size else "grown"
            raise IntegrityError(f"{path}: {size} bytes, the manifest says {expected_size} ({how})")
        sha, parts = _hash_fd(fd, path, 0, size, stop, ranges)
        return sha, size, parts
    finally:
        os.close(fd)


def hash_files(paths: Sequence[Path]) -> list[tuple[str, int]]:
    """Hash many files in parallel; results in input order."""
    order = sorted(range(len(paths)), key=lambda i: -_size(paths[i]))
    futures = {i: pool().submit(hash_file, paths[i]) for i in order}
    return [futures[i].result() for i in range(len(paths))]


def hash_ranges(path: Path, ranges: Sequence[tuple[int, int]]) -> list[str]:
    """SHA-256 of each [start, end) byte range of one file, in parallel."""
    futures = [pool().submit(_hash_range, path, a, b) for a, b in ranges]
    return [f.result() for f in futures]


def _read_hash_into(fd: int, start: int, dest: memoryview) -> str:
    pos, done = start, 0
    h = hashlib.sha256()
    while done < len(dest):
        n = os.preadv(fd, [dest[done : done + BLOCK]], pos)
        if n == 0:
            raise EOFError(f"file ends at byte {pos}")
        h.update(dest[done : done + n])
        done += n
        pos += n
    return h.hexdigest()


_Job = tuple[int, int, memoryview]  # (index, file offset, destination)


def _read_hash_jobs(fd: int, jobs: list[_Job], take: Iterator[int], digests: list[str]) -> None:
    """Pull jobs until none are left; pulling balances threads that run at different speeds."""
    for k in take:
        if k >= len(jobs):
            return
        i, start, dest = jobs[k]
        digests[i] = _read_hash_into(fd, start, dest)


def read_and_hash(source: Path | int, ranges: Sequence[tuple[int, int]], dest: memoryview,
                  meanwhile: Callable[[], object] | None = None) -> list[str]:
    """Read each [start, end) range of `source` (a path, or a file descriptor the caller keeps open)
    into consecutive slices of `dest` and hash it.

    One pass over the bytes: each block is hashed right after it is read, while still in cache.
    One thread per core, the calling thread among them, pulls the next range in file order:
    measured on a 2-vCPU Intel Xeon VM, the two vCPUs often run at different speeds, and a fixed half
    each left the faster one waiting. `meanwhile`, if given, runs on the calling thread after the
    other threads have started and before it joins them; it must not read `dest`.
    """
    jobs: list[_Job] = []
    at = 0
    for i, (a, b) in enumerate(ranges):
        if at + (b - a) > len(dest):
            raise ValueError("destination buffer too small")
        jobs.append((i, a, dest[at : at + (b - a)]))
        at += b - a
    digests: list[str] = [""] * len(jobs)
    take = itertools.count()  # next() on it is atomic under the GIL
    fd = open_regular(source) if isinstance(source, Path) else source
    try:
        helpers = min(cores(), len(jobs)) - 1 if at >= PARALLEL_MIN_BYTES else 0
        futures = [pool().submit(_read_hash_jobs, fd, jobs, take, digests) for _ in range(helpers)]
        try:
            if meanwhile is not None:
                meanwhile()
            _read_hash_jobs(fd, jobs, take, digests)
        finally:
            wait(futures)  # every reader is done with fd (and dest) before either is let go
        for f in futures:
            f.result()
    finally:
        if isinstance(source, Path):
            os.close(fd)
    return digests


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
