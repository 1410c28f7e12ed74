"""`verify` of everything streams: a format-2 release's files are listed, sized and hashed a shard at a time,
and the folder is compared with them by counting (module docstring of kvgraft.release.integrity: _check).

Memory that grows with the entries would be a set of names: the success path builds none
(`release_folder_files` is never called), and CheckedRelease.files holds manifest.json and the index files
only unless asked for every digest (signing, an OMS list). Each shortcut has a control: an extra file, a
digest collision of names, and files in an ignored path are still told apart exactly.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import IntegrityError
from kvgraft.release import integrity
from kvgraft.release.format import Release
from kvgraft.release.integrity import Beside, check_release
from kvgraft.release.records import MANIFEST

from release_factory import release_fixtures

ENTRIES, SHARD = 7, 2


base, rel = release_fixtures(entries=ENTRIES, format_version=2, shard_entries=SHARD, seed=11)


def _err(call: object) -> str:
    with pytest.raises(IntegrityError) as info:
        call()  # type: ignore[operator]
    return str(info.value)


@pytest.fixture
def no_name_sets(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Calls of release_folder_files (the exact comparison by names) from here on, recorded."""
    calls: list[Path] = []
    real = integrity.release_folder_files

    def listing(root: Path) -> set[str]:
        calls.append(root)
        return real(root)

    monkeypatch.setattr(integrity, "release_folder_files", listing)
    return calls


def test_verify_of_everything_keeps_no_name_per_entry(rel: Path, no_name_sets: list[Path]) -> None:
    opened = Release.open(rel)
    index_files = set(opened.subject_files())
    entry_files = {e["file"] for e in opened.iter_entries()}
    checked = check_release(rel)
    assert no_name_sets == []
    assert set(checked.files) == {MANIFEST} | index_files
    assert checked.count == 1 + len(index_files) + len(entry_files) == 1 + len(index_files) + ENTRIES
    every = check_release(rel, keep_files=True)
    assert set(every.files) == {MANIFEST} | index_files | entry_files
    assert every.files[sorted(entry_files)[0]] == sha256_hex((rel / sorted(entry_files)[0]).read_bytes())
    # the control: an extra file makes the counts differ, and the names are compared to say which
    (rel / "entries" / "stray.bin").write_bytes(b"x")
    assert _err(lambda: check_release(rel)) == \
        f"{rel}: files differ from the manifest: not part of the release: entries/stray.bin"
    assert no_name_sets == [rel]


def test_colliding_name_digests_fall_back_to_names(rel: Path, monkeypatch: pytest.MonkeyPatch,
                                                  no_name_sets: list[Path]) -> None:
    """Every name given one digest: the counts cannot agree, the exact comparison runs and finds no fault; an
    extra file is still refused by name."""
    monkeypatch.setattr(integrity, "_name_key", lambda name: 0)
    assert check_release(rel).count == check_release(rel).count
    assert len(no_name_sets) == 2
    (rel / "stray.bin").write_bytes(b"x")
    assert _err(lambda: check_release(rel)) == f"{rel}: files differ from the manifest: not part of the release: stray.bin"


def test_an_ignored_path_excuses_only_files_outside_the_release(rel: Path) -> None:
    """A path a signature ignores that also holds a release file, and a file beside the release inside one:
    neither may stand in for an extra file elsewhere in the count."""
    first = sorted(e["file"] for e in Release.open(rel).iter_entries())[0]
    (rel / "stray.bin").write_bytes(b"x")
    assert "not part of the release: stray.bin" in _err(lambda: check_release(rel, beside=Beside("B", excused=(first,))))
    (rel / "README.md").write_text("card\n")
    card = {"README.md": sha256_hex(b"card\n")}
    assert "not part of the release: stray.bin" in _err(
        lambda: check_release(rel, beside=Beside("B", card, ("README.md",))))
    # the controls: the stray file in an ignored path is excused, and reported
    checked = check_release(rel, beside=Beside("B", card, ("stray.bin",)))
    assert checked.ignored == ["stray.bin"] and checked.beside == card


def test_files_missing_are_named_with_their_entries_in_one_pass_over_the_records(
        rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Naming the entries that use the missing files reads the records once, not twice per file (at
    100,000 entries a pass parses every shard)."""
    files = sorted(e["file"] for e in Release.open(rel).iter_entries())[:3]
    for name in files:
        (rel / name).unlink()
    passes: list[int] = []
    real = Release.iter_entries

    def counted(self: Release) -> object:
        passes.append(1)
        return real(self)

    monkeypatch.setattr(Release, "iter_entries", counted)
    message = _err(lambda: check_release(rel))
    assert message.startswith(f"{rel / files[0]}: files differ from the manifest: missing {files[0]} (entry ")
    assert all(f"{name} (entry " in message for name in files)
    assert len(passes) == 1
