"""An audit's journal: each judged unit appended as it lands, so an interrupted audit resumes from it.

A journal is JSON lines: a header `{"kind": "kvgraft-journal", "version": 1, "run": RUN}` binding it to
one run (release root digest, which entries, the settings and environment that decide verdicts), then
one line `{"unit": ID, "result": {...}}` per judged unit, flushed and fsynced before the next one is
counted. A unit id is a string (an entry id) or a list of strings and integers (a unit judged after the
entries, such as ["prefix", 16, ID], which no entry id can equal). Resuming reads the judged units back
(a torn last line, from a kill mid-write, is dropped and recomputed) and refuses a journal whose run
differs, naming the first differing field: units judged under other conditions are never mixed into a
result. A journal is a file in the output folder, which someone else may have written: every line read
back must be a unit of this run and pass the caller's `check` (its schema, fields re-derived), else the
whole resume is refused naming the file and line. Nothing here decides whether a result is complete; the
caller writes its report only when every unit is judged, then removes the journal.

The path may name a file kvgraft did not write (`--journal notes.txt`): a new journal is made whole, its
header written to a temporary file linked into place, so an existing file that does not begin with a
journal header was never one kvgraft wrote, and is refused, never truncated, written or removed; so is
anything but a regular file. Every line read back is bounded (header MAX_LINE, results MAX_RESULT_LINE,
no more result lines than units) and nests at most jsonio.MAX_DEPTH deep.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, TypeAlias

from pydantic import JsonValue

from kvgraft._internal.jsonio import MAX_DEPTH, loads_strict, nesting_depth, open_regular, stat_or_none, unreadable, writing
from kvgraft.errors import BusyError, InputError
from kvgraft.results.base import JsonObject

KIND = "kvgraft-journal"
VERSION = 1
# A header names the run's entries (a sample's, or every entry's: about 70 bytes each); a header that is
# byte for byte this run's is never parsed, so only another run's is bounded by MAX_HEADER_PARSED.
MAX_LINE = 64 * 1024 * 1024
MAX_HEADER_PARSED = 16 * 1024 * 1024
# One judged unit's result: tens of kilobytes for a model of 80 layers. Parsed, a line of JSON numbers
# takes some 8 times its size in memory.
MAX_RESULT_LINE = 4 * 1024 * 1024

Unit: TypeAlias = str | tuple[str | int, ...]  # a tuple is written as a JSON list and read back as a tuple
# Why a result read back cannot be reused (None: it can).
Check: TypeAlias = Callable[[Unit, JsonObject], str | None]


@dataclass(frozen=True)
class Header:
    """A journal's first line: the run it belongs to (the settings that decide verdicts: the caller's JSON)."""

    run: JsonObject

    def encode(self) -> bytes:
        return json.dumps({"kind": KIND, "version": VERSION, "run": self.run}).encode() + b"\n"

    @classmethod
    def decode(cls, first: bytes, path: Path) -> Header:
        """The header a journal's first line holds; anything else is not a journal kvgraft wrote."""
        if not first.endswith(b"\n"):
            raise InputError(f"{path}: not a kvgraft journal (no complete first line); kvgraft writes, truncates or "
                             "removes only a journal it wrote: choose another --journal, or remove the file")
        if len(first) > MAX_HEADER_PARSED:
            raise InputError(f"{path}:1: a journal of another run (a header of {len(first)} bytes, not this run's)")
        try:
            doc = loads_strict(first, f"{path}:1")
        except InputError:
            doc = None
        if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
            raise InputError(f"{path}:1: not a kvgraft journal (version {VERSION}); kvgraft writes, truncates or "
                             "removes only a journal it wrote: choose another --journal, or remove the file")
        run = doc.get("run")
        if not isinstance(run, dict):
            raise InputError(f"{path}:1: journal header has no run")
        return cls(run)


