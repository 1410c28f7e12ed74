"""Servers the remote-release tests read from, on 127.0.0.1, started and stopped by the tests.

`FolderServer`: a threaded HTTP server of folders with single byte-range support (206 and Content-Range),
a log of every request (method, path, Range, status) and faults injected per path: a connection dropped
after some bytes, other bytes at an offset, a wrong Content-Length, 5xx answers, a stall, a redirect, a 404.
JSON documents can be served at fixed paths too (the Hub's API for hf:// tests).

`s3_server`: moto's ThreadedMotoServer (the server s3fs tests itself against) on a free port, with the
requests it served taken from werkzeug's log.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit


def quiet(stderr: str) -> str:
    """A command's stderr without its progress lines: a loaded machine may take long enough over a fetch to print
    one, and it is not an error (an error line is kept)."""
    return "\n".join(line for line in stderr.strip().splitlines() if not line.startswith("kvgraft: fetching ")).strip()


@dataclass
class Fault:
    """What to do instead of answering a request whose path contains `match`, `times` times (-1: always).

    kind: "drop" (send `after` bytes of the body, then close), "corrupt" (flip the byte at file offset `at`),
    "short-length" (a Content-Length `by` bytes short of the body), "long-length" (`by` bytes more than
    the body, then close), "status" (answer `status`), "stall" (send `after` bytes, then wait `seconds`),
    "redirect" (302 to the same path with `to` in place of `match`), "missing" (404), "slow" (wait `seconds`,
    then answer), "extra" (`by` bytes more than the range asked for, Content-Length saying so), "short-range"
    (a range from `at` on answered `by` bytes short, its Content-Range and Content-Length saying so), "shift" (a range
    answered from `by` bytes further on, its Content-Range saying so), "elsewhere" (302 to the same path on
    the host `to`, e.g. localhost for 127.0.0.1: another origin), "loop" (302 to the same path with a new
    query, without end), "drip" (a byte every `seconds`, `after` bytes if given, then close), "whole" (a
    range request answered with the whole file, 200).
    """

    match: str
    kind: str
    times: int = 1
    after: int = 0
    at: int = 0
    by: int = 0
    status: int = 500
    seconds: float = 0.0
    to: str = ""
    used: int = 0


@dataclass
class Logged:
    method: str
    path: str
    range: str | None
    status: int
    authorization: str | None = None
    host: str | None = None  # the Host header: which name of this server the client asked


@dataclass
class FolderServer:
    folders: dict[str, Path] = field(default_factory=dict)  # URL path prefix -> folder
    documents: dict[str, Any] = field(default_factory=dict)  # exact URL path -> JSON
    faults: list[Fault] = field(default_factory=list)
    log: list[Logged] = field(default_factory=list)
    ranges: bool = True  # False: a server that ignores Range and sends the whole file (200)
    sent: dict[str, int] = field(default_factory=dict)  # URL path -> body bytes written to the socket
    stopping: threading.Event = field(default_factory=threading.Event)
    tls: tuple[str, str] | None = None
    _httpd: ThreadingHTTPServer | None = None

    def url(self, prefix: str) -> str:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return f"{'https' if self.tls else 'http'}://{host}:{port}/{prefix.strip('/')}"

    def address(self) -> tuple[str, int]:
        assert self._httpd is not None
        host, port = self._httpd.server_address[:2]
        return str(host), int(port)

    def paths(self, method: str = "GET") -> list[str]:
        return [r.path for r in self.log if r.method == method]

    def fault(self, path: str) -> Fault | None:
        for f in self.faults:
            if f.match in path and (f.times < 0 or f.used < f.times):
                f.used += 1
                return f
        return None

    def file(self, path: str) -> Path | None:
        for prefix, folder in sorted(self.folders.items(), key=lambda kv: -len(kv[0])):
            p = "/" + prefix.strip("/") + "/"
            if path.startswith(p):
                target = folder / path[len(p):]
                return target if target.is_file() else None
        return None

    def start(self) -> FolderServer:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: Any) -> None:
                pass

            def _answer(self, status: int, body: bytes = b"", headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **(headers or {})}.items():
                    self.send_header(k, v)
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def do_HEAD(self) -> None:
                self.do_GET()

            def do_GET(self) -> None:
                path = unquote(urlsplit(self.path).path)
                rng = self.headers.get("Range")
                entry = Logged(self.command, path, rng, 0, self.headers.get("Authorization"), self.headers.get("Host"))
                server.log.append(entry)
                fault = server.fault(path)
                if fault is not None and fault.kind == "slow":
                    server.stopping.wait(fault.seconds)
                if path in server.documents:
                    entry.status = 200
                    self._answer(200, json.dumps(server.documents[path]).encode(), {"Content-Type": "application/json"})
                    return
                if fault is not None and fault.kind in ("status", "missing", "redirect", "elsewhere", "loop"):
                    entry.status = {"status": fault.status, "missing": 404}.get(fault.kind, 302)
                    port = server.address()[1]
                    location = {"redirect": path.replace(fault.match, fault.to), "loop": f"{path}?hop={fault.used}",
                                "elsewhere": f"http://{fault.to}:{port}{path}"}.get(fault.kind)
                    self._answer(entry.status, b"", {"Location": location} if location else {})
                    return
                target = server.file(path)
                if target is None:
                    entry.status = 404
                    self._answer(404)
                    return
                data = target.read_bytes()
                start, end, status = 0, len(data), 200
                if rng is not None and server.ranges and not (fault is not None and fault.kind == "whole"):
                    m = re.fullmatch(r"bytes=(\d+)-(\d*)", rng)
                    if m is None or int(m.group(1)) >= len(data):
                        entry.status = 416
                        self._answer(416, b"", {"Content-Range": f"bytes */{len(data)}"})
                        return
                    start = int(m.group(1))
                    end = min(len(data), int(m.group(2)) + 1) if m.group(2) else len(data)
                    status = 206
                if status == 206 and fault is not None and fault.kind == "short-range" and start >= fault.at:
                    end = max(start + 1, end - fault.by)
                if status == 206 and fault is not None and fault.kind == "shift":
                    start = min(start + fault.by, end - 1)
                body = bytearray(data[start:end])
                headers = {"Content-Range": f"bytes {start}-{end - 1}/{len(data)}"} if status == 206 else {}
                entry.status = status
                if fault is not None and fault.kind == "corrupt" and start <= fault.at < end:
                    body[fault.at - start] ^= 0xFF
                if fault is not None and fault.kind == "extra":
                    body += b"\0" * fault.by
                length = len(body)
                if fault is not None and fault.kind == "short-length":
                    length = max(0, len(body) - fault.by)
                if fault is not None and fault.kind == "long-length":
                    length = len(body) + fault.by
                self.send_response(status)
                self.send_header("Content-Length", str(length))
                for k, v in headers.items():
                    self.send_header(k, v)
                self.end_headers()
                if fault is not None and fault.kind == "drip":
                    for i in range(min(len(body), fault.after or len(body))):
                        if server.stopping.wait(fault.seconds):
                            break
                        self.wfile.write(bytes(body[i:i + 1]))
                        self.wfile.flush()
                    self.close_connection = True
                    return
                if fault is not None and fault.kind in ("drop", "stall"):
                    self.wfile.write(bytes(body[:fault.after]))
                    self.wfile.flush()
                    if fault.kind == "stall":
                        server.stopping.wait(fault.seconds)
                    self.close_connection = True
                    return
                self.wfile.write(bytes(body))
                server.sent[path] = server.sent.get(path, 0) + len(body)
                if fault is not None and fault.kind == "long-length":
                    self.close_connection = True

        class Quiet(ThreadingHTTPServer):
            def handle_error(self, request: Any, client_address: Any) -> None:
                pass  # a client that hung up mid-answer (the faults make many): nothing to print

        self._httpd = Quiet(("127.0.0.1", 0), Handler)
        if self.tls is not None:  # (certificate, key) PEM files: an HTTPS server
            import ssl

            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(*self.tls)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


@contextmanager
def folder_server(**folders: Path) -> Iterator[FolderServer]:
    server = FolderServer({k: v for k, v in folders.items()}).start()
    try:
        yield server
    finally:
        server.stop()


HUB_COMMIT = "0123456789abcdef0123456789abcdef01234567"


@contextmanager
def hub_server(rel: Path, tmp_path: Path, monkeypatch: Any) -> Iterator[FolderServer]:
    """A local server standing in for the Hub: dataset org/kv-releases, its main revision pinned to HUB_COMMIT,
    `rel` at releases/v1; huggingface_hub pointed at it (HF_ENDPOINT's constants), online, with a token and a cache
    under `tmp_path`."""
    from huggingface_hub import constants

    with folder_server(**{f"datasets/org/kv-releases/resolve/{HUB_COMMIT}/releases/v1": rel}) as server:
        server.documents["/api/datasets/org/kv-releases/revision/main"] = {"id": "org/kv-releases", "sha": HUB_COMMIT}
        endpoint = server.url("").rstrip("/")  # what HF_ENDPOINT sets when huggingface_hub is imported
        monkeypatch.setattr(constants, "ENDPOINT", endpoint)
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", endpoint + "/{repo_id}/resolve/{revision}/{filename}")
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hf-cache"))
        monkeypatch.setenv("HF_TOKEN", "hf_kvgraft_test_token")
        yield server


class _Requests(logging.Handler):
    """werkzeug's access log lines, parsed: ("GET", "/bucket/key", status)."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.seen: list[tuple[str, str, int]] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = re.sub(r"\x1b\[[0-9;]*m", "", record.getMessage())  # werkzeug colours the status
        m = re.search(r'"([A-Z]+) (\S+) HTTP/[\d.]+" (\d+)', text)
        if m:
            self.seen.append((m.group(1), unquote(urlsplit(m.group(2)).path), int(m.group(3))))


@dataclass
class S3Server:
    endpoint: str
    requests: _Requests

    def gets(self, bucket: str) -> list[str]:
        """Keys read (GET) from `bucket`, in order."""
        return [p[len(bucket) + 2:] for m, p, _ in self.requests.seen if m == "GET" and p.startswith(f"/{bucket}/")]


@contextmanager
def s3_server() -> Iterator[S3Server]:
    from moto.server import ThreadedMotoServer

    handler = _Requests()
    log = logging.getLogger("werkzeug")
    old = (log.level, log.propagate)
    log.setLevel(logging.INFO)
    log.propagate = False
    log.addHandler(handler)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    try:
        yield S3Server(f"http://{host}:{port}", handler)
    finally:
        server.stop()
        log.removeHandler(handler)
        log.setLevel(old[0])
        log.propagate = old[1]


def upload(endpoint: str, bucket: str, prefix: str, folder: Path) -> None:
    """Every file under `folder` to s3://bucket/prefix/..., through boto3 (made with the test's credentials)."""
    import boto3

    s3 = boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1")
    existing = {b["Name"] for b in s3.list_buckets().get("Buckets", [])}
    if bucket not in existing:
        s3.create_bucket(Bucket=bucket)
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{path.relative_to(folder).as_posix()}", Body=path.read_bytes())


def wait_for(predicate: Any, seconds: float = 5.0) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.01)
    return bool(predicate())


def verified_pieces(cache: Path) -> list[str]:
    """The digests of a cache's pieces, after checking that each file hashes to its name."""
    names = []
    for piece in sorted((cache / "pieces").glob("*/*")):
        assert hashlib.sha256(piece.read_bytes()).hexdigest() == piece.name, f"{piece}: an unverified piece"
        names.append(piece.name)
    return names
