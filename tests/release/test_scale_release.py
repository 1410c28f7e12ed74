"""The indexed release (format 2) and verification at the cost of what is used.

Bytes read are counted through the OS calls every kvgraft reader uses (os.pread, os.preadv, os.read
on descriptors from os.open), per file: no timing.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from kvgraft._internal.digest import sha256_hex
from kvgraft._internal.jsonio import canonical
from kvgraft.errors import InputError, IntegrityError, VerificationError
from kvgraft.inference.graft import read_entry_tensors
from kvgraft.release import index as release_index
from kvgraft.release.format import Release
from kvgraft.release.records import MANIFEST, entry_digest, root_digest, token_ids_digest
from kvgraft.signing import keys, sign
from kvgraft.signing.policy import Entries, OwnOutput, SignatureNotChecked, SignedWithKeys, verify_policy
from kvgraft.signing.verify import verified
from tests.verifying import verify_result

from release_factory import make_many, make_release


class ReadCounter:
    """Bytes read per file path through os.open'ed descriptors."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.paths: dict[int, str] = {}
        self.bytes: dict[str, int] = defaultdict(int)
        real_open, real_pread, real_preadv, real_read = os.open, os.pread, os.preadv, os.read

        def o(path: Any, *a: Any, **k: Any) -> int:
            fd = real_open(path, *a, **k)
            self.paths[fd] = os.path.realpath(os.fspath(path))
            return fd

        def pread(fd: int, n: int, off: int) -> bytes:
            data = real_pread(fd, n, off)
            self.bytes[self.paths.get(fd, f"fd{fd}")] += len(data)
            return data

        def preadv(fd: int, bufs: Any, off: int, *a: Any) -> int:
            n = real_preadv(fd, bufs, off, *a)
            self.bytes[self.paths.get(fd, f"fd{fd}")] += n
            return n

        def read(fd: int, n: int) -> bytes:
            data = real_read(fd, n)
            self.bytes[self.paths.get(fd, f"fd{fd}")] += len(data)
            return data

        monkeypatch.setattr(os, "open", o)
        monkeypatch.setattr(os, "pread", pread)
        monkeypatch.setattr(os, "preadv", preadv)
        monkeypatch.setattr(os, "read", read)

    def under(self, folder: Path) -> int:
        prefix = os.path.realpath(folder) + os.sep
        return sum(n for p, n in self.bytes.items() if p.startswith(prefix))

    def reset(self) -> None:
        self.bytes.clear()


@pytest.fixture
def counter(monkeypatch: pytest.MonkeyPatch) -> Iterator[ReadCounter]:
    yield ReadCounter(monkeypatch)


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("keys") / "signer")


@pytest.fixture
def signed_v2(tmp_path: Path, keypair: tuple[Path, Path]) -> Path:
    rel = tmp_path / "rel"
    make_release(rel, entries=10, tokens=40, format_version=2, shard_entries=4)
    sign.sign_release(rel, keys.load_private_key(keypair[0]))
    return rel


def test_startup_reads_no_entry_bytes(signed_v2: Path, keypair: tuple[Path, Path], counter: ReadCounter) -> None:
    checked = verified(signed_v2, verify_policy(key=keypair[1], require_signature=True))
    rel = checked.release
    assert counter.under(signed_v2 / "entries") == 0
    assert counter.under(signed_v2 / "index") == 0  # not even a shard: opening reads manifest.json
    assert counter.bytes[os.path.realpath(signed_v2 / MANIFEST)] == (signed_v2 / MANIFEST).stat().st_size
    # Positive control: using one entry reads that entry's file (and its shard), no other.
    entry = rel.entry("rec-005")
    read_entry_tensors(checked, entry)
    used = os.path.realpath(signed_v2 / entry["file"])
    assert counter.bytes[used] >= sum(t["byte_range"][1] - t["byte_range"][0] for t in entry["tensors"].values())
    assert counter.under(signed_v2 / "entries") == counter.bytes[used]
    assert counter.under(signed_v2 / "index") == (signed_v2 / release_index.shard_name(1)).stat().st_size


