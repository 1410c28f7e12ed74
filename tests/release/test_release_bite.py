"""release/integrity.py's checks, each with its whole message and its counts (mutmut's integrity survivors,
docs/mutation.md).

The older tests (test_verify_tamper, test_hostile_release) match a fragment of each message; a mutant
that wraps the message, changes a count or a location still passes them. These compare whole lines,
computed from this machine's bytes (the digests in them are hashed here), and what CheckedRelease
counts.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import InputError, IntegrityError, VerificationError
from kvgraft.release.format import Release
from kvgraft.release.integrity import Beside, Listing, check_entry, check_release, open_release, release_folder_files
from kvgraft.release.records import MANIFEST, root_digest
from kvgraft.release.sources import Source
from kvgraft.signing.policy import SignedWithKeys

import rewrite
from release_factory import listed_digests, make_release, release_fixtures

E0, E1 = "entries/00000.safetensors", "entries/00001.safetensors"


base, rel = release_fixtures(entries=3, seed=35)


def _m(root: Path) -> dict[str, Any]:
    return json.loads((root / MANIFEST).read_text())


def _err(call: Any, kind: type[Exception] = Exception) -> str:
    with pytest.raises(kind) as info:
        call()
    return str(info.value)



def test_an_intact_release_counts_every_file_byte_and_tensor(rel: Path) -> None:
    m = _m(rel)
    msize = (rel / MANIFEST).stat().st_size
    sizes = sum(f["size"] for f in m["files"].values())
    ntensors = sum(len(e["tensors"]) for e in m["entries"])
    tensor_bytes = sum(t["byte_range"][1] - t["byte_range"][0] for e in m["entries"] for t in e["tensors"].values())
    c = check_release(rel)
    assert (c.manifest_size, c.bytes_hashed, c.tensors, c.tensors_rehashed) == (msize, msize + sizes, ntensors, 0)
    assert c.files == listed_digests(rel) and c.beside == {} and c.manifest_sha256 == listed_digests(rel)[MANIFEST]
    assert c.root == rel and c.release.root == rel and c.manifest["root_digest"] == m["root_digest"]
    d = check_release(rel, Listing(listed_digests(rel), "signed statement", vouched=True), deep=True)
    assert (d.bytes_hashed, d.tensors, d.tensors_rehashed) == (msize + sizes + tensor_bytes, ntensors, ntensors)
    o = open_release(rel, Listing(listed_digests(rel), "manifest"))
    assert (o.bytes_hashed, o.tensors, o.tensors_rehashed, o.manifest_size) == (msize, 0, 0, msize)
    assert o.files == listed_digests(rel)
    one = check_entry(o.release, m["entries"][1]["id"])
    size1 = m["files"][E1]["size"]
    assert (one.entry["id"], one.bytes_hashed, one.tensors) == (m["entries"][1]["id"], size1, 4)
    deep = check_entry(o.release, m["entries"][1]["id"], deep=True)
    per = sum(t["byte_range"][1] - t["byte_range"][0] for t in m["entries"][1]["tensors"].values())
    assert deep.bytes_hashed == size1 + per


def test_folder_and_manifest_presence(rel: Path, tmp_path: Path) -> None:
    assert _err(lambda: check_release(tmp_path / "none"), InputError) == f"{tmp_path / 'none'}: does not exist"
    assert _err(lambda: open_release(tmp_path / "none"), InputError) == f"{tmp_path / 'none'}: does not exist"
    (tmp_path / "file").write_text("")
    assert _err(lambda: open_release(tmp_path / "file"), InputError) == f"{tmp_path / 'file'}: not a folder"
    subjects = listed_digests(rel)
    no_manifest = {k: v for k, v in subjects.items() if k != MANIFEST}
    for call in (check_release, open_release):
        assert _err(lambda c=call: c(rel, Listing(no_manifest, "signed statement")), VerificationError) == \
            f"{rel}: the signed statement does not list {MANIFEST} as a subject"
    (rel / MANIFEST).unlink()
    for call in (check_release, open_release):
        assert _err(lambda c=call: c(rel, Listing(subjects, "signed statement")), IntegrityError) == \
            f"{rel / MANIFEST}: missing ({MANIFEST} is a subject of the signed statement)"
        assert _err(lambda c=call: c(rel), InputError) == \
            f"{rel / MANIFEST}: missing manifest (is {rel} a cache release?)"


def test_manifest_digest_against_the_statement(rel: Path) -> None:
    subjects = {**listed_digests(rel), MANIFEST: "0" * 64}
    actual = sha256_hex((rel / MANIFEST).read_bytes())
    note = f"the statement attests the release with root digest {'ab' * 32}"
    for call in (check_release, open_release):
        assert _err(lambda c=call: c(rel, Listing(subjects, "S")), IntegrityError) == \
            f"{rel / MANIFEST}: sha256 {actual} does not match the S ({'0' * 64})"
        assert _err(lambda c=call: c(rel, Listing(subjects, "S", manifest_note=note)), IntegrityError) == (
            f"{rel / MANIFEST}: sha256 {actual} does not match the S ({'0' * 64}); the statement attests the release "
            f"with root digest {'ab' * 32}")


def test_statement_subjects_against_the_manifest(rel: Path) -> None:
    subjects = {**listed_digests(rel), E1: "1" * 64}
    real = _m(rel)["files"][E1]["sha256"]
    for call in (check_release, open_release):
        assert _err(lambda c=call: c(rel, Listing(subjects, "S")), VerificationError) == \
            f"{rel / E1}: the S lists sha256 {'1' * 64} and the manifest {real}"
    extra = {**listed_digests(rel), "entries/zz.safetensors": "2" * 64}
    assert _err(lambda: check_release(rel, Listing(extra, "S")), VerificationError) == \
        f"{rel / 'entries/zz.safetensors'}: the S lists sha256 {'2' * 64} and the manifest None"
    # An OMS list (lists_more) may name further files; open_release ignores them.
    assert open_release(rel, Listing(extra, "manifest", every_file=True)).files == listed_digests(rel)
    seen: list[tuple[str, int]] = []
    hook = Listing(listed_digests(rel), "manifest", also=lambda m, sha, size: seen.append((sha, size)))
    check_release(rel, hook)
    open_release(rel, hook)
    assert seen == [(listed_digests(rel)[MANIFEST], (rel / MANIFEST).stat().st_size)] * 2


def test_missing_and_extra_files_are_named(rel: Path) -> None:
    ids = [e["id"] for e in _m(rel)["entries"]]
    (rel / E1).unlink()
    (rel / "extra.txt").write_text("x")
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{rel / E1}: files differ from the manifest: missing {E1} (entry {ids[1]!r}); not part of the release: "
        f"extra.txt")
    (rel / E0).unlink()
    (rel / "extra.txt").unlink()
    assert _err(lambda: check_release(rel, Listing(listed_digests(rel) | {}, "S")), Exception).startswith(
        f"{rel / E0}: files differ from the S: missing {E0} (entry {ids[0]!r}), {E1} (entry {ids[1]!r})")


def test_more_than_five_missing_or_extra(base: Path, tmp_path: Path) -> None:
    root = tmp_path / "many"
    make_release(root, entries=7, seed=3)
    names = sorted(n for n in _m(root)["files"])
    for n in names:
        (root / n).unlink()
    message = _err(lambda: check_release(root), IntegrityError)
    assert message.startswith(f"{root / names[0]}: files differ from the manifest: missing ")
    assert message.endswith(" (+2 more)") and message.count("(entry '") == 5
    fresh = tmp_path / "extra"
    shutil.copytree(base, fresh)
    for i in range(7):
        (fresh / f"x{i}.txt").write_text("x")
    assert _err(lambda: check_release(fresh), IntegrityError) == (
        f"{fresh}: files differ from the manifest: not part of the release: x0.txt, x1.txt, x2.txt, x3.txt, x4.txt "
        f"(+2 more)")


def test_a_file_shared_by_entries_is_named_with_the_count(rel: Path) -> None:
    # Point entries 1 and 2 at entry 0's file (rewritten digests): missing, it names one entry and "1 more".
    def share(m: dict[str, Any]) -> None:
        for e in m["entries"][1:]:
            e["file"] = E0
        for n in list(m["files"]):
            if n != E0:
                del m["files"][n]
    rewrite.manifest(rel, share)
    os.remove(rel / E1)
    os.remove(rel / "entries/00002.safetensors")
    ids = [e["id"] for e in _m(rel)["entries"]]
    (rel / E0).rename(rel / "moved")
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{rel / E0}: files differ from the manifest: missing {E0} (entry {ids[0]!r} and 2 more); not part of the "
        f"release: moved")


def test_sizes_truncated_and_grown(rel: Path) -> None:
    ids = [e["id"] for e in _m(rel)["entries"]]
    size = _m(rel)["files"][E1]["size"]
    data = (rel / E1).read_bytes()
    (rel / E1).write_bytes(data[:-4])
    assert _err(lambda: check_release(rel), IntegrityError) == \
        f"{rel / E1}: entry {ids[1]!r}: {size - 4} bytes, the manifest says {size} (truncated)"
    (rel / E1).write_bytes(data + b"1234")
    assert _err(lambda: check_release(rel), IntegrityError) == \
        f"{rel / E1}: entry {ids[1]!r}: {size + 4} bytes, the manifest says {size} (grown)"


def test_a_changed_tensor_is_located(rel: Path) -> None:
    m = _m(rel)
    e = m["entries"][1]
    name = "layer.1.values"
    a, b = e["tensors"][name]["byte_range"]
    data = bytearray((rel / E1).read_bytes())
    data[a + 3] ^= 1
    (rel / E1).write_bytes(bytes(data))
    file_sha = sha256_hex(bytes(data))
    tensor_sha = sha256_hex(bytes(data[a:b]))
    want = m["files"][E1]["sha256"]
    message = _err(lambda: check_release(rel), IntegrityError)
    assert message == (f"{rel / E1}: entry {e['id']!r} tensor {name!r} bytes [{a}, {b}): sha256 {tensor_sha}, the "
                       f"manifest says {e['tensors'][name]['sha256']} (file sha256 {file_sha}, manifest says {want})")
    opened = open_release(rel)
    assert _err(lambda: check_entry(opened.release, e["id"]), IntegrityError) == message.replace(
        f"(file sha256 {file_sha}, manifest says {want})", f"(file sha256 {file_sha}, manifest says {want})")


def test_two_changed_files_and_a_swap(rel: Path) -> None:
    one, two = (rel / E0).read_bytes(), (rel / E1).read_bytes()
    (rel / E0).write_bytes(two)
    (rel / E1).write_bytes(one)
    m = _m(rel)
    message = _err(lambda: check_release(rel), IntegrityError)
    assert message == (f"{rel / E0}: sha256 {m['files'][E1]['sha256']} does not match the manifest "
                       f"({m['files'][E0]['sha256']}): it has the content of {E1} (files swapped or copied) "
                       f"(and 1 more files differ: {E1})")


def test_a_changed_safetensors_header_is_located(rel: Path) -> None:
    m = _m(rel)
    e = m["entries"][0]
    data = bytearray((rel / E0).read_bytes())
    at = bytes(data).index(b'"layer.0.keys"')
    data[at + 10] = ord("x")  # the tensor table names another tensor: same size, valid JSON
    (rel / E0).write_bytes(bytes(data))
    start = min(t["byte_range"][0] for t in e["tensors"].values())
    base = f"{rel / E0}: sha256 {sha256_hex(bytes(data))} does not match the manifest ({m['files'][E0]['sha256']})"
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{base}: entry {e['id']!r}: the safetensors header region [0, {start}) differs (its tensor table no longer "
        f"matches the manifest)")
    junk = b"\xff" * len(data)
    (rel / E0).write_bytes(junk)
    assert _err(lambda: check_release(rel), IntegrityError).startswith(
        f"{rel / E0}: sha256 {sha256_hex(junk)} does not match the manifest "
        f"({m['files'][E0]['sha256']}): entry {e['id']!r}: the safetensors header is damaged (")


def test_deep_finds_a_tensor_digest_the_file_digest_agrees_with(rel: Path) -> None:
    """A manifest (digests recomputed) whose tensor sha256 is wrong while the file's is right: the default pass
    hashes each tensor's range as it reads the file (nothing re-read), `deep` reads each tensor again."""
    def wrong(m: dict[str, Any]) -> None:
        m["entries"][2]["tensors"]["layer.0.keys"]["sha256"] = "3" * 64
    rewrite.manifest(rel, wrong)
    m = _m(rel)
    e = m["entries"][2]
    a, b = e["tensors"]["layer.0.keys"]["byte_range"]
    real = sha256_hex((rel / e["file"]).read_bytes()[a:b])
    want = (f"{rel / e['file']}: entry {e['id']!r} tensor 'layer.0.keys' bytes [{a}, {b}): sha256 {real}, the "
            f"manifest says {'3' * 64}")
    assert _err(lambda: check_release(rel), IntegrityError) == want
    assert _err(lambda: check_release(rel, deep=True), IntegrityError) == want
    opened = open_release(rel)
    assert _err(lambda: check_entry(opened.release, e["id"]), IntegrityError) == want
    assert _err(lambda: check_entry(opened.release, e["id"], deep=True), IntegrityError) == want


