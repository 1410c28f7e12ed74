"""Two releases from two locations in one process, one a local folder and one served over HTTP: each carries where it
came from, and its errors and results name that place, never the other's, never the folder a remote one is read
through."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from kvgraft.errors import InputError, IntegrityError
from kvgraft.release.format import Release
from kvgraft.signing.policy import ALL, Entries, SignedWithKeys
from kvgraft.signing.verify import verify

from remote_servers import FolderServer


def _flip(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-2] ^= 0x01
    path.write_bytes(bytes(data))


def test_each_release_carries_its_origin_and_names_it_in_errors(http: FolderServer, rel: Path, pub: Path,
                                                                 private_cache: Path, tmp_path: Path) -> None:
    local = Path(shutil.copytree(rel, tmp_path / "local"))
    url, policy = http.url("rel"), SignedWithKeys((pub,))
    with verify(local, policy) as here:
        with pytest.raises(InputError) as far, verify(url, policy) as there:
            assert (there.origin.location, there.origin.cache, there.origin.scope) == (url, private_cache, "open")
            assert (here.origin.location, here.origin.cache, here.origin.policy) == (str(local), None, policy)
            mirror = there.root
            there.release.entry("nope")  # raised naming the folder it reads: named by its URL on the way out
        said = far.value.diagnostics()
        assert said.startswith(f"{url}: no entry 'nope'"), said
        assert str(mirror) not in said and str(local) not in said
        assert not mirror.exists()  # closed by its owner
        with pytest.raises(InputError) as near:
            here.release.entry("nope")
        assert near.value.diagnostics().startswith(f"{local}: no entry 'nope'") and url not in near.value.diagnostics()


def test_a_damaged_remote_release_is_named_by_its_url_beside_an_open_local_one(http: FolderServer, rel: Path, pub: Path,
                                                                              tmp_path: Path) -> None:
    local = Path(shutil.copytree(rel, tmp_path / "local"))
    url, policy = http.url("rel"), SignedWithKeys((pub,))
    entry = Release.open(rel).entry("rec-002")
    _flip(rel / entry["file"])  # on the server only
    with verify(local, policy, Entries(("rec-002",))) as here:
        with pytest.raises(IntegrityError) as far:
            verify(url, policy, Entries(("rec-002",)))
        said = far.value.diagnostics()
        assert said.startswith(f"{url}/{entry['file']}: "), said
        assert str(local) not in said and str(tmp_path / "cache" / "mirrors") not in said
        assert here.checked.checked_entries == ["rec-002"]  # the local copy is intact, and stays usable
    _flip(rel / entry["file"])
    _flip(local / entry["file"])  # now the local copy only
    with verify(url, policy, Entries(("rec-002",))) as there:
        with pytest.raises(IntegrityError) as near:
            verify(local, policy, Entries(("rec-002",)))
        said = near.value.diagnostics()
        assert said.startswith(f"{local / entry['file']}: "), said
        assert url not in said and str(there.root) not in said


def test_each_result_names_its_own_location(http: FolderServer, rel: Path, pub: Path, tmp_path: Path) -> None:
    local = Path(shutil.copytree(rel, tmp_path / "local"))
    url, policy = http.url("rel"), SignedWithKeys((pub,))
    with verify(local, policy, ALL) as here, verify(url, policy, ALL) as there:
        near, far = (v.checked.document().model_dump(mode="json", exclude_unset=True) for v in (here, there))
    assert (near["release"], far["release"]) == (str(local), url)
    assert near["signature"]["bundle"] == str(local / "release.sigstore.json")
    assert far["signature"]["bundle"] == f"{url}/release.sigstore.json"
    assert far["signature"]["oms_signature"] == f"{url}/model.sig"
    assert [f["file"] for f in far["signature"]["signatures"]] == [f"{url}/release.sigstore.json", f"{url}/model.sig"]
    assert [w for w in far["warnings"] if "cannot be listed over HTTP" in w]  # what reading it over HTTP left unchecked
    assert not [w for w in near["warnings"] if "HTTP" in w]
