"""Byte ranges of the files of a remote folder: HTTP(S) through fsspec's aiohttp file system, S3 through s3fs.

A store answers one question: the bytes [start, end) of a file, streamed to a sink and never more than
asked for (`get`). Nothing a server says about sizes is believed: a body is read in blocks up to the
number of bytes asked for, and one more byte is an error. Sizes and digests come from the signed chain
(kvgraft.remote.transfer checks them). Which failures are worth a retry is decided here: a refused
connection, a dropped one, a timeout, an HTTP 5xx or 429, a short body; a 404 or another 4xx is not.

fsspec, aiohttp and s3fs are imported only when a remote location is read (`pip install kvgraft[remote]`).
docs/remote.md says why these libraries.
"""

from __future__ import annotations

import os
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote, urlsplit, urlunsplit

from kvgraft.errors import InputError

BLOCK = 1024 * 1024
Sink = Callable[[bytes], None]


class FetchError(InputError):
    """A remote file that could not be read: not found, refused, or no complete answer in time (exit 2)."""


class NotFound(Exception):
    """The server says the file does not exist (HTTP 404/410, S3 NoSuchKey)."""


class Transient(Exception):
    """A failure another try may not repeat: connection refused or dropped, timeout, 5xx, short body."""


class Oversize(Exception):
    """The server sent more bytes than were asked for."""


@dataclass(frozen=True)
class Settings:
    """How long to wait and how often to try; from the environment (docs/remote.md)."""

    timeout: float = 30.0  # seconds without a byte (connect, or read) before a try is abandoned
    tries: int = 5  # per byte range; a retry resumes after the bytes already received
    parallel: int = 4  # byte ranges of one file in flight at once, and files at once
    chunk: int = 16 * 1024 * 1024  # a file larger than this is fetched as ranges of this size

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
            if value <= 0:
                raise InputError(f"{var}={raw!r}: expected a number above 0")
            return value

        return cls(number("KVGRAFT_REMOTE_TIMEOUT", cls.timeout, float), number("KVGRAFT_REMOTE_TRIES", cls.tries, int),
                   number("KVGRAFT_REMOTE_PARALLEL", cls.parallel, int), cls.chunk)


def _missing(package: str) -> FetchError:
    return FetchError(f"reading a remote release needs {package}: pip install 'kvgraft[remote]'")


async def _drain(read: Callable[[int], Awaitable[bytes]], skip: int, limit: int, sink: Sink) -> int:
    """Feed `sink` at most `limit` bytes of a body, after discarding its first `skip`; return how many came.
    A byte beyond `limit` is an error: the server answered with more than was asked for."""
    while skip > 0:
        block = await read(min(BLOCK, skip))
        if not block:
            return 0
        skip -= len(block)
    got = 0
    while True:
        block = await read(min(BLOCK, limit + 1 - got))
        if not block:
            return got
        if got + len(block) > limit:
            raise Oversize(f"the server sent more than the {limit} bytes asked for")
        got += len(block)
        sink(block)


def _range_header(start: int, end: int) -> str:
    return f"bytes={start}-{end - 1}"