def test_v1_release_opens_without_entry_bytes(tmp_path: Path, counter: ReadCounter) -> None:
    make_release(tmp_path / "v1", entries=4, format_version=1)
    checked = verified(tmp_path / "v1", SignatureNotChecked())
    rel = checked.release
    assert rel.format_version == 1 and counter.under(tmp_path / "v1" / "entries") == 0
    read_entry_tensors(checked, rel.entry("rec-002"))
    assert counter.under(tmp_path / "v1" / "entries") > 0


def _flip(path: Path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= 0x01
    path.write_bytes(bytes(data))


def test_tampered_entry_refused_when_used(signed_v2: Path, keypair: tuple[Path, Path]) -> None:
    policy = verify_policy(key=keypair[1])
    checked = verified(signed_v2, policy)
    rel = checked.release
    victim = rel.entry("rec-003")
    name = sorted(victim["tensors"])[1]
    start = victim["tensors"][name]["byte_range"][0]
    _flip(signed_v2 / victim["file"], start + 3)
    read_entry_tensors(checked, rel.entry("rec-000"))  # another entry is still served
    with pytest.raises(IntegrityError, match=rf"entry 'rec-003' tensor '{name}' bytes \[{start}, "):
        read_entry_tensors(checked, rel.entry("rec-003"))
    with pytest.raises(IntegrityError, match=rf"entry 'rec-003' tensor '{name}'"):
        verify_result(signed_v2, policy)  # everything: still refused
    with pytest.raises(IntegrityError, match="rec-003"):
        verify_result(signed_v2, policy, Entries(("rec-003",)))
    ok = verify_result(signed_v2, policy, Entries(("rec-000", "rec-009")))
    assert ok.scope == "entries" and ok.checked_entries == ["rec-000", "rec-009"]


def test_swapped_entry_files_refused(signed_v2: Path, keypair: tuple[Path, Path]) -> None:
    checked = verified(signed_v2, verify_policy(key=keypair[1]))
    rel = checked.release
    a, b = rel.entry("rec-001"), rel.entry("rec-002")
    pa, pb = signed_v2 / a["file"], signed_v2 / b["file"]
    tmp = pa.with_suffix(".tmp")
    pa.rename(tmp)
    pb.rename(pa)
    tmp.rename(pb)
    for entry in (a, b):
        # its header names the other entry (safetensors metadata): refused before any tensor is read
        with pytest.raises(IntegrityError, match=rf"entry '{entry['id']}': safetensors header bytes \[0, "):
            read_entry_tensors(checked, entry)
    with pytest.raises(IntegrityError, match="swapped"):
        verify_result(signed_v2, SignedWithKeys((keypair[1],)))


def test_truncated_and_rewritten_after_open(signed_v2: Path, keypair: tuple[Path, Path]) -> None:
    checked = verified(signed_v2, verify_policy(key=keypair[1]))
    rel = checked.release
    entry = rel.entry("rec-004")
    read_entry_tensors(checked, entry)  # read once: its header is now known
    path = signed_v2 / entry["file"]
    original = path.read_bytes()
    # rewritten in place, same size, after it was last read: refused at the next read
    name = sorted(entry["tensors"])[0]
    _flip(path, entry["tensors"][name]["byte_range"][1] - 1)
    with pytest.raises(IntegrityError, match=rf"entry 'rec-004' tensor '{name}'"):
        read_entry_tensors(checked, entry)
    path.write_bytes(original)
    read_entry_tensors(checked, entry)  # restored: served again (the refusal was about those bytes)
    with path.open("r+b") as fh:
        fh.truncate(len(original) - 10)
    with pytest.raises(IntegrityError, match=r"rec-004.*bytes, manifest says"):
        read_entry_tensors(checked, entry)


def test_signed_root_binds_every_record(signed_v2: Path, keypair: tuple[Path, Path]) -> None:
    """A shard rewritten with consistent digests (an entry claiming other token ids) is refused at
    use; with manifest and root digest rewritten too, the signature refuses it at open."""
    shard_path = signed_v2 / release_index.shard_name(0)
    doc = json.loads(shard_path.read_text())
    ids = doc["entries"][1]["token_ids"]
    ids[0] = ids[0] + 1 if ids[0] % 10 != 9 else ids[0] - 1  # same length: the shard keeps its size
    doc["entries"][1]["token_ids_sha256"] = token_ids_digest(ids)
    doc["entries"][1]["digest"] = entry_digest(doc["entries"][1])
    data = canonical(doc)
    assert len(data) == (signed_v2 / release_index.shard_name(0)).stat().st_size
    shard_path.write_bytes(data)
    checked = verified(signed_v2, verify_policy(key=keypair[1]))
    rel = checked.release
    rel.entry("rec-004")  # another shard: served
    with pytest.raises(IntegrityError, match=r"index shard 0: sha256 .* does not match the manifest"):
        rel.entry("rec-001")
    manifest = json.loads((signed_v2 / MANIFEST).read_text())
    manifest["index"]["shards"][0].update(sha256=sha256_hex(data), size=len(data))
    manifest["root_digest"] = root_digest(manifest)
    (signed_v2 / MANIFEST).write_text(json.dumps(manifest))
    with pytest.raises(IntegrityError, match=r"manifest.json: sha256 .* does not match the signed statement"):
        verified(signed_v2, verify_policy(key=keypair[1]))
    # Unsigned, the consistent rewrite opens: only a signature (or a recompute) can tell.
    (signed_v2 / "release.sigstore.json").unlink()
    (signed_v2 / "model.sig").unlink(missing_ok=True)
    unsigned = verified(signed_v2, SignatureNotChecked())
    assert unsigned.release.entry("rec-001")["token_ids"][0] == doc["entries"][1]["token_ids"][0]


def test_oms_only_release_per_entry(signed_v2: Path, keypair: tuple[Path, Path]) -> None:
    (signed_v2 / "release.sigstore.json").unlink()
    if not (signed_v2 / "model.sig").exists():
        pytest.skip("the test key makes no OMS signature")
    # model.sig lists release.sigstore.json: without it the list differs, which the open check sees
    with pytest.raises(VerificationError, match=r"release\.sigstore\.json"):
        verified(signed_v2, verify_policy(key=keypair[1]))


def test_ten_thousand_entries_open_bounded_by_index(tmp_path: Path, counter: ReadCounter) -> None:
    root = tmp_path / "big"
    n = 10_000
    make_many(root, entries=n)  # ~15 s on a 2-core VM: the writer's per-record digests
    counter.reset()
    rel = Release.open(root)
    manifest_size = (root / MANIFEST).stat().st_size
    assert rel.num_entries == n
    assert counter.under(root) == manifest_size
    assert manifest_size < 60 * n + 20_000  # ~40 bytes of index per entry (its id in its shard's list)
    entry = rel.entry("rec-7777")
    assert entry["id"] == "rec-7777"
    shard = root / release_index.shard_name(7777 // release_index.SHARD_ENTRIES)
    assert counter.under(root) == manifest_size + shard.stat().st_size  # one shard, nothing else
    assert counter.under(root / "entries") == 0


def test_prefix_lookup_hit_miss_partial(tmp_path: Path) -> None:
    make_release(tmp_path / "p", entries=6, tokens=50, format_version=2, shard_entries=4)
    rel = Release.open(tmp_path / "p")
    entry = rel.entry("rec-004")
    ids = list(entry["token_ids"])
    b = release_index.BLOCK_TOKENS
    hit = rel.longest_prefix([*ids, 1, 2, 3])
    assert hit is not None and hit[0]["id"] == "rec-004" and hit[1] == 48  # 3 whole blocks of 50 tokens
    partial = rel.longest_prefix([*ids[:2 * b], ids[2 * b] + 1, *ids[2 * b + 1:]])
    assert partial is not None and partial[0]["id"] == "rec-004" and partial[1] == 2 * b
    assert rel.longest_prefix([ids[0] + 1, *ids[1:]]) is None  # first block differs: a miss
    assert rel.longest_prefix(ids[:b - 1]) is None  # shorter than a block
    assert rel.longest_prefix(ids, block_tokens=32) == (entry, 32)
    # a format-1 release gives the same answers from its manifest
    make_release(tmp_path / "p1", entries=6, tokens=50, format_version=1)
    v1 = Release.open(tmp_path / "p1")
    got = v1.longest_prefix([*ids, 1])
    assert got is not None and got[0]["id"] == "rec-004" and got[1] == 48


def test_tampered_prefix_index_refused(tmp_path: Path) -> None:
    make_release(tmp_path / "p", entries=3, tokens=40, format_version=2)
    path = tmp_path / "p" / release_index.PREFIX_FILE
    _flip(path, 40)
    rel = Release.open(tmp_path / "p")
    with pytest.raises(IntegrityError, match="prefix index: sha256"):
        rel.longest_prefix(rel.entry("rec-001")["token_ids"])


def test_v2_full_verify_counts_every_file(tmp_path: Path) -> None:
    m = make_release(tmp_path / "r", entries=9, format_version=2, shard_entries=4)
    result = verify_result(tmp_path / "r")
    # manifest.json + 3 shards + the prefix index + 9 entry files
    assert result.files == 1 + 3 + 1 + 9 and result.entries == 9 and result.scope == "all"
    assert result.root_digest == m["root_digest"]
    extra = tmp_path / "r" / "entries" / "stray.bin"
    extra.write_bytes(b"x")
    with pytest.raises(IntegrityError, match="not part of the release"):
        verify_result(tmp_path / "r")
    verify_result(tmp_path / "r", None, Entries(("rec-000",)))  # per entry: the stray file is not looked at
    shutil.rmtree(tmp_path / "r" / "entries" / "00000")
    with pytest.raises(IntegrityError, match="missing"):
        verify_result(tmp_path / "r", None, Entries(("rec-001",)))


def test_prefix_graft_hit_miss_partial(tiny_lm: Any, tmp_path: Path) -> None:
    """The transformers path: the longest block-aligned prefix of a prompt that an entry starts with
    is grafted (rows [0, n) of the verified entry), a miss grafts nothing, a prompt that leaves the
    entry after two blocks gets those two blocks; the graft records the schedule of those rows."""
    import torch

    from kvgraft.inference import capture, graft
    from kvgraft.inference.runtime import encode

    lm = tiny_lm("llama")
    text = " ".join(f"w{i}" for i in range(60))
    capture.capture(lm, [("t", {"id": "long", "text": text})], tmp_path / "rel", probe_tokens=0)
    checked = verified(tmp_path / "rel", SignatureNotChecked())
    rel = checked.release
    entry = rel.entry("long")
    ids = list(entry["token_ids"])
    b = release_index.BLOCK_TOKENS
    assert len(ids) >= 3 * b + 1
    stored, _ = read_entry_tensors(checked, entry)

    hit = graft.restore_prefix(checked, [*ids[:3 * b + 2], *encode(lm, " and more")], lm)
    assert hit is not None and hit.prefix is not None
    assert hit.prefix["tokens"] == 3 * b and hit.prefix["of"] == len(ids) and hit.entry["num_tokens"] == 3 * b
    assert hit.prefix["schedule"] == rel.manifest["schedule"] and "one-shot prefill of all" in hit.prefix["rows"]
    layer = hit.cache.layers[0]
    assert layer.keys.shape[-2] == 3 * b
    assert torch.equal(layer.keys, stored["layer.0.keys"][:, :, :3 * b, :])  # the verified rows, as stored

    partial = graft.restore_prefix(checked, [*ids[:2 * b], ids[2 * b] + 1, *ids[2 * b + 1:]], lm)
    assert partial is not None and partial.prefix is not None and partial.prefix["tokens"] == 2 * b

    assert graft.restore_prefix(checked, [ids[0] + 1, *ids[1:]], lm) is None  # the first block differs: a miss
    whole = graft.restore_prefix(checked, ids, lm)  # the whole prompt: one token is left to prefill
    assert whole is not None and whole.prefix is not None and whole.prefix["tokens"] == (len(ids) - 1) // b * b


def test_sliding_layers_window_or_every_position(tiny_lm: Any, tmp_path: Path) -> None:
    """Tiny Gemma 3 (window 8): a capture records its sliding layers as their window; a release that
    stores every position of them grafts the same cache (the window is cut at graft) and can be
    prefix-grafted, which a window-stored one cannot; a window record holding more is refused."""
    import torch
    from transformers.cache_utils import DynamicCache

    from kvgraft.inference import capture, graft
    from kvgraft.inference.runtime import Schedule, layer_map, prefill
    from kvgraft.release.format import ReleaseWriter

    lm = tiny_lm("gemma3")
    text = " ".join(f"w{i}" for i in range(40))
    capture.capture(lm, [("t", {"id": "g", "text": text})], tmp_path / "win", probe_tokens=0)
    win = verified(tmp_path / "win", SignatureNotChecked())
    entry = win.release.entry("g")
    sliding = [m for m in entry["layers"] if m["kind"] == "sliding"]
    assert sliding and all(m["stores"] == "window" and m["positions"][1] - m["positions"][0] == m["sliding_window"] - 1
                           for m in sliding)
    assert all(m["stores"] == "all" for m in entry["layers"] if m["kind"] == "full")
    n_tokens = entry["num_tokens"]

    # the same prefill into a cache that keeps every position of every layer
    with torch.no_grad():
        full_cache, _ = prefill(lm, entry["token_ids"], Schedule(), cache=DynamicCache())
    _, every = layer_map(lm, full_cache)  # all DynamicLayer: every position
    layers = []
    for m in entry["layers"]:
        meta = dict(m)
        if m["kind"] == "sliding":
            meta.update(stores="all", positions=[0, n_tokens])
        layers.append(meta)
    record = {k: entry[k] for k in ("id", "num_tokens", "token_ids", "token_ids_sha256", "source", "next_token")}
    writer = ReleaseWriter(tmp_path / "all")
    writer.add_entry({**record, "layers": layers}, every)
    writer.finish({k: win.manifest[k] for k in ("model", "schedule", "environment")})
    alls = verified(tmp_path / "all", OwnOutput("the release this test wrote"))

    a = graft.restore(win, "g", lm).cache
    b = graft.restore(alls, "g", lm).cache
    for m in sliding:
        la, lb = a.layers[m["index"]], b.layers[m["index"]]
        assert lb.keys.shape == la.keys.shape and torch.equal(lb.keys, la.keys) and torch.equal(lb.values, la.values)
        assert lb.cumulative_length == la.cumulative_length == n_tokens

    ids = entry["token_ids"]
    b16 = release_index.BLOCK_TOKENS
    cut = graft.restore_prefix(alls, [*ids[:b16], ids[b16] + 1], lm)
    assert cut is not None and cut.prefix is not None and cut.prefix["tokens"] == b16
    assert cut.cache.layers[sliding[0]["index"]].keys.shape[-2] == sliding[0]["sliding_window"] - 1
    with torch.no_grad():
        fresh, _ = prefill(lm, ids[:b16], Schedule())
    w = sliding[0]["index"]  # the prefix's own window: its last positions, as a prefill of b16 tokens keeps
    assert torch.allclose(cut.cache.layers[w].keys, fresh.layers[w].keys, atol=1e-5)
    # Unusable input (exit 2), not damaged bytes; its positions written as inspect writes them, [a, b).
    with pytest.raises(InputError, match=r"positions \[\d+, \d+\), window\); a prefix graft needs every layer"):
        graft.restore_prefix(win, [*ids[:b16], ids[b16] + 1], lm)

    def claim_window(m: dict[str, Any]) -> dict[str, Any]:
        return {**m, "stores": "window"} if m["kind"] == "sliding" else m

    liar = {**alls.release.entry("g"), "layers": [claim_window(m) for m in layers]}
    tensors, _ = read_entry_tensors(alls, alls.release.entry("g"))
    with pytest.raises(IntegrityError, match="stores its window of 7 positions but holds"):
        graft.build_cache(lm, liar, tensors, "test")


def test_prefix_index_naming_another_entry_never_grafts_it(tmp_path: Path) -> None:
    """An (unsigned) release whose prefix index, manifest and root were rewritten consistently so that
    an entry's block chain names another entry: the lookup compares the named record's token ids."""
    import struct

    root = tmp_path / "p"
    make_release(root, entries=2, tokens=40, format_version=2)
    path = root / release_index.PREFIX_FILE
    data = bytearray(path.read_bytes())
    for at in range(0, len(data), release_index.RECORD.size):
        h, ordinal, k = release_index.RECORD.unpack_from(data, at)
        struct.pack_into("<32sII", data, at, h, 1 - ordinal, k)  # every chain names the other entry
    path.write_bytes(bytes(data))
    manifest = json.loads((root / MANIFEST).read_text())
    manifest["index"]["prefix"]["sha256"] = sha256_hex(bytes(data))
    manifest["root_digest"] = root_digest(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest))
    checked = verified(root, SignatureNotChecked())
    rel = checked.release
    with pytest.raises(IntegrityError, match="does not start with the prompt's first 32 tokens"):
        rel.longest_prefix(rel.entry("rec-000")["token_ids"])


def test_prefix_audit_judges_under_the_recorded_schedule(tiny_lm: Any, tmp_path: Path) -> None:
    """Rows [0, n) of a graft are judged against a fresh prefill of all T tokens (the graft's claim)
    and compared with a prefill of the n tokens alone (recorded); an altered stored row is found."""
    import torch

    from kvgraft.inference import capture
    from kvgraft.inference.runtime import Schedule, layer_map, prefill
    from kvgraft.recompute.prefix import audit_prefix
    from kvgraft.signing.policy import SignatureNotChecked
    from kvgraft.signing.verify import verified

    import rewrite
    from release_factory import as_format_1

    lm = tiny_lm("llama")
    text = " ".join(f"w{i}" for i in range(50))
    capture.capture(lm, [("t", {"id": "p", "text": text})], tmp_path / "rel", probe_tokens=0)
    n = 32
    result = audit_prefix(verified(tmp_path / "rel", SignatureNotChecked()), "p", n, lm)
    assert result["verdict"] == "byte-exact" and result["under_recorded_schedule"]["byte_exact"]
    assert result["rows"].startswith(f"rows [0, {n}) of a one-shot prefill of all")
    assert result["schedule"] == Release.open(tmp_path / "rel").manifest["schedule"]
    ids = Release.open(tmp_path / "rel").entry("p")["token_ids"]
    with torch.no_grad():
        whole, _ = prefill(lm, ids, Schedule())
        alone, _ = prefill(lm, ids[:n], Schedule())
    _, w = layer_map(lm, whole)
    _, a = layer_map(lm, alone)
    same = all(torch.equal(w[k][:, :, :n, :], a[k]) for k in a)  # this machine's answer, computed here
    assert result["against_prefix_alone"]["byte_exact"] == same
    # a difference from the prefix alone is judged by the noise bound of the n-token computation
    assert result["against_prefix_alone"]["verdict"] == ("byte-exact" if same else "consistent")

    as_format_1(tmp_path / "rel")
    rewrite.element(tmp_path / "rel", 0, "layer.1.values", 3, lambda x: x + 0.5)  # row 0, within the prefix
    altered = audit_prefix(verified(tmp_path / "rel", SignatureNotChecked()), "p", n, lm)
    assert altered["verdict"] == "inconsistent" and not altered["byte_exact"]
    assert altered["under_recorded_schedule"]["first_differing_tensor"] == "layer.1.values"
    assert altered["under_recorded_schedule"]["first_outside_tensor"] == "layer.1.values"
    assert altered["against_prefix_alone"]["verdict"] == "inconsistent"


def test_verify_cli_entry_option(signed_v2: Path, keypair: tuple[Path, Path]) -> None:
    from typer.testing import CliRunner

    from kvgraft.cli import app

    runner = CliRunner()
    args = ["verify", str(signed_v2), "--key", str(keypair[1]), "--entry", "rec-002", "--entry", "rec-007", "--json"]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    assert doc["scope"] == "entries" and doc["checked_entries"] == ["rec-002", "rec-007"] and doc["entries"] == 10
    entry = Release.open(signed_v2).entry("rec-007")
    _flip(signed_v2 / entry["file"], entry["tensors"]["layer.0.keys"]["byte_range"][0])
    assert runner.invoke(app, args).exit_code == 1
    assert runner.invoke(app, [*args[:4], "--entry", "rec-002"]).exit_code == 0  # another entry: not read
    assert runner.invoke(app, ["verify", str(signed_v2), "--key", str(keypair[1])]).exit_code == 1