def test_links_and_special_files_are_refused(rel: Path) -> None:
    (rel / "link").symlink_to(rel / E0)
    assert _err(lambda: check_release(rel), InputError) == f"{rel / 'link'}: is a symlink; releases may not contain links"
    (rel / "link").unlink()
    os.mkfifo(rel / "entries" / "fifo")
    assert _err(lambda: release_folder_files(rel), InputError) == \
        f"{rel / 'entries/fifo'}: is not a regular file; releases hold only plain files"
    (rel / "entries" / "fifo").unlink()
    (rel / ".git").mkdir()
    (rel / ".git" / "HEAD").write_text("x")
    (rel / "release.sigstore.json").write_text("{}")
    assert release_folder_files(rel) == set(_m(rel)["files"]) | {MANIFEST}
    manifest_link = rel / "m2"
    (rel / MANIFEST).rename(manifest_link)
    (rel / MANIFEST).symlink_to(manifest_link)
    assert _err(lambda: open_release(rel), InputError) == \
        f"{rel / MANIFEST}: is a symlink; releases may not contain links"


def test_files_beside_the_release_a_signature_lists(rel: Path) -> None:
    (rel / "README.md").write_text("card")
    card = sha256_hex(b"card")
    c = check_release(rel, beside=Beside("OMS signature (model.sig)", {"README.md": card}))
    assert c.beside == {"README.md": card} and c.bytes_hashed == check_release(rel, beside=Beside("OMS signature", {
        "README.md": card})).bytes_hashed
    assert c.bytes_hashed == (rel / MANIFEST).stat().st_size + sum(
        f["size"] for f in _m(rel)["files"].values()) + 4
    assert _err(lambda: check_release(rel, beside=Beside("B", {"README.md": "4" * 64})), IntegrityError) == (
        f"{rel / 'README.md'}: sha256 {card} does not match the B ({'4' * 64}); it is beside the release, outside "
        f"its manifest")
    assert _err(lambda: check_release(rel, beside=Beside("B", {".git/config": "5" * 64})),
                VerificationError) == f"{rel / '.git/config'}: the B lists it beside the release, which ignores it"
    (rel / "README.md").unlink()
    assert _err(lambda: check_release(rel, beside=Beside("B", {"README.md": card})), IntegrityError) == \
        f"{rel / 'README.md'}: files differ from the manifest: missing README.md"
    # A file the manifest lists, named by the signature too, is the release's own (compared by the caller).
    assert check_release(rel, beside=Beside("OMS signature", {E0: "6" * 64})).beside == {}
    # subjects_beside: what an OMS list names beyond the manifest is beside the release.
    (rel / "README.md").write_text("card")
    oms_list = {**listed_digests(rel), "README.md": card}
    got = check_release(rel, Listing(oms_list, "OMS", every_file=True, keeps_beside=True))
    assert got.beside == {"README.md": card}
    assert Release.open(rel).root == rel


def test_check_entry_refuses_a_grown_file_naming_the_entry(rel: Path) -> None:
    opened = open_release(rel)
    e = _m(rel)["entries"][1]
    size = _m(rel)["files"][E1]["size"]
    with (rel / E1).open("ab") as f:
        f.write(b"1234")
    assert _err(lambda: check_entry(opened.release, e["id"]), IntegrityError) == \
        f"{rel / E1}: {size + 4} bytes, the manifest says {size} (grown): entry {e['id']!r}"


def _deep_names_first(root: Path, e: dict[str, Any], first: str) -> None:
    """check_release and check_entry, deep, both name `first` (its digest rewritten to 7...7) and its bytes."""
    a, b = e["tensors"][first]["byte_range"]
    real = sha256_hex((root / e["file"]).read_bytes()[a:b])
    want = (f"{root / e['file']}: entry {e['id']!r} tensor {first!r} bytes [{a}, {b}): sha256 {real}, the "
            f"manifest says {'7' * 64}")
    assert _err(lambda: check_release(root, deep=True), IntegrityError) == want
    assert _err(lambda: check_entry(open_release(root).release, e["id"], deep=True), IntegrityError) == want


def test_deep_reports_the_first_wrong_tensor_in_file_order(tmp_path: Path) -> None:
    """Two wrong tensor digests: the first in the file is named (11 layers: layer.10 and layer.2 sort differently
    as names and as numbers)."""
    root = tmp_path / "rel"
    make_release(root, entries=1, layers=11, tokens=2, head_dim=2, seed=4)

    def wrong(m: dict[str, Any]) -> None:
        for name in ("layer.2.keys", "layer.10.keys"):
            m["entries"][0]["tensors"][name]["sha256"] = "7" * 64
    rewrite.manifest(root, wrong)
    e = _m(root)["entries"][0]
    first = min(("layer.2.keys", "layer.10.keys"), key=lambda n: e["tensors"][n]["byte_range"][0])
    _deep_names_first(root, e, first)


def test_opening_weighs_an_unsigned_manifest_as_verifying_does(rel: Path) -> None:
    """A manifest above the 16 MiB floor (whitespace: valid JSON) of a release with little data: opening
    refuses it unparsed with the same line as the full verification."""
    with (rel / MANIFEST).open("ab") as f:
        f.write(b" " * (16 * 1024 * 1024 + 1))
    message = _err(lambda: open_release(rel), InputError)
    assert message == _err(lambda: check_release(rel), InputError)
    assert message.startswith(f"{rel / MANIFEST}: ") and "exceeds the 16777216-byte limit for an unsigned manifest" \
        in message


def test_opening_names_the_manifest_in_a_schema_error_and_returns_its_root(rel: Path) -> None:
    o = open_release(rel)
    assert (o.root, o.manifest_sha256, o.release.root) == (rel, listed_digests(rel)[MANIFEST], rel)
    rewrite.manifest(rel, lambda m: m.update(num_layers="two"))
    message = _err(lambda: open_release(rel), InputError)
    assert message.startswith(f"{rel / MANIFEST}: ") and message == _err(lambda: check_release(rel), InputError)


# Format 2 (the indexed layout capture writes): what differs from format 1 in the checks above.
# mutmut's integrity survivors _locate 15, 17, 18, 19 and _statement_matches 12 (docs/mutation.md).

def _flip_in_tensor(path: Path, byte_range: list[int]) -> bytes:
    data = bytearray(path.read_bytes())
    data[byte_range[0] + 3] ^= 1
    path.write_bytes(bytes(data))
    return bytes(data)


def test_a_changed_tensor_is_located_in_a_format_2_release(tmp_path: Path) -> None:
    """A changed entry file of an indexed release is located to its tensor, as in format 1 (the entry
    files are under entries/, their records in the shards)."""
    root = tmp_path / "rel"
    make_release(root, entries=3, seed=36, format_version=2, shard_entries=2)
    rel = Release.open(root)
    e = rel.entry("rec-001")
    name = "layer.0.keys"
    a, b = e["tensors"][name]["byte_range"]
    meta = rel.file_meta(e)
    path = root / e["file"]
    assert e["file"].startswith("entries/") and rel.index is not None
    data = _flip_in_tensor(path, [a, b])
    want = (f"{path}: entry 'rec-001' tensor {name!r} bytes [{a}, {b}): sha256 {sha256_hex(data[a:b])}, the manifest "
            f"says {e['tensors'][name]['sha256']} (file sha256 {sha256_hex(data)}, manifest says {meta['sha256']})")
    assert _err(lambda: check_release(root), IntegrityError) == want
    assert _err(lambda: check_entry(open_release(root).release, "rec-001"), IntegrityError) == want


def test_a_changed_tensor_is_located_in_an_entry_file_outside_entries(rel: Path) -> None:
    """Format 1 names its entry files freely (another writer need not use entries/): a changed one is
    still located to its tensor."""
    moved = "kv/first.safetensors"
    (rel / "kv").mkdir()
    os.rename(rel / E0, rel / moved)

    def move(m: dict[str, Any]) -> None:
        m["files"][moved] = m["files"].pop(E0)
        m["entries"][0]["file"] = moved

    rewrite.manifest(rel, move)
    assert check_release(rel).files[moved]  # control: the moved release verifies
    m = _m(rel)
    e = m["entries"][0]
    name = "layer.1.keys"
    a, b = e["tensors"][name]["byte_range"]
    data = _flip_in_tensor(rel / moved, [a, b])
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{rel / moved}: entry {e['id']!r} tensor {name!r} bytes [{a}, {b}): sha256 {sha256_hex(data[a:b])}, the "
        f"manifest says {e['tensors'][name]['sha256']} (file sha256 {sha256_hex(data)}, manifest says "
        f"{m['files'][moved]['sha256']})")


def test_a_format_2_release_signed_with_oms_alone_is_checked_against_every_file(tmp_path: Path) -> None:
    """Signed with OMS alone, the list names every file (the entry files too, not just the index files a
    kvgraft statement lists): an intact release verifies, and the list's digest of an entry file is
    compared with the shard's."""
    from kvgraft.signing import keys, oms
    from tests.verifying import verify_result

    root = tmp_path / "rel"
    make_release(root, entries=3, seed=37, format_version=2, shard_entries=2)
    private, public = keys.write_keypair(tmp_path / "signer")
    key = keys.load_private_key(private)
    rel = Release.open(root)
    every = listed_digests(root)
    entry_file = rel.entry("rec-002")["file"]
    assert entry_file not in rel.subject_files()  # what makes format 2 differ here
    assert oms.sign(root, key, every) is not None
    result = verify_result(root, SignedWithKeys((public,)))
    assert result.signature.status == "verified" and result.signature.oms_verified
    assert oms.sign(root, key, {**every, entry_file: "ef" * 32}) is not None
    with pytest.raises(VerificationError) as info:
        verify_result(root, SignedWithKeys((public,)))
    assert str(info.value) == (f"{root / entry_file}: the OMS signature lists sha256 "
                               f"{'ef' * 32} and the manifest {every[entry_file]}")


# The sampled run of 2026-12-01 (`mutation/run.py --sample 100`, docs/mutation.md): integrity survivors.

def test_a_folder_that_cannot_be_listed_is_named(tmp_path: Path) -> None:
    """release_folder_files names the folder it cannot list and why (as root nothing is unreadable: a missing
    folder and a file stand for it); the control lists a folder."""
    (tmp_path / "plain").write_text("x")
    assert release_folder_files(tmp_path) == {"plain"}
    assert _err(lambda: release_folder_files(tmp_path / "gone"), InputError) == \
        f"{tmp_path / 'gone'}: cannot list: No such file or directory"
    assert _err(lambda: release_folder_files(tmp_path / "plain"), InputError) == \
        f"{tmp_path / 'plain'}: cannot list: Not a directory"


