"""The local cache of verified pieces: files of remote releases, kept under their SHA-256.

Layout, under $KVGRAFT_CACHE (default: $XDG_CACHE_HOME/kvgraft, else ~/.cache/kvgraft, where the Hugging
Face cache keeps ~/.cache/huggingface):

    pieces/<sha[:2]>/<sha>      a file whose bytes hash to <sha>: only ever renamed here after the check
    partial/<sha>-<size>/<at>   bytes received so far of a piece being fetched, one file per byte range
                                starting at <at> (a later fetch resumes each range after its last byte)
    locks/<sha>.lock            flock()ed while a piece is fetched: two processes fetch it once
    mirrors/<name>/             a folder standing for a remote release in one process (kvgraft.remote.mirror),
    mirrors/<name>.lock         its files hard links to pieces; flock()ed while that process lives

Content addressing shares the bytes of an entry two releases both hold. A piece is read-only and never
written in place, so a hard link to it in a mirror stays valid when the piece is evicted. The size limit
($KVGRAFT_CACHE_LIMIT, default 50 GiB) is kept by evicting the pieces least recently used (their mtime,
touched on each use) that no mirror links; `kvgraft cache prune` does the same on demand and removes what
crashed processes left.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import re
import shutil
import stat
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from kvgraft.errors import InputError

DEFAULT_LIMIT = 50 * 2**30
_SHA = re.compile(r"[0-9a-f]{64}")
_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 10**3, "kib": 2**10, "m": 2**20, "mb": 10**6, "mib": 2**20,
          "g": 2**30, "gb": 10**9, "gib": 2**30, "t": 2**40, "tb": 10**12, "tib": 2**40}


def parse_size(text: str, where: str) -> int:
    """'50GiB', '20G', '500MB', '1024' -> bytes."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if m is None or m.group(2).lower() not in _UNITS:
        raise InputError(f"{where}: {text!r} is not a size (e.g. 20GiB, 500MB, 1048576)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def default_root() -> Path:
    if os.environ.get("KVGRAFT_CACHE"):
        return Path(os.environ["KVGRAFT_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kvgraft"


def default_limit() -> int:
    raw = os.environ.get("KVGRAFT_CACHE_LIMIT")
    return DEFAULT_LIMIT if not raw else parse_size(raw, "KVGRAFT_CACHE_LIMIT")


@dataclass(frozen=True)
class Piece:
    sha256: str
    path: Path
    size: int
    used: float  # last use (mtime)
    in_use: bool  # a mirror of a live or crashed process links it


@contextlib.contextmanager
def flocked(path: Path, *, wait: bool = True) -> Iterator[bool]:
    """Hold an exclusive flock on `path` (created if needed); yields False at once when not `wait` and it is held."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)  # releases the lock


class Cache:
    def __init__(self, root: Path | None = None, limit: int | None = None) -> None:
        self.root = Path(root) if root is not None else default_root()
        self.limit = limit if limit is not None else default_limit()
        self.added = 0  # bytes of pieces this process stored since the last eviction

    # ------------------------------------------------------------------------------------------- pieces

    def piece(self, sha256: str) -> Path:
        if not _SHA.fullmatch(sha256):
            raise InputError(f"{sha256!r}: not a SHA-256 digest")
        return self.root / "pieces" / sha256[:2] / sha256

    def lock(self, sha256: str) -> contextlib.AbstractContextManager[bool]:
        return flocked(self.root / "locks" / f"{sha256}.lock")

    def partial(self, sha256: str, size: int) -> Path:
        return self.root / "partial" / f"{sha256}-{size}"

    def ready(self) -> Path:
        """The cache's folder, made if needed; an unusable one (a file, a place nobody may write) is one line."""
        where = f"KVGRAFT_CACHE={self.root}" if os.environ.get("KVGRAFT_CACHE") else f"the cache {self.root}"
        try:
            for sub in ("pieces", "partial", "locks", "mirrors"):
                (self.root / sub).mkdir(parents=True, exist_ok=True)
            if not os.access(self.root / "mirrors", os.W_OK | os.X_OK):
                raise PermissionError("not writable")
        except OSError as exc:
            raise InputError(f"{where}: not a folder kvgraft can keep its cache in ({exc.strerror or exc})") from None
        return self.root

    def has(self, sha256: str, size: int) -> Path | None:
        """The piece's path when something is cached under its name (and mark it used), else None. Anything
        there that is not a regular file of that size (a link, a folder, a cut file) is a piece to discard."""
        path = self.piece(sha256)
        try:
            path.lstat()
        except FileNotFoundError:
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)
        return path

    def intact(self, sha256: str, size: int) -> bool:
        """Whether the piece is a regular file of `size` bytes whose SHA-256 is its name (read again each use:
        a file in the cache can be changed by anyone who may write there)."""
        path = self.piece(sha256)
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except OSError:
            return False
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            os.close(fd)
            return False
        with os.fdopen(fd, "rb") as f:
            h = hashlib.sha256()
            while block := f.read(8 * 2**20):
                h.update(block)
        return h.hexdigest() == sha256

    def discard(self, sha256: str) -> None:
        """Remove what lies under the piece's name (never what a link there points to)."""
        path = self.piece(sha256)
        try:
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
        except OSError as exc:
            raise InputError(f"{path}: a damaged piece of the cache {self.root} cannot be removed "
                             f"({exc.strerror or exc}); remove it, or run `kvgraft cache prune --all`") from None

    def store(self, sha256: str, checked: Path) -> Path:
        """Move a file whose bytes were just checked against `sha256` into place (read-only)."""
        target = self.piece(sha256)
        target.parent.mkdir(parents=True, exist_ok=True)
        os.chmod(checked, 0o444)
        os.replace(checked, target)
        return target

    def pieces(self) -> list[Piece]:
        found: list[Piece] = []
        base = self.root / "pieces"
        linked = self._linked()
        for sub in sorted(base.iterdir()) if base.is_dir() else []:
            for path in sorted(sub.iterdir()) if sub.is_dir() else []:
                if not _SHA.fullmatch(path.name):
                    continue
                with contextlib.suppress(FileNotFoundError):
                    st = path.lstat()
                    found.append(Piece(path.name, path, st.st_size, st.st_mtime, (st.st_dev, st.st_ino) in linked))
        return found

    def _linked(self) -> set[tuple[int, int]]:
        """The files (device, inode) the mirrors of this cache hold. Only they keep a piece from eviction: a
        link made anywhere else (a folder copied with `cp -l`) does not, so the limit bounds every piece."""
        held: set[tuple[int, int]] = set()
        base = self.root / "mirrors"
        for folder in sorted(base.iterdir()) if base.is_dir() else []:
            if folder.suffix == ".lock" or folder.is_symlink() or not folder.is_dir():
                continue
            for f in folder.rglob("*"):
                with contextlib.suppress(OSError):
                    st = f.lstat()
                    if stat.S_ISREG(st.st_mode):
                        held.add((st.st_dev, st.st_ino))
        return held

    def partial_bytes(self) -> int:
        base = self.root / "partial"
        return sum(f.lstat().st_size for f in base.rglob("*") if f.is_file()) if base.is_dir() else 0

    # ------------------------------------------------------------------------------------------- limits

    def evict(self, limit: int | None = None, *, keep: set[str] | frozenset[str] = frozenset()) -> list[Piece]:
        """Remove the least recently used pieces that no mirror links until the pieces fit in `limit`
        (default: the cache's); return those removed. A piece linked by a mirror stays (it is in use)."""
        limit = self.limit if limit is None else limit
        self.added = 0
        pieces = self.pieces()
        total = sum(p.size for p in pieces)
        removed: list[Piece] = []
        for p in sorted(pieces, key=lambda p: p.used):
            if total <= limit:
                break
            if p.in_use or p.sha256 in keep:
                continue
            with self.lock(p.sha256), contextlib.suppress(FileNotFoundError):  # not while it is stored or linked
                p.path.unlink()
                total -= p.size
                removed.append(p)
        return removed

    def prune_stale(self) -> tuple[int, int]:
        """Remove the mirrors of processes that are gone and the partial fetches no process holds;
        return (mirrors, partial fetches) removed. Pieces their mirrors linked become evictable."""
        mirrors = partials = 0
        base = self.root / "mirrors"
        for folder in sorted(base.iterdir()) if base.is_dir() else []:
            if folder.suffix == ".lock" or not folder.is_dir():
                continue
            with flocked(base / f"{folder.name}.lock", wait=False) as free:
                if free:
                    shutil.rmtree(folder, ignore_errors=True)
                    (base / f"{folder.name}.lock").unlink(missing_ok=True)
                    mirrors += 1
        base = self.root / "partial"
        for folder in sorted(base.iterdir()) if base.is_dir() else []:
            sha = folder.name.split("-")[0]
            if not _SHA.fullmatch(sha):
                continue
            with flocked(self.root / "locks" / f"{sha}.lock", wait=False) as free:
                if free:
                    shutil.rmtree(folder, ignore_errors=True)
                    partials += 1
        return mirrors, partials


def age(seconds: float) -> str:
    """How long ago, in words a table can hold."""
    s = max(0.0, time.time() - seconds)
    for unit, n in (("d", 86400), ("h", 3600), ("min", 60)):
        if s >= n:
            return f"{s / n:.0f} {unit} ago"
    return f"{s:.0f} s ago"