@dataclass(frozen=True)
class Line:
    """One judged unit, as a line after the header."""

    unit: Unit
    result: JsonObject

    def encode(self) -> bytes:
        # json.dumps, not a strict writer: a result may hold a non-finite float (written Infinity), read back as such
        return json.dumps({"unit": self.unit, "result": self.result}, default=str).encode() + b"\n"

    @classmethod
    def decode(cls, line: bytes, where: str, units: set[Unit]) -> Line:
        """A judged unit of this run as `encode` wrote it; anything else is refused naming `where`."""
        doc = _result_line(line, where)
        unit = _unit(doc.get("unit")) if isinstance(doc, dict) else None
        result = doc.get("result") if isinstance(doc, dict) else None
        if unit is None or unit not in units or not isinstance(result, dict):
            raise InputError(f"{where}: not a judged unit of this run")
        return cls(unit, result)


def _first_difference(a: JsonValue, b: JsonValue, path: str = "run") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}"
            d = _first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    return None if a == b else path


def _plain(run: JsonObject) -> JsonObject:
    """`run` as it reads back from JSON (a tuple as a list, a path as its string)."""
    plain: JsonObject = json.loads(json.dumps(run, default=str))
    return plain


def _result_line(line: bytes, where: str) -> JsonValue:
    """A judged unit as `record` wrote it. Python's own reader, not the strict one: a result may hold a
    non-finite float (json.dumps writes Infinity) that must read back; its nesting is bounded first."""
    try:
        if nesting_depth(line) > MAX_DEPTH:
            raise ValueError(f"nested deeper than {MAX_DEPTH} levels")
        doc: JsonValue = json.loads(line)
        return doc
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise InputError(f"{where}: invalid journal line: {exc}") from None


