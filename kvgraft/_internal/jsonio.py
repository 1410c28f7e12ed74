"""Strict JSON in, canonical JSON out, atomic writes."""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import gc
import json
import math
import os
import re
import shutil
import stat
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import rfc8785

from kvgraft.errors import BusyError, Error, InputError, IOFailure

if TYPE_CHECKING:
    from pydantic import JsonValue

    from kvgraft.results.base import JsonObject

MAX_JSON_BYTES = 64 * 1024 * 1024


def _no_duplicates(pairs: list[tuple[str, JsonValue]]) -> JsonObject:
    out = dict(pairs)  # C speed; called for every object of every document read
    if len(out) != len(pairs):
        seen: set[str] = set()
        key = next(k for k, _ in pairs if k in seen or seen.add(k))  # type: ignore[func-returns-value]
        raise ValueError(f"duplicate key {key!r}")
    return out


def _no_constant(name: str) -> Any:
    raise ValueError(f"non-finite number {name} is not JSON")


# Every document kvgraft reads nests well under this; the bound keeps a hostile one from reaching the
# C parser's or a later recursive consumer's (canonical JSON, schema validation) recursion limit.
MAX_DEPTH = 64
# I-JSON (RFC 7493) numbers: integers beyond 2^53 do not survive canonical JSON (RFC 8785), so a
# document holding one could be read but never digested.
MAX_INT = 2**53 - 1
_MAX_INT_DIGITS = len(str(MAX_INT))
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


def _parse_int(text: str) -> int:
    if len(text) > _MAX_INT_DIGITS + 1 or abs(value := int(text)) > MAX_INT:
        raise ValueError(f"integer {text[:24]}{'...' if len(text) > 24 else ''} is outside the I-JSON range +-(2^53-1)")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"number {text[:24]} overflows to a non-finite float")
    return value


def _depth_exceeded(raw: bytes | str) -> bool:
    """True when brackets nest deeper than MAX_DEPTH; strings are skipped. Only called when the C parser
    gave up on recursion, so its Python speed does not matter."""
    depth = 0
    in_string = escaped = False
    for ch in raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "[{":
            depth += 1
            if depth > MAX_DEPTH:
                return True
        elif ch in "]}":
            depth -= 1
    return False


_BRACKETS = bytes.maketrans(b"[{]}", b"(())")
_NOT_SYNTAX = bytes(range(256)).translate(None, b'[]{}"')


def nesting_depth(raw: bytes, limit: int = MAX_DEPTH) -> int:
    """How deep the containers of a JSON text (one the parser accepted) nest, or limit + 1 when deeper.

    At C speed: escaped backslashes and quotes removed, every byte but quotes and brackets dropped, then
    what lay between quotes (every other piece: once escaped quotes are gone, each quote opens or closes a
    string), leaving the brackets outside strings; each round of removing "()" removes the innermost
    containers, so the rounds until nothing is left are the depth. check_tree is the reference (tests
    compare the two); this one is for the documents read in bulk (index shards, safetensors headers), where
    check_tree's walk of every container was most of a shard's cost.
    """
    if b"\\" in raw:
        raw = raw.replace(b"\\\\", b"").replace(b'\\"', b"")
    s = raw.translate(None, _NOT_SYNTAX)  # quotes and brackets: a few % of the document
    s = b"".join(s.split(b'"')[::2]).translate(_BRACKETS)
    depth = 0
    while s:
        if depth == limit:
            return limit + 1
        s = s.replace(b"()", b"")
        depth += 1
    return depth


