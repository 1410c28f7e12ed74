"""Each check of the security and verdict core fails a test when it is broken.

Every test here was run red against a hand-made mutant of the check it names (the list, mutant ->
test, is in docs/mutation.md). They go through the public API and the release's bytes: a statement
or an OMS signature validly signed over another file set, a manifest with a stale digest, a file
changed after it was verified, a release of entries with different verdicts, a NaN planted where the
fresh value is finite, a tensor stored in another shape, and recorded conditions a recompute must
replay.
"""

from __future__ import annotations

import base64
import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import IntegrityError, VerificationError
from kvgraft.release.format import Release
from kvgraft.release.records import MANIFEST
from kvgraft.signing import attest, keys, oms, sign
from kvgraft.signing.policy import SignatureNotChecked, SignedWithKeys, verify_policy
from kvgraft.signing.verify import verified
from tests.verifying import verify_result

import rewrite
from release_factory import listed_digests, release_fixtures

ENTRY_FILE = "entries/00000.safetensors"


# --------------------------------------------------------------------------- signed releases, no model


@pytest.fixture(scope="module")
def keypair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("keys") / "signer")


@pytest.fixture(scope="module")
def other_key(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    return keys.write_keypair(tmp_path_factory.mktemp("keys") / "other")


base, rel = release_fixtures(entries=2, seed=26)



def _sign_statement(root: Path, private: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Write a release.sigstore.json whose statement (the one kvgraft would sign, then `change`d) is
    validly signed with the key; any OMS signature is removed (it would list the old bundle)."""
    data = (root / MANIFEST).read_bytes()
    stmt = attest.statement(json.loads(data), sha256_hex(data), len(data))
    change(stmt)
    payload = attest.statement_bytes(stmt)
    key = keys.load_private_key(private)
    sig = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    attest.write_bundle(root, (json.dumps(attest.key_bundle(payload, sig, keys.key_id(key))) + "\n").encode())
    (root / attest.OMS_NAME).unlink(missing_ok=True)


def _sign_oms_statement(root: Path, private: Path, digests: dict[str, str],
                        change: Callable[[dict[str, Any]], None] | None = None) -> None:
    """Write RELEASE/model.sig over `digests`, validly signed with the key, its statement `change`d first."""
    stmt = oms.statement(root, digests)
    if change is not None:
        change(stmt)
    payload = (json.dumps(stmt, indent=2) + "\n").encode()
    key = keys.load_private_key(private)
    sig = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    bundle = {"mediaType": attest.BUNDLE_MEDIA_TYPE,
              "verificationMaterial": {"publicKey": {"hint": keys.key_id(key)}, "tlogEntries": []},
              "dsseEnvelope": {"payload": base64.b64encode(payload).decode(), "payloadType": attest.PAYLOAD_TYPE,
                               "signatures": [{"sig": base64.b64encode(sig).decode()}]}}
    (root / attest.OMS_NAME).write_text(json.dumps(bundle))


def test_signed_statement_listing_another_digest_for_a_file_is_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    """Step 3: the statement's subjects against the manifest's files (the predicate still matches)."""
    _sign_statement(rel, keypair[0], lambda s: next(x for x in s["subject"] if x["name"] == ENTRY_FILE)
                    ["digest"].update(sha256="ab" * 32))
    for key in (keypair[1], None):  # signature checked, and only read
        with pytest.raises(VerificationError, match=f"{ENTRY_FILE}: the .*statement.* lists sha256 abab"):
            verify_result(rel, verify_policy(key=key))  # None: the signature only read


def test_signed_statement_listing_a_file_the_manifest_does_not_is_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    def add(s: dict[str, Any]) -> None:
        s["subject"].append({"name": "extra.bin", "digest": {"sha256": "cd" * 32}})
        s["predicate"]["num_files"] += 1  # what a signer of that file set would state

    _sign_statement(rel, keypair[0], add)
    with pytest.raises(VerificationError, match=r"extra\.bin: the signed statement lists sha256 cdcd"):
        verify_result(rel, SignedWithKeys((keypair[1],)))


def test_control_a_statement_signed_over_the_release_itself_verifies(rel: Path, keypair: tuple[Path, Path]) -> None:
    _sign_statement(rel, keypair[0], lambda s: None)
    assert verify_result(rel, SignedWithKeys((keypair[1],))).signature.status == "verified"


def test_oms_signature_over_another_file_list_beside_the_bundle_is_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    """verify.py: the OMS resources against the release's files, when a kvgraft bundle is the statement."""
    signed = sign.sign_release(rel, keys.load_private_key(keypair[0]))
    assert signed.oms is not None
    bundle_sha = sha256_hex((rel / attest.BUNDLE_NAME).read_bytes())
    _sign_oms_statement(rel, keypair[0], {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha, ENTRY_FILE: "ef" * 32})
    for key in (keypair[1], None):
        with pytest.raises(VerificationError, match=r"model\.sig: the OpenSSF model signing signature lists other files"):
            verify_result(rel, verify_policy(key=key))  # None: the signature only read
    # Control: the same signature over the release's own files verifies.
    _sign_oms_statement(rel, keypair[0], {**listed_digests(rel), attest.BUNDLE_NAME: bundle_sha})
    assert verify_result(rel, SignedWithKeys((keypair[1],))).signature.oms_verified


def test_oms_only_signature_over_another_file_list_is_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    """Without a kvgraft bundle the OMS file list is the statement: integrity step 3 and verify.py's
    comparison both refuse it (removing both together must still fail this test)."""
    _sign_oms_statement(rel, keypair[0], {**listed_digests(rel), ENTRY_FILE: "ef" * 32})
    for key in (keypair[1], None):
        with pytest.raises(VerificationError, match=f"({ENTRY_FILE}|model.sig): .*(lists sha256 efef|lists other files)"):
            verify_result(rel, verify_policy(key=key))  # None: the signature only read
    _sign_oms_statement(rel, keypair[0], listed_digests(rel))
    assert verify_result(rel, SignedWithKeys((keypair[1],))).signature.status == "verified"


def test_oms_subject_digest_not_of_its_resources_is_refused(rel: Path, keypair: tuple[Path, Path]) -> None:
    """signing/oms.py: the one subject's digest must be the one the listed resources imply; model_signing
    verifies that digest, so a signature whose subject names other bytes is not a signature of these."""
    _sign_oms_statement(rel, keypair[0], listed_digests(rel), lambda s: s["subject"][0]["digest"].update(sha256="01" * 32))
    for key in (keypair[1], None):
        with pytest.raises(VerificationError, match=r"model\.sig: the subject digest does not match"):
            verify_result(rel, verify_policy(key=key))  # None: the signature only read


def test_stale_entry_digest_is_refused(rel: Path) -> None:
    """check_commitments: an entry edited (its token digest recomputed) but its entry digest left stale."""
    m = json.loads((rel / MANIFEST).read_text())
    m["entries"][1]["source"]["text"] = "another text"
    (rel / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match=r"manifest.json: entry 'rec-001': digest [0-9a-f]{64} does not match"):
        verify_result(rel)
    with pytest.raises(IntegrityError, match="entry 'rec-001': digest"):
        Release.open(rel)


def test_stale_root_digest_is_refused(rel: Path) -> None:
    m = json.loads((rel / MANIFEST).read_text())
    m["model"]["spec"] = "someone/else"
    (rel / MANIFEST).write_text(json.dumps(m))
    with pytest.raises(IntegrityError, match=r"manifest\.json: root_digest [0-9a-f]{64} does not match the manifest"):
        verify_result(rel)
    # Control: the same edit with every digest recomputed is read (only a signature could tell).
    rewrite.manifest(rel, lambda m: None)
    assert verify_result(rel).model.spec == "someone/else"


def test_a_verified_release_holds_the_policy_it_was_verified_under(rel: Path, keypair: tuple[Path, Path],
                                                                   other_key: tuple[Path, Path]) -> None:
    sign.sign_release(rel, keys.load_private_key(keypair[0]))
    opened = verified(rel, SignatureNotChecked())  # no key: the signature is not checked
    assert opened.checked.signature.status == "not checked" and opened.policy == SignatureNotChecked()
    with pytest.raises(VerificationError, match="does not verify with key"):
        verified(rel, verify_policy(key=other_key[1]))
    checked = verified(rel, verify_policy(key=keypair[1]))
    assert checked.checked.signature.status == "verified" and checked.policy == SignedWithKeys((keypair[1],))
    assert opened.checked.signature.status == "not checked"  # each verification is its own, kept in its result


def test_verified_with_require_signature_refuses_an_unsigned_release(rel: Path) -> None:
    from kvgraft.errors import InputError

    opened = verified(rel, SignatureNotChecked())
    assert opened.warnings  # unsigned: a warning only
    with pytest.raises(InputError, match="--require-signature needs --key"):
        verified(rel, verify_policy(require_signature=True))


def test_a_ray_worker_verifies_the_release_under_the_drivers_policy(rel: Path, keypair: tuple[Path, Path],
                                                                    other_key: tuple[Path, Path]) -> None:
    """The policy crosses the process boundary, never an opened Release: the worker verifies under it itself."""
    from kvgraft.errors import InputError
    from kvgraft.execution.ray_worker import Worker
    from kvgraft.execution.records import ReleaseHandle

    sign.sign_release(rel, keys.load_private_key(keypair[0]))
    worker = Worker.__new__(Worker)  # opening a release needs no model
    worker.index, worker.releases, worker._policy_dir = 0, {}, None
    digest = json.loads((rel / MANIFEST).read_text())["root_digest"]

    def handle(policy: Any) -> ReleaseHandle:
        return ReleaseHandle(str(rel), digest, policy)

    with pytest.raises(InputError, match="no verification policy"):
        worker.release(handle(None))  # what crossed the process boundary is checked, whatever its annotation
    assert worker.release(handle(SignatureNotChecked())).checked.signature.status == "not checked"
    with pytest.raises(VerificationError, match="does not verify with key"):  # not the one verified without a key
        worker.release(handle(SignedWithKeys((other_key[1],))))
    got = worker.release(handle(SignedWithKeys((keypair[1],))))
    assert got.policy == SignedWithKeys((keypair[1],)) and got.checked.signature.status == "verified"
    # Shipped (no folder shared with the driver): the files the policy names travel with it, written on the node.
    there = Path("/the/driver/only/signer.pub.pem")
    moved = worker._policy_files(SignedWithKeys((there,)), {str(there): keypair[1].read_bytes()})
    assert moved.keys[0] != there and moved.keys[0].read_bytes() == keypair[1].read_bytes()
    assert verified(rel, moved).checked.signature.status == "verified"
    # Written once per worker, in one folder that goes with the worker (each audit used to leave one behind).
    again = worker._policy_files(SignedWithKeys((there,)), {str(there): keypair[1].read_bytes()})
    folder = moved.keys[0].parent
    assert again.keys == moved.keys and [p.name for p in folder.iterdir()] == [moved.keys[0].name]
    del worker, got
    import gc

    gc.collect()
    assert not folder.exists()


# ------------------------------------------------------------------------------ tiny model: graft, recompute


def _text(n: int) -> str:
    import tiny

    return " ".join(tiny._CORPUS * 3)[: n * 4]


@pytest.fixture(scope="module")
def captured(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Three entries of the tiny llama, one-shot, sdpa (this machine's bytes)."""
    from kvgraft.inference import capture

    root = tmp_path_factory.mktemp("cap") / "rel"
    records = [("t", {"id": name, "text": _text(40 + 8 * i)}) for i, name in enumerate("abc")]
    capture.capture(tiny_lm("llama"), records, root, probe_tokens=2)
    return root


@pytest.fixture
def cap(captured: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(captured, tmp_path / "rel"))


def _flip_tensor_byte(root: Path, entry: dict[str, Any], tensor: str) -> None:
    path = root / entry["file"]
    start, _ = entry["tensors"][tensor]["byte_range"]
    data = bytearray(path.read_bytes())
    data[start + 1] ^= 0x10
    path.write_bytes(bytes(data))


def test_graft_refuses_a_tensor_changed_after_verification(tiny_lm: Callable[[str], Any], cap: Path) -> None:
    """graft.read_entry_tensors: each tensor's SHA-256 on read, the check that guards a verified release."""
    from kvgraft.inference import graft

    lm = tiny_lm("llama")
    checked = verified(cap, SignatureNotChecked())
    assert graft.restore(checked, "a", lm).entry["id"] == "a"  # control: intact, it grafts
    _flip_tensor_byte(cap, checked.release.entry("b"), "layer.1.values")
    with pytest.raises(IntegrityError, match=r"entry 'b' tensor 'layer.1.values' bytes \[\d+, \d+\): sha256"):
        graft.restore(checked, "b", lm)


def test_recompute_comparison_refuses_a_tensor_changed_after_verification(tiny_lm: Callable[[str], Any],
                                                                          cap: Path) -> None:
    """recompute's stored-tensor read checks each digest: the comparison never judges unverified bytes."""
    from kvgraft.inference.runtime import Schedule, prefill
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm("llama")
    rel = verified(cap, SignatureNotChecked())
    entry = rel.release.entry("b")
    fresh, _ = prefill(lm, entry["token_ids"], Schedule())
    assert recompute.classify(recompute.compare_layers(rel, entry, lm, fresh)) == ("byte-exact", None)  # control
    _flip_tensor_byte(cap, entry, "layer.2.keys")
    fresh, _ = prefill(lm, entry["token_ids"], Schedule())
    with pytest.raises(IntegrityError, match=r"entry 'b' tensor 'layer.2.keys' bytes \[\d+, \d+\): sha256") as info:
        recompute.compare_layers(rel, entry, lm, fresh)
    assert str(info.value).endswith(f"the manifest says {entry['tensors']['layer.2.keys']['sha256']}")


def _next_ulp(x: float) -> float:
    return float(np.nextafter(np.float32(x), np.float32(np.inf)))


def test_release_verdict_is_its_worst_entry(tiny_lm: Callable[[str], Any], cap: Path) -> None:
    """a byte-exact, b one ulp off in one element (consistent), c one element doubled (inconsistent)."""
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm("llama")
    rewrite.element(cap, 1, "layer.1.keys", 5, _next_ulp)
    rewrite.element(cap, 2, "layer.1.keys", 5, lambda x: 2.0 * x + 1.0)
    two = recompute.audit(verified(cap, SignatureNotChecked()), lm, entries=["a", "b"], require="consistent")
    assert [e["verdict"] for e in two["entries"]] == ["byte-exact", "consistent"]
    assert two["verdict"] == "consistent" and two["passed"] and not two["all_byte_exact"]
    assert not recompute.audit(verified(cap, SignatureNotChecked()), lm, entries=["b", "a"], require="exact")["passed"]
    three = recompute.audit(verified(cap, SignatureNotChecked()), lm, require="consistent")
    assert [e["verdict"] for e in three["entries"]] == ["byte-exact", "consistent", "inconsistent"]
    assert three["verdict"] == "inconsistent" and not three["passed"]
    assert "Verdict inconsistent" in three["statements"][-1]


def test_a_nan_stored_where_fresh_is_finite_is_outside_the_noise_bound(tiny_lm: Callable[[str], Any], cap: Path) -> None:
    from kvgraft.recompute import audit as recompute

    rewrite.element(cap, 0, "layer.0.values", 3, lambda x: float("nan"))
    e = recompute.audit(verified(cap, SignatureNotChecked()), tiny_lm("llama"), require="consistent")["entries"][0]
    assert e["verdict"] == "inconsistent"
    assert e["layers"][0]["values"]["outside"] == 1
    assert e["outside"]["first"]["layer"] == 0 and e["outside"]["first"]["tensor"] == "values"


def test_a_tensor_stored_in_another_shape_is_inconsistent(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    """A shape mismatch alone (every other tensor byte-exact) is not the same computation."""
    from kvgraft.inference import capture
    from kvgraft.inference.runtime import Schedule, prefill
    from kvgraft.recompute import audit as recompute
    from kvgraft.release.format import ReleaseWriter

    lm = tiny_lm("llama")
    entry, tensors = capture.capture_entry(lm, {"id": "s", "text": _text(40)}, Schedule(), 0, "t")
    tensors["layer.1.keys"] = tensors["layer.1.keys"][..., :4].clone()  # half the head dim
    writer = ReleaseWriter(tmp_path / "rel")
    writer.add_entry(entry, tensors)
    writer.finish(capture.header(lm, Schedule()))
    rel = verified(tmp_path / "rel", SignatureNotChecked())
    fresh, _ = prefill(lm, entry["token_ids"], Schedule())
    rows = recompute.compare_layers(rel, rel.release.entry("s"), lm, fresh)
    assert sum(not t.equal for r in rows for t in (r.keys, r.values) if t is not None) == 1
    verdict, outside = recompute.classify(rows)
    assert verdict == "inconsistent"
    n = entry["num_tokens"]
    assert outside is not None and outside.layers == [1] and outside.shape == [
        f"layer 1 keys: stored [1, 2, {n}, 4] torch.float32, fresh [1, 2, {n}, 8] torch.float32"]


def test_recorded_attention_kernel_is_replayed_even_beside_an_override(tiny_lm: Callable[[str], Any],
                                                                       tmp_path: Path) -> None:
    """A release captured with eager attention, recomputed on a model loaded with sdpa: eager is
    replayed (byte-exact), also while another condition is overridden; overriding it differs (control)."""
    from kvgraft.inference import capture
    from kvgraft.inference.reapply import Conditions
    from kvgraft.inference.runtime import attention
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm("llama")
    with attention(lm, "eager"):
        capture.capture(lm, [("t", {"id": "e", "text": _text(60)})], tmp_path / "rel", probe_tokens=2)
    assert lm.attn == "sdpa"
    recorded = json.loads((tmp_path / "rel" / MANIFEST).read_text())["environment"]
    assert recorded["attn_implementation"] == "eager"
    # What the CLI loads the model with: the recorded kernel unless --attn says otherwise.
    assert Conditions().load_options(recorded) == ("cpu", "float32", "eager")
    assert Conditions(attn="sdpa").load_options(recorded)[2] == "sdpa"
    for overrides in ({}, {"threads": 1}, {"deterministic_algorithms": False}):
        r = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, overrides=overrides)
        assert r["environment"]["current"]["attn_implementation"] == "eager", overrides
        assert "attn_implementation" in r["conditions"]["replayed"], overrides
        assert r["all_byte_exact"], overrides
    control = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, overrides={"attn_implementation": "sdpa"})
    assert not control["all_byte_exact"] and "attn_implementation" in control["conditions"]["overridden"]
    assert lm.attn == "sdpa"


def test_recorded_prefill_schedule_is_replayed(tiny_lm: Callable[[str], Any], tmp_path: Path) -> None:
    """Captured in chunks of 4 tokens: replayed byte-exact; recomputed one-shot it differs (control)."""
    from kvgraft.inference import capture
    from kvgraft.inference.runtime import Schedule
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm("llama")
    capture.capture(lm, [("t", {"id": "k", "text": _text(60)})], tmp_path / "rel", schedule=Schedule(chunk_tokens=4),
                    probe_tokens=2)
    r = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm)
    assert r["all_byte_exact"] and not r["schedule_overridden"] and r["schedule"]["chunk_tokens"] == 4
    control = recompute.audit(verified(tmp_path / "rel", SignatureNotChecked()), lm, schedule=Schedule())
    assert control["schedule_overridden"] and not control["all_byte_exact"]
