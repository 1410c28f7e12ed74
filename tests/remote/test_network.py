"""The network is never mistaken for an attacker: cut small files retried, short or shifted ranges resumed, a
whole-file answer read once, permanent failures said at once, a fetch deadline, credentials kept to their host,
and bad locations or cache folders refused in one line."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.format import Release
from kvgraft.remote.store import Settings

from remote_servers import HUB_COMMIT, Fault, FolderServer, hub_server, quiet

runner = CliRunner()
CHUNK = 512


@pytest.fixture(autouse=True)
def small_ranges(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(Settings, "chunk", CHUNK)


def verify(url: str, pub: Path, *more: str) -> tuple[int, str]:
    res = runner.invoke(app, ["verify", url, "--entry", "rec-002", "--key", str(pub), *more])
    return res.exit_code, quiet(res.stderr)


def asked(server: FolderServer, suffix: str) -> list[str | None]:
    return [r.range for r in server.log if r.path.endswith("/" + suffix)]


@pytest.mark.parametrize("name", ["manifest.json", "release.sigstore.json", "model.sig"])
def test_a_small_file_cut_mid_body_is_fetched_again_not_taken_whole(name: str, http: FolderServer, rel: Path,
                                                                    pub: Path) -> None:
    assert (rel / name).stat().st_size > 200
    http.faults.append(Fault(f"/rel/{name}", "drop", times=1, after=100))
    assert verify(http.url("rel"), pub) == (0, "")
    assert len(asked(http, name)) == 2  # the cut answer, then the whole file


@pytest.mark.parametrize("name", ["manifest.json", "model.sig"])
def test_a_small_file_cut_on_every_try_is_a_fetch_error_not_tampering(name: str, http: FolderServer, pub: Path) -> None:
    http.faults.append(Fault(f"/rel/{name}", "drop", times=-1, after=100))
    code, line = verify(http.url("rel"), pub)
    assert code == 2 and "\n" not in line, line
    assert f"{http.url('rel')}/{name}: " in line and "the answer ended after 100 bytes" in line and line.endswith("(3 tries)")


@pytest.mark.parametrize("by", [1, 30])
def test_a_small_file_shorter_than_its_content_range_says_is_fetched_again(by: int, http: FolderServer,
                                                                          pub: Path) -> None:
    # Content-Length and the range's end agree with the short body; only the file size after '/' tells
    http.faults.append(Fault("/rel/manifest.json", "short-range", times=1, by=by))
    assert verify(http.url("rel"), pub) == (0, "")
    assert len(asked(http, "manifest.json")) == 2


def entry_file(rel: Path) -> tuple[str, int]:
    r = Release.open(rel)
    e = r.entry("rec-002")
    return e["file"], int(r.file_meta(e)["size"])


def test_a_range_answered_one_byte_short_is_resumed_at_that_byte(http: FolderServer, rel: Path, pub: Path) -> None:
    file, _ = entry_file(rel)
    http.faults.append(Fault(f"/{file}", "short-range", times=-1, by=1, at=CHUNK))  # ranges after the first
    assert verify(http.url("rel"), pub) == (0, "")
    ranges = asked(http, file)
    cut = next(r for r in http.log if r.path.endswith(file) and r.range and r.range.startswith(f"bytes={CHUNK}-"))
    assert cut.range is not None
    b = int(cut.range.split("-")[1])
    assert f"bytes={b}-{b}" in ranges  # the one byte missing, asked for again


def test_a_range_answered_from_another_start_is_refused_and_asked_again(http: FolderServer, rel: Path,
                                                                        pub: Path, private_cache: Path) -> None:
    file, _ = entry_file(rel)
    http.faults.append(Fault(f"/{file}", "shift", times=1, by=1))
    assert verify(http.url("rel"), pub) == (0, "")
    assert len(asked(http, file)) == -(-entry_file(rel)[1] // CHUNK) + 1
    http.faults.append(Fault(f"/{file}", "shift", times=-1, by=1))
    http.log.clear()
    for piece in (private_cache / "pieces").glob("*/*"):
        piece.unlink()
    code, line = verify(http.url("rel"), pub)
    assert code == 2 and "asked for bytes from" in line and "answered with 'bytes 1-" in line


def test_a_server_answering_ranges_with_the_whole_file_sends_it_once(http: FolderServer, rel: Path, pub: Path,
                                                                     private_cache: Path) -> None:
    file, size = entry_file(rel)
    http.faults.append(Fault(f"/{file}", "whole", times=-1))  # the index shard before it was served as ranges
    assert size > 8 * CHUNK  # some ten ranges, were they asked for one by one
    assert verify(http.url("rel"), pub) == (0, "")
    assert http.sent[f"/rel/{file}"] == size
    assert len(asked(http, file)) == 1


def test_a_redirect_to_another_host_drops_the_authorization_header(hub_token: FolderServer, rel: Path,
                                                                   pub: Path) -> None:
    file, _ = entry_file(rel)
    hub_token.faults.append(Fault(f"/{file}", "elsewhere", times=1, to="localhost"))
    res = runner.invoke(app, ["verify", "hf://datasets/org/kv-releases@main/releases/v1", "--entry", "rec-002",
                              "--key", str(pub)])
    assert res.exit_code == 0, res.output
    mine = [r for r in hub_token.log if r.path.endswith(file)]
    moved = [r for r in mine if (r.host or "").startswith("localhost:")]
    assert mine[0].status == 302 and mine[0].authorization == "Bearer hf_kvgraft_test_token"  # the Hub's host: sent
    assert len(moved) == 1 and moved[0].status == 206 and moved[0].authorization is None  # another origin: not


def test_the_hub_token_is_sent_to_the_hubs_host_only(hub_token: FolderServer, pub: Path) -> None:
    host, port = hub_token.address()
    same = f"http://{host}:{port}/datasets/org/kv-releases/resolve/{COMMIT}/releases/v1"
    assert verify(same, pub)[0] == 0
    assert {r.authorization for r in hub_token.log if "/resolve/" in r.path} == {"Bearer hf_kvgraft_test_token"}
    hub_token.log.clear()
    other = f"http://localhost:{port}/datasets/org/kv-releases/resolve/{COMMIT}/releases/v1"
    assert verify(other, pub)[0] == 0
    assert hub_token.log and {r.authorization for r in hub_token.log} == {None}


def test_a_redirect_loop_is_one_line_after_a_few_hops_and_no_retry(http: FolderServer, pub: Path) -> None:
    http.faults.append(Fault("/rel/manifest.json", "loop", times=-1))
    code, line = verify(http.url("rel"), pub)
    assert code == 2 and "\n" not in line
    assert "more than 10 redirects" in line and "not retried" in line
    assert len(asked(http, "manifest.json")) == 11


def test_a_4xx_answer_is_not_retried(http: FolderServer, pub: Path) -> None:
    http.faults.append(Fault("/rel/manifest.json", "status", times=-1, status=403))
    code, line = verify(http.url("rel"), pub)
    assert code == 2 and "HTTP 403" in line and "not retried" in line
    assert len(asked(http, "manifest.json")) == 1


def test_a_refused_connection_is_not_retried(pub: Path) -> None:
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    started = time.monotonic()
    code, line = verify(f"http://127.0.0.1:{port}/rel", pub)
    assert code == 2 and "connection refused" in line and "not retried" in line, line
    assert time.monotonic() - started < 2


def test_a_server_dripping_bytes_ends_at_the_fetch_deadline(http: FolderServer, pub: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KVGRAFT_FETCH_DEADLINE", "1.5")
    # each byte well within the timeout; 30 bytes (6 s) a try, then the connection closes
    http.faults.append(Fault("/rel/manifest.json", "drip", times=-1, seconds=0.2, after=30))
    started = time.monotonic()
    code, line = verify(http.url("rel"), pub)
    assert code == 2 and "\n" not in line, line
    assert f"{http.url('rel')}/manifest.json" in line and "KVGRAFT_FETCH_DEADLINE" in line
    assert time.monotonic() - started < 5


def test_a_password_in_the_url_is_never_echoed(http: FolderServer, pub: Path) -> None:
    host, port = http.address()
    http.faults.append(Fault("/rel/manifest.json", "status", times=-1, status=500))
    code, line = verify(f"http://user:s3cret-pw@{host}:{port}/rel", pub)
    assert code == 2 and "s3cret-pw" not in line and "user:***@" in line, line


@pytest.mark.parametrize("url", ["file:///tmp/rel", "ftp://example.org/rel", "http://[::1/x",
                                 "http://127.0.0.1:99999/rel", "https:///rel", "http://" + "a" * 300 + "/rel"])
def test_a_location_kvgraft_does_not_read_is_one_line_exit_2(url: str) -> None:
    res = runner.invoke(app, ["verify", url])
    assert res.exit_code == 2 and res.stderr.count("\n") == 1 and res.stderr.startswith("kvgraft: error: "), res.output
    why = "locations are not read" if url.startswith(("file", "ftp")) else "URL"
    assert why in res.stderr, res.stderr


@pytest.mark.parametrize("where", ["a-file", "/proc/kvgraft-cache"])
def test_an_unusable_cache_folder_is_one_line_exit_2(where: str, http: FolderServer, pub: Path,
                                                     tmp_path: Path) -> None:
    cache = tmp_path / where if not where.startswith("/") else Path(where)
    if where == "a-file":
        cache.write_text("not a folder")
    env = {**os.environ, "KVGRAFT_CACHE": str(cache)}
    cli = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]
    res = subprocess.run([*cli, "verify", http.url("rel"), "--entry", "rec-002", "--key", str(pub)], env=env,
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and res.stderr.count("\n") == 1, res.stderr
    assert f"KVGRAFT_CACHE={cache}: not a folder kvgraft can keep its cache in" in res.stderr
    if where == "a-file":
        assert cache.read_text() == "not a folder"


COMMIT = HUB_COMMIT


@pytest.fixture()
def hub_token(rel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):  # type: ignore[no-untyped-def]
    with hub_server(rel, tmp_path, monkeypatch) as server:
        yield server


@pytest.mark.parametrize(("var", "value"), [("KVGRAFT_REMOTE_TIMEOUT", "inf"), ("KVGRAFT_FETCH_DEADLINE", "1e400"),
                                            ("KVGRAFT_FETCH_DEADLINE", "nan"), ("KVGRAFT_REMOTE_TRIES", "0")])
def test_a_bad_setting_is_one_line_exit_2(var: str, value: str, http: FolderServer, pub: Path,
                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(var, value)
    code, line = verify(http.url("rel"), pub)
    assert code == 2 and "\n" not in line and f"{var}={value!r}: expected a finite number above 0" in line, line


def self_signed(folder: Path) -> tuple[str, str]:
    """A certificate for 127.0.0.1, signed by its own key: (certificate, key) PEM files."""
    import datetime
    import ipaddress

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
            .sign(key, hashes.SHA256()))
    (folder / "cert.pem").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    (folder / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                       serialization.NoEncryption()))
    return str(folder / "cert.pem"), str(folder / "key.pem")


def test_a_certificate_that_does_not_verify_is_not_retried_and_ssl_cert_file_trusts_it(rel: Path, pub: Path,
                                                                                       tmp_path: Path) -> None:
    tls = self_signed(tmp_path)
    server = FolderServer({"rel": rel}, tls=tls).start()
    cli = [sys.executable, "-c", "from kvgraft.cli import entrypoint; entrypoint()"]
    argv = [*cli, "verify", server.url("rel"), "--entry", "rec-002", "--key", str(pub)]
    env = {k: v for k, v in os.environ.items() if k not in ("SSL_CERT_FILE", "SSL_CERT_DIR")}
    try:
        refused = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60)
        assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
        assert "certificate" in refused.stderr.lower() and "not retried" in refused.stderr
        trusted = subprocess.run(argv, env={**env, "SSL_CERT_FILE": tls[0]}, capture_output=True, text=True,
                                 timeout=60)
        assert trusted.returncode == 0, trusted.stderr
    finally:
        server.stop()


def test_a_pulled_subset_records_its_origin_without_the_password(http: FolderServer, pub: Path, tmp_path: Path) -> None:
    host, port = http.address()
    out = tmp_path / "subset"
    res = runner.invoke(app, ["pull", f"http://user:s3cret-pw@{host}:{port}/rel", "--entry", "rec-002", "--out", str(out),
                              "--key", str(pub)])
    assert res.exit_code == 0, res.output
    assert "s3cret-pw" not in res.output and "s3cret-pw" not in (out / "kvgraft-subset.json").read_text()