def check_tree(obj: Any, where: str, surrogates: bool = True) -> None:
    """Bound nesting depth and refuse strings holding lone surrogates (which no UTF-8 writer can emit)."""
    stack: list[tuple[Any, int]] = [(obj, 1)]
    while stack:
        x, depth = stack.pop()
        if depth > MAX_DEPTH:
            raise InputError(f"{where}: invalid JSON: nested deeper than {MAX_DEPTH} levels")
        if isinstance(x, dict):
            if surrogates:
                for k in x:
                    _no_surrogate(k, where)
            values = list(x.values())
        else:
            values = x
        kinds = set(map(type, values))  # C speed: most containers (token ids, shapes) hold scalars only
        if not surrogates and dict not in kinds and list not in kinds:
            continue
        for v in values:
            if isinstance(v, (dict, list)):
                stack.append((v, depth + 1))
            elif surrogates and isinstance(v, str):
                _no_surrogate(v, where)


def _no_surrogate(s: str, where: str) -> None:
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        raise InputError(f"{where}: invalid JSON: a string holds a lone UTF-16 surrogate") from None


# 16 digits are the shortest text of an integer beyond 2^53 (9007199254740992). A number follows "[",
# "," or ":" (after whitespace, with an optional "-") or starts the text; hex digests sit after a quote.
# Without such a run (the usual case) every integer is in range and the parser needs no per-integer
# hook. Found with C-speed translate and substring search; a false hit (inside a string) only costs time.
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_Z16 = b"0" * 16


def _may_hold_long_integer(raw: bytes) -> bool:
    t = raw.translate(_DIGITS_AS_ZERO, b" \t\r\n-")
    return t.startswith(_Z16) or any(lead + _Z16 in t for lead in (b"[", b",", b":"))