def test_a_folder_of_exactly_the_file_limit_is_listed_and_one_more_refused(rel: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """MAX_RELEASE_FILES is the most a release may hold (a million here: scaled down to this release's count)."""
    from kvgraft.release import integrity

    count = len(_m(rel)["files"]) + 1  # manifest.json too
    monkeypatch.setattr(integrity, "MAX_RELEASE_FILES", count)
    assert len(release_folder_files(rel)) == count
    assert check_release(rel).files == listed_digests(rel)
    monkeypatch.setattr(integrity, "MAX_RELEASE_FILES", count - 1)
    assert _err(lambda: release_folder_files(rel), InputError) == f"{rel}: more than {count - 1} files"
    assert _err(lambda: check_release(rel), InputError) == f"{rel}: more than {count - 1} files"


def test_manifests_above_the_limits_are_refused_with_whole_lines(rel: Path) -> None:
    """Unsigned: the data-weighed limit, stated with its reasons; signed: MAX_MANIFEST_BYTES (a sparse file:
    its size is checked before a byte is read). The control: below the signed limit it is parsed."""
    path = rel / MANIFEST
    original = path.read_bytes()
    with path.open("ab") as f:
        f.write(b" " * (16 * 1024 * 1024 + 1 - len(original)))
    size = path.stat().st_size
    assert size == 16 * 1024 * 1024 + 1
    vouched = Listing(listed_digests(rel), "signed statement", vouched=True)  # its maker was verified
    assert _err(lambda: check_release(rel), InputError) == (
        f"{path}: {size} bytes exceeds the 16777216-byte limit for an unsigned manifest (16 MiB here: 1/64 of the "
        f"stored data, at least 16 MiB)")
    assert check_release(rel, vouched).manifest_size == size  # the control: a signed one may be larger
    os.truncate(path, 256 * 1024 * 1024 + 1)
    assert _err(lambda: check_release(rel, vouched), InputError) == \
        f"{path}: {256 * 1024 * 1024 + 1} bytes exceeds the 268435456-byte limit for a manifest"
    assert _err(lambda: open_release(rel, vouched), InputError) == \
        f"{path}: {256 * 1024 * 1024 + 1} bytes exceeds the 268435456-byte limit for a manifest"


def test_a_file_removed_after_the_listing_is_named_missing(rel: Path) -> None:
    """A file the manifest lists that goes away after the folder was counted (here: while the statement's
    claims are checked, the caller's hook) is refused by name, with the entry using it (the folder is listed
    again, by name, to say so); the control: the same hook removing nothing."""
    listed = listed_digests(rel)
    assert check_release(rel, Listing(listed, "manifest", also=lambda m, sha, size: None)).files == listed

    def remove(m: dict[str, Any], sha: str, size: int) -> None:
        os.remove(rel / E1)

    assert _err(lambda: check_release(rel, Listing(listed_digests(rel), "manifest", also=remove)), IntegrityError) == \
        f"{rel / E1}: files differ from the manifest: missing {E1} (entry 'rec-001')"


def test_an_unchecked_oms_list_names_itself_in_a_beside_file_mismatch(rel: Path, tmp_path: Path) -> None:
    """Signed with OMS alone and verified without a key: a file beside the release that its list names with
    another digest is refused naming the unchecked signature (not a checked one); the control: the right digest."""
    from kvgraft.signing import keys, oms
    from tests.verifying import verify_result

    private, _public = keys.write_keypair(tmp_path / "signer")
    key = keys.load_private_key(private)
    (rel / "README.md").write_text("card")
    card = sha256_hex(b"card")
    oms.sign(rel, key, {**listed_digests(rel), "README.md": card})
    assert verify_result(rel).signature.status == "not checked"
    oms.sign(rel, key, {**listed_digests(rel), "README.md": "4" * 64})
    with pytest.raises(IntegrityError) as info:
        verify_result(rel)
    assert str(info.value) == (f"{rel / 'README.md'}: sha256 {card} does not match the OMS signature (not checked) "
                               f"({'4' * 64}); it is beside the release, outside its manifest")


def _lay_out_in_reverse_name_order(root: Path, index: int, gap: int = 0) -> None:
    """Rewrite entry `index`'s file with its tensors stored in reverse name order (as another writer may lay
    them out), `gap` zero bytes after the first, its tensor table and every digest rewritten to match (with no
    gap: an intact release)."""
    import struct

    m = _m(root)
    e = m["entries"][index]
    path = root / e["file"]
    data = path.read_bytes()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    names = sorted((k for k in header if k != "__metadata__"), reverse=True)
    blobs = {k: data[e["tensors"][k]["byte_range"][0]:e["tensors"][k]["byte_range"][1]] for k in names}
    at = 0
    for i, k in enumerate(names):
        header[k]["data_offsets"] = [at, at + len(blobs[k])]
        at += len(blobs[k]) + (gap if i == 0 else 0)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    head = struct.pack("<Q", len(raw)) + raw
    path.write_bytes(head + blobs[names[0]] + b"\0" * gap + b"".join(blobs[k] for k in names[1:]))

    def relayout(doc: dict[str, Any]) -> None:
        entry = doc["entries"][index]
        for k in names:
            a, b = header[k]["data_offsets"]
            entry["tensors"][k]["byte_range"] = [len(head) + a, len(head) + b]
        if "header_sha256" in entry:
            entry["header_sha256"] = sha256_hex(head)
        doc["files"][entry["file"]] = {"sha256": sha256_hex(path.read_bytes()), "size": path.stat().st_size}

    rewrite.manifest(root, relayout)


def test_deep_names_the_first_wrong_tensor_in_a_file_laid_out_in_another_order(rel: Path) -> None:
    """Tensors stored in reverse name order: the control verifies deep; with two wrong tensor digests the one
    first in the file is named, by check_release and check_entry alike."""
    _lay_out_in_reverse_name_order(rel, 1)
    e = _m(rel)["entries"][1]
    starts = {k: t["byte_range"][0] for k, t in e["tensors"].items()}
    assert sorted(starts, key=starts.__getitem__) == sorted(starts, reverse=True)  # the layout under test
    assert check_release(rel, deep=True).tensors_rehashed == sum(len(x["tensors"]) for x in _m(rel)["entries"])
    assert check_entry(open_release(rel).release, e["id"], deep=True).tensors == len(starts)
    first, last = "layer.1.values", "layer.0.keys"  # first and last in this file; last and first by name

    def wrong(doc: dict[str, Any]) -> None:
        for k in (first, last):
            doc["entries"][1]["tensors"][k]["sha256"] = "7" * 64
    rewrite.manifest(rel, wrong)
    _deep_names_first(rel, e, first)


# The sampled run of 2026-12-01: release group survivors (format.py, index.py, safetensors_header.py).

def test_a_manifest_that_is_not_an_object_is_refused(rel: Path) -> None:
    assert Release.open(rel).num_entries == 3  # the control
    (rel / MANIFEST).write_text("[1, 2]")
    want = f"{rel / MANIFEST}: manifest is not a JSON object"
    assert _err(lambda: Release.open(rel), InputError) == want
    assert _err(lambda: check_release(rel), InputError) == want
    assert _err(lambda: open_release(rel), InputError) == want


def test_a_prefix_lookup_reads_the_prefix_index_and_one_shard(tmp_path: Path) -> None:
    """Format 2: finding the longest stored prefix reads the prefix index and the hit's shard, no other; the
    hit is cut to the caller's block size, and one cut to nothing is no hit. Format 1 answers the same."""
    from kvgraft.release import index as release_index

    root = tmp_path / "v2"
    make_release(root, entries=3, tokens=40, seed=38, format_version=2, shard_entries=1)
    ids = list(Release.open(root).entry("rec-002")["token_ids"])
    rel = Release.open(root)
    assert rel.index is not None and rel.index.bytes_read == 0
    hit = rel.longest_prefix([*ids, 7])
    assert hit is not None and (hit[0]["id"], hit[1]) == ("rec-002", 32)  # two whole blocks of 16 of 40 tokens
    assert rel.index.bytes_read == ((root / release_index.PREFIX_FILE).stat().st_size
                                    + (root / release_index.shard_name(2)).stat().st_size)
    cut = rel.longest_prefix(ids, block_tokens=24)
    assert cut is not None and (cut[0]["id"], cut[1]) == ("rec-002", 24)
    assert rel.longest_prefix(ids, block_tokens=64) is None  # 32 tokens hold no block of 64
    assert rel.longest_prefix(ids[:15]) is None  # shorter than one block
    flat = tmp_path / "v1"
    shutil.copytree(root, flat)
    rewrite.manifest(flat, lambda m: None)  # the same records in the single-manifest layout
    v1 = Release.open(flat)
    assert v1.index is None
    got = v1.longest_prefix([*ids, 7])
    assert got is not None and (got[0]["id"], got[1]) == ("rec-002", 32)
    assert v1.longest_prefix(ids, block_tokens=64) is None


def test_a_format_2_header_changed_after_opening_is_refused_by_its_digest(tmp_path: Path) -> None:
    """A format-2 record binds its file's safetensors header bytes: a header that still parses to the same
    tensor table (its metadata changed, same length) is refused when the header is read again, as a graft
    of a release changed since it was verified does; the control reads the intact header."""
    import struct

    root = tmp_path / "rel"
    make_release(root, entries=2, seed=39, format_version=2)
    rel = Release.open(root)
    e = rel.entry("rec-000")
    path = root / e["file"]
    assert set(rel.tensor_layout(e)) == set(e["tensors"])
    data = bytearray(path.read_bytes())
    (n,) = struct.unpack("<Q", data[:8])
    at = bytes(data[:8 + n]).index(b'"rec-000"')
    data[at + 7] = ord("9")  # the metadata names rec-009: the same tensors, other header bytes
    path.write_bytes(bytes(data))
    header = sha256_hex(bytes(data[:8 + n]))
    assert _err(lambda: rel.tensor_layout(e), IntegrityError) == (
        f"{path}: entry 'rec-000': safetensors header bytes [0, {8 + n}): sha256 {header}, the manifest says "
        f"{e['header_sha256']}")


def test_bytes_between_tensors_are_refused_where_the_record_binds_the_header(tmp_path: Path) -> None:
    """A record with a header digest (format 2, here in the single-manifest layout) says the tensors fill the
    file after the header: a file with 8 bytes between two tensors is refused naming them, every digest
    rewritten to match; the control, the same rewrite without the gap, verifies."""
    root = tmp_path / "rel"
    make_release(root, entries=2, seed=40, format_version=2)
    rewrite.manifest(root, lambda m: None)
    good = tmp_path / "good"
    shutil.copytree(root, good)
    _lay_out_in_reverse_name_order(good, 1)
    assert check_release(good, deep=True).tensors_rehashed == 8
    _lay_out_in_reverse_name_order(root, 1, gap=8)
    e = _m(root)["entries"][1]
    assert "header_sha256" in e
    end = e["tensors"]["layer.1.values"]["byte_range"][1]  # the first tensor in the file
    size = (root / e["file"]).stat().st_size
    assert _err(lambda: check_release(root), IntegrityError) == \
        f"{root / e['file']}: entry {e['id']!r}: bytes [{end}, {size}) belong to no tensor"


def _entry_bytes() -> bytes:
    """A one-tensor safetensors file (float32 [1])."""
    import struct

    raw = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + b"\0\0\x80?"


def test_the_writer_refuses_an_entry_id_twice_and_leaves_nothing(tmp_path: Path) -> None:
    from kvgraft.release.format import ReleaseWriter

    out = tmp_path / "out"
    writer = ReleaseWriter(out, format_version=1)
    record = {"id": "a", "num_tokens": 1, "token_ids": [5]}
    assert writer.add_entry_file(record, _entry_bytes())["file"] == "entries/00000.safetensors"  # the control
    assert writer.add_entry_file({**record, "id": "b"}, _entry_bytes())["file"] == "entries/00001.safetensors"
    assert _err(lambda: writer.add_entry_file(record, _entry_bytes()), InputError) == \
        f"{out}: entry id 'a' appears twice"
    writer.abort()
    assert list(tmp_path.iterdir()) == []


def test_overwriting_a_release_replaces_it_whole(tmp_path: Path) -> None:
    from kvgraft.errors import ExistsError

    out = tmp_path / "out"
    make_release(out, entries=2, seed=41)
    first = _m(out)["root_digest"]
    assert _err(lambda: make_release(out, entries=1, seed=42), ExistsError) == \
        f"{out}: already exists; pass --overwrite to replace it"
    assert _m(out)["root_digest"] == first  # refused: the old release stays as it was
    make_release(out, entries=1, seed=42, overwrite=True)
    assert _m(out)["root_digest"] != first and Release.open(out).num_entries == 1
    assert check_release(out).files == listed_digests(out)  # no file of the old release left inside
    assert [p.name for p in tmp_path.iterdir()] == ["out"]  # nor beside it (the old one, a temp folder)


def test_the_writer_returns_the_release_as_one_document(tmp_path: Path) -> None:
    """finish (what capture reports) returns Release.flat's shape: in format 2 the records and their files,
    without the index."""
    doc = make_release(tmp_path / "v2", entries=3, seed=43, format_version=2, shard_entries=2)
    assert doc == Release.open(tmp_path / "v2").flat() and "index" not in doc
    one = make_release(tmp_path / "v1", entries=2, seed=43, format_version=1)
    assert one == Release.open(tmp_path / "v1").flat() == _m(tmp_path / "v1")


def _header_file(path: Path, header: dict[str, Any], data: int) -> Path:
    import struct

    raw = json.dumps(header).encode()
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * data)
    return path


def test_hostile_safetensors_headers_are_refused_with_whole_lines(tmp_path: Path) -> None:
    from kvgraft.release import safetensors_header as stfile

    def f32(shape: list[Any], a: int, b: int) -> dict[str, Any]:
        return {"dtype": "F32", "shape": shape, "data_offsets": [a, b]}

    good = _header_file(tmp_path / "good", {"a": f32([2], 0, 8), "b": f32([2], 8, 16)}, 16)
    tensors, _ = stfile.read_header(good)
    base = good.stat().st_size - 16
    assert [(t.name, t.start, t.end) for t in tensors.values()] == [("a", base, base + 8), ("b", base + 8, base + 16)]
    neg = _header_file(tmp_path / "neg", {"a": f32([-2], 0, 8)}, 8)
    assert _err(lambda: stfile.read_header(neg), InputError) == \
        f"{neg}: tensor 'a': shape must be a list of non-negative integers"
    past = _header_file(tmp_path / "past", {"a": f32([2], 0, 8), "b": f32([2], 8, 16)}, 12)
    size = past.stat().st_size
    start = size - 12
    assert _err(lambda: stfile.read_header(past), InputError) == \
        f"{past}: tensor 'b': byte range [{start + 8}, {start + 16}) does not fit shape [2] float32 in a {size}-byte file"
    over = _header_file(tmp_path / "over", {"a": f32([2], 0, 8), "b": f32([2], 4, 12)}, 12)
    assert _err(lambda: stfile.read_header(over), InputError) == f"{over}: tensors 'a' and 'b' overlap"