class Store:
    """The files of one remote folder. `get` may be called from many threads at once."""

    display: str  # the folder as messages name it (the URL given)
    ranges: bool = True  # False once the server answered a range request with the whole file

    def shown(self, name: str) -> str:
        return f"{self.display}/{name}"

    def get(self, name: str, start: int, end: int, sink: Sink) -> int:
        """Stream bytes [start, end) of `name` into `sink`; return how many came (fewer: the body ended early)."""
        raise NotImplementedError

    def list(self) -> list[str] | None:
        """Every file name under the folder, or None where a folder cannot be listed (HTTP)."""
        return None


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
        self._fs: Any = None

    def url(self, name: str) -> str:
        return f"{self._base}/{quote(name, safe='/')}" + (f"?{self._query}" if self._query else "")

    def _filesystem(self) -> Any:
        if self._fs is None:
            try:
                import aiohttp
                from fsspec.implementations.http import HTTPFileSystem
            except ImportError:
                raise _missing("fsspec and aiohttp") from None
            t = self.settings.timeout
            # No decompression (the bytes hashed are the bytes served); proxies and .netrc credentials from
            # the environment, as curl and requests take them.
            self._fs = HTTPFileSystem(skip_instance_cache=True, client_kwargs={
                "timeout": aiohttp.ClientTimeout(total=None, sock_connect=t, sock_read=t),
                "auto_decompress": False, "trust_env": True})
        return self._fs

    def get(self, name: str, start: int, end: int, sink: Sink) -> int:

        import aiohttp
        from fsspec.asyn import sync

        fs = self._filesystem()
        url = self.url(name)

        async def go() -> int:
            session = await fs.set_session()
            headers = {**self.headers, "Accept-Encoding": "identity", "Range": _range_header(start, end)}
            async with session.get(url, headers=headers) as r:
                if r.status in (404, 410):
                    raise NotFound(f"HTTP {r.status}")
                if r.status >= 500 or r.status in (408, 429):
                    raise Transient(f"HTTP {r.status} {r.reason or ''}".rstrip())
                if r.status not in (200, 206):
                    raise FetchError(f"{self.shown(name)}: HTTP {r.status} {r.reason or ''}".rstrip())
                skip = 0
                if r.status == 200:  # the whole file: this server serves no ranges
                    skip, self.ranges = start, False if start > 0 else self.ranges
                else:
                    m = re.match(r"bytes (\d+)-", r.headers.get("Content-Range", ""))
                    if m is None or int(m.group(1)) != start:
                        raise Transient(f"asked for bytes from {start}, answered with "
                                        f"{r.headers.get('Content-Range', 'no Content-Range')!r}")
                return await _drain(r.content.read, skip, end - start, sink)

        try:
            return int(sync(fs.loop, go))
        except TimeoutError:
            raise Transient(f"no data for {self.settings.timeout:g} s (timed out)") from None
        except aiohttp.ClientResponseError as exc:
            raise Transient(f"HTTP {exc.status} {exc.message}") from None
        except aiohttp.ClientError as exc:
            raise Transient(f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__) from None


class S3Store(Store):
    """A prefix of an S3 bucket, on AWS or any S3-compatible endpoint; credentials and endpoint the standard
    way (botocore: AWS_* variables, ~/.aws; fsspec configuration, e.g. FSSPEC_S3_ENDPOINT_URL)."""

    def __init__(self, bucket: str, prefix: str, *, display: str, settings: Settings | None = None) -> None:
        self.bucket, self.prefix, self.display = bucket, prefix.strip("/"), display
        self.settings = settings or Settings.from_env()
        self._fs: Any = None

    def key(self, name: str) -> str:
        return f"{self.prefix}/{name}" if self.prefix else name

    def _filesystem(self) -> Any:
        if self._fs is None:
            try:
                import fsspec
                import s3fs  # noqa: F401  (registers the protocol)
            except ImportError:
                raise _missing("s3fs") from None
            t = self.settings.timeout
            # Retries are this module's (each resumes after the bytes already received); botocore's and
            # s3fs's own are turned off so that a failure is reported once, after the tries it took.
            self._fs = fsspec.filesystem("s3", skip_instance_cache=True, retries=1, config_kwargs={
                "connect_timeout": t, "read_timeout": t, "retries": {"max_attempts": 1}})
        return self._fs

    def get(self, name: str, start: int, end: int, sink: Sink) -> int:
        from fsspec.asyn import sync

        fs = self._filesystem()

        async def go() -> int:
            resp = await fs._call_s3("get_object", Bucket=self.bucket, Key=self.key(name), Range=_range_header(start, end))
            body = resp["Body"]
            try:
                return await _drain(body.read, 0, end - start, sink)
            finally:
                body.close()

        try:
            return int(sync(fs.loop, go))
        except FileNotFoundError:
            raise NotFound("no such key") from None
        except PermissionError as exc:
            raise FetchError(f"{self.shown(name)}: access denied ({exc})") from None
        except (NotFound, Transient, Oversize, FetchError):
            raise
        except Exception as exc:  # botocore's, aiohttp's and s3fs's failures: connection, timeout, 5xx
            if "InvalidRange" in str(exc):
                return 0  # asked past the end: the object is shorter than the signed size
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
