"""Byte ranges of the files of a remote folder: HTTP(S) through fsspec's aiohttp file system, S3 through s3fs.

A store answers one question: the bytes [start, end) of a file, streamed to a sink and never more than
asked for (`get`). Nothing a server says about sizes is believed: a body is read in blocks up to the
number of bytes asked for, and one more byte is an error. Sizes and digests come from the signed chain
(kvgraft.remote.transfer checks them). Which failures are worth a retry is decided here: a dropped
connection, a timeout, an HTTP 5xx, 408 or 429, a short body are (`Transient`); a refused connection, a TLS
certificate that does not verify, missing S3 credentials, a redirect loop, a 404 or another 4xx are not
(`Refused`, `NotFound`): another try would only repeat them. Redirects are followed here, not by aiohttp,
so that the Authorization header never leaves the host it was meant for and a loop ends after a few hops.

fsspec, aiohttp and s3fs are imported only when a remote location is read (`pip install kvgraft[remote]`).
docs/remote.md says why these libraries.
"""

from __future__ import annotations

import asyncio
import errno
import math
import os
import re
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urljoin, urlsplit, urlunsplit

from kvgraft.errors import InputError
from kvgraft.remote.location import redact

BLOCK = 1024 * 1024
MAX_REDIRECTS = 10
REDIRECTS = (301, 302, 303, 307, 308)
Sink = Callable[[bytes], None]


class FetchError(InputError):
    """A remote file that could not be read: not found, refused, or no complete answer in time (exit 2)."""


class NotFound(Exception):
    """The server says the file does not exist (HTTP 404/410, S3 NoSuchKey)."""


class Transient(Exception):
    """A failure another try may not repeat: connection refused or dropped, timeout, 5xx, short body."""


class Refused(Exception):
    """A failure another try would repeat: refused connection, bad TLS certificate, no credentials, 4xx, redirect loop."""


class Oversize(Exception):
    """The server sent more bytes than were asked for."""


@dataclass(frozen=True)
class Settings:
    """How long to wait and how often to try; from the environment (docs/remote.md)."""

    timeout: float = 30.0  # seconds without a byte (connect, or read) before a try is abandoned
    tries: int = 5  # per byte range; a retry resumes after the bytes already received
    parallel: int = 4  # byte ranges of one file in flight at once, and files at once
    chunk: int = 16 * 1024 * 1024  # a file larger than this is fetched as ranges of this size
    deadline: float = 3600.0  # seconds one file's fetch may take in all, every try included

    @classmethod
    def from_env(cls) -> Settings:
        def number(var: str, default: float, kind: type) -> Any:
            raw = os.environ.get(var)
            if raw is None or raw == "":
                return default
            try:
                value = kind(raw)
            except ValueError:
                raise InputError(f"{var}={raw!r}: expected a number") from None
            if not value > 0 or not math.isfinite(value):  # nan and inf are floats too
                raise InputError(f"{var}={raw!r}: expected a finite number above 0")
            return value

        return cls(number("KVGRAFT_REMOTE_TIMEOUT", cls.timeout, float), number("KVGRAFT_REMOTE_TRIES", cls.tries, int),
                   number("KVGRAFT_REMOTE_PARALLEL", cls.parallel, int), cls.chunk,
                   number("KVGRAFT_FETCH_DEADLINE", cls.deadline, float))


def _missing(package: str) -> FetchError:
    return FetchError(f"reading a remote release needs {package}: pip install 'kvgraft[remote]'")


async def _counted(drain: Awaitable[int], counted: list[int], ended_early: tuple[type[BaseException], ...],
                   declared: int | None, complete: bool) -> int:
    """`drain`'s count; when the body ends before its Content-Length (connection closed), the bytes that did
    come (`counted`, kept by the sink): the caller sees a short answer and resumes after them. `complete`:
    the caller cannot tell a short answer from a whole one (a file of unknown size), so a body that ended
    early, or shorter than the server `declared`, is a Transient failure here."""
    try:
        got = await drain
    except ended_early:
        if complete:
            raise Transient(f"the answer ended after {counted[0]} bytes (connection closed)") from None
        return counted[0]
    if complete and declared is not None and got < declared:
        raise Transient(f"the answer ended after {got} of the {declared} bytes the server announced")
    return got


