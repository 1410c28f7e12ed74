"""Hostile releases: sizes bounded before arithmetic, UTF-8-only JSON, numbers in
messages capped, every filesystem call on a release path guarded. Each test reproduces a hostile input that
was exit 70, or work proportional to a hostile header, before its bound."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft._internal import jsonio
from kvgraft.cli import app
from kvgraft.errors import InputError
from kvgraft.release import safetensors_header as stfile
from kvgraft.release.records import root_digest
from kvgraft.signing import keys, sign
from tests.verifying import verify_result

from release_factory import make_release, unsign

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("hostile-sizes")
    private, public = keys.write_keypair(folder / "k")
    make_release(folder / "rel", entries=2, heads=4, tokens=64, seed=23)
    sign.sign_release(folder / "rel", keys.load_private_key(private))
    return folder / "rel", public


@pytest.fixture
def signed(built: tuple[Path, Path], tmp_path: Path) -> tuple[Path, Path]:
    root, public = built
    return Path(shutil.copytree(root, tmp_path / "rel")), public


def cli(*args: str) -> Any:
    return runner.invoke(app, list(args))


def _one_line(r: Any, code: int) -> str:
    assert r.exit_code == code, r.output
    assert r.exception is None or isinstance(r.exception, SystemExit), repr(r.exception)
    lines = r.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvgraft: error: "), lines
    assert "Traceback" not in r.output and "internal error" not in r.output
    return str(lines[0])


# ------------------------------------------------------------------- 1. safetensors header sizes


def _header(shape: list[int], size: int, *, nbytes: int = 4) -> bytes:
    """A one-tensor safetensors file of exactly `size` bytes whose header states `shape`."""
    body = json.dumps({"t": {"dtype": "F32", "shape": shape, "data_offsets": [0, nbytes]}}, separators=(",", ":"))
    pad = size - 8 - nbytes - len(body)
    assert pad >= 0, (size, len(body))
    raw = (body + " " * pad).encode()
    return len(raw).to_bytes(8, "little") + raw + bytes(nbytes)


def _parse(data: bytes) -> Any:
    n = int.from_bytes(data[:8], "little")
    return stfile.parse_header(Path("f"), len(data), n, data[8:8 + n])


def test_a_shape_of_more_dimensions_than_the_schema_allows_is_refused_before_its_product() -> None:
    with pytest.raises(InputError, match=r"t': shape has 200000 dimensions; at most 8"):
        _parse(_header([1] * 200_000, 2_000_000))
    assert stfile.MAX_RANK == 8  # the manifest schema's maxItems for a tensor's shape
    with pytest.raises(InputError, match="9 dimensions; at most 8"):
        _parse(_header([1] * 9, 200))
    tensors, _ = _parse(_header([1] * 8, 200))
    assert tensors["t"].shape == (1,) * 8


@pytest.mark.parametrize(("shape", "ok"), [([2**40, 2**40, 0], True), ([2**40, 2], False), ([2**20, 2**20], True),
                                           ([2**20, 2**20, 2], False), ([2**53 - 1] * 8, False)])
def test_element_counts_saturate_as_they_accumulate_and_messages_stay_short(shape: list[int], ok: bool) -> None:
    nbytes = 0 if ok and 0 in shape else 4
    raw = _header(shape, 400, nbytes=nbytes)
    if ok and 0 in shape:
        tensors, _ = _parse(raw)
        assert tensors["t"].end == tensors["t"].start
        return
    with pytest.raises(InputError) as info:
        _parse(raw)  # in bounds: refused for its byte range only
    assert len(str(info.value)) < 400, str(info.value)
    assert ("more than 1099511627776 elements" in str(info.value)) == (not ok), str(info.value)


@pytest.mark.parametrize("signed_by_key", [True, False])
def test_a_same_size_entry_with_200k_dimensions_is_exit_1_fast(signed: tuple[Path, Path], signed_by_key: bool) -> None:
    """Was: exit 70 (an integer of more than 4,300 digits formatted in the message), after a quadratic product."""
    root, public = signed
    if not signed_by_key:
        unsign(root)
    path = sorted((root / "entries").iterdir())[0]
    size = path.stat().st_size
    dims = (size - 200) // 2
    path.write_bytes(_header([2] * dims, size))  # 2**dims elements: more than 4,300 digits
    started = time.monotonic()
    r = cli("verify", str(root), *(["--key", str(public)] if signed_by_key else []))
    line = _one_line(r, 1)
    assert time.monotonic() - started < 20  # a hang guard, not a speed figure (bench/ measures speed)
    assert str(path) in line and f"{dims} dimensions; at most 8" in line


def test_error_messages_cap_the_digits_of_numbers() -> None:
    from kvgraft.errors import short_int

    assert short_int(12345) == "12345"
    assert short_int(10**23) == str(10**23)
    assert short_int(10**24) == "an integer of 25 digits" and short_int(10**30 - 1) == "an integer of 30 digits"
    assert short_int(-(7**20_000)) == "-an integer of 16902 digits"  # len(str(7**20000)), counted once


# --------------------------------------------------------------------------------- 2. UTF-8 only


@pytest.mark.parametrize("encoding", ["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-32-le"])
def test_json_in_another_unicode_encoding_is_refused(encoding: str) -> None:
    with pytest.raises(InputError, match=r"where: invalid JSON: not UTF-8 \(RFC 8259 §8.1\)"):
        jsonio.loads_strict('{"a": 1}'.encode(encoding), "where")
    assert jsonio.loads_strict('{"a": "é"}'.encode(), "where") == {"a": "é"}
    with pytest.raises(InputError, match="not UTF-8"):
        jsonio.loads_strict(b'{"a": "\xff"}', "where")  # a byte no UTF-8 text holds, inside a string


@pytest.mark.parametrize(("edit", "message"), [
    (None, "not UTF-8"),  # a UTF-16 manifest was accepted before
    (lambda t: t.replace('"token_ids": [', '"token_ids": [1180591620717411303424, ', 1), "not UTF-8"),  # exit 70
    (lambda t: t.replace('"text": "', '"text": "\\ud800', 1), "not UTF-8"),  # exit 70 (CanonicalizationError)
])
def test_an_unsigned_manifest_in_utf16_is_exit_2(signed: tuple[Path, Path], edit: Any, message: str) -> None:
    root, _ = signed
    unsign(root)
    text = (root / "manifest.json").read_text()
    (root / "manifest.json").write_bytes((edit(text) if edit else text).encode("utf-16"))
    r = cli("verify", str(root), "--json")
    line = _one_line(r, 2)
    assert message in line and "manifest.json" in line
    assert json.loads(r.stdout)["exit_code"] == 2


def test_a_utf16_bundle_and_jsonl_records_are_refused(signed: tuple[Path, Path], tmp_path: Path) -> None:
    root, public = signed
    bundle = root / "release.sigstore.json"
    bundle.write_bytes(bundle.read_text().encode("utf-16"))
    assert "not UTF-8" in _one_line(cli("verify", str(root), "--key", str(public)), 2)
    records = tmp_path / "r.jsonl"
    records.write_bytes('{"id": "a", "text": "x"}\n'.encode("utf-16-le"))
    with pytest.raises(InputError, match="not UTF-8"):
        list(jsonio.read_jsonl(records))


# ------------------------------------------------------------- 2. filesystem calls on release paths


def _deep(root: Path, total: int = 4200) -> Path:
    """A folder inside `root` whose path is longer than PATH_MAX (4096), made step by step with dir fds."""
    part = "d" * 200
    fd = os.open(root, os.O_RDONLY)
    depth = 0
    try:
        while len(str(root)) + depth * (len(part) + 1) < total:
            os.mkdir(part, dir_fd=fd)
            nxt = os.open(part, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = nxt
            depth += 1
        leaf = os.open("x", os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)
        os.close(leaf)
    finally:
        os.close(fd)
    return root.joinpath(*[part] * depth)


def test_a_path_inside_the_release_longer_than_path_max_is_exit_2(signed: tuple[Path, Path]) -> None:
    """Was: exit 70, OSError ENAMETOOLONG from an unguarded stat."""
    root, public = signed
    _deep(root)
    for args in ((), ("--key", str(public))):
        line = _one_line(cli("verify", str(root), *args), 2)
        assert "File name too long" in line
    shutil.rmtree(root)


def test_a_release_path_longer_than_path_max_is_exit_2(tmp_path: Path) -> None:
    long = tmp_path / "/".join(["e" * 200] * 25)
    line = _one_line(cli("verify", str(long)), 2)
    assert "File name too long" in line
    with pytest.raises(InputError, match="File name too long"):
        verify_result(long)
    line = _one_line(cli("verify", str(tmp_path), "--key", str(long)), 2)
    assert "File name too long" in line


def test_a_manifest_listing_a_name_longer_than_path_max_under_the_root_is_exit_2(signed: tuple[Path, Path],
                                                                                 tmp_path: Path) -> None:
    """A release whose own path is just under PATH_MAX, and a name the schema allows that takes it over:
    the symlink check on the way to the file (safe_path) raised ENAMETOOLONG, exit 70."""


    src, _ = signed
    unsign(src)
    deep = tmp_path / "x"
    while len(str(deep)) < 4096 - 60:
        deep = deep / ("d" * min(200, 4096 - 60 - len(str(deep))))
    root = Path(shutil.copytree(src, deep))
    manifest = json.loads((root / "manifest.json").read_text())
    manifest["files"]["n" * 100] = {"sha256": "0" * 64, "size": 1}
    manifest["root_digest"] = root_digest(manifest)
    (root / "manifest.json").write_text(json.dumps(manifest))
    line = _one_line(cli("verify", str(root)), 2)
    assert "File name too long" in line
