"""Verify a cache release: files against the statement and manifest, commitments, signature, identity.

What `verify_release` checks, in order (the first failure raises, naming what and where):

1. the bundle RELEASE/release.sigstore.json, when present: strict JSON, bounded size; its DSSE
   signature with `key`, or with Sigstore (certificate chain to the trusted root, identity policy,
   transparency-log inclusion, signed time) when `identity`/`issuer` are given. With neither, the
   statement is still read and compared, and the signature is reported as not checked. A key or an
   identity given for a release without a bundle is a failure: the release is unsigned.
2. manifest.json's SHA-256 against its statement subject, before the manifest is parsed;
3. the manifest: bounded, strict JSON, schema, entry/root digests (`release.check_commitments`),
   and the statement's subjects and predicate against it;
4. the folder: no file missing, none extra, no symlinks or unsafe names, every size;
5. every file's SHA-256, hashed once, in parallel across files; a mismatch is located to the
   first tensor (entry, byte range, digests) or to the safetensors header;
6. each safetensors header against the manifest's tensor table (dtype, shape, byte range);
7. with `deep`, every tensor byte range against its sha256 in the manifest.

Per-tensor digests are bound by the signed manifest (the file digests cover the same bytes) and are
re-checked by graft on load, so the default pass reads each byte once; `deep` reads it twice.

Imports no torch; sigstore is imported only for Sigstore checks.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from concurrent.futures import Future
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from cryptography.hazmat.primitives.asymmetric import ec

from kvgraft import __version__
from kvgraft._internal import jsonio
from kvgraft.errors import InputError, IntegrityError, VerificationError
from kvgraft.release import format as release_format
from kvgraft.release import safetensors_header as stfile
from kvgraft.release.format import MANIFEST, Release, check_commitments, safe_path, tensor_mismatch
from kvgraft.release.hashing import hash_file, hash_ranges, pool, sha256_hex
from kvgraft.signing import attest, keys

if TYPE_CHECKING:
    from sigstore.verify import Verifier

RESULT_FORMAT = "kvgraft-verify-result"
RESULT_VERSION = 1
MAX_TRUST_BYTES = 16 * 1024 * 1024


def _one_line(text: str) -> str:
    return " ".join(text.split())


# ------------------------------------------------------------------------------------------ sigstore


@dataclass(frozen=True)
class SigstoreTrust:
    """Which Sigstore root of trust: production (default), staging, or a trusted-root file.

    `offline` uses the trusted root embedded in sigstore-python (or its local TUF cache) instead of
    refreshing it over the network. `trusted_root` is a TrustedRoot or ClientTrustConfig JSON file.
    """

    staging: bool = False
    offline: bool = False
    trusted_root: Path | None = None


@dataclass(frozen=True)
class SigstoreVerified:
    """A bundle that passed Sigstore verification under an identity policy."""

    identity: str
    issuer: str
    payload_type: str | None  # DSSE bundles: the verified envelope's payload
    payload: bytes | None


def sigstore_verifier(trust: SigstoreTrust) -> Verifier:
    """A sigstore `Verifier` for `trust`; a trust root that cannot be loaded is unusable input."""
    from sigstore.errors import Error as SigstoreError
    from sigstore.models import ClientTrustConfig, TrustedRoot
    from sigstore.verify import Verifier

    try:
        if trust.trusted_root is not None:
            if trust.staging:
                raise InputError("give --trusted-root or --staging, not both")
            path = Path(trust.trusted_root)
            raw = jsonio.read_bounded(path, MAX_TRUST_BYTES, "JSON")
            doc = jsonio.loads_strict(raw, str(path))
            media_type = doc.get("mediaType", "") if isinstance(doc, dict) else ""
            if media_type.startswith("application/vnd.dev.sigstore.clienttrustconfig"):
                root = ClientTrustConfig.from_json(raw.decode()).trusted_root
            elif media_type.startswith("application/vnd.dev.sigstore.trustedroot"):
                root = TrustedRoot.from_file(str(path))
            else:
                raise InputError(f"{path}: not a Sigstore trusted root or client trust config (mediaType {media_type!r})")
            return Verifier(trusted_root=root)
        if trust.staging:
            return Verifier.staging(offline=trust.offline)
        return Verifier.production(offline=trust.offline)
    except SigstoreError as exc:
        hint = "" if trust.offline or trust.trusted_root else " (pass --offline to use the embedded trusted root)"
        raise InputError(f"cannot load the Sigstore trusted root: {_one_line(exc.diagnostics())}{hint}") from None
    except ValueError as exc:  # pydantic validation of a trust file
        raise InputError(f"{trust.trusted_root}: not a valid Sigstore trust root: {_one_line(str(exc))[:300]}") from None


def verify_sigstore_bundle(artifact: bytes | Path | None, bundle: bytes, *, identity: str, issuer: str,
                           trust: SigstoreTrust | None = None, where: str = "bundle") -> SigstoreVerified:
    """Verify a Sigstore bundle (and its artifact) under the policy "signed by `identity` via `issuer`".

    Checks the certificate chain to the trusted root, the identity policy, the transparency-log
    inclusion proof/promise and signed time, and the signature: over `artifact` for a message-
    signature bundle (`artifact` required), or over the DSSE envelope for a DSSE bundle, whose
    verified payload is returned (and, when `artifact` is given, must list its SHA-256 as a subject).
    Raises InputError for an unusable bundle or trust root, VerificationError when a check fails.
    """
    if len(bundle) > attest.MAX_BUNDLE_BYTES:
        raise InputError(f"{where}: {len(bundle)} bytes exceeds the {attest.MAX_BUNDLE_BYTES}-byte limit for a bundle")
    doc = jsonio.loads_strict(bundle, where)  # refuses duplicate keys before sigstore parses it
    if not isinstance(doc, dict):
        raise InputError(f"{where}: not a Sigstore bundle (not a JSON object)")

    from sigstore.errors import Error as SigstoreError
    from sigstore.hashes import Hashed
    from sigstore.models import Bundle, InvalidBundle
    from sigstore.verify import policy
    from sigstore_models.common.v1 import HashAlgorithm

    try:
        parsed = Bundle.from_json(bundle)
    except InvalidBundle as exc:
        raise InputError(f"{where}: not a valid Sigstore bundle: {_one_line(str(exc))[:300]}") from None
    except ValueError as exc:
        raise InputError(f"{where}: not a valid Sigstore bundle: {_one_line(str(exc))[:300]}") from None
    verifier = sigstore_verifier(trust or SigstoreTrust())
    rule = policy.Identity(identity=identity, issuer=issuer)
    payload_type: str | None = None
    payload: bytes | None = None
    try:
        if "dsseEnvelope" in doc:
            payload_type, payload = verifier.verify_dsse(parsed, rule)
        else:
            if artifact is None:
                raise InputError(f"{where}: a message-signature bundle is verified against its artifact; none given")
            if isinstance(artifact, Path):
                digest, _ = hash_file(artifact)
                hashed = Hashed(algorithm=HashAlgorithm.SHA2_256, digest=bytes.fromhex(digest))
                verifier.verify_artifact(hashed, parsed, rule)
            else:
                verifier.verify_artifact(artifact, parsed, rule)
    except SigstoreError as exc:
        raise VerificationError(f"{where}: Sigstore verification failed: {_one_line(str(exc))}") from None
    if payload is not None and artifact is not None:
        sha = hash_file(artifact)[0] if isinstance(artifact, Path) else sha256_hex(artifact)
        stmt = jsonio.loads_strict(payload, f"{where}: statement")
        listed = stmt.get("subject", []) if isinstance(stmt, dict) else []
        if not any(isinstance(s, dict) and isinstance(s.get("digest"), dict) and s["digest"].get("sha256") == sha
                   for s in listed):
            raise VerificationError(f"{where}: the artifact's sha256 {sha} is not a subject of the signed statement")
    return SigstoreVerified(identity, issuer, payload_type, payload)


# ------------------------------------------------------------------------------------------- release


@dataclass
class CheckedRelease:
    """A release whose files, sizes, digests and safetensors headers matched its manifest."""

    root: Path
    manifest: dict[str, Any]
    manifest_sha256: str
    manifest_size: int
    files: dict[str, str]  # name -> sha256 of every file, manifest.json included
    bytes_hashed: int
    tensors: int
    tensors_rehashed: int
    release: Release


@dataclass(frozen=True)
class VerifyPolicy:
    """What a release must satisfy beyond its bytes, the same for `kvgraft verify` and every consumer.

    `key` or `identity` + `issuer`: the signature is checked with it (an unsigned release fails).
    `require_signature`: an unsigned release, or one whose signature is not checked, fails. Without
    either, a bundle present is still read and its statement must match the files (a stale bundle
    fails); an absent bundle is a recorded warning.
    """

    key: Path | None = None
    identity: str | None = None
    issuer: str | None = None
    trust: SigstoreTrust | None = None
    require_signature: bool = False


@dataclass
class SignatureStatus:
    status: str  # "verified" or "not checked"
    method: str | None = None  # "key" or "sigstore"
    bundle: str | None = None  # path of the bundle, None when the release has none
    bundle_sha256: str | None = None  # digest of the exact bundle bytes accepted
    oms_signature: str | None = None  # path of an OpenSSF model signing signature (model.sig), if any
    oms_sha256: str | None = None  # digest of its exact bytes
    oms_verified: bool = False  # it was checked with the key (else only its file list was compared)
    key_id: str | None = None
    identity: str | None = None
    issuer: str | None = None

    def describe(self) -> str:
        oms = f"; OpenSSF model signing signature {'verified' if self.oms_verified else 'present'}" if self.oms_signature else ""
        if self.status == "verified":
            who = f"key {self.key_id}" if self.method == "key" else f"{self.identity} via {self.issuer} (Sigstore)"
            return f"verified: {who}{oms}"
        if self.bundle is None and self.oms_signature is not None:
            return "not checked: an OpenSSF model signing signature (model.sig) is present; pass --key"
        if self.bundle is None:
            return "not checked: the release is unsigned (no release.sigstore.json)"
        return "not checked: pass --key or --certificate-identity/--certificate-oidc-issuer"


@dataclass
class VerifyResult:
    """A release that passed every check asked for."""

    release: Path
    root_digest: str
    manifest_sha256: str
    entries: int
    files: int
    tensors: int
    bytes_hashed: int
    seconds: float
    deep: bool
    signature: SignatureStatus
    statement: bool  # a statement was read and compared (signed or not)
    model: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    policy: VerifyPolicy = field(default_factory=VerifyPolicy)
    opened: Release | None = field(default=None, repr=False)  # the checked release, headers included

    @property
    def throughput(self) -> float:
        """Bytes hashed per second."""
        return self.bytes_hashed / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> dict[str, Any]:
        """The `verify --json` document (schemas/verify-result.v1.json)."""
        return {
            "format": RESULT_FORMAT, "format_version": RESULT_VERSION, "kvgraft_version": __version__,
            "ok": True, "exit_code": 0, "error": None, "release": str(self.release),
            "root_digest": self.root_digest, "manifest_sha256": self.manifest_sha256,
            "model": self.model, "entries": self.entries, "files": self.files, "tensors": self.tensors,
            "bytes_hashed": self.bytes_hashed, "seconds": round(self.seconds, 6),
            "throughput_bytes_per_s": round(self.throughput, 1), "deep": self.deep,
            "statement": self.statement, "signature": asdict(self.signature), "warnings": list(self.warnings),
        }


def failure_dict(release: Path | str, error: str, exit_code: int) -> dict[str, Any]:
    """The `verify --json` document of a failed verification."""
    return {"format": RESULT_FORMAT, "format_version": RESULT_VERSION, "kvgraft_version": __version__,
            "ok": False, "exit_code": exit_code, "error": error, "release": str(release)}


def _locate(rel: Release, name: str, actual: str, expected: str, source: str, by_sha: dict[str, str]) -> str:
    """One line naming where a file whose sha256 mismatches differs: which tensor, or its header."""
    path = rel.root / name
    base = f"{path}: sha256 {actual} does not match the {source} ({expected})"
    other = by_sha.get(actual)
    if other is not None and other != name:
        return f"{base}: it has the content of {other} (files swapped or copied)"
    entries = [e for e in rel.manifest["entries"] if e["file"] == name]
    if not entries:
        return base
    try:
        header, _ = stfile.read_header(path)
    except InputError as exc:
        return f"{base}: entry {entries[0]['id']!r}: the safetensors header is damaged ({exc})"
    data_start = min((t.start for t in header.values()), default=path.stat().st_size)
    for entry in entries:
        tensors = entry["tensors"]
        try:
            rel.tensor_layout(entry)
        except (IntegrityError, InputError):
            return (f"{base}: entry {entry['id']!r}: the safetensors header region [0, {data_start}) differs "
                    f"(its tensor table no longer matches the manifest)")
        order = sorted(tensors, key=lambda n: tensors[n]["byte_range"][0])
        digests = hash_ranges(path, [(tensors[n]["byte_range"][0], tensors[n]["byte_range"][1]) for n in order])
        for n, got in zip(order, digests, strict=True):
            t = tensors[n]
            if got != t["sha256"]:
                a, b = t["byte_range"]
                where = f"{path}: entry {entry['id']!r}"
                return (f"{tensor_mismatch(where, n, a, b, got, t['sha256'])} "
                        f"(file sha256 {actual}, {source} says {expected})")
    return (f"{base}: entry {entries[0]['id']!r}: every tensor matches; the safetensors header region "
            f"[0, {data_start}) differs")


# An unsigned manifest (or one whose signature was not checked) is bounded by the data it describes
# before it is parsed: parsing costs about 9 bytes of memory and 50 ns per manifest byte, and nothing
# else stops a hostile one short of MAX_MANIFEST_BYTES. Real manifests are ~1/10,000 of their tensor
# bytes (token ids and tensor tables against the KV states of every token); 1/64 leaves a wide margin.
UNSIGNED_MANIFEST_FLOOR = 16 * 1024 * 1024
UNSIGNED_MANIFEST_RATIO = 64


def _unsigned_manifest_limit(root: Path, present: set[str]) -> int:
    stored = 0
    for name in present:
        if name != MANIFEST:
            with contextlib.suppress(OSError):  # gone: reported as missing later
                stored += (root / name).lstat().st_blocks * 512  # allocated bytes: a sparse file adds nothing
    return min(release_format.MAX_MANIFEST_BYTES, max(UNSIGNED_MANIFEST_FLOOR, stored // UNSIGNED_MANIFEST_RATIO))


def check_release(root: Path, *, statement: dict[str, Any] | None = None, source: str = "manifest",
                  deep: bool = False, signed: bool = False, subjects: dict[str, str] | None = None) -> CheckedRelease:
    """Steps 2-7 of the module docstring: the release's bytes against `statement` (if any) and the manifest.

    `source` names the statement in messages ("signed statement", ...). `signed`: the statement's
    signature was verified, so the manifest it pins is as large as its signer made it; otherwise the
    manifest is refused unparsed when larger than its data warrants (_unsigned_manifest_limit).
    Raises IntegrityError when bytes differ, VerificationError when the statement and the manifest
    disagree, InputError for unusable input.
    """
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: not a folder")
    present = attest.release_folder_files(root)
    stmt_subjects = attest.subjects(statement) if statement is not None else subjects
    manifest_path = root / MANIFEST

    # 2. the manifest file against the statement, before it is parsed. Its bytes are read once: the
    # bytes hashed are the bytes parsed.
    if stmt_subjects is not None:
        if MANIFEST not in stmt_subjects:
            raise VerificationError(f"{root}: the {source} does not list {MANIFEST} as a subject")
        if MANIFEST not in present:
            raise IntegrityError(f"{manifest_path}: missing ({MANIFEST} is a subject of the {source})")
    if MANIFEST not in present:
        raise InputError(f"{manifest_path}: missing manifest (is {root} a cache release?)")
    limit = release_format.MAX_MANIFEST_BYTES if signed else _unsigned_manifest_limit(root, present)
    what = "a manifest" if signed else (f"an unsigned manifest ({limit // 2**20} MiB here: 1/{UNSIGNED_MANIFEST_RATIO} "
                                        f"of the stored data, at least {UNSIGNED_MANIFEST_FLOOR // 2**20} MiB)")
    data = jsonio.read_bounded(manifest_path, limit, what)
    msha, msize = sha256_hex(data), len(data)
    if stmt_subjects is not None and msha != stmt_subjects[MANIFEST]:
        theirs = f"; the statement attests the release with root digest {statement['predicate']['root_digest']}" \
            if statement is not None else ""
        raise IntegrityError(f"{manifest_path}: sha256 {msha} does not match the {source} ({stmt_subjects[MANIFEST]})"
                             f"{theirs}")
    doc = jsonio.loads_strict(data, str(manifest_path))
    del data
    # Start hashing the files now, on the pool, while this thread validates the manifest. Only regular
    # files found inside the folder whose size already equals the one the manifest states are read, so
    # a grown (or sparse-extended) file costs nothing before it is refused. Results are used only after
    # every check passed.
    stop = threading.Event()
    prefetch = {name: pool().submit(hash_file, root / name, size, stop)
                for name, size in _files_to_prefetch(root, present, doc)}
    try:
        return _check(root, present, prefetch, statement, stmt_subjects, source, deep, doc, msha, msize, stop)
    finally:
        stop.set()  # after a failure, hashing that is under way ends at its next block instead of running on
        for future in prefetch.values():
            future.cancel()


def _files_to_prefetch(root: Path, present: set[str], doc: Any) -> list[tuple[str, int]]:
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, dict):
        return []  # check_manifest says why
    sizes: dict[str, int] = {}
    for name, meta in files.items():
        want = meta.get("size") if isinstance(meta, dict) else None
        if name not in present or name == MANIFEST or type(want) is not int:
            continue
        try:
            if (root / name).stat().st_size == want:
                sizes[name] = want
        except OSError:
            continue  # gone already: reported as missing by the checks
    return sorted(sizes.items(), key=lambda item: -item[1])


def _result(future: Future[tuple[str, int]], path: Path) -> tuple[str, int]:
    try:
        return future.result()
    except EOFError:
        raise IntegrityError(f"{path}: the file shrank while it was being verified") from None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None


def _brief(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, ensure_ascii=True)
    return text if len(text) <= 200 else text[:200] + "..."


def _check(root: Path, present: set[str], prefetch: dict[str, Future[tuple[str, int]]], statement: dict[str, Any] | None,
           stmt_subjects: dict[str, str] | None, source: str, deep: bool, doc: Any, msha: str,
           msize: int, stop: threading.Event) -> CheckedRelease:
    manifest_path = root / MANIFEST

    # 3. manifest content, statement vs manifest; its digests (the costly part) after the cheap
    # checks of step 4, so that a huge manifest that does not describe this folder is refused sooner
    manifest = release_format.check_manifest(doc, manifest_path)
    rel = Release(root, manifest)
    expected = {MANIFEST: msha, **{name: f["sha256"] for name, f in manifest["files"].items()}}
    if stmt_subjects is not None:
        for name in sorted(set(stmt_subjects) | set(expected)):
            if stmt_subjects.get(name) != expected.get(name):
                raise VerificationError(
                    f"{root / name}: the {source} lists sha256 {stmt_subjects.get(name)} and the manifest "
                    f"{expected.get(name)}")
    if statement is not None:
        # Every member the predicate states must be what the manifest implies; only the version of
        # the kvgraft that signed is the signer's own.
        claimed = statement["predicate"]
        implied = attest.statement(manifest, msha, msize)["predicate"]
        for what in sorted((set(claimed) | set(implied)) - {"kvgraft_version"}):
            if claimed.get(what) != implied.get(what):
                raise VerificationError(f"{manifest_path}: the {source} predicate's {what} {_brief(claimed.get(what))} "
                                        f"does not match the manifest ({_brief(implied.get(what))})")

    # 4. the folder: names, missing, extra, sizes
    for name in manifest["files"]:
        safe_path(root, name, "manifest file")
    missing = sorted(set(expected) - present)
    extra = sorted(present - set(expected))
    users: dict[str, list[str]] = {}
    for entry in manifest["entries"]:
        users.setdefault(entry["file"], []).append(entry["id"])

    def of(name: str) -> str:
        ids = users.get(name, [])
        return f"entry {ids[0]!r}{f' and {len(ids) - 1} more' if len(ids) > 1 else ''}" if ids else ""

    if missing or extra:
        parts = []
        if missing:
            parts.append(f"missing {', '.join(f'{n} ({of(n)})' if of(n) else n for n in missing[:5])}"
                         + (f" (+{len(missing) - 5} more)" if len(missing) > 5 else ""))
        if extra:
            parts.append(f"not part of the release: {', '.join(extra[:5])}"
                         + (f" (+{len(extra) - 5} more)" if len(extra) > 5 else ""))
        # Named by the first missing file's path when there is one: the line says where to look.
        head = root / missing[0] if missing else root
        raise IntegrityError(f"{head}: files differ from the {source}: {'; '.join(parts)}")
    names = sorted(manifest["files"])
    paths = [root / n for n in names]
    for name, path in zip(names, paths, strict=True):
        want, got = manifest["files"][name]["size"], path.lstat().st_size
        if got != want:
            how = "truncated" if got < want else "grown"
            label = f": {of(name)}" if of(name) else ""
            raise IntegrityError(f"{path}{label}: {got} bytes, the manifest says {want} ({how})")

    check_commitments(root, manifest)

    # 5. every byte, once, across cores (most of it already hashed by the prefetch)
    pending = {n: prefetch[n] if n in prefetch else pool().submit(hash_file, root / n, manifest["files"][n]["size"], stop)
               for n in names}
    results = [_result(pending[n], root / n) for n in names]
    by_sha = {sha: n for n, sha in expected.items()}
    bad = [(n, sha) for n, (sha, _) in zip(names, results, strict=True) if sha != expected[n]]
    if bad:
        name, actual = bad[0]
        message = _locate(rel, name, actual, expected[name], source, by_sha)
        if len(bad) > 1:
            message += f" (and {len(bad) - 1} more files differ: {', '.join(n for n, _ in bad[1:4])})"
        raise IntegrityError(message)

    # 6. safetensors headers against the manifest's tensor tables
    tensors = 0
    for entry in manifest["entries"]:
        rel.tensor_layout(entry)
        tensors += len(entry["tensors"])

    # 7. optionally every tensor byte range against its own digest
    rehashed = 0
    if deep:
        for entry in manifest["entries"]:
            table = entry["tensors"]
            order = sorted(table, key=lambda n: table[n]["byte_range"][0])
            path = root / entry["file"]
            got = hash_ranges(path, [(table[n]["byte_range"][0], table[n]["byte_range"][1]) for n in order])
            for n, sha in zip(order, got, strict=True):
                if sha != table[n]["sha256"]:
                    a, b = table[n]["byte_range"]
                    raise IntegrityError(tensor_mismatch(f"{path}: entry {entry['id']!r}", n, a, b, sha, table[n]["sha256"]))
            rehashed += len(order)

    hashed = msize + sum(size for _, size in results)
    if deep:
        hashed += sum(t["byte_range"][1] - t["byte_range"][0] for e in manifest["entries"] for t in e["tensors"].values())
    files = {MANIFEST: msha, **{n: sha for n, (sha, _) in zip(names, results, strict=True)}}
    return CheckedRelease(root, manifest, msha, msize, files, hashed, tensors, rehashed, rel)


def _read_oms(root: Path, public_key: keys.PublicKey | None, signature: SignatureStatus,
              bundle_raw: bytes | None) -> tuple[dict[str, str], str | None] | None:
    """An OpenSSF model signing signature (RELEASE/model.sig), if present: its files (name -> sha256)
    without release.sigstore.json, and the digest it lists for release.sigstore.json (None if none).
    With a key given it must verify with that key when the release has no kvgraft bundle; beside one,
    a key OMS cannot use (Ed25519) leaves it unchecked, and its file list is still compared."""
    from kvgraft.signing import oms

    path = root / attest.OMS_NAME
    try:
        os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    usable = public_key is not None and (bundle_raw is None or isinstance(public_key, ec.EllipticCurvePublicKey))
    files, verified_by, digest = oms.read(path, public_key if usable else None)
    signature.oms_signature, signature.oms_sha256, signature.oms_verified = str(path), digest, verified_by is not None
    return files, files.pop(attest.BUNDLE_NAME, None)


def verify_release(root: Path | str, *, key: Path | None = None, identity: str | None = None,
                   issuer: str | None = None, trust: SigstoreTrust | None = None, deep: bool = False,
                   policy: VerifyPolicy | None = None) -> VerifyResult:
    """Verify a release (module docstring); return what passed, raise a kvgraft Error on the first failure.

    `policy` (or, for short, `key`, `identity` + `issuer`, `trust`): see VerifyPolicy. `key`: a PEM
    public key the DSSE signature must verify with. `identity` + `issuer`: the Sigstore certificate
    identity (SAN) and OIDC issuer the bundle must be signed by, checked against `trust`.
    """
    started = time.perf_counter()
    if policy is None:
        policy = VerifyPolicy(key=key, identity=identity, issuer=issuer, trust=trust)
    elif (key, identity, issuer, trust) != (None, None, None, None):
        raise InputError("give a verification policy or key/identity arguments, not both")
    key, identity, issuer, trust = policy.key, policy.identity, policy.issuer, policy.trust
    root = Path(root)
    if not root.is_dir():
        raise InputError(f"{root}: not a folder (expected a cache release)")
    if (identity is None) != (issuer is None):
        raise InputError("--certificate-identity and --certificate-oidc-issuer must be given together")
    if key is not None and identity is not None:
        raise InputError("give --key or --certificate-identity/--certificate-oidc-issuer, not both")
    if policy.require_signature and key is None and identity is None:
        raise InputError("--require-signature needs --key or --certificate-identity/--certificate-oidc-issuer "
                         "to check the signature with")
    public_key = keys.load_public_key(key) if key is not None else None

    bundle_path = root / attest.BUNDLE_NAME
    signature = SignatureStatus("not checked")
    statement: dict[str, Any] | None = None
    warnings: list[str] = []
    source = "manifest"
    try:
        bundle_mode: int | None = bundle_path.lstat().st_mode
    except FileNotFoundError:
        bundle_mode = None
    except OSError as exc:
        raise InputError(f"{bundle_path}: cannot read: {exc.strerror}") from None
    bundle_raw: bytes | None = None
    if bundle_mode is not None:
        bundle = attest.read_bundle(bundle_path)  # refuses a link or a special file before opening it
        bundle_raw = bundle.raw
        signature.bundle = str(bundle_path)
        signature.bundle_sha256 = sha256_hex(bundle.raw)
        payload_type, payload = bundle.payload_type, bundle.payload
        if public_key is not None:
            signature.key_id = attest.verify_with_key(bundle, public_key)
            signature.status, signature.method = "verified", "key"
        elif identity is not None and issuer is not None:
            if not bundle.has_certificate:
                raise VerificationError(f"{bundle_path}: the release is signed with key {bundle.key_hint}, not a Sigstore "
                                        f"certificate; verify it with --key")
            verified = verify_sigstore_bundle(None, bundle.raw, identity=identity, issuer=issuer, trust=trust,
                                              where=str(bundle_path))
            assert verified.payload_type is not None and verified.payload is not None
            payload_type, payload = verified.payload_type, verified.payload
            signature.status, signature.method = "verified", "sigstore"
            signature.identity, signature.issuer = identity, issuer
        else:
            warnings.append("the signature was not checked (no --key or Sigstore identity given); the statement "
                            "in the bundle was compared with the files")
        statement = attest.parse_statement(payload_type, payload, str(bundle_path))
        source = "signed statement" if signature.status == "verified" else "statement (signature not checked)"
    elif (root / attest.OMS_NAME).exists() and identity is None:
        pass  # an OpenSSF model signing signature alone: read below
    elif public_key is not None or identity is not None:
        wanted = "--key" if public_key is not None else "--certificate-identity"
        raise VerificationError(f"{root}: the release is unsigned (no {attest.BUNDLE_NAME}) but {wanted} "
                                f"requires a signature")
    else:
        warnings.append(f"the release is unsigned (no {attest.BUNDLE_NAME}): only its bytes against its manifest "
                        f"were checked")

    oms_read = _read_oms(root, public_key, signature, bundle_raw)
    oms_files = oms_read[0] if oms_read is not None else None
    if oms_files is not None and statement is None:
        # Signed only with OpenSSF model signing: its file list plays the statement's part.
        if public_key is not None and signature.oms_verified:
            signature.status, signature.method, signature.key_id = "verified", "key", keys.key_id(public_key)
        if policy.require_signature and signature.status != "verified":
            raise VerificationError(f"{root}: --require-signature: the OpenSSF model signing signature was not checked")
        warnings[:] = [] if signature.status == "verified" else [
            f"the OpenSSF model signing signature ({attest.OMS_NAME}) was not checked (no --key given); its file "
            f"list was compared with the files"]
        source = "OMS signature" if signature.status == "verified" else "OMS signature (not checked)"
    checked = check_release(root, statement=statement, source=source, deep=deep, signed=signature.status == "verified",
                            subjects=oms_files if statement is None else None)
    if oms_read is not None:
        # After the release's own checks, which say more precisely what changed.
        oms_files, listed_bundle = oms_read
        if oms_files != checked.files:
            differs = sorted(n for n in set(oms_files) | set(checked.files) if oms_files.get(n) != checked.files.get(n))
            raise VerificationError(f"{root / attest.OMS_NAME}: the OpenSSF model signing signature lists other files "
                                    f"or digests than the release has ({', '.join(differs[:3])})")
        actual_bundle = sha256_hex(bundle_raw) if bundle_raw is not None else None
        if listed_bundle != actual_bundle:
            raise VerificationError(f"{root / attest.OMS_NAME}: the OpenSSF model signing signature lists "
                                    f"{attest.BUNDLE_NAME} with sha256 {listed_bundle}, the release has {actual_bundle}")
    m = checked.manifest
    result = VerifyResult(
        release=root, root_digest=m["root_digest"], manifest_sha256=checked.manifest_sha256,
        entries=len(m["entries"]), files=len(checked.files), tensors=checked.tensors,
        bytes_hashed=checked.bytes_hashed, seconds=time.perf_counter() - started, deep=deep,
        signature=signature, statement=statement is not None,
        model={"spec": m["model"]["spec"], "identity_sha256": m["model"]["identity"]["sha256"]},
        warnings=warnings, policy=policy, opened=checked.release,
    )
    checked.release.verification = result
    return result


def verified(release: Release | Path | str, policy: VerifyPolicy | None = None) -> Release:
    """The one verification every consumer of a release's bytes goes through (graft, run, audits).

    Runs `verify_release` under `policy` (default: VerifyPolicy(), as `kvgraft verify` without
    options) unless `release` already passed it under the same policy, or under any policy when none
    is asked for. A Release object passed in is marked verified in place, so that its later uses
    (one graft per entry) do not verify again; later reads still check each tensor's digest and that
    each safetensors header is the one verified. Raises as verify_release does.
    """
    if (isinstance(release, Release) and release.verification is not None
            and (policy is None or release.verification.policy == policy)):
        return release
    root = release.root if isinstance(release, Release) else Path(release)
    result = verify_release(root, policy=policy or VerifyPolicy())
    assert result.opened is not None
    if not isinstance(release, Release):
        return result.opened
    now = result.opened.manifest["root_digest"]
    if now != release.manifest["root_digest"]:
        raise IntegrityError(f"{root / MANIFEST}: the release changed after it was opened (root digest "
                             f"{release.manifest['root_digest']}, now {now})")
    release._checked_headers = dict(result.opened._checked_headers)
    release.verification = result
    return release