def _counting(sink: Sink) -> tuple[Sink, list[int]]:
    counted = [0]

    def count(block: bytes) -> None:
        sink(block)
        counted[0] += len(block)

    return count, counted


async def _drain(read: Callable[[int], Awaitable[bytes]], limit: int, sink: Sink, *, skip: int | None = None) -> int:
    """Feed `sink` at most `limit` bytes of a body; return how many came. A byte beyond `limit` is an error
    (the server answered with more than was asked for), unless the body is the whole file (`skip` given:
    its first `skip` bytes are discarded, and what follows the range is not read)."""
    left = skip or 0
    while left > 0:
        block = await read(min(BLOCK, left))
        if not block:
            return 0
        left -= len(block)
    got = 0
    while True:
        block = await read(min(BLOCK, limit + (0 if skip is not None else 1) - got))
        if not block:
            return got
        if got + len(block) > limit:
            raise Oversize(f"the server sent more than the {limit} bytes asked for")
        got += len(block)
        sink(block)
        if got == limit and skip is not None:
            return got


def _range_header(start: int, end: int) -> str:
    return f"bytes={start}-{end - 1}"


class Store:
    """The files of one remote folder. `get` may be called from many threads at once."""

    _making = threading.Lock()  # one file system (and HTTP client) per store, made by the first thread that asks

    display: str  # the folder as messages name it (the URL given)
    ranges: bool = True  # False once the server answered a range request with the whole file

    def shown(self, name: str) -> str:
        return f"{self.display}/{name}"

    def get(self, name: str, start: int, end: int, sink: Sink, *, whole: int | None = None, complete: bool = False,
            deadline: float | None = None) -> int:
        """Stream bytes [start, end) of `name` into `sink`; return how many came (fewer: the body ended early).
        `whole`: when the server answers with the whole file (no ranges), read it up to this offset rather
        than `end`, so that it is read once. `complete`: see `_counted`. `deadline` (time.monotonic()):
        the answer is abandoned then."""
        raise NotImplementedError

    def list(self) -> list[str] | None:
        """Every file name under the folder, or None where a folder cannot be listed (HTTP)."""
        return None

    _fs: Any = None

    def _filesystem(self) -> Any:
        with self._making:
            if self._fs is None:
                self._fs = self._make()
            return self._fs

    def _make(self) -> Any:
        raise NotImplementedError