@contextlib.contextmanager
def collector_paused(pause: bool = True) -> Iterator[None]:
    """The cyclic garbage collector off while large documents are parsed: the parser makes tens of
    thousands of containers, each allocation counts toward a collection, and the collections find nothing
    (a parsed tree has no cycles) while they walk every object the process holds (at 100,000 entries, the
    index's ids). Nested pauses end with the outermost; one collection may follow."""
    was = pause and gc.isenabled()
    if was:
        gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def loads_strict(data: bytes | str, where: str) -> Any:
    """Parse JSON refusing duplicate keys, NaN/Infinity (also as overflowing numbers such as 1e999),
    integers beyond +-(2^53-1), lone surrogates, nesting deeper than MAX_DEPTH and bytes that are not
    UTF-8 (RFC 8259 §8.1: no UTF-16 or UTF-32, no byte order mark); errors name `where`."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "surrogatepass")
    if isinstance(data, bytes):
        # RFC 8259 §8.1: JSON exchanged between systems is UTF-8. json.loads would also detect UTF-16 and
        # UTF-32, which the byte-level guards below (long integers, surrogate escapes) cannot read.
        found = json.detect_encoding(data)  # by the NUL bytes and BOMs of the first 4 bytes, as json.loads does
        if found != "utf-8":
            what = "a UTF-8 byte order mark" if found == "utf-8-sig" else f"it looks like {found.upper()}"
            raise InputError(f"{where}: invalid JSON: not UTF-8 (RFC 8259 §8.1): {what}")
        try:
            text = data.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise InputError(f"{where}: invalid JSON: not UTF-8 (RFC 8259 §8.1): byte {exc.start} "
                             f"(0x{data[exc.start]:02x}) {exc.reason}") from None
    else:
        text = data
    try:
        with collector_paused(len(raw) > 65536):
            doc = json.loads(text, object_pairs_hook=_no_duplicates, parse_constant=_no_constant,
                             parse_int=_parse_int if _may_hold_long_integer(raw) else None, parse_float=_parse_float)
    except RecursionError:
        detail = f"nested deeper than {MAX_DEPTH} levels" if _depth_exceeded(data) else "nested too deeply"
        raise InputError(f"{where}: invalid JSON: {detail}") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"{where}: invalid JSON: {exc}") from None
    if isinstance(doc, (dict, list)):
        if isinstance(data, str) or _SURROGATE_ESCAPE.search(raw) is not None:
            check_tree(doc, where)  # a lone surrogate shows only in the parsed strings
        elif nesting_depth(raw) > MAX_DEPTH:
            raise InputError(f"{where}: invalid JSON: nested deeper than {MAX_DEPTH} levels")
    return doc


def stat_or_none(path: Path, *, follow: bool = False) -> os.stat_result | None:
    """lstat (stat with `follow`) of a path that comes from input; None when nothing is there.

    Every other failure (a name longer than NAME_MAX or PATH_MAX, a loop of links, no permission) is
    input that cannot be used, one line naming the path: Path.exists/is_dir/is_file raise those.
    """
    try:
        return os.stat(path) if follow else os.lstat(path)
    except (FileNotFoundError, NotADirectoryError):
        return None
    except OSError as exc:
        raise unreadable(path, exc) from None


def is_folder(path: Path) -> bool:
    """True when `path` is a folder (through a link); failures other than absence are InputError."""
    st = stat_or_none(path, follow=True)
    return st is not None and stat.S_ISDIR(st.st_mode)


def require_folder(path: Path, expected: str = "") -> None:
    """Refuse a path that is not a folder, saying whether nothing is there or something else is
    (`expected`, e.g. " (expected a cache release)", ends the message)."""
    st = stat_or_none(path, follow=True)
    if st is None:
        raise InputError(f"{path}: does not exist{expected}")
    if not stat.S_ISDIR(st.st_mode):
        raise InputError(f"{path}: not a folder{expected}")


def open_regular(path: Path, what: str = "file", looked: os.stat_result | None = None) -> int:
    """A read-only descriptor of a regular file, refusing anything else before opening it for reading.

    lstat first (`looked`: the lstat the caller already made of it): a FIFO, device or socket is never
    opened (opening a FIFO blocks until a writer comes, a device may act on open). O_NONBLOCK and
    O_NOFOLLOW cover a swap between the lstat and the open, and fstat checks what was actually opened.
    """
    try:
        mode = (looked or os.lstat(path)).st_mode
        if stat.S_ISLNK(mode):
            raise InputError(f"{path}: is a symlink; kvgraft reads {what} from regular files only, never through a link")
        if not stat.S_ISREG(mode):
            raise InputError(f"{path}: not a regular file; refusing to read {what} from it")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError as exc:
        raise unreadable(path, exc) from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise InputError(f"{path}: not a regular file; refusing to read {what} from it")
    return fd


def read_fd_bounded(fd: int, max_bytes: int) -> bytes:
    """Up to max_bytes + 1 bytes from offset 0 of `fd` (one more than allowed shows it was too large)."""
    parts: list[bytes] = []
    got = 0
    while got <= max_bytes:
        chunk = os.pread(fd, min(max_bytes + 1 - got, 64 * 1024 * 1024), got)
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return b"".join(parts)


def read_bounded(path: Path, max_bytes: int, what: str, looked: os.stat_result | None = None) -> bytes:
    """A file's bytes, refused (naming `what` it should be) when larger than `max_bytes`; the size is
    checked before reading and again on what was read, in case the file grew in between. `looked`: its
    lstat, already made (open_regular)."""
    fd = open_regular(path, what, looked)
    try:
        size = os.fstat(fd).st_size
        if size <= max_bytes:
            data = read_fd_bounded(fd, max_bytes)
            size = len(data)
    except OSError as exc:
        raise unreadable(path, exc) from None
    finally:
        os.close(fd)
    if size > max_bytes:
        raise InputError(f"{path}: {size} bytes exceeds the {max_bytes}-byte limit for {what}")
    return data


def load_file(path: Path, max_bytes: int = MAX_JSON_BYTES) -> Any:
    """Read and strictly parse a JSON file whose size is bounded before reading."""
    return loads_strict(read_bounded(path, max_bytes, "JSON"), str(path))


_SAFE_INT = 2**53 - 1  # RFC 8785 (I-JSON) integers; rfc8785 refuses larger ones, and so must we


def _plain_scalar(v: Any) -> bool:
    return not isinstance(v, float) and not (isinstance(v, int) and not -_SAFE_INT <= v <= _SAFE_INT)


_LEAVES = frozenset({str, bool, type(None), int, dict, list})  # exact types the fast walk takes as they are


def _plain(obj: Any) -> bool:
    """True when `json.dumps` already yields RFC 8785 output: no floats, no integer beyond 2^53, and no
    key with a character beyond the BMP (RFC 8785 sorts keys by UTF-16 code units, Python by code points).

    Walked a container at a time at C speed where it can be (the writer's records: ~30,000 calls for
    10,000 entries): the keys joined and checked as one string, the values' exact types taken as a set;
    any other type (a float, a subclass) goes through the per-value check. tests/test_hashing.py
    compares `canonical` with rfc8785's output on random and on release-record data.
    """
    if not isinstance(obj, (dict, list)):
        return _plain_scalar(obj)
    stack = [obj]
    while stack:
        x = stack.pop()
        if isinstance(x, dict):
            try:
                keys = "".join(x)
            except TypeError:  # a key that is not a string
                return False
            if not keys.isascii() and max(map(ord, keys)) > 0xFFFF:
                return False
            values = list(x.values())
        else:
            values = x
        kinds = set(map(type, values))  # C speed; lists of integers (token ids, shapes) end here
        if kinds <= _LEAVES:
            ints = values if kinds == {int} else [v for v in values if type(v) is int] if int in kinds else ()
            if ints and (max(ints) > _SAFE_INT or min(ints) < -_SAFE_INT):
                return False
            if dict in kinds or list in kinds:
                stack.extend(v for v in values if type(v) is dict or type(v) is list)
            continue
        for v in values:
            if isinstance(v, (dict, list)):
                stack.append(v)
            elif not _plain_scalar(v):
                return False
    return True


def is_plain(obj: Any) -> bool:
    """True when `obj` holds no float, no integer beyond I-JSON and no key beyond the BMP: its canonical JSON
    is then sorted, compact JSON (`canonical`)."""
    return _plain(obj)


_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def finite_json(obj: Any) -> Any:
    """`obj` with each non-finite float as the string "Infinity", "-Infinity" or "NaN" (as protobuf's JSON
    mapping writes them): JSON has no such number, and writing 1.797e308 instead would be a finite lie.
    The schemas allow these strings where a measure can be infinite (recompute's max_abs, max_excess)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else _NON_FINITE.get(obj, "NaN")
    if isinstance(obj, dict):
        return {k: finite_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_json(v) for v in obj]
    return obj


def canonical(obj: Any) -> bytes:
    """RFC 8785 canonical JSON bytes.

    Without floats, RFC 8785 is exactly sorted, compact, non-ASCII-escaping JSON (same string
    escapes), so the C encoder is used; anything with a float goes through the rfc8785 package,
    a non-finite one written as finite_json says.
    """
    if _plain(obj):
        return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()
    return rfc8785.dumps(finite_json(obj))


def read_jsonl(path: Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """Yield (line number, object) for each non-blank line; errors name file and line."""
    fh = os.fdopen(open_regular(path, "JSON lines"), "rb")
    with fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            obj = loads_strict(line, f"{path}:{lineno}")
            if not isinstance(obj, dict):
                raise InputError(f"{path}:{lineno}: expected a JSON object")
            yield lineno, obj


def refuse_existing(path: Path, overwrite: bool) -> None:
    """The one refusal to replace an output that exists (exit 5) unless overwriting was asked for."""
    from kvgraft.errors import ExistsError

    if not overwrite and Path(path).exists():
        raise ExistsError(f"{path}: already exists; pass --overwrite to replace it")


def check_writable(path: Path) -> None:
    """Refuse an output that cannot be written (InputError, exit 2) before the work that would make it: a
    model load, a release's hashing. The folder it is created in (its nearest existing ancestor: writers
    create the rest) must take a new file; probed by making an unnamed temporary file there (O_TMPFILE,
    else a named one removed at once), so a read-only filesystem or a missing permission says so now; a probe
    the system fails (ENOSPC, EDQUOT, EIO) is IOFailure, exit 7, as the write would be."""
    path = Path(path)
    folder = path.parent
    while stat_or_none(folder, follow=True) is None and folder != folder.parent:
        folder = folder.parent
    if not is_folder(folder):
        raise InputError(f"{path}: cannot write it: {folder} is not a folder")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        if exc.errno in READ_ERRNOS:  # the system refused it (a full disk, a quota, the device): a refused write
            raise io_failure(path, OSError(exc.errno, exc.strerror)) from None
        raise InputError(f"{path}: cannot write it: {exc.strerror or exc} ({folder})") from None


# The system's refusals of a write: a CLI turns one that escaped the library's wrapping into exit 7 too.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EIO, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM})


# A read the system failed (the device, not the input): exit 7 like a refused write, not exit 2.
READ_ERRNOS = frozenset({errno.EIO, errno.ENOSPC, errno.EDQUOT})


def unreadable(path: Path | str, exc: OSError, verb: str = "read") -> Error:
    """One line for a read that failed: 'PATH: cannot read: Input/output error (EIO)' (IOFailure) when the
    system failed it, else 'PATH: cannot read: Permission denied' (InputError: the input cannot be used)."""
    if exc.errno in READ_ERRNOS:
        return IOFailure(f"{path}: cannot {verb}: {exc.strerror or exc} ({errno.errorcode[exc.errno]})")
    return InputError(f"{path}: cannot {verb}: {exc.strerror}")


def io_failure(path: Path | str, exc: OSError) -> IOFailure:
    """One line naming the path and the cause of a refused write: 'PATH: cannot write: No space left on
    device (ENOSPC)'. A write() error carries no file name, so `path` names what was being written."""
    name = errno.errorcode.get(exc.errno or 0)
    where = exc.filename if exc.filename is not None else path
    cause = exc.strerror or str(exc)
    return IOFailure(f"{where}: cannot write: {cause}{f' ({name})' if name else ''}")


@contextlib.contextmanager
def writing(path: Path | str, *, always: bool = False) -> Iterator[None]:
    """Turn an OSError from the writes inside into IOFailure (exit 7) naming `path` or (unless `always`)
    the file the error names."""
    try:
        yield
    except OSError as exc:
        raise io_failure(path, OSError(exc.errno, exc.strerror) if always else exc) from None


def warn(message: str) -> None:
    """A line on stderr for what went wrong after an output was complete and in place (nothing to undo)."""
    print(f"kvgraft: warning: {message}", file=sys.stderr)


# What a writer of NAME leaves when killed: write_atomic's temp file, ReleaseWriter's temp folder and the
# previous release set aside (".NAME.old" from earlier versions). tempfile's random part is 8 characters.
def _leftover(name: str) -> re.Pattern[str]:
    return re.compile(rf"\.{re.escape(name)}(\.[a-z0-9_]{{8}}\.(tmp|partial|old)|\.old)")


def remove_tree(path: Path) -> None:
    """Remove a folder or file; raises OSError naming what could not be removed."""
    if os.path.isdir(path) and not os.path.islink(path):
        errors: list[OSError] = []
        shutil.rmtree(path, onerror=lambda _f, p, info: errors.append(
            OSError(getattr(info[1], "errno", None), getattr(info[1], "strerror", str(info[1])), p)))
        if errors:
            raise errors[0]
    else:
        os.unlink(path)


class OutputLock:
    """The one writer of `path`: flock on `.NAME.lock` beside it. The kernel drops the lock when its holder
    dies, so a killed writer never leaves it stuck; a second writer is refused at once (BusyError, exit 8).
    Held, it clears what killed writers of the same name left (their temp files and folders)."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.file = self.path.with_name(f".{self.path.name}.lock")
        self.fd = -1

    def __enter__(self) -> OutputLock:
        # Named by the output, not the lock file: its folder is what refuses (read-only, full, no permission).
        with writing(self.path, always=True):
            self.path.parent.mkdir(parents=True, exist_ok=True)
            while True:
                fd = os.open(self.file, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    os.close(fd)
                    raise BusyError(f"{self.path}: another process is writing it now (it holds {self.file}); "
                                    "try again when it is done") from None
                st = stat_or_none(self.file)
                if st is not None and st.st_ino == os.fstat(fd).st_ino:
                    break
                os.close(fd)  # the holder removed its lock file between our open and flock: lock the new one
        self.fd = fd
        pattern = _leftover(self.path.name)
        with contextlib.suppress(OSError):
            for name in os.listdir(self.path.parent):
                if pattern.fullmatch(name):
                    with contextlib.suppress(OSError):
                        remove_tree(self.path.parent / name)
        return self

    def __exit__(self, *_: object) -> None:
        self.release()

    def release(self) -> None:
        if self.fd >= 0:
            with contextlib.suppress(OSError):
                self.file.unlink()  # while still held: a writer that opened it meanwhile sees the inode change
            os.close(self.fd)
            self.fd = -1


def clear_leftovers(path: Path) -> None:
    """Remove what killed writers of `path` left beside it (OutputLock does, once it holds the lock);
    nothing when its folder does not exist (no folder is made for it)."""
    if is_folder(path.parent):
        with OutputLock(path):
            pass


_RENAME_EXCHANGE = 2
_AT_FDCWD = -100


def exchange(a: Path, b: Path) -> None:
    """Swap two existing paths in one step (Linux renameat2 RENAME_EXCHANGE): a reader of either sees the
    old or the new, never nothing. OSError (EINVAL, ENOSYS) where the system or file system lacks it."""
    fn = getattr(ctypes.CDLL(None, use_errno=True), "renameat2", None)
    if fn is None:
        raise OSError(errno.ENOSYS, "renameat2 is not available", str(b))
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) != 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code), str(b))


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o644, *, owner: Path | None = None) -> None:
    """Write to a temp name in the same folder, fsync, rename: never a partial file.

    `mode` is set explicitly: mkstemp's 0600 would make published files unreadable to others,
    while private keys must keep 0600. Under the output's lock (a second writer gets BusyError); a
    refused write (disk full, I/O error, read-only) is IOFailure naming the path, the old file intact.
    `owner`: the folder `path` lies in (a release), whose lock (OutputLock(owner)) the caller holds; the temp
    file is made beside the folder, named as the folder's leftovers, so that a kill leaves nothing inside it
    (inside only where the folder is another file system than its parent: a rename cannot cross it).
    """
    with contextlib.nullcontext() if owner else OutputLock(path), writing(path):
        where = owner or path
        fd, tmp = tempfile.mkstemp(prefix=f".{where.name}.", suffix=".tmp", dir=where.parent)
        try:
            os.fchmod(fd, mode)
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            try:
                os.replace(tmp, path)
            except OSError as exc:
                if owner is None or exc.errno != errno.EXDEV:
                    raise
                Path(tmp).unlink(missing_ok=True)
                write_atomic(path, data, mode)  # its temp file inside, cleared by the next writer of that name
                return
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    try:
        fsync_dir(path.parent)
    except OSError as exc:
        warn(f"{path}: written and in place, but its folder could not be flushed to disk: {exc.strerror}")


def json_bytes(obj: Any) -> bytes:
    """What write_json writes: indented JSON, non-finite floats as finite_json says."""
    return (json.dumps(obj if _plain(obj) else finite_json(obj), indent=2, allow_nan=False) + "\n").encode()


def write_json(path: Path, obj: Any, *, canonical_form: bool = False) -> None:
    write_atomic(path, canonical(obj) if canonical_form else json_bytes(obj))
