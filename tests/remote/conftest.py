"""Fixtures of the remote-release tests: a small signed release, the servers it is read from, a private cache."""

from __future__ import annotations

import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from kvgraft.remote import transfer
from kvgraft.signing import keys, sign

from release_factory import make_release
from remote_servers import FolderServer, folder_server


@pytest.fixture(scope="session")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A format-2 release of 5 entries in 3 index shards, signed with a key: (release, public key)."""
    base = tmp_path_factory.mktemp("remote-signed")
    make_release(base / "rel", entries=5, format_version=2, shard_entries=2, tokens=20)
    private, public = keys.write_keypair(base / "signer")
    sign.sign_release(base / "rel", keys.load_private_key(private))
    return base / "rel", public


@pytest.fixture()
def rel(signed: tuple[Path, Path], tmp_path: Path) -> Path:
    """A copy of the signed release this test may change."""
    return Path(shutil.copytree(signed[0], tmp_path / "served" / "rel"))


@pytest.fixture()
def pub(signed: tuple[Path, Path]) -> Path:
    return signed[1]


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Each test its own cache; short waits so that the fault tests stay fast."""
    monkeypatch.setenv("KVGRAFT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("KVGRAFT_REMOTE_TRIES", "3")
    monkeypatch.setenv("KVGRAFT_REMOTE_TIMEOUT", "2")
    monkeypatch.setattr(transfer, "FIRST_PAUSE", 0.01)
    return tmp_path / "cache"


@pytest.fixture()
def http(rel: Path) -> Iterator[FolderServer]:
    with folder_server(rel=rel) as server:
        yield server