def _unit(value: JsonValue) -> Unit | None:
    """A unit id as a journal line holds it, or None when it is none."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        return None
    parts: list[str | int] = []
    for v in value:
        if not isinstance(v, str | int) or isinstance(v, bool):
            return None
        parts.append(v)
    return tuple(parts)


def _first_line(fd: int, path: Path) -> bytes:
    """The first line of the file open at `fd`, newline included; a file with no newline in its first MAX_LINE
    bytes is refused, and one with none at all gives at most its first kilobyte (no complete line): what is
    held in memory is the line, never what a file without one claims."""
    try:
        at = 0
        while at <= MAX_LINE:
            chunk = os.pread(fd, min(1 << 20, MAX_LINE + 1 - at), at)
            end = chunk.find(b"\n")
            if end >= 0:
                return os.pread(fd, at + end + 1, 0)
            if not chunk:
                return os.pread(fd, 1024, 0)
            at += len(chunk)
    except OSError as exc:
        raise unreadable(path, exc) from None
    raise InputError(f"{path}: not a kvgraft journal (a first line over {MAX_LINE} bytes); kvgraft writes, truncates "
                     "or removes only a journal it wrote: choose another --journal, or remove the file")


def header(path: Path) -> JsonObject | None:
    """The run a journal records, or None when there is no journal at `path`; a path holding anything but a
    journal (a user's file, a device, a folder) is refused."""
    if stat_or_none(path) is None:
        return None
    fd = open_regular(path, "a journal")
    try:
        return Header.decode(_first_line(fd, path), path).run
    finally:
        os.close(fd)


def is_journal(path: Path) -> bool:
    """True when `path` is a regular file that begins with a journal header: one kvgraft may remove."""
    try:
        return header(path) is not None
    except InputError:
        return False


class Journal:
    """Judged units of one run, on disk; `record` appends one durably."""

    def __init__(self, path: Path, run: JsonObject, fh: IO[bytes], done: dict[Unit, dict[str, Any]],
                 resumed: bool = False) -> None:
        self.path = path
        self.run = run
        self._fh = fh
        # unit id -> result, as judged by an earlier (interrupted) run: the caller's own result, which it reads
        # and marks as resumed in place (JSON as read back; its shape is the caller's, checked by `check`)
        self.done = done
        self.resumed = resumed  # an existing journal was read back (even one holding no unit yet)

    @classmethod
    def open(cls, path: Path, run: JsonObject, units: set[Unit], check: Check | None = None) -> Journal:
        """Open (resume) or create the journal of `run`; a journal of another run is refused, and so is
        one another audit holds open now (BusyError: two audits never interleave their lines), and a path
        holding anything but a journal (module docstring).

        `check(unit, result)` says why a result read back cannot be reused (None: it can); any such line
        refuses the resume, naming the file and line.
        """
        run = _plain(run)
        fh, created = _locked(path, Header(run).encode())
        try:
            done = {} if created else _resume(path, run, units, fh, check)
            return cls(path, run, fh, done, resumed=not created)
        except BaseException:
            fh.close()
            raise

    def record(self, unit: Unit, result: JsonObject) -> None:
        with writing(self.path):
            self._fh.write(Line(unit, result).encode())
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def remove(self) -> None:
        """The run is complete and its report written: the journal has done its job."""
        self.path.unlink(missing_ok=True)  # while still locked: an audit that opened it meanwhile sees it gone
        self.close()


def _create(path: Path, head: bytes) -> bool:
    """A new journal holding `head`, linked into place whole; False when something is at `path` already."""
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(head)
            fh.flush()
            os.fsync(fh.fileno())
        os.chmod(tmp, 0o644)
        try:
            os.link(tmp, path)  # never replaces: a file that appeared meanwhile is read as an existing one
        except FileExistsError:
            return False
        return True
    finally:
        with contextlib.suppress(OSError):
            os.unlink(tmp)


def _locked(path: Path, head: bytes) -> tuple[IO[bytes], bool]:
    """The journal at `path` opened for appending under an exclusive flock, which the kernel drops when the
    holder dies (a killed audit never leaves it stuck); created holding `head` when absent (True)."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
    while True:
        st = stat_or_none(path)
        created = False
        if st is None:
            with writing(path):
                created = _create(path, head)
            if not created:
                continue
        elif not stat.S_ISREG(st.st_mode):
            what = "a symlink" if stat.S_ISLNK(st.st_mode) else "not a regular file"
            raise InputError(f"{path}: {what}; a journal is a regular file kvgraft writes")
        try:
            fd = os.open(path, os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        except FileNotFoundError:
            continue  # its holder finished and removed it between our look and our open
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise InputError(f"{path}: a symlink; a journal is a regular file kvgraft writes") from None
            raise unreadable(path, exc, "open the journal") from None
        fh = os.fdopen(fd, "a+b")
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise InputError(f"{path}: not a regular file; a journal is a regular file kvgraft writes")
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise BusyError(f"{path}: another audit is writing this journal now; try again when it is done") from None
        except BaseException:
            fh.close()
            raise
        now = stat_or_none(path)
        if now is not None and now.st_ino == os.fstat(fd).st_ino:
            return fh, created
        fh.close()  # its holder finished and removed it between our open and flock: open the new one


def _resume(path: Path, run: JsonObject, units: set[Unit], fh: IO[bytes],
            check: Check | None) -> dict[Unit, dict[str, Any]]:
    """The units judged so far, each result `check`ed, the torn tail cut off; a file that does not begin
    with a journal header is refused untouched."""
    done: dict[Unit, dict[str, Any]] = {}
    first = _first_line(fh.fileno(), path)
    if first != Header(run).encode():
        diff = _first_difference(Header.decode(first, path).run, run)
        if diff:
            raise InputError(f"{path}: a journal of another run ({diff} differs); delete it to start afresh, "
                             "or rerun with the settings it records")
    good = len(first)  # byte length of the valid prefix: a torn tail is cut off before appending
    lines = 0
    try:
        with os.fdopen(os.dup(fh.fileno()), "rb") as reader:
            reader.seek(good)
            for lineno in range(2, 2**62):
                line = reader.readline(MAX_RESULT_LINE + 1)
                if not line.endswith(b"\n"):
                    if len(line) > MAX_RESULT_LINE:
                        raise InputError(f"{path}:{lineno}: a journal line over {MAX_RESULT_LINE} bytes; no judged "
                                         "unit's result is that large")
                    break  # the end, or a line torn by a kill mid-write: that unit is judged again
                lines += 1
                if lines > len(units):
                    raise InputError(f"{path}:{lineno}: more judged units than this run has ({len(units)})")
                read = Line.decode(line, f"{path}:{lineno}", units)
                unit = read.unit
                problem = check(unit, read.result) if check is not None and unit not in done else None
                if problem:
                    raise InputError(f"{path}:{lineno}: unit {unit!r}: {problem}; nothing was resumed (delete "
                                     "the journal to judge every unit afresh)")
                done.setdefault(unit, read.result)  # kept once
                good += len(line)
    except OSError as exc:
        raise unreadable(path, exc) from None
    with writing(path):
        fh.truncate(good)
    return done