def test_hashing_works_where_the_os_has_no_posix_fadvise(rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The read-ahead advice is optional (macOS and Windows have no os.posix_fadvise): without it files and
    byte ranges hash as before, and a release verifies."""
    from kvgraft.release.hashing import hash_file, hash_ranges

    path = rel / E0
    data = path.read_bytes()
    monkeypatch.delattr(os, "posix_fadvise")
    assert hash_file(path) == (sha256_hex(data), len(data))
    assert hash_ranges(path, [(0, 8), (8, len(data))]) == [sha256_hex(data[:8]), sha256_hex(data[8:])]
    assert check_release(rel, deep=True).files == listed_digests(rel)


# The sampled run C (seed 2) of 2026-12-01: integrity survivors.

def test_a_format_2_release_whose_root_digest_is_stale_is_refused(tmp_path: Path) -> None:
    """Format 2 checks the commitments before it trusts the shard digests (format 1 after the sizes): without a
    signature, only the root digest tells that the manifest was edited."""
    root = tmp_path / "r2"
    make_release(root, entries=3, seed=43, format_version=2, shard_entries=2)
    assert check_release(root).tensors > 0  # the control
    m = _m(root)
    m["model"]["spec"] = "someone/else"
    (root / MANIFEST).write_text(json.dumps(m))
    message = _err(lambda: check_release(root), IntegrityError)
    assert message.startswith(f"{root / MANIFEST}: root_digest {m['root_digest']} does not match the manifest")


def test_a_file_beside_the_release_is_named_with_what_lists_it(rel: Path) -> None:
    """check_release's `beside` (files outside the manifest, such as a Hub card) names the OMS signature by
    default, or the source its caller gives."""
    (rel / "README.md").write_text("# card\n")
    real = sha256_hex((rel / "README.md").read_bytes())
    assert check_release(rel, beside=Beside("OMS signature", {"README.md": real})).tensors > 0  # the control
    wrong = {"README.md": "0" * 64}
    assert _err(lambda: check_release(rel, beside=Beside("OMS signature", wrong)), IntegrityError) == (
        f"{rel / 'README.md'}: sha256 {real} does not match the OMS signature ({'0' * 64}); it is beside the release, "
        f"outside its manifest")
    assert _err(lambda: check_release(rel, beside=Beside("card list", wrong)), IntegrityError).startswith(
        f"{rel / 'README.md'}: sha256 {real} does not match the card list (")


def test_a_folder_differing_in_many_files_names_five_and_counts_the_rest(tmp_path: Path) -> None:
    root = tmp_path / "r"
    make_release(root, entries=6, seed=44)
    files = sorted(_m(root)["files"])
    assert len(files) == 6
    for name in files[:5]:
        (root / name).unlink()
    assert "more)" not in _err(lambda: check_release(root), IntegrityError)  # exactly five: all named
    (root / files[5]).unlink()
    missing = _err(lambda: check_release(root), IntegrityError)
    assert missing.endswith(" (+1 more)") and missing.count("(entry '") == 5
    root = tmp_path / "s"
    make_release(root, entries=1, seed=45)
    for i in range(5):
        (root / f"stray{i}.bin").write_bytes(b"x")
    assert _err(lambda: check_release(root), IntegrityError) == (
        f"{root}: files differ from the manifest: not part of the release: "
        f"{', '.join(f'stray{i}.bin' for i in range(5))}")
    (root / "stray5.bin").write_bytes(b"x")
    assert _err(lambda: check_release(root), IntegrityError).endswith("stray4.bin (+1 more)")


# The sampled run C (seed 2): release survivors (docs/mutation.md).

def test_a_manifest_tensor_table_that_differs_from_the_file_is_refused_naming_both_sides(rel: Path) -> None:
    """A record listing a tensor its file does not hold (the manifest edited, every digest recomputed: the
    file is intact, so only the tensor tables can tell) is refused naming the missing and the unexpected."""
    e = _m(rel)["entries"][1]
    assert check_release(rel).tensors == 12  # the control

    def rename(m: dict[str, Any]) -> None:
        entry = m["entries"][1]
        entry["tensors"]["layer.0.kexs"] = entry["tensors"].pop("layer.0.keys")
        entry["layers"][0]["keys"] = "layer.0.kexs"

    rewrite.manifest(rel, rename)
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{rel / E1}: entry {e['id']!r}: tensors differ from the manifest (missing ['layer.0.kexs'], "
        f"unexpected ['layer.0.keys'])")


def _count_header_parses(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """The files whose safetensors header is parsed from now on (parse_header wrapped, not replaced)."""
    from kvgraft.release import safetensors_header as stfile

    parsed: list[Path] = []
    real = stfile.parse_header

    def counting(path: Path, size: int, n: int, raw: bytes) -> Any:
        parsed.append(path)
        return real(path, size, n, raw)

    monkeypatch.setattr(stfile, "parse_header", counting)
    return parsed


def test_a_header_already_checked_is_not_parsed_again(rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """tensor_layout's promise (a graft and an audit read the layout of a verified entry again): the same
    header bytes, checked once in this opened release, are not parsed again; other bytes are."""
    parsed = _count_header_parses(monkeypatch)
    r = Release.open(rel)
    e = r.entry(_m(rel)["entries"][0]["id"])
    first = r.tensor_layout(e)
    with open(rel / E0, "rb") as f:
        assert r.tensor_layout(e, f.fileno()) == first
    assert r.tensor_layout(e) == first and parsed == [rel / E0]
    data = bytearray((rel / E0).read_bytes())
    at = data.index(b'"rec-000"')
    data[at + 7] = ord("9")  # the metadata names rec-009: other header bytes, the same tensor table
    (rel / E0).write_bytes(bytes(data))
    assert r.tensor_layout(e) == first and parsed == [rel / E0] * 2  # format 1 binds no header bytes


def test_an_entry_file_names_its_entry_in_its_safetensors_metadata(tmp_path: Path) -> None:
    """add_entry (what capture writes) labels each file with its entry id, so a file taken out of its release
    still says which record it is; add_entry_file keeps the caller's bytes as given (the control)."""
    from kvgraft.release import safetensors_header as stfile

    doc = make_release(tmp_path / "rel", entries=2, seed=46)
    for e in doc["entries"]:
        assert stfile.read_header(tmp_path / "rel" / e["file"])[1] == {"kvgraft_entry": e["id"]}
    from kvgraft.release.format import ReleaseWriter

    writer = ReleaseWriter(tmp_path / "given", format_version=1)
    written = writer.add_entry_file({"id": "a", "num_tokens": 1, "token_ids": [5]}, _entry_bytes())
    assert stfile.read_header(writer.tmp / written["file"])[1] == {}
    writer.abort()


def test_a_failure_after_the_release_is_in_place_is_a_warning_not_an_error(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """Once the release is renamed into place, a later step that fails (here the parent folder's fsync) is a
    warning naming the path: an error would tell the user the capture failed over a complete, valid release.
    The control: abort before finish removes the temp folder."""
    from kvgraft._internal import jsonio
    from kvgraft.release.format import ReleaseWriter

    early = ReleaseWriter(tmp_path / "early", format_version=1)
    early.add_entry_file({"id": "a", "num_tokens": 1, "token_ids": [5]}, _entry_bytes())
    early.abort()
    assert list(tmp_path.iterdir()) == []

    real = jsonio.fsync_dir

    def failing(path: Path) -> None:  # the release's parent only: the manifest's own folder syncs
        if path == tmp_path:
            raise OSError(5, "Input/output error")
        real(path)

    monkeypatch.setattr(jsonio, "fsync_dir", failing)
    out = tmp_path / "out"
    make_release(out, entries=1, seed=47)
    monkeypatch.undo()
    assert f"kvgraft: warning: {out}: written and in place" in capsys.readouterr().err
    assert check_release(out).files == listed_digests(out) and [p.name for p in tmp_path.iterdir()] == ["out"]


def _v2_manifest(root: Path, change: Any) -> None:
    """Edit a format-2 manifest.json in place and recompute its root digest (what an unsigned release's author
    can publish)."""
    from kvgraft.release.records import root_digest

    m = _m(root)
    change(m)
    m["root_digest"] = root_digest(m)
    (root / MANIFEST).write_text(json.dumps(m))


def test_a_prefix_index_whose_size_is_not_its_records_is_refused_on_opening(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    make_release(root, entries=2, tokens=20, seed=48, format_version=2)
    meta = _m(root)["index"]["prefix"]
    assert Release.open(root).index is not None  # the control, and the root digest recomputed below is valid:
    _v2_manifest(root, lambda m: None)
    assert Release.open(root).num_entries == 2

    def more(m: dict[str, Any]) -> None:
        m["index"]["prefix"]["records"] += 1

    _v2_manifest(root, more)
    assert _err(lambda: Release.open(root), InputError) == (
        f"{root / MANIFEST}: prefix index of {meta['records'] + 1} records cannot be {meta['size']} bytes")


def test_a_grown_index_file_is_named_grown(tmp_path: Path) -> None:
    """An index shard or the prefix index longer than the manifest says is refused when it is read, with its
    size; the control: the same reads of the intact release."""
    from kvgraft.release import index as release_index

    root = tmp_path / "rel"
    make_release(root, entries=2, tokens=20, seed=49, format_version=2)
    ids = list(Release.open(root).entry("rec-001")["token_ids"])
    hit = Release.open(root).longest_prefix(ids)
    assert hit is not None and hit[0]["id"] == "rec-001"  # the control
    shard = root / release_index.shard_name(0)
    size = shard.stat().st_size
    with shard.open("ab") as f:
        f.write(b" ")
    assert _err(lambda: Release.open(root).entry("rec-001"), IntegrityError) == \
        f"{shard}: index shard 0: {size + 1} bytes, the manifest says {size} (grown)"
    prefix = root / release_index.PREFIX_FILE
    psize = prefix.stat().st_size
    with prefix.open("ab") as f:
        f.write(b"\0")
    assert _err(lambda: Release.open(root).longest_prefix(ids), IntegrityError) == \
        f"{prefix}: prefix index: {psize + 1} bytes, the manifest says {psize} (grown)"


def test_an_entry_record_of_another_release_is_refused_by_id(tmp_path: Path) -> None:
    """Format 2: asking a release for the file of a record it does not hold (here another release's, renamed)
    names the id; the control: its own record."""
    root = tmp_path / "rel"
    make_release(root, entries=2, seed=50, format_version=2)
    r = Release.open(root)
    own = r.entry("rec-001")
    assert r.file_meta(own) == {"sha256": sha256_hex((root / own["file"]).read_bytes()),
                                "size": (root / own["file"]).stat().st_size}
    foreign = {**own, "id": "rec-099"}
    assert _err(lambda: r.file_meta(foreign), InputError) == f"{root / MANIFEST}: no entry 'rec-099'"
    assert _err(lambda: r.tensor_layout(foreign), InputError) == f"{root / MANIFEST}: no entry 'rec-099'"


def test_the_prefix_index_binary_search_finds_every_record() -> None:
    """The sorted prefix records (format 2) answer every lookup as the in-memory table (format 1) does: each
    stored prefix at every length, and misses."""
    import random

    from kvgraft.release.index import PrefixTable, PrefixWriter

    gen = random.Random(51)
    entries = [{"token_ids": [gen.randrange(1, 1000) for _ in range(16 * gen.randrange(1, 6) + gen.randrange(16))]}
               for _ in range(12)]
    entries.append({"token_ids": entries[0]["token_ids"][:40] + [7] * 30})  # shares two blocks with entry 0
    writer = PrefixWriter(16)
    for i, e in enumerate(entries):
        writer.add(i, e["token_ids"])
    records = writer.data()
    searched = PrefixTable(16, records)
    table = PrefixTable.from_entries(entries, 16)
    assert len(records) // 40 == len(writer.records) > 30
    asked = 0
    for e in entries:
        ids = e["token_ids"]
        for n in range(16, len(ids) + 1, 16):
            want = table.longest(ids[:n])
            assert want is not None and want[1] == n // 16
            assert searched.longest(ids[:n]) == want
            asked += 1
        assert searched.longest([*ids[:16], 1001]) == table.longest([*ids[:16], 1001])
    assert asked == len(writer.records) + 2  # entry 12's first two blocks are entry 0's records
    assert searched.longest([1001] * 32) is None and table.longest([1001] * 32) is None


def test_a_file_name_with_a_backslash_is_refused(rel: Path) -> None:
    """A name from a signature (not schema-checked, as the manifest's are) holding a backslash, a separator on
    Windows, is refused; the control: the same file named with a forward slash."""
    from kvgraft.release.records import check_relpath

    assert check_relpath("entries/00000.safetensors", "here") == "entries/00000.safetensors"
    assert _err(lambda: check_relpath("entries\\00000.safetensors", "here"), InputError) == \
        "here: unsafe file name 'entries\\\\00000.safetensors' (absolute, '..' or empty parts are refused)"
    (rel / "README.md").write_text("card")
    card = {"README.md": sha256_hex(b"card")}
    assert check_release(rel, beside=Beside("OMS signature", card)).beside == card
    assert _err(lambda: check_release(rel, beside=Beside("OMS signature", {"docs\\README.md": "0" * 64})), InputError) == \
        f"{rel}: the OMS signature: unsafe file name 'docs\\\\README.md' (absolute, '..' or empty parts are refused)"


def test_a_layer_naming_a_values_tensor_its_entry_lacks_is_refused(rel: Path) -> None:
    e = _m(rel)["entries"][2]
    assert Release.open(rel).entry(e["id"])["layers"][1]["values"] == "layer.1.values"  # the control

    def rename(m: dict[str, Any]) -> None:
        m["entries"][2]["layers"][1]["values"] = "layer.1.valuez"

    rewrite.manifest(rel, rename)
    assert _err(lambda: Release.open(rel), InputError) == \
        f"{rel / MANIFEST}: entry {e['id']!r} layer 1: tensor 'layer.1.valuez' is not listed"


def test_a_safetensors_header_length_past_the_file_is_out_of_bounds(tmp_path: Path) -> None:
    import struct

    from kvgraft.release import safetensors_header as stfile

    good = _header_file(tmp_path / "good", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 8)
    assert list(stfile.read_header(good)[0]) == ["a"]  # the control
    bad = tmp_path / "bad"
    bad.write_bytes(struct.pack("<Q", 100) + b"{}" + b" " * 40)
    assert _err(lambda: stfile.read_header(bad), InputError) == \
        f"{bad}: safetensors header length 100 is out of bounds (file is 50 bytes)"


def test_a_safetensors_file_that_cannot_be_read_is_named(tmp_path: Path) -> None:
    from kvgraft.release import safetensors_header as stfile

    assert _err(lambda: stfile.read_header(tmp_path / "gone"), InputError) == \
        f"{tmp_path / 'gone'}: cannot read: No such file or directory"
    assert _err(lambda: stfile.read_header(tmp_path), InputError) == f"{tmp_path}: cannot read: Is a directory"


def test_read_header_reads_the_open_file_not_the_path_again(tmp_path: Path) -> None:
    """With `fd` the header is the open file's (the one the caller reads tensors from), even after another file
    was renamed to its path; the control: by path, the new file."""
    from kvgraft.release import safetensors_header as stfile

    path = _header_file(tmp_path / "f", {"old": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 4)
    fd = os.open(path, os.O_RDONLY)
    try:
        os.replace(_header_file(tmp_path / "new", {"new": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}, 4),
                   path)
        assert list(stfile.read_header(path)[0]) == ["new"]
        assert list(stfile.read_header(path, fd)[0]) == ["old"]
        path.unlink()
        assert list(stfile.read_header(path, fd)[0]) == ["old"]  # `path` only names it
    finally:
        os.close(fd)


def test_more_hostile_safetensors_headers_are_refused_with_whole_lines(tmp_path: Path) -> None:
    """Headers that are not an object, offsets that are not two integers, a byte range of another length
    than the shape's; the control: the same header with integer offsets of the right length parses."""
    from kvgraft.release import safetensors_header as stfile

    good = _header_file(tmp_path / "good", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}, 12)
    assert [(t.end - t.start) for t in stfile.read_header(good)[0].values()] == [8]
    import struct

    listed = tmp_path / "list"
    listed.write_bytes(struct.pack("<Q", 18) + b"[{\"dtype\": \"F32\"}]" + b"\0" * 8)
    assert _err(lambda: stfile.read_header(listed), InputError) == f"{listed}: safetensors header is not an object"
    for offsets in ([0, 8.0], [0, "8"], [0.0, 8], [True, 8]):
        f = _header_file(tmp_path / "offsets", {"a": {"dtype": "F32", "shape": [2], "data_offsets": offsets}}, 12)
        assert _err(lambda f=f: stfile.read_header(f), InputError) == \
            f"{f}: tensor 'a': data_offsets must be two integers", offsets
    longer = _header_file(tmp_path / "longer", {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 12]}}, 12)
    size = longer.stat().st_size
    base = size - 12
    assert _err(lambda: stfile.read_header(longer), InputError) == \
        f"{longer}: tensor 'a': byte range [{base}, {base + 12}) does not fit shape [2] float32 in a {size}-byte file"


def test_a_tensor_of_exactly_the_element_bound_is_accepted_and_one_more_refused(tmp_path: Path) -> None:
    """MAX_ELEMENTS (2^40) is the most a tensor may hold: parse_header is given the file size, so a 1 TiB
    tensor is checked without a 1 TiB file."""
    from kvgraft.release import safetensors_header as stfile

    bound = stfile.MAX_ELEMENTS

    def header(count: int) -> tuple[int, bytes]:
        raw = json.dumps({"a": {"dtype": "U8", "shape": [count], "data_offsets": [0, count]}}).encode()
        return len(raw), raw

    n, raw = header(bound)
    tensors, _ = stfile.parse_header(tmp_path / "f", 8 + n + bound, n, raw)
    assert tensors["a"].end - tensors["a"].start == bound
    n, raw = header(bound + 1)
    assert _err(lambda: stfile.parse_header(tmp_path / "f", 8 + n + bound + 1, n, raw), InputError) == \
        f"{tmp_path / 'f'}: tensor 'a': shape [{bound + 1}] has more than {bound} elements: exceeds the bound"


def test_a_tensor_with_a_zero_dimension_is_accepted_and_verifies(tmp_path: Path) -> None:
    """safetensors writes an empty tensor as an empty byte range (shape [0, 4], data_offsets [k, k]), and the
    manifest schema allows a zero dimension: kvgraft reads such a header, writes its record (the digest of no
    bytes) and verifies the release deep, in both layouts. A negative dimension is still refused."""
    import torch
    from safetensors.torch import save

    from kvgraft.release import safetensors_header as stfile
    from kvgraft.release.format import ReleaseWriter
    from kvgraft.release.records import new_entry, source_record

    from release_factory import fake_header

    data = save({"empty": torch.zeros(0, 4), "layer.0.keys": torch.ones(1, 1, 2, 4),
                 "layer.0.values": torch.ones(1, 1, 2, 4)})
    path = tmp_path / "e.safetensors"
    path.write_bytes(data)
    tensors, _ = stfile.read_header(path)
    assert (tensors["empty"].shape, tensors["empty"].end - tensors["empty"].start) == ((0, 4), 0)
    for version in (1, 2):
        out = tmp_path / f"v{version}"
        writer = ReleaseWriter(out, format_version=version)
        layer = {"index": 0, "kind": "full", "keys": "layer.0.keys", "values": "layer.0.values", "positions": [0, 2]}
        record = new_entry("e", [3, 4], source_record("text", "t"), [layer],
                           {"logits_sha256": "0" * 64, "argmax": 0, "dtype": "float32"})
        written = writer.add_entry_file(record, data)
        assert written["tensors"]["empty"]["sha256"] == sha256_hex(b"")
        writer.finish(fake_header(num_layers=1))
        assert check_release(out, deep=True).tensors_rehashed == 3
    neg = _header_file(tmp_path / "neg", {"a": {"dtype": "F32", "shape": [0, -1], "data_offsets": [0, 0]}}, 0)
    assert _err(lambda: stfile.read_header(neg), InputError) == \
        f"{neg}: tensor 'a': shape must be a list of non-negative integers"


# The sampled run D (seed 3) of 2026-12-01: integrity survivors.

def test_a_file_whose_path_is_too_long_to_read_is_named(tmp_path: Path) -> None:
    """A file whose full path exceeds PATH_MAX inside a folder that can still be listed: the listing names the file
    it cannot read and why (as root nothing else is unreadable). Built with dir_fd, one level at a time."""
    limit = os.pathconf("/", "PC_PATH_MAX")
    fd = os.open(tmp_path, os.O_RDONLY)
    deep, name = tmp_path, "d" * 200
    try:
        while limit - len(str(deep)) > 250:  # then 50 to 250 characters are left for the file's name
            os.mkdir(name, dir_fd=fd)
            nxt = os.open(name, os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd, deep = nxt, deep / name
        leaf = "f" * (limit - len(str(deep)) + 5)
        os.close(os.open(leaf, os.O_WRONLY | os.O_CREAT, dir_fd=fd))
    finally:
        os.close(fd)
    assert len(str(deep / leaf)) > limit > len(str(deep))
    assert _err(lambda: release_folder_files(tmp_path), InputError) == (
        f"{deep / leaf}: cannot read: File name too long")


# The sampled run E (seed 4): release survivors (docs/mutation.md).

def test_a_manifest_that_is_a_link_or_too_large_is_refused_naming_a_manifest(rel: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """load_manifest names what the file should be: a manifest.json that is a symlink, or larger than the
    bound (lowered here), is refused in one whole line; the control: the same release read intact."""
    from kvgraft.release import format as release_format

    size = (rel / MANIFEST).stat().st_size
    assert release_format.load_manifest(rel)["root_digest"] == _m(rel)["root_digest"]  # the control
    monkeypatch.setattr(release_format, "MAX_MANIFEST_BYTES", size - 1)
    assert _err(lambda: release_format.load_manifest(rel), InputError) == \
        f"{rel / MANIFEST}: {size} bytes exceeds the {size - 1}-byte limit for a manifest"
    monkeypatch.undo()
    (rel / "real.json").write_bytes((rel / MANIFEST).read_bytes())
    (rel / MANIFEST).unlink()
    (rel / MANIFEST).symlink_to("real.json")
    assert _err(lambda: release_format.load_manifest(rel), InputError) == \
        f"{rel / MANIFEST}: manifest is a symlink; releases may not contain links"


def test_a_tensor_whose_shape_differs_from_its_record_is_named_with_both_sides(rel: Path) -> None:
    """The record's tensor table edited (every digest recomputed): the line names the header's and the
    manifest's dtype, shape and byte range."""
    e = _m(rel)["entries"][1]
    t = e["tensors"]["layer.0.keys"]
    assert check_release(rel).tensors == 12  # the control

    def reshape(m: dict[str, Any]) -> None:
        m["entries"][1]["tensors"]["layer.0.keys"]["shape"] = [1, t["shape"][1], t["shape"][2] * t["shape"][3]]

    rewrite.manifest(rel, reshape)
    a, b = t["byte_range"]
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{rel / E1}: entry {e['id']!r} tensor 'layer.0.keys': header says {t['dtype']} {t['shape']} bytes "
        f"[{a}, {b}), manifest says {t['dtype']} {[1, t['shape'][1], t['shape'][2] * t['shape'][3]]} bytes [{a}, {b}]")


def test_a_header_checked_against_an_equal_tensor_table_is_not_parsed_again(rel: Path,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    """The header cache compares the tensor table by value: a record read again (a copy, as format 2 hands out
    for each shard it reads) does not parse the same header again; a different table does (the control)."""
    import copy

    parsed = _count_header_parses(monkeypatch)
    r = Release.open(rel)
    e = r.entry(_m(rel)["entries"][0]["id"])
    first = r.tensor_layout(e)
    again = copy.deepcopy(e)
    assert again["tensors"] is not e["tensors"] and r.tensor_layout(again) == first and parsed == [rel / E0]
    other = copy.deepcopy(e)
    other["tensors"]["layer.0.keys"]["shape"] = [9]
    with pytest.raises(IntegrityError):
        r.tensor_layout(other)
    assert parsed == [rel / E0] * 2


def test_now_utc_is_whole_seconds_in_utc_marked_z() -> None:
    import datetime
    import re

    from kvgraft.release.format import now_utc

    stamp = now_utc()
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", stamp), stamp
    when = datetime.datetime.fromisoformat(stamp.replace("Z", "+00:00"))
    assert abs((datetime.datetime.now(datetime.UTC) - when).total_seconds()) < 5


def test_entry_file_names_at_the_folder_edges(tmp_path: Path) -> None:
    """Format 1 names entries flat up to 99,999, then in folders of 1,000; format 2 always in folders, the
    1,000th entry of a folder starting the next one."""
    from kvgraft.release.format import ReleaseWriter

    names = {}
    for version in (1, 2):
        writer = ReleaseWriter(tmp_path / f"v{version}", format_version=version)
        for n in (0, 999, 1000, 99_999, 100_000, 100_999):
            writer.count = n
            names[version, n] = writer._entry_name()
        writer.abort()
    assert [names[1, n] for n in (0, 999, 99_999, 100_000, 100_999)] == [
        "entries/00000.safetensors", "entries/00999.safetensors", "entries/99999.safetensors",
        "entries/00100/000.safetensors", "entries/00100/999.safetensors"]
    assert [names[2, n] for n in (0, 999, 1000, 99_999, 100_000)] == [
        "entries/00000/000.safetensors", "entries/00000/999.safetensors", "entries/00001/000.safetensors",
        "entries/00099/999.safetensors", "entries/00100/000.safetensors"]


def test_a_format_2_manifest_that_fails_its_schema_names_manifest_json(tmp_path: Path) -> None:
    """finish validates the manifest it is about to write; the error names the file it would be; the
    control: the same writer with a valid header finishes."""
    from kvgraft.errors import SchemaError
    from kvgraft.release.format import ReleaseWriter

    from release_factory import fake_header

    out = tmp_path / "out"
    writer = ReleaseWriter(out, format_version=2)
    with pytest.raises(SchemaError) as info:
        writer.finish({**fake_header(num_layers=1), "num_layers": "one"})
    assert info.value.where == str(out / MANIFEST) and str(info.value).startswith(f"{out / MANIFEST}: schema error at ")
    writer.abort()
    good = ReleaseWriter(tmp_path / "good", format_version=2)
    good.finish(fake_header(num_layers=1))
    assert Release.open(tmp_path / "good").num_entries == 0


def test_a_range_past_the_end_of_its_file_is_named_with_both_ends(rel: Path) -> None:
    from kvgraft.release import hashing

    data = (rel / E0).read_bytes()
    assert hashing.hash_ranges(rel / E0, [(8, len(data))]) == [sha256_hex(data[8:])]  # the control
    assert _err(lambda: hashing.hash_ranges(rel / E0, [(8, len(data) + 3)]), EOFError) == \
        f"{rel / E0}: file ends at byte {len(data)}, expected data up to {len(data) + 3}"


def test_an_index_whose_shards_repeat_an_id_or_miscount_is_refused_naming_both(tmp_path: Path) -> None:
    """Format 2: shards listing one id twice (here the second and third of three) name that id; an entry count
    that is not the shards' names both numbers; the control: the release intact (its digest recomputed)."""
    root = tmp_path / "rel"
    make_release(root, entries=3, seed=52, format_version=2)
    _v2_manifest(root, lambda m: None)
    assert Release.open(root).num_entries == 3  # the control
    ids = _m(root)["index"]["shards"][0]["ids"]

    def repeat(m: dict[str, Any]) -> None:
        m["index"]["shards"][0]["ids"] = [ids[0], ids[1], ids[1]]

    _v2_manifest(root, repeat)
    assert _err(lambda: Release.open(root), InputError) == f"{root / MANIFEST}: entry id {ids[1]!r} appears twice"
    _v2_manifest(root, lambda m: m["index"]["shards"][0].update(ids=ids))

    def more(m: dict[str, Any]) -> None:
        m["index"]["entries"] = 4

    _v2_manifest(root, more)
    assert _err(lambda: Release.open(root), InputError) == f"{root / MANIFEST}: index says 4 entries, its shards list 3"


def test_a_shard_holding_other_entries_than_the_manifest_lists_names_both(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    make_release(root, entries=3, seed=53, format_version=2)
    ids = _m(root)["index"]["shards"][0]["ids"]
    assert Release.open(root).entry(ids[1])["id"] == ids[1]  # the control
    listed = [ids[0], "rec-009", ids[2]]
    _v2_manifest(root, lambda m: m["index"]["shards"][0].update(ids=listed))
    from kvgraft.release import index as release_index

    shard = root / release_index.shard_name(0)
    assert _err(lambda: Release.open(root).entry("rec-009"), IntegrityError) == \
        f"{shard}: index shard 0 holds entries {ids[:3]}..., the manifest lists {listed[:3]}..."


def test_a_tensor_of_too_many_dimensions_is_named(tmp_path: Path) -> None:
    from kvgraft.release import safetensors_header as stfile

    ok = _header_file(tmp_path / "ok", {"a": {"dtype": "F32", "shape": [1] * 8, "data_offsets": [0, 4]}}, 4)
    assert stfile.read_header(ok)[0]["a"].shape == (1,) * 8  # the control: 8 dimensions
    bad = _header_file(tmp_path / "bad", {"a": {"dtype": "F32", "shape": [1] * 9, "data_offsets": [0, 4]}}, 4)
    assert _err(lambda: stfile.read_header(bad), InputError) == \
        f"{bad}: tensor 'a': shape has 9 dimensions; at most 8"


# Sample G (seed 6) of 2026-12-02: integrity survivors after the streaming verify (docs/mutation.md).

def test_a_changed_file_laid_out_in_another_order_names_its_first_wrong_tensor(rel: Path) -> None:
    """Not deep: the file's digest differs, and _locate names the first changed tensor in the file, not by name
    (tensors stored in reverse name order, two of them changed)."""
    _lay_out_in_reverse_name_order(rel, 1)
    e = _m(rel)["entries"][1]
    assert check_release(rel).tensors == sum(len(x["tensors"]) for x in _m(rel)["entries"])  # the control
    first, last = "layer.1.values", "layer.0.keys"  # first and last in this file; last and first by name
    path = rel / e["file"]
    data = bytearray(path.read_bytes())
    for k in (first, last):
        data[e["tensors"][k]["byte_range"][0]] ^= 0xFF
    path.write_bytes(bytes(data))
    a, b = e["tensors"][first]["byte_range"]
    actual, stated = sha256_hex(bytes(data)), _m(rel)["files"][e["file"]]["sha256"]
    want = (f"{path}: entry {e['id']!r} tensor {first!r} bytes [{a}, {b}): sha256 {sha256_hex(bytes(data[a:b]))}, "
            f"the manifest says {e['tensors'][first]['sha256']} (file sha256 {actual}, manifest says {stated})")
    assert _err(lambda: check_release(rel), IntegrityError) == want
    assert _err(lambda: check_entry(open_release(rel).release, e["id"]), IntegrityError) == want


def test_check_index_reads_every_record_once_and_counts_the_index_bytes(rel: Path, tmp_path: Path) -> None:
    """`verify --sample`'s pass over the index: each record handed to `each` once, in release order; the bytes
    read are the index files' (format 2) or none (format 1, whose records the manifest holds)."""
    from kvgraft.release.integrity import check_index

    ids = [e["id"] for e in _m(rel)["entries"]]
    seen: list[str] = []
    assert check_index(open_release(rel).release, lambda e: seen.append(e["id"])) == 0
    assert seen == ids
    assert check_index(open_release(rel).release) == 0
    root = tmp_path / "v2"
    make_release(root, entries=5, seed=61, format_version=2, shard_entries=2)
    opened = open_release(root).release
    assert opened.index is not None
    index_bytes = sum((root / n).stat().st_size for n in opened.index.index_files())
    seen.clear()
    assert check_index(opened, lambda e: seen.append(e["id"])) == index_bytes
    assert seen == Release.open(root).entry_ids() and len(seen) == 5
    assert check_index(open_release(root).release) == index_bytes


def test_an_ignored_file_whose_name_sorts_after_every_listed_one_is_excused(rel: Path) -> None:
    """The count of the folder excuses a file in an ignored path by asking whether the listed names hold it (a
    sorted array of 64-bit name digests); a name whose digest is above all of theirs is not held, and excused."""
    from kvgraft.release.integrity import _name_key

    top = max(_name_key(n) for n in _m(rel)["files"])
    name = next(f"notes/{i}.txt" for i in range(1000) if _name_key(f"notes/{i}.txt") > top)
    (rel / "notes").mkdir()
    (rel / name).write_text("x")
    assert _err(lambda: check_release(rel), IntegrityError) == \
        f"{rel}: files differ from the manifest: not part of the release: {name}"  # the control: not ignored
    checked = check_release(rel, beside=Beside("B", excused=("notes",)))
    assert checked.ignored == [name] and checked.count == 1 + len(_m(rel)["files"])


# ------------------------------------------------------------------ the release group's reads (sample G's survivors)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A format-2 release of 4 entries in shards of 1, each entry 40 tokens (two prefix blocks of 16)."""
    root = tmp_path_factory.mktemp("indexed") / "rel"
    make_release(root, entries=4, tokens=40, seed=37, format_version=2, shard_entries=1)
    return root


def test_records_come_in_the_order_asked_and_an_unknown_id_is_named(indexed: Path) -> None:
    rel = Release.open(indexed)
    got = rel.records(["rec-002", "rec-000", "rec-002"])
    assert [r["id"] for r in got] == ["rec-002", "rec-000", "rec-002"] and got[1] == rel.entry("rec-000")
    known = ", ".join(rel.entry_ids())
    assert _err(lambda: Release.open(indexed).records(["rec-001", "nope"]), InputError) == (
        f"{indexed}: no entry 'nope' (entries: {known})")


def test_the_record_cache_keeps_the_most_recent_records(indexed: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Index.entry keeps the last CACHED_RECORDS records handed out (oldest evicted first), so a record asked
    for again is not parsed from its shard again, even when its shard has left the shard cache."""
    from kvgraft.release import index as release_index
    monkeypatch.setattr(release_index.Index, "CACHED_RECORDS", 2)
    monkeypatch.setattr(release_index.Index, "CACHED_SHARDS", 1)
    rel = Release.open(indexed)
    assert rel.index is not None
    for eid in ("rec-000", "rec-001", "rec-002", "rec-003"):
        rel.entry(eid)
    assert rel.index.shards_read == [0, 1, 2, 3]
    assert rel.entry("rec-002")["id"] == "rec-002" and rel.index.shards_read == [0, 1, 2, 3]  # kept: not read again
    assert rel.entry("rec-000")["id"] == "rec-000" and rel.index.shards_read == [0, 1, 2, 3, 0]  # evicted: read again


def test_token_counts_of_a_manifest_that_lists_none_are_read_from_the_shards(indexed: Path, tmp_path: Path) -> None:

    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    m = _m(root)
    for s in m["index"]["shards"]:
        del s["num_tokens"]
    m["root_digest"] = root_digest(m)
    (root / MANIFEST).write_text(json.dumps(m))
    rel = Release.open(root)
    assert rel.token_counts() == [40, 40, 40, 40] and rel.index is not None and rel.index.shards_read == [0, 1, 2, 3]


def test_a_prefix_index_that_is_a_symlink_is_refused_by_name(indexed: Path, tmp_path: Path) -> None:
    from kvgraft.release import index as release_index
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    rel = Release.open(root)
    assert rel.index is not None and rel.index.prefix_pages() is not None  # control: the copy reads
    prefix = root / release_index.PREFIX_FILE
    shutil.move(prefix, tmp_path / "prefix.bin")
    prefix.symlink_to(tmp_path / "prefix.bin")
    fresh = Release.open(root)
    assert fresh.index is not None
    assert _err(fresh.index.prefix_pages, InputError) == (
        f"{prefix}: prefix index is a symlink; releases may not contain links")


def test_an_entry_file_of_a_release_from_elsewhere_is_fetched_with_its_digest_and_size(indexed: Path) -> None:
    asked: list[tuple[Any, ...]] = []
    rel = Release.open(indexed, _RecordingSource(indexed, asked))
    e = rel.entry("rec-001")
    meta = rel.file_meta(e)
    asked.clear()  # the index shard that holds its record (the test above)
    assert rel.entry_file(e) == indexed / e["file"]
    assert asked == [(e["file"], meta["sha256"], meta["size"], "entry 'rec-001'", e)]
    assert meta["size"] == (indexed / e["file"]).stat().st_size


def test_a_killed_writers_partial_folder_is_removed_by_the_next_writer(tmp_path: Path) -> None:
    from kvgraft.release.format import ReleaseWriter
    out = tmp_path / "rel"
    first = ReleaseWriter(out)
    assert first.tmp.is_dir() and first.tmp.parent == tmp_path
    first._lock.release()  # as when its process is killed: the lock goes, the folder stays
    (tmp_path / ".rel.keep").mkdir()  # control: not a writer's leftover
    second = ReleaseWriter(out)
    try:
        assert not first.tmp.exists() and second.tmp.is_dir() and (tmp_path / ".rel.keep").is_dir()
    finally:
        second.abort()
    assert sorted(p.name for p in tmp_path.iterdir()) == [".rel.keep"]


# ------------------------------------------------------------------ integrity: sample G's unresolved timeouts


def test_opening_counts_its_files_and_names_the_manifest_as_the_default_source(indexed: Path) -> None:
    listed = {n: f["sha256"] for n, f in Release.open(indexed).subject_files().items()}  # the index files
    o = open_release(indexed, Listing({MANIFEST: listed_digests(indexed)[MANIFEST], **listed}, "manifest"))
    assert o.count == len(o.files) == 1 + len(listed) and len(listed) > 1
    subjects = listed
    assert _err(lambda: open_release(indexed, Listing(subjects, "manifest")), VerificationError) == (
        f"{indexed}: the manifest does not list {MANIFEST} as a subject")


def test_check_release_checks_the_prefix_records_of_an_indexed_release(indexed: Path) -> None:
    """A format-2 release with prefix records (40 tokens an entry, blocks of 16) verifies: its records are
    weighed against the entries' blocks (control for the prefix checks of test_hostile_index)."""
    c = check_release(indexed)
    assert c.release.index is not None and c.release.index.prefix_meta is not None
    assert c.count == len(listed_digests(indexed))


def test_a_read_across_a_replace_is_read_again_and_any_other_failure_stands(rel: Path, tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """check_release reads the folder again when it was replaced while read (the failure said nothing about
    either release), at most READS_ACROSS_A_REPLACE times; a failure of a folder left in place is reported
    after one read."""
    from kvgraft.release import integrity
    calls = _replaced_during_the_first_read(rel, tmp_path, monkeypatch)
    assert check_release(rel).root == rel and len(calls) == 2

    def always_fails(root: Path, **options: Any) -> Any:
        calls.append(1)
        raise IntegrityError(f"{root}: damaged")

    calls.clear()
    monkeypatch.setattr(integrity, "_check_release", always_fails)
    assert _err(lambda: check_release(rel), IntegrityError) == f"{rel}: damaged" and len(calls) == 1


# ------------------------------------------------------------------ the release group's reads (sample H's survivors)


def test_format_1_records_and_token_counts_come_from_the_manifest(rel: Path) -> None:
    r = Release.open(rel)
    assert [e["id"] for e in r.records(["rec-002", "rec-000"])] == ["rec-002", "rec-000"]
    assert r.token_counts() == [int(e["num_tokens"]) for e in _m(rel)["entries"]] == [6, 6, 6]


def test_token_counts_listed_by_the_manifest_read_no_shard(indexed: Path) -> None:
    r = Release.open(indexed)
    assert r.token_counts() == [40, 40, 40, 40] and r.index is not None and r.index.shards_read == []


def test_a_file_an_entry_names_outside_its_shards_listing_is_refused_by_name(indexed: Path) -> None:
    r = Release.open(indexed)
    e = {**r.entry("rec-001"), "file": "entries/elsewhere.safetensors"}
    assert _err(lambda: r.file_meta(e), InputError) == (
        f"{indexed / MANIFEST}: entry 'rec-001': file 'entries/elsewhere.safetensors' is not listed")


def test_the_longest_prefix_stops_at_the_first_block_no_entry_holds(indexed: Path) -> None:
    r = Release.open(indexed)
    ids = r.entry("rec-002")["token_ids"]
    other = [t + 1 for t in ids[16:32]]  # the second block changed: only the first is held
    assert r.prefix_table().longest(ids[:16] + other) == (2, 1)
    hit = r.longest_prefix(ids[:16] + other)
    assert hit is not None and (hit[0]["id"], hit[1]) == ("rec-002", 16)
    assert r.prefix_table().longest([t + 1 for t in ids[:16]]) is None


def test_the_prefix_index_of_a_release_from_elsewhere_is_fetched_with_its_label(indexed: Path) -> None:
    asked: list[tuple[Any, ...]] = []
    r = Release.open(indexed, _RecordingSource(indexed, asked))
    assert r.index is not None and r.index.prefix_meta is not None
    m = r.index.prefix_meta
    assert r.index.prefix_pages() is not None
    assert asked == [(m["file"], m["sha256"], m["size"], "prefix index", None)]


def test_a_manifest_that_is_not_utf8_is_named(rel: Path) -> None:
    (rel / MANIFEST).write_bytes(b"\xff{}")
    assert _err(lambda: Release.open(rel), InputError).startswith(f"{rel / MANIFEST}: invalid JSON: not UTF-8")


def test_two_shards_that_name_one_file_are_refused_by_name(indexed: Path, tmp_path: Path) -> None:
    from kvgraft.release import index as release_index

    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    m = _m(root)
    m["index"]["shards"][1]["file"] = name = m["index"]["shards"][0]["file"]
    m["root_digest"] = root_digest(m)
    (root / MANIFEST).write_text(json.dumps(m))
    assert _err(lambda: Release.open(root), InputError) == (
        f"{root / MANIFEST}: index shard 1: file {name!r} is not a distinct file under {release_index.INDEX_DIR}/")


def test_overwriting_where_the_file_system_cannot_swap_takes_two_renames(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from kvgraft._internal import jsonio

    def cannot(_a: Path, _b: Path) -> None:
        raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")

    out = tmp_path / "rel"
    make_release(out, entries=2, seed=38)
    first = _m(out)["root_digest"]
    monkeypatch.setattr(jsonio, "exchange", cannot)
    make_release(out, entries=3, seed=39, overwrite=True)
    assert _m(out)["root_digest"] != first and len(Release.open(out).entry_ids()) == 3
    assert check_release(out).root == out and sorted(p.name for p in tmp_path.iterdir()) == ["rel"]


class _RecordingSource(Source):
    """A release read from elsewhere (kvgraft.release.sources) that records each fetch asked of it."""

    remote = True

    def __init__(self, root: Path, asked: list[tuple[Any, ...]]) -> None:
        super().__init__(root, "https://example.invalid/rel")
        self.asked = asked

    def fetch(self, name: str, sha256: str, size: int, what: str, entry: dict[str, Any] | None = None) -> None:
        self.asked.append((name, sha256, size, what, entry))

    def fetch_all(self) -> None:
        raise AssertionError("not expected")


# ------------------------------------------------------------------ sample H's survivors without a test


def test_an_entry_file_removed_before_it_is_asked_for_is_named_missing(rel: Path) -> None:
    r = Release.open(rel)
    e = _m(rel)["entries"][1]
    assert r.entry_file(e) == rel / E1  # the control
    (rel / E1).unlink()
    assert _err(lambda: r.entry_file(e), IntegrityError) == f"{rel / E1}: entry {e['id']!r}: file is missing"


def test_a_format_1_entry_naming_a_file_the_manifest_does_not_list_is_refused_by_name(rel: Path) -> None:
    assert Release.open(rel).num_entries == 3  # the control
    eid = _m(rel)["entries"][1]["id"]
    rewrite.manifest(rel, lambda m: m["entries"][1].update(file="entries/unlisted.safetensors"))
    assert _err(lambda: Release.open(rel), InputError) == (
        f"{rel / MANIFEST}: entry {eid!r}: file 'entries/unlisted.safetensors' is not listed in files")


def _rewrite_shard(root: Path, k: int, change: Any) -> Path:
    """Edit index shard `k` of a format-2 release, then what the manifest says of it and the root digest (what
    an unsigned release's author can publish)."""
    from kvgraft._internal import jsonio
    from kvgraft.release import index as release_index

    path = root / release_index.shard_name(k)
    doc = json.loads(path.read_bytes())
    change(doc)
    data = jsonio.canonical(doc)
    path.write_bytes(data)
    _v2_manifest(root, lambda m: m["index"]["shards"][k].update(sha256=sha256_hex(data), size=len(data)))
    return path


def test_a_shard_listing_a_file_no_entry_uses_is_refused_naming_the_file(indexed: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    _rewrite_shard(root, 1, lambda doc: None)
    assert Release.open(root).entry("rec-001")["id"] == "rec-001"  # the control: the shard rewritten as it was
    unused = {"sha256": "0" * 64, "size": 1}
    path = _rewrite_shard(root, 1, lambda doc: doc["files"].update({"entries/unused.safetensors": unused}))
    assert _err(lambda: Release.open(root).entry("rec-001"), InputError) == (
        f"{path}: index shard 1 lists files its entries do not use: ['entries/unused.safetensors']")


def test_a_shard_not_listing_files_its_entries_use_is_refused_naming_three(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    make_release(root, entries=5, tokens=2, layers=1, seed=65, format_version=2)
    names = sorted(e["file"] for e in Release.open(root).iter_entries())
    path = _rewrite_shard(root, 0, lambda doc: doc["files"].clear())
    assert _err(lambda: Release.open(root).entry("rec-001"), InputError) == (
        f"{path}: index shard 0 does not list files its entries use: {names[:3]}")


def test_an_unsupported_format_version_names_the_versions_this_kvgraft_reads(rel: Path) -> None:
    from kvgraft import __version__
    from kvgraft.errors import FormatVersionError
    from kvgraft.release.format import FORMAT_VERSIONS

    m = _m(rel)
    m["format_version"] = 99
    (rel / MANIFEST).write_text(json.dumps(m))
    assert _err(lambda: Release.open(rel), FormatVersionError) == (
        f"{rel / MANIFEST}: format version 99 is not supported; this kvgraft {__version__} reads versions "
        f"{', '.join(map(str, FORMAT_VERSIONS))}")
    assert FORMAT_VERSIONS == (1, 2)


def test_a_safetensors_header_of_exactly_the_length_limit_is_read_and_one_byte_more_refused(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The limit is inclusive. Shown with the limit lowered to the length of a real header (the real one is
    100 MiB); a header length above the real limit is refused before anything is read."""
    import struct

    from kvgraft.release import safetensors_header as stfile

    raw = json.dumps({"t": {"dtype": "F32", "shape": [1], "data_offsets": [0, 4]}}).encode()
    path = tmp_path / "x.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + b"\0" * 4 + b"\0")  # one byte more: room for a longer header
    monkeypatch.setattr(stfile, "MAX_HEADER_BYTES", len(raw))
    assert stfile.read_raw_header(path) == (len(raw) + 13, len(raw), raw)
    path.write_bytes(struct.pack("<Q", len(raw) + 1) + raw + b" " + b"\0" * 4)
    assert _err(lambda: stfile.read_raw_header(path), InputError) == (
        f"{path}: safetensors header length {len(raw) + 1} is out of bounds (file is {len(raw) + 13} bytes)")
    monkeypatch.undo()
    assert stfile.read_raw_header(path)[1] == len(raw) + 1  # the control: under the real limit it is read
    path.write_bytes(struct.pack("<Q", stfile.MAX_HEADER_BYTES + 1) + raw)
    assert _err(lambda: stfile.read_raw_header(path), InputError) == (
        f"{path}: safetensors header length {stfile.MAX_HEADER_BYTES + 1} is out of bounds "
        f"(file is {len(raw) + 8} bytes)")


def test_a_prefix_index_that_cannot_be_read_is_named_with_the_cause(indexed: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    """An I/O error reading the prefix index, when it is first hashed and when a page is read again, names the
    file and the errno (IOFailure, exit 7); the control: the same lookups without it."""
    import errno

    from kvgraft.errors import IOFailure
    from kvgraft.release import index as release_index

    ids = Release.open(indexed).entry("rec-002")["token_ids"]
    path = indexed / release_index.PREFIX_FILE

    def eio(_self: Any, _fd: int, _p: int) -> bytes:
        raise OSError(errno.EIO, "Input/output error")

    r = Release.open(indexed)
    hit = r.longest_prefix(ids)
    assert hit is not None and hit[0]["id"] == "rec-002"  # the control
    assert r.index is not None
    pages = r.index.prefix_pages()
    assert pages is not None
    read = release_index.PrefixPages._read
    monkeypatch.setattr(release_index.PrefixPages, "_read", eio)
    assert _err(lambda: Release.open(indexed).longest_prefix(ids), IOFailure) == \
        f"{path}: cannot read: Input/output error (EIO)"
    pages._cache.clear()  # the page a lookup needs is read again
    assert _err(lambda: r.longest_prefix(ids), IOFailure) == f"{path}: cannot read: Input/output error (EIO)"
    monkeypatch.setattr(release_index.PrefixPages, "_read", read)
    hit = r.longest_prefix(ids)
    assert hit is not None and hit[0]["id"] == "rec-002"


def test_an_overwrite_whose_second_rename_fails_puts_the_old_release_back(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """Where the file system cannot swap in one step, the old release is moved aside and the new one renamed
    into place; if that second rename fails the old release is put back and the write is refused by name."""
    import errno

    from kvgraft._internal import jsonio
    from kvgraft.errors import IOFailure

    def cannot(_a: Path, _b: Path) -> None:
        raise OSError(errno.EINVAL, "no RENAME_EXCHANGE here")

    out = tmp_path / "rel"
    make_release(out, entries=2, seed=38)
    first = listed_digests(out)
    replace = os.replace

    def second_fails(src: Any, dst: Any) -> None:
        if Path(dst) == out and Path(src).suffix == ".partial":  # the new release into place, not the old one back
            raise OSError(errno.EIO, "Input/output error", str(dst))
        replace(src, dst)

    monkeypatch.setattr(jsonio, "exchange", cannot)
    monkeypatch.setattr(os, "replace", second_fails)
    assert _err(lambda: make_release(out, entries=3, seed=39, overwrite=True), IOFailure) == \
        f"{out}: cannot write: Input/output error (EIO)"
    monkeypatch.undo()
    assert listed_digests(out) == first and check_release(out).files == first
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rel"]


def test_ranges_read_by_the_helper_threads_are_hashed_with_the_rest(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Above PARALLEL_MIN_BYTES a helper thread reads ranges beside the calling one: here it reads every range
    while the caller runs `meanwhile` (which waits for it), and the digests it found are returned in order."""
    import hashlib
    import time

    from kvgraft.release import hashing

    data = os.urandom(hashing.PARALLEL_MIN_BYTES + 4096)
    path = tmp_path / "data"
    path.write_bytes(data)
    step = len(data) // 8
    ranges = [(i * step, (i + 1) * step) for i in range(8)]
    dest = bytearray(8 * step)
    monkeypatch.setattr(hashing, "cores", lambda: 2)

    def wait_for_the_helper() -> None:
        deadline = time.monotonic() + 10
        while dest != data[:8 * step] and time.monotonic() < deadline:
            time.sleep(0.01)

    digests = hashing.read_and_hash(path, ranges, memoryview(dest), meanwhile=wait_for_the_helper)
    assert bytes(dest) == data[:8 * step]
    assert digests == [hashlib.sha256(data[a:b]).hexdigest() for a, b in ranges]


def test_aborting_a_writer_whose_partial_folder_is_gone_raises_nothing_and_frees_the_release(tmp_path: Path) -> None:
    from kvgraft.release.format import ReleaseWriter

    out = tmp_path / "rel"
    w = ReleaseWriter(out)
    shutil.rmtree(w.tmp)
    w.abort()
    make_release(out, entries=1, seed=40)  # the control: the next writer is not locked out
    assert check_release(out).root == out and sorted(p.name for p in tmp_path.iterdir()) == ["rel"]


# ------------------------------------------------------------------ integrity, sample I (seed 8): survivors


def test_check_index_checks_the_prefix_records_of_an_indexed_release(indexed: Path, tmp_path: Path) -> None:
    """`verify --sample`'s pass over the index weighs each prefix record against the blocks its entry holds; the
    control: the release as written, whose 4 entries of 40 tokens hold 2 blocks each."""
    import struct

    from kvgraft.release import index as release_index
    from kvgraft.release.integrity import check_index

    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    opened = open_release(root).release
    assert opened.index is not None and opened.index.prefix_meta is not None
    assert opened.index.prefix_meta["records"] == 8
    assert check_index(opened) == sum((root / n).stat().st_size for n in opened.index.index_files())
    prefix = root / release_index.PREFIX_FILE
    rows = [list(r) for r in release_index.RECORD.iter_unpack(prefix.read_bytes())]
    rows[0][2] = 3  # three blocks, of an entry that holds two
    data = b"".join(release_index.RECORD.pack(*r) for r in rows)
    prefix.write_bytes(data)
    _v2_manifest(root, lambda m: m["index"]["prefix"].update(sha256=sha256_hex(data)))
    opened = open_release(root).release
    assert opened.index is not None
    eid = opened.index.id_at(rows[0][1])
    assert _err(lambda: check_index(opened), IntegrityError) == (
        f"{prefix}: prefix index record 0 (bytes [0, {release_index.RECORD.size})): 3 blocks, entry {eid!r} holds "
        f"2 blocks of 16 tokens")
    assert struct.calcsize(release_index.RECORD.format) == release_index.RECORD.size


def test_a_changed_entry_file_whose_header_lists_no_tensor_is_named_header_to_its_end(rel: Path) -> None:
    """A file replaced, at its size, by a safetensors file of no tensors (its header fills it): the region named
    is the whole file."""
    import struct

    size = (rel / E1).stat().st_size
    raw = b"{}" + b" " * (size - 10)
    (rel / E1).write_bytes(struct.pack("<Q", len(raw)) + raw)
    sha = sha256_hex((rel / E1).read_bytes())
    m = _m(rel)
    want, eid = m["files"][E1]["sha256"], m["entries"][1]["id"]
    assert _err(lambda: check_release(rel), IntegrityError) == (
        f"{rel / E1}: sha256 {sha} does not match the manifest ({want}): entry {eid!r}: the safetensors header "
        f"region [0, {size}) differs (its tensor table no longer matches the manifest)")


def test_a_file_that_cannot_be_read_while_it_is_verified_is_named_with_the_cause(rel: Path, tmp_path: Path,
                                                                                 monkeypatch: pytest.MonkeyPatch
                                                                                 ) -> None:
    """An I/O error hashing a file (format 1: prefetched; format 2: hashed in the release's pass) names it and the
    errno; the control: the same releases verify."""
    import errno

    from kvgraft.errors import IOFailure
    from kvgraft.release import hashing
    from kvgraft.release import integrity as release_integrity

    v2 = tmp_path / "v2"
    make_release(v2, entries=2, seed=62, format_version=2)
    e1 = Release.open(v2).entry("rec-001")["file"]
    assert check_release(rel).root == rel and check_release(v2).root == v2  # the control
    bad = {rel / E1, v2 / e1}

    def eio(path: Path, *args: Any) -> tuple[str, int, list[str]]:
        if path in bad:
            raise OSError(errno.EIO, "Input/output error")
        return hashing.hash_file_ranges(path, *args)

    monkeypatch.setattr(release_integrity, "hash_file_ranges", eio)
    for root, name in ((rel, E1), (v2, e1)):
        assert _err(lambda r=root: check_release(r), IOFailure) == \
            f"{root / name}: cannot read: Input/output error (EIO)"


def test_a_file_that_grows_after_the_folder_was_listed_is_refused_by_its_size(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Format 2 (no prefetch): each file is hashed with the size the release lists, so one that changed size
    since the folder was checked is refused by its size, not read (and not reported as other bytes)."""
    from kvgraft.release import integrity as release_integrity

    root = tmp_path / "rel"
    make_release(root, entries=2, seed=63, format_version=2)
    name = Release.open(root).entry("rec-001")["file"]
    size = (root / name).stat().st_size
    listing = release_integrity._list

    def then_grow(*args: Any) -> Any:
        listed = listing(*args)
        with (root / name).open("ab") as f:
            f.write(b"\0")
        return listed

    monkeypatch.setattr(release_integrity, "_list", then_grow)
    assert _err(lambda: check_release(root), IntegrityError) == \
        f"{root / name}: {size + 1} bytes, the manifest says {size} (grown)"
    monkeypatch.undo()
    assert _err(lambda: check_release(root), IntegrityError) == \
        f"{root / name}: entry 'rec-001': {size + 1} bytes, the manifest says {size} (grown)"  # found by the listing


def test_names_whose_digests_collide_are_compared_exactly_and_counted(rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The folder's count is compared with the distinct names listed, counted by 64-bit digests; names whose
    digests collide (here every name: the digest made constant) make the counts differ, and the exact comparison
    of names then decides, and counts."""
    from kvgraft.release import integrity as release_integrity

    files = len(_m(rel)["files"])
    assert check_release(rel).count == 1 + files  # the control
    monkeypatch.setattr(release_integrity, "_name_key", lambda name: 7)
    assert check_release(rel).count == 1 + files
    (rel / "notes.txt").write_text("x")
    assert _err(lambda: check_release(rel), IntegrityError) == \
        f"{rel}: files differ from the manifest: not part of the release: notes.txt"


# ------------------------------------------------------------------ release, sample I (seed 8): survivors


def test_a_destination_buffer_smaller_than_the_ranges_is_refused_before_any_read(tmp_path: Path) -> None:
    from kvgraft.release.hashing import read_and_hash

    path = tmp_path / "data"
    path.write_bytes(b"x" * 20)
    dest = bytearray(15)
    assert _err(lambda: read_and_hash(path, [(0, 10), (10, 20)], memoryview(dest)), ValueError) == \
        "destination buffer too small"
    assert dest == bytearray(15)  # nothing read: the ranges are weighed first
    assert read_and_hash(path, [(0, 10), (10, 15)], memoryview(dest)) == [sha256_hex(b"x" * 10), sha256_hex(b"x" * 5)]


def test_an_unknown_entry_id_is_named_with_the_first_ten_ids(tmp_path: Path) -> None:
    root = tmp_path / "rel"
    make_release(root, entries=12, tokens=2, layers=1, seed=64)
    ids = Release.open(root).entry_ids()
    assert len(ids) == 12
    assert _err(lambda: Release.open(root).entry("nope"), InputError) == \
        f"{root}: no entry 'nope' (entries: {', '.join(ids[:10])})"


def test_records_asked_out_of_order_read_each_shard_once_in_release_order(indexed: Path) -> None:
    r = Release.open(indexed)
    assert r.index is not None
    got = r.records(["rec-003", "rec-001", "rec-002", "rec-000", "rec-003"])
    assert [e["id"] for e in got] == ["rec-003", "rec-001", "rec-002", "rec-000", "rec-003"]
    assert r.index.shards_read == [0, 1, 2, 3]


def test_a_grown_prefix_index_is_refused_by_verify_naming_its_size(indexed: Path, tmp_path: Path) -> None:
    """A file of the release that no entry uses (format 2: the prefix index) of another size is named by its size
    alone, with no entry; the control: the release intact."""
    from kvgraft.release import index as release_index

    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    assert check_release(root).root == root  # the control
    prefix = root / release_index.PREFIX_FILE
    size = prefix.stat().st_size
    with prefix.open("ab") as f:
        f.write(b"\0")
    assert _err(lambda: check_release(root), IntegrityError) == \
        f"{prefix}: {size + 1} bytes, the manifest says {size} (grown)"


def test_a_release_reached_through_a_link_is_read_again_when_the_folder_behind_it_is_replaced(
        rel: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What tells one folder from the next is the folder a link leads to, not the link (which stays as it was)."""
    link = tmp_path / "current"
    link.symlink_to(rel, target_is_directory=True)
    calls = _replaced_during_the_first_read(rel, tmp_path, monkeypatch)  # the folder behind the link
    assert check_release(link).root == link and len(calls) == 2


def test_an_index_shard_of_a_release_from_elsewhere_is_fetched_with_its_digest_and_size(indexed: Path) -> None:
    asked: list[tuple[Any, ...]] = []
    r = Release.open(indexed, _RecordingSource(indexed, asked))
    assert r.index is not None
    meta = r.index.shards[1]
    assert r.entry("rec-001")["id"] == "rec-001"
    assert asked == [(meta["file"], meta["sha256"], meta["size"], "index shard 1", None)]


def test_an_index_shard_that_is_a_symlink_is_refused_by_name(indexed: Path, tmp_path: Path) -> None:
    from kvgraft.release import index as release_index
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    shard = root / release_index.shard_name(1)
    shutil.copy(shard, tmp_path / "elsewhere.json")
    shard.unlink()
    shard.symlink_to(tmp_path / "elsewhere.json")
    assert _err(lambda: Release.open(root).entry("rec-001"), InputError) == \
        f"{shard}: index shard 1 is a symlink; releases may not contain links"


def test_an_index_shard_that_is_not_json_is_refused_by_name(indexed: Path, tmp_path: Path) -> None:
    from kvgraft.release import index as release_index
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    shard = root / release_index.shard_name(1)
    data = b"{not json"
    shard.write_bytes(data)
    _v2_manifest(root, lambda m: m["index"]["shards"][1].update(sha256=sha256_hex(data), size=len(data)))
    assert _err(lambda: Release.open(root).entry("rec-001"), InputError).startswith(f"{shard}: invalid JSON")


def test_a_record_handed_out_again_by_its_shard_is_not_checked_again(indexed: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.release import index as release_index
    checks: list[str] = []
    real = release_index.check_entry_record

    def counted(where: Path, entry: dict[str, Any], files: dict[str, Any], num_layers: int, **how: Any) -> None:
        checks.append(entry["id"])
        real(where, entry, files, num_layers, **how)

    monkeypatch.setattr(release_index, "check_entry_record", counted)
    r = Release.open(indexed)
    assert r.index is not None
    shard = r.index.shard(2)
    assert shard.record("rec-002") is shard.record("rec-002") and checks == ["rec-002"]


def test_a_list_of_every_file_naming_one_the_release_lacks_is_refused_by_its_first_name(tmp_path: Path) -> None:
    """A list that names every file (an OMS list, `every_file`), not taken as naming files beside the release: a
    name beyond the release's files is refused, the first of them named; the control: the list as it is."""
    root = tmp_path / "rel"
    make_release(root, entries=2, seed=66, format_version=2)
    every = listed_digests(root)
    assert check_release(root, Listing(every, "L", every_file=True)).root == root  # the control
    more = {**every, "zz.bin": "2" * 64, "extra/a.bin": "3" * 64}
    assert _err(lambda: check_release(root, Listing(more, "L", every_file=True)), VerificationError) == \
        f"{root / 'extra/a.bin'}: the L lists sha256 {'3' * 64} and the manifest None"


def test_an_index_shard_of_another_format_is_refused_by_name(indexed: Path, tmp_path: Path) -> None:
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    path = _rewrite_shard(root, 1, lambda doc: doc.update(format="something-else"))
    assert _err(lambda: Release.open(root).entry("rec-001"), InputError) == f"{path}: not a kvgraft index shard"


def test_a_signed_manifest_above_the_limit_is_refused_as_a_manifest(rel: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A manifest whose signature was checked is bounded by MAX_MANIFEST_BYTES alone (lowered here), and named as a
    manifest (not as an unsigned one, with its ratio); the control: the bound it fits."""
    from kvgraft.release import format as release_format

    size, subjects = (rel / MANIFEST).stat().st_size, listed_digests(rel)
    monkeypatch.setattr(release_format, "MAX_MANIFEST_BYTES", size)
    assert check_release(rel, Listing(subjects, "statement", vouched=True)).manifest_size == size  # the control
    monkeypatch.setattr(release_format, "MAX_MANIFEST_BYTES", size - 1)
    assert _err(lambda: check_release(rel, Listing(subjects, "statement", vouched=True)), InputError) == \
        f"{rel / MANIFEST}: {size} bytes exceeds the {size - 1}-byte limit for a manifest"


def test_a_layer_naming_a_keys_tensor_its_entry_lacks_is_refused(rel: Path) -> None:
    e = _m(rel)["entries"][2]
    assert Release.open(rel).entry(e["id"])["layers"][0]["keys"] == "layer.0.keys"  # the control
    rewrite.manifest(rel, lambda m: m["entries"][2]["layers"][0].update(keys="layer.0.keyz"))
    assert _err(lambda: Release.open(rel), InputError) == \
        f"{rel / MANIFEST}: entry {e['id']!r} layer 0: tensor 'layer.0.keyz' is not listed"


def test_a_safetensors_header_entry_of_other_fields_is_refused_naming_its_tensor(tmp_path: Path) -> None:
    """Each tensor's header entry has exactly dtype, shape and data_offsets: one more field, one fewer, or not an
    object is refused by the tensor's name; the control: the same tensor as written."""
    from kvgraft.release import safetensors_header as stfile

    t = {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}
    assert list(stfile.read_header(_header_file(tmp_path / "good", {"a": t}, 8))[0]) == ["a"]
    for i, entry in enumerate(({**t, "extra": 1}, {k: v for k, v in t.items() if k != "shape"}, [0, 8])):
        path = _header_file(tmp_path / f"bad{i}", {"a": t, "b": entry}, 16)
        assert _err(lambda p=path: stfile.read_header(p), InputError) == f"{path}: tensor 'b': malformed header entry"


def test_an_index_shard_that_grows_while_it_is_read_is_refused_naming_both_sizes(indexed: Path,
                                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The shard's size is checked when it is opened and again on what was read (one byte more is asked for):
    a shard that grew in between (here the read made to return one byte more) is refused with both sizes."""
    from kvgraft._internal import jsonio
    from kvgraft.release import index as release_index

    path = indexed / release_index.shard_name(1)
    size = path.stat().st_size
    real = jsonio.read_fd_bounded

    def grown(fd: int, limit: int) -> bytes:
        return real(fd, limit) + b" "

    monkeypatch.setattr(jsonio, "read_fd_bounded", grown)
    assert _err(lambda: Release.open(indexed).entry("rec-001"), IntegrityError) == \
        f"{path}: index shard 1: {size + 1} bytes, the manifest says {size} (grown) (changed while it was read)"


def test_hashing_works_where_the_file_system_refuses_the_read_ahead_advice(rel: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    import errno

    from kvgraft.release.hashing import hash_file

    def refused(*_args: Any) -> None:
        raise OSError(errno.ESPIPE, "Illegal seek")

    path = rel / E0
    data = path.read_bytes()
    monkeypatch.setattr(os, "posix_fadvise", refused)
    assert hash_file(path) == (sha256_hex(data), len(data))


def test_a_truncated_index_shard_is_named_truncated(indexed: Path, tmp_path: Path) -> None:
    from kvgraft.release import index as release_index
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    shard = root / release_index.shard_name(1)
    size = shard.stat().st_size
    os.truncate(shard, size - 1)
    assert _err(lambda: Release.open(root).entry("rec-001"), IntegrityError) == \
        f"{shard}: index shard 1: {size - 1} bytes, the manifest says {size} (truncated)"


def test_a_format_2_release_without_a_prefix_index_finds_prefixes_from_its_records(indexed: Path,
                                                                                   tmp_path: Path) -> None:
    """The prefix index is optional in a format-2 manifest: without it, lookups use the entries' token ids."""
    root = Path(shutil.copytree(indexed, tmp_path / "rel"))
    _v2_manifest(root, lambda m: m["index"].pop("prefix"))
    r = Release.open(root)
    assert r.index is not None and r.index.prefix_meta is None
    ids = r.entry("rec-002")["token_ids"]
    hit = r.longest_prefix(ids)
    assert hit is not None and (hit[0]["id"], hit[1]) == ("rec-002", 32)


def test_a_range_longer_than_one_read_block_is_read_and_hashed_whole(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A range is read a block at a time (the block lowered here to 1 KiB): every block from where the last ended."""
    from kvgraft.release import hashing

    data = os.urandom(5000)
    path = tmp_path / "data"
    path.write_bytes(data)
    monkeypatch.setattr(hashing, "BLOCK", 1024)
    dest = bytearray(4900)
    assert hashing.read_and_hash(path, [(100, 5000)], memoryview(dest)) == [sha256_hex(data[100:])]
    assert bytes(dest) == data[100:]


def test_a_file_shorter_than_a_safetensors_length_field_is_refused_by_name(tmp_path: Path) -> None:
    from kvgraft.release import safetensors_header as stfile
    path = tmp_path / "short.safetensors"
    path.write_bytes(b"\x01\x00\x00")
    assert _err(lambda: stfile.read_raw_header(path), InputError) == \
        f"{path}: not a safetensors file (shorter than 8 bytes)"


def _replaced_during_the_first_read(folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`_check_release` patched so that its first read meets `folder` and then sees it replaced by an intact copy
    (and fails, as a read across a replace does); later reads are real. Returns the list of calls made."""
    from kvgraft.release import integrity
    intact = Path(shutil.copytree(folder, tmp_path / "intact"))
    real = integrity._check_release
    calls: list[int] = []

    def replaced_while_read(root: Path, **options: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            shutil.move(folder, tmp_path / "old")
            shutil.move(intact, folder)
            raise IntegrityError(f"{root}: read across a replace")
        return real(root, **options)

    monkeypatch.setattr(integrity, "_check_release", replaced_while_read)
    return calls