class HttpStore(Store):
    """A folder served over HTTP(S); a Hugging Face Hub `resolve/<revision>/` URL is one."""

    def __init__(self, base: str, *, display: str | None = None, headers: dict[str, str] | None = None,
                 settings: Settings | None = None) -> None:
        parts = urlsplit(base)
        self._base = urlunsplit((parts.scheme, parts.netloc, parts.path.rstrip("/"), "", ""))
        self._query = parts.query
        self.display = display or self._base
        self.headers = dict(headers or {})
        self.settings = settings or Settings.from_env()

    def url(self, name: str) -> str:
        return f"{self._base}/{quote(name, safe='/')}" + (f"?{self._query}" if self._query else "")

    def _make(self) -> Any:
        try:
            import aiohttp
            from fsspec.asyn import sync
            from fsspec.implementations.http import HTTPFileSystem
        except ImportError:
            raise _missing("fsspec and aiohttp") from None
        t = self.settings.timeout
        # No decompression (the bytes hashed are the bytes served); proxies and .netrc credentials from the
        # environment, as curl and requests take them.
        fs = HTTPFileSystem(skip_instance_cache=True, client_kwargs={
            "timeout": aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t),
            "auto_decompress": False, "trust_env": True})
        sync(fs.loop, fs.set_session)  # once, before the threads: each would open an HTTP client of its own
        return fs

    def get(self, name: str, start: int, end: int, sink: Sink, *, whole: int | None = None, complete: bool = False,
            deadline: float | None = None) -> int:
        import aiohttp
        from fsspec.asyn import sync

        fs = self._filesystem()
        ended = (aiohttp.ClientPayloadError,)

        async def answer(r: Any) -> int:
            if r.status in (404, 410):
                raise NotFound(f"HTTP {r.status}")
            if r.status >= 500 or r.status in (408, 429):
                raise Transient(f"HTTP {r.status} {r.reason or ''}".rstrip())
            if r.status not in (200, 206):
                raise Refused(f"HTTP {r.status} {r.reason or ''}".rstrip())
            count, counted = _counting(sink)
            if r.status == 200:  # the whole file: this server serves no ranges
                self.ranges = False
                upto = max(end, whole or 0)
                return await _counted(_drain(r.content.read, upto - start, count, skip=start), counted, ended,
                                      None if r.content_length is None else r.content_length - start, complete)
            m = re.match(r"bytes (\d+)-(\d+)/(\d+|\*)", r.headers.get("Content-Range", ""))
            if m is None or int(m.group(1)) != start:
                raise Transient(f"asked for bytes from {start}, answered with "
                                f"{r.headers.get('Content-Range', 'no Content-Range')!r}")
            # what a whole answer holds: up to the end asked for, or of the file where the server says it ends
            declared = (min(end, int(m.group(3))) if m.group(3) != "*" else int(m.group(2)) + 1) - start
            return await _counted(_drain(r.content.read, end - start, count), counted, ended, declared, complete)

        async def go() -> int:
            client = await fs.set_session()
            target, headers = self.url(name), {**self.headers, "Accept-Encoding": "identity",
                                               "Range": _range_header(start, end)}
            for _ in range(MAX_REDIRECTS + 1):
                async with client.get(target, headers=headers, allow_redirects=False) as r:
                    if r.status not in REDIRECTS:
                        return await answer(r)
                    to = urljoin(target, r.headers.get("Location", ""))
                if urlsplit(to).scheme.lower() not in ("http", "https") or to == target:
                    raise Refused(f"HTTP {r.status}: a redirect to {redact(to)!r}")
                if _origin(to) != _origin(target):  # credentials are for the host they were given for
                    headers = {k: v for k, v in headers.items() if k.lower() != "authorization"}
                target = to
            raise Refused(f"more than {MAX_REDIRECTS} redirects (a redirect loop?)")

        return _run(fs, sync, go, deadline, self.settings.timeout, aiohttp)


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme.lower(), (parts.hostname or "").lower(), parts.port


async def _within(go: Callable[[], Awaitable[int]], deadline: float | None) -> int:
    """`go()`, stopped when the monotonic `deadline` passes (None: never), which is then a Transient failure; a read
    that timed out before it is left as it is."""
    if deadline is None:
        return await go()
    try:
        return await asyncio.wait_for(go(), max(0.0, deadline - time.monotonic()))
    except TimeoutError:
        if time.monotonic() < deadline:
            raise  # a read that timed out, not the deadline
        raise Transient("the fetch deadline passed (KVGRAFT_FETCH_DEADLINE)") from None


def _run(fs: Any, sync: Any, go: Callable[[], Awaitable[int]], deadline: float | None, timeout: float,
         aiohttp: Any) -> int:
    """`go()` on the file system's loop, bounded by `deadline`, its errors sorted into retried or not."""
    try:
        return int(sync(fs.loop, _within, go, deadline))
    except TimeoutError:
        raise Transient(f"no data for {timeout:g} s (timed out)") from None
    except (aiohttp.ClientSSLError, aiohttp.InvalidURL) as exc:
        raise Refused(redact(f"{type(exc).__name__}: {exc}")) from None
    except aiohttp.ClientConnectorError as exc:
        if getattr(exc, "os_error", None) is not None and exc.os_error.errno == errno.ECONNREFUSED:
            raise Refused(redact(f"connection refused ({exc})")) from None
        raise Transient(redact(f"{type(exc).__name__}: {exc}")) from None
    except aiohttp.ClientResponseError as exc:
        raise Transient(f"HTTP {exc.status} {exc.message}") from None
    except aiohttp.ClientError as exc:
        raise Transient(redact(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__)) from None


