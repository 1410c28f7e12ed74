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
"""

from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any, TypeAlias

from kvgraft._internal.jsonio import loads_strict, stat_or_none, writing
from kvgraft.errors import BusyError, InputError

KIND = "kvgraft-journal"
VERSION = 1
MAX_LINE = 64 * 1024 * 1024

Unit: TypeAlias = str | tuple[str | int, ...]  # a tuple is written as a JSON list and read back as a tuple


def _first_difference(a: Any, b: Any, path: str = "run") -> str | None:
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                return f"{path}.{k}"
            d = _first_difference(a[k], b[k], f"{path}.{k}")
            if d:
                return d
        return None
    return None if a == b else path


def _plain(obj: Any) -> Any:
    return json.loads(json.dumps(obj, default=str))


def _result_line(line: bytes, where: str) -> Any:
    """A judged unit as `record` wrote it. Python's own reader, not the strict one: this is the auditor's
    own file, and a result may hold a non-finite float (json.dumps writes Infinity) that must read back."""
    try:
        return json.loads(line)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: invalid journal line: {exc}") from None


def _unit(value: Any) -> Unit | None:
    """A unit id as a journal line holds it, or None when it is none."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str | int) and not isinstance(v, bool) for v in value):
        return tuple(value)
    return None


def header(path: Path) -> dict[str, Any] | None:
    """The run a journal records, or None when there is no journal at `path`."""
    if not path.exists():
        return None
    with path.open("rb") as fh:
        first = fh.readline(MAX_LINE)
    if not first.endswith(b"\n"):
        return None  # killed while writing the header: nothing was judged
    doc = loads_strict(first, f"{path}:1")
    if not isinstance(doc, dict) or doc.get("kind") != KIND or doc.get("version") != VERSION:
        raise InputError(f"{path}:1: not a kvgraft journal (version {VERSION})")
    run = doc.get("run")
    if not isinstance(run, dict):
        raise InputError(f"{path}:1: journal header has no run")
    return run


class Journal:
    """Judged units of one run, on disk; `record` appends one durably."""

    def __init__(self, path: Path, run: dict[str, Any], fh: IO[bytes], done: dict[Unit, dict[str, Any]],
                 resumed: bool = False) -> None:
        self.path = path
        self.run = run
        self._fh = fh
        self.done = done  # unit id -> result, as judged by an earlier (interrupted) run
        self.resumed = resumed  # an existing journal was read back (even one holding no unit yet)

    @classmethod
    def open(cls, path: Path, run: dict[str, Any], units: set[Unit],
             check: Callable[[Unit, dict[str, Any]], str | None] | None = None) -> Journal:
        """Open (resume) or create the journal of `run`; a journal of another run is refused, and so is
        one another audit holds open now (BusyError: two audits never interleave their lines).

        `check(unit, result)` says why a result read back cannot be reused (None: it can); any such line
        refuses the resume, naming the file and line.
        """
        run = _plain(run)
        fh = _locked(path)
        try:
            resumed = header(path) is not None
            return cls(path, run, fh, _resume(path, run, units, fh, check), resumed=resumed)
        except BaseException:
            fh.close()
            raise

    def record(self, unit: Unit, result: dict[str, Any]) -> None:
        with writing(self.path):
            self._fh.write(json.dumps({"unit": unit, "result": result}, default=str).encode() + b"\n")
            self._fh.flush()
            os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def remove(self) -> None:
        """The run is complete and its report written: the journal has done its job."""
        self.path.unlink(missing_ok=True)  # while still locked: an audit that opened it meanwhile sees it gone
        self.close()


def _locked(path: Path) -> IO[bytes]:
    """The journal at `path` opened for appending (created empty if absent) under an exclusive flock,
    which the kernel drops when the holder dies: a killed audit never leaves it stuck."""
    with writing(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        while True:
            fh = path.open("a+b")
            try:
                fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                fh.close()
                raise BusyError(f"{path}: another audit is writing this journal now; try again when it is done") from None
            st = stat_or_none(path)
            if st is not None and st.st_ino == os.fstat(fh.fileno()).st_ino:
                return fh
            fh.close()  # its holder finished and removed it between our open and flock: open the new one


def _resume(path: Path, run: dict[str, Any], units: set[Unit], fh: IO[bytes],
            check: Callable[[Unit, dict[str, Any]], str | None] | None) -> dict[Unit, dict[str, Any]]:
    """The units judged so far (none for a new or empty journal), each result `check`ed, the torn tail cut
    off, the header written when there was none."""
    done: dict[Unit, dict[str, Any]] = {}
    recorded = header(path)
    if recorded is not None:
        diff = _first_difference(recorded, run)
        if diff:
            raise InputError(f"{path}: a journal of another run ({diff} differs); delete it to start afresh, "
                             "or rerun with the settings it records")
        good = 0  # byte length of the valid prefix: a torn tail is cut off before appending
        with path.open("rb") as lines:
            for lineno, line in enumerate(lines, 1):
                if not line.endswith(b"\n"):
                    break  # torn by a kill mid-write: that unit is judged again
                if lineno > 1:
                    doc = _result_line(line, f"{path}:{lineno}")
                    unit = _unit(doc.get("unit")) if isinstance(doc, dict) else None
                    if unit is None or unit not in units or not isinstance(doc.get("result"), dict):
                        raise InputError(f"{path}:{lineno}: not a judged unit of this run")
                    problem = check(unit, doc["result"]) if check is not None and unit not in done else None
                    if problem:
                        raise InputError(f"{path}:{lineno}: unit {unit!r}: {problem}; nothing was resumed (delete "
                                         "the journal to judge every unit afresh)")
                    done.setdefault(unit, doc["result"])  # kept once
                good += len(line)
        with writing(path):
            fh.truncate(good)
    else:
        with writing(path):
            fh.truncate(0)  # empty, or a header torn by a kill: nothing was judged
            fh.write(json.dumps({"kind": KIND, "version": VERSION, "run": run}).encode() + b"\n")
            fh.flush()
            os.fsync(fh.fileno())
    return done