class S3Store(Store):
    """A prefix of an S3 bucket, on AWS or any S3-compatible endpoint; credentials and endpoint the standard
    way (botocore: AWS_* variables, ~/.aws; fsspec configuration, e.g. FSSPEC_S3_ENDPOINT_URL)."""

    def __init__(self, bucket: str, prefix: str, *, display: str, settings: Settings | None = None) -> None:
        self.bucket, self.prefix, self.display = bucket, prefix.strip("/"), display
        self.settings = settings or Settings.from_env()

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _make(self) -> Any:
        try:
            import fsspec
            import s3fs  # noqa: F401  (registers the protocol)
            from fsspec.asyn import sync
        except ImportError:
            raise _missing("s3fs") from None
        t = self.settings.timeout
        # Retries are this module's (each resumes after the bytes already received); botocore's and s3fs's
        # own are turned off so that a failure is reported once, after the tries it took.
        fs = fsspec.filesystem("s3", skip_instance_cache=True, config_kwargs={
            "connect_timeout": t, "read_timeout": t, "retries": {"max_attempts": 1}})
        fs.retries = 1
        sync(fs.loop, fs.set_session)  # once, before the threads: each would build a client of its own
        return fs

    def get(self, name: str, start: int, end: int, sink: Sink, *, whole: int | None = None, complete: bool = False,
            deadline: float | None = None) -> int:
        import aiohttp
        import botocore.exceptions
        from fsspec.asyn import sync

        fs = self._filesystem()

        async def go() -> int:
            resp = await fs._call_s3("get_object", Bucket=self.bucket, Key=self.key(name), Range=_range_header(start, end))
            body = resp["Body"]
            count, counted = _counting(sink)
            try:
                return await _counted(_drain(body.read, end - start, count), counted,
                                      (aiohttp.ClientPayloadError, botocore.exceptions.IncompleteReadError,
                                       botocore.exceptions.ResponseStreamingError), resp.get("ContentLength"), complete)
            finally:
                body.close()

        try:
            return int(sync(fs.loop, _within, go, deadline))
        except FileNotFoundError:
            raise NotFound("no such key") from None
        except PermissionError as exc:
            raise FetchError(f"{self.shown(name)}: access denied ({exc})") from None
        except (botocore.exceptions.NoCredentialsError, botocore.exceptions.PartialCredentialsError,
                botocore.exceptions.EndpointConnectionError) as exc:
            raise Refused(f"{type(exc).__name__}: {exc}") from None
        except (OSError, botocore.exceptions.BotoCoreError, botocore.exceptions.ClientError, aiohttp.ClientError) as exc:
            # s3fs's translation of S3's errors (OSError), botocore's and aiohttp's: connection, timeout, 5xx
            if "InvalidRange" in str(exc):
                return 0  # asked past the end: the object is shorter than the signed size
            cause = exc.__cause__ if isinstance(exc.__cause__, botocore.exceptions.ClientError) else exc
            status = getattr(cause, "response", {}).get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
            if 400 <= int(status or 0) < 500 and status not in (408, 429):
                raise Refused(f"{type(exc).__name__}: {exc}") from None
            if isinstance(exc, (TimeoutError, asyncio.TimeoutError)):
                raise Transient(f"no data for {self.settings.timeout:g} s (timed out)") from None
            raise Transient(f"{type(exc).__name__}: {exc}") from None

    def list(self) -> list[str] | None:
        from fsspec.asyn import sync

        fs = self._filesystem()
        base = f"{self.bucket}/{self.prefix}" if self.prefix else self.bucket
        try:
            found = sync(fs.loop, fs._find, base)
        except Exception as exc:
            raise FetchError(f"{self.display}: cannot list: {exc}") from None
        return sorted(str(k)[len(base) + 1:] for k in found if str(k).startswith(base + "/"))
