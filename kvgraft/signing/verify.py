"""Verify a cache release under one policy and scope: its signature and statement, then its bytes (release.integrity).

What `verify(source, policy, scope)` checks, in order (the first failure raises, naming what and where):

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

`verify` runs them as named steps: `_read_bundle` and `_read_oms_signature` (1),
`_every_key_verifies_a_signature`, `_check_files` (2-7: `kvgraft.release.integrity.check_release`, or
what opening checks), `_check_entries` (`--entry`), `_compare_oms_list`. The policy (which signature,
whose) is a `kvgraft.signing.policy` object, and so is the scope (how much is read: `OPEN`, `Everything`,
`Entries`, `Sample`); the Sigstore checks are `kvgraft.signing.sigstore`. Each signature file is looked at
and read once per verification (`_Signatures`). `verify` returns a `VerifiedRelease`
(kvgraft.signing.verified: the release, what was checked, under which policy, where it came from), the only
type graft, recompute, the audits and the libraries take; `verified(path, policy)` (scope `OPEN`) is what
the edges call (the CLI, a plan's run, the vLLM connector's start-up, a Ray worker given a path and the
driver's policy). `kvgraft verify` builds the policy and the scope from its options (`policy.verify_policy`,
`policy.scope_of`) and calls `verify`.
Per-tensor digests are bound by the signed manifest (the file digests cover the same bytes) and are
re-checked by graft on load, so the default pass reads each byte once; `deep` reads it twice.

Imports no torch; sigstore is imported only for Sigstore checks.
"""

from __future__ import annotations

import os
import stat
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, overload

from cryptography.hazmat.primitives.asymmetric import ec

from kvgraft import __version__, sampling
from kvgraft._internal import jsonio
from kvgraft._internal.digest import sha256_hex
from kvgraft.errors import Error, InputError, VerificationError
from kvgraft.release.format import Release
from kvgraft.release.integrity import (
    Beside,
    CheckedEntry,
    CheckedRelease,
    Listing,
    check_entry,
    check_index,
    check_release,
    open_release,
)
from kvgraft.release.models import Entry
from kvgraft.release.sources import Source
from kvgraft.remote import open_source, subset
from kvgraft.results import verify as results
from kvgraft.results.verify import Checked, SignatureFile
from kvgraft.signing import attest, keys
from kvgraft.signing.policy import (
    OPEN,
    Entries,
    Everything,
    OwnOutput,
    Sample,
    Scope,
    ScopeName,
    SignatureNotChecked,
    VerifyPolicy,
)
from kvgraft.signing.sigstore import integrated_time, verify_sigstore_bundle
from kvgraft.signing.verified import Origin as Origin
from kvgraft.signing.verified import VerifiedRelease as VerifiedRelease

RESULT_FORMAT: Final = "kvgraft-verify-result"
RESULT_VERSION: Final = 1


# What model.sig says: its files (release.sigstore.json aside), the digest it lists for release.sigstore.json
# (None: none), and the paths it says it ignores.
_OmsList = tuple[dict[str, str], str | None, tuple[str, ...]]


@dataclass
class SignatureStatus:
    status: Checked
    method: Literal["key", "sigstore"] | None = None
    bundle: str | None = None  # path of the bundle, None when the release has none
    bundle_sha256: str | None = None  # digest of the exact bundle bytes accepted
    oms_signature: str | None = None  # path of an OpenSSF model signing signature (model.sig), if any
    oms_sha256: str | None = None  # digest of its exact bytes
    oms_verified: bool = False  # it was checked with the key (else only its file list was compared)
    key_id: str | None = None
    identity: str | None = None
    issuer: str | None = None
    signed_time: str | None = None  # Sigstore: the transparency log's integrated time (UTC), which it verified
    # Each signature file read, and the key that verified it.
    signatures: list[SignatureFile] = field(default_factory=list)
    # Files outside the manifest that the OMS signature lists (a Hub card): hashed and compared.
    oms_beside_release: list[str] = field(default_factory=list)
    # Files outside the manifest in paths the OMS signature says it ignores: no signature covers them.
    oms_ignored: list[str] = field(default_factory=list)

    def describe(self) -> str:
        oms = f"; OpenSSF model signing signature {'verified' if self.oms_verified else 'present'}" if self.oms_signature else ""
        beside = (f"; beside the release, signed by the OMS signature only: {', '.join(self.oms_beside_release[:5])}"
                  if self.oms_beside_release else "")
        keyed = [s for s in self.signatures if s.key_id]
        if self.status == "verified" and len(self.signatures) > 1 and keyed:
            return "verified: " + "; ".join(
                f"{Path(s.file).name} {'verified with key ' + s.key_id if s.key_id else 'not checked'}"
                for s in self.signatures) + beside
        if self.status == "verified":
            who = f"key {self.key_id}" if self.method == "key" else f"{self.identity} via {self.issuer} (Sigstore)"
            return f"verified: {who}{oms}{beside}"
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
    model: results.Model
    warnings: list[str] = field(default_factory=list)
    policy: VerifyPolicy = field(default_factory=SignatureNotChecked)
    opened: Release | None = field(default=None, repr=False)  # the checked release, headers included
    scope: ScopeName = "all"  # "all": every file; "open": signature, statement, manifest; "entries": and checked_entries;
    # "sample": signature, statement, manifest, every index record, and the files of a drawn sample (checked_entries)
    checked_entries: list[str] = field(default_factory=list)
    sample: results.Sample | None = None  # scope "sample": the draw (kvgraft.sampling.sample_record)
    bound: results.Bound | None = None  # scope "sample": what it says of the release (kvgraft.sampling.check_bound)
    location: str = ""  # the release as given (a folder, or the URL its folder `release` stands for)

    @property
    def throughput(self) -> float:
        """Bytes hashed per second."""
        return self.bytes_hashed / self.seconds if self.seconds > 0 else 0.0

    def document(self) -> results.VerifyResult:
        """The `verify --json` document (schemas/verify-result.v1.json); its members are those set
        (`model_dump(mode="json", exclude_unset=True)`: `sample` and `bound` only for a sample)."""
        s = self.signature
        signature = results.Signature(
            status=s.status, method=s.method, bundle=self._shown(s.bundle), bundle_sha256=s.bundle_sha256,
            oms_signature=self._shown(s.oms_signature), oms_sha256=s.oms_sha256, oms_verified=s.oms_verified,
            key_id=s.key_id, identity=s.identity, issuer=s.issuer, signed_time=s.signed_time,
            signatures=[f.model_copy(update={"file": self._shown(f.file)}) for f in s.signatures],
            oms_beside_release=list(s.oms_beside_release), oms_ignored=list(s.oms_ignored))
        document = results.VerifyResult(
            format=RESULT_FORMAT, format_version=RESULT_VERSION, kvgraft_version=__version__,
            ok=True, exit_code=0, error=None, release=self.location or str(self.release),
            root_digest=self.root_digest, manifest_sha256=self.manifest_sha256,
            model=self.model, entries=self.entries, files=self.files, tensors=self.tensors,
            bytes_hashed=self.bytes_hashed, seconds=round(self.seconds, 6),
            throughput_bytes_per_s=round(self.throughput, 1), deep=self.deep,
            statement=self.statement, signature=signature, warnings=list(self.warnings),
            scope=self.scope, checked_entries=list(self.checked_entries))
        if self.sample is None:
            return document
        return document.model_copy(update={"sample": self.sample, "bound": self.bound})  # members set: dumped

    @overload
    def _shown(self, path: str) -> str: ...
    @overload
    def _shown(self, path: None) -> None: ...
    def _shown(self, path: str | None) -> str | None:
        """A file's path as the person named it (a remote release: its URL, not its folder)."""
        if path is None or not self.location:
            return path
        return path.replace(str(self.release), self.location)


def failure(release: Path | str, error: str, exit_code: int) -> results.VerifyResult:
    """The `verify --json` document of a failed verification, its exit_code the status the process exits with."""
    # Not validated: a status the schema does not list (a remote release whose pieces could not be written: 7)
    # is still the one printed, as the process exits with it.
    return results.VerifyResult.model_construct(
        format=RESULT_FORMAT, format_version=RESULT_VERSION, kvgraft_version=__version__, ok=False,
        exit_code=exit_code, error=error, release=str(release))


class _Signatures:
    """The signature files of one verification (release.sigstore.json, model.sig or a detached OMS signature),
    each looked at and read at most once however many steps ask about it."""

    def __init__(self, root: Path) -> None:
        self.bundle_path = root / attest.BUNDLE_NAME
        self._stats: dict[Path, os.stat_result | None] = {}
        self._bytes: dict[Path, bytes] = {}

    def look(self, path: Path) -> os.stat_result | None:
        """Its lstat, made once (None: nothing there); reading it later opens what this looked at."""
        if path not in self._stats:
            self._stats[path] = jsonio.stat_or_none(path)
        return self._stats[path]

    def present(self, path: Path) -> bool:
        return self.look(path) is not None

    def read(self, path: Path, what: str) -> bytes:
        if path not in self._bytes:
            self._bytes[path] = jsonio.read_bounded(path, attest.MAX_BUNDLE_BYTES, what, self._stats.get(path))
        return self._bytes[path]

    def oms(self, path: Path, given: Sequence[keys.PublicKey] | None, advice: str = "") -> Any:
        from kvgraft.signing import oms

        return oms.read(path, given, advice, raw=self.read(path, "an OMS signature"))


def _read_oms(path: Path, given: list[keys.PublicKey], signature: SignatureStatus,
              has_bundle: bool, signatures: _Signatures) -> _OmsList | None:
    """An OpenSSF model signing signature (RELEASE/model.sig, or the detached one at `path`), if present:
    its files (name -> sha256) without release.sigstore.json, and the digest it lists for
    release.sigstore.json (None if none). With keys given it must verify with one of them; beside a
    kvgraft bundle, keys OMS cannot use (Ed25519 only) leave it unchecked, and its file list is still
    compared."""
    if not signatures.present(path):
        return None
    usable = [k for k in given if isinstance(k, ec.EllipticCurvePublicKey)] if has_bundle else given
    advice = (f"; the release has two signatures ({attest.BUNDLE_NAME} and {path.name}): give --key for each "
              f"signer" if has_bundle else "")
    found = signatures.oms(path, usable or None, advice)
    files, verified_by, digest = found.files, found.verified_by, found.sha256
    signature.oms_signature, signature.oms_sha256, signature.oms_verified = str(path), digest, verified_by is not None
    signature.signatures.append(SignatureFile(file=str(path), kind="oms", sha256=digest,
                                              status="verified" if verified_by else "not checked", key_id=verified_by))
    return files, files.pop(attest.BUNDLE_NAME, None), found.ignored


def verify(source: str | Path | Source, policy: VerifyPolicy, scope: Scope = OPEN) -> VerifiedRelease:
    """The one verification (module docstring): the release `source` names (a folder, an http(s)://, hf://
    or s3:// location, or a source already open) checked under `policy` as far as `scope` reads it.

    `scope` (kvgraft.signing.policy): `OPEN` checks step 1 and what opening a release checks
    (`release.integrity.open_release`: manifest.json against the statement, the manifest, the statement
    against it), reading no entry bytes: what every consumer of release bytes is handed (graft, run, the
    audits, the vLLM connector, a Ray worker), each entry's bytes then checked when read. `Everything`
    checks every file (steps 1-7). `Entries`: opening, then those entries' files only (size, SHA-256,
    header; `deep`: every tensor). `Sample`: opening, every index shard and record, then the files of the
    entries drawn from the root digest and the nonce (kvgraft.sampling, the draw of a sampled audit), every
    tensor re-hashed; the result states the bound.

    Returns a `VerifiedRelease` that carries where it came from; raises a kvgraft Error on the first failure,
    named by the location given. A source opened here (from a folder or a location) is closed when the
    `VerifiedRelease` is (`with verify(...) as checked:`), or at once when verification fails.
    """
    owned = not isinstance(source, Source)
    src = open_source(source) if not isinstance(source, Source) else source
    try:
        result = _verify(src, policy, scope)
    except BaseException as exc:
        if isinstance(exc, Error):
            src.name(exc)
        if owned:
            src.close()
        raise
    assert result.opened is not None
    return VerifiedRelease(result.opened, result, src, owned)


def _verify(src: Source, policy: VerifyPolicy, scope: Scope) -> VerifyResult:
    started = time.perf_counter()
    root = src.root
    jsonio.require_folder(root, " (expected a cache release)")
    pulled = subset.read(root) if isinstance(scope, Everything) else None
    if pulled is not None:  # a subset `kvgraft pull` made: the entries it holds, and no other file
        scope = Entries(tuple(pulled.entries), isinstance(scope, Everything) and scope.deep)
    deep = isinstance(scope, Everything | Entries) and scope.deep
    entries = scope.ids if isinstance(scope, Entries) else ()
    given = [keys.load_public_key(p) for p in policy.keys]
    files = _Signatures(root)
    oms_path = _oms_path(root, policy, files)
    read = _read_bundle(root, policy, given, oms_path, files)
    oms_read = _read_oms_signature(root, policy, given, read, oms_path, scope.name, files)
    _every_key_verifies_a_signature(root, given, read.signature)
    checked = _check_files(src, policy, read, oms_read, oms_path, scope.name, deep)
    drawn = _draw(checked, scope.size, scope.nonce) if isinstance(scope, Sample) else None
    if drawn is not None:
        checked_entries, tensors, hashed = _check_sample(checked, drawn.entries, oms_read, oms_path)
    else:
        checked_entries, tensors, hashed = _check_entries(checked, entries, deep, oms_read, oms_path)
    if oms_read is not None:
        _compare_oms_list(oms_read, checked, read, oms_path, scope.name)
    if pulled is not None:
        read.warnings.append(subset.check_folder(root, pulled, checked.release))
    read.warnings.extend(src.notes)  # what reading it from elsewhere could not check
    m = checked.manifest
    return VerifyResult(
        release=root, root_digest=m["root_digest"], manifest_sha256=checked.manifest_sha256,
        entries=checked.release.num_entries, files=checked.count, tensors=tensors,
        bytes_hashed=hashed, seconds=time.perf_counter() - started, deep=deep,
        signature=read.signature, statement=read.statement is not None,
        model=results.Model(spec=m["model"]["spec"], identity_sha256=m["model"]["identity"]["sha256"]),
        warnings=read.warnings, policy=policy, opened=checked.release, scope=scope.name,
        checked_entries=checked_entries, sample=drawn,
        bound=sampling.check_bound(len(drawn.entries), drawn.population) if drawn else None,
        location=src.location,
    )


def _draw(checked: CheckedRelease, size: int, nonce: str | None) -> results.Sample:
    """`--sample`: the sample drawn from the root digest and the nonce as a sampled audit draws it
    (kvgraft.sampling), from the ids and token counts the manifest lists."""
    rel = checked.release
    source = "given" if nonce is not None else "drawn"
    nonce = sampling.check_nonce(nonce) if nonce is not None else sampling.new_nonce()
    return results.Sample.model_validate(sampling.sample_record(str(rel.manifest["root_digest"]), nonce, rel.entry_ids(),
                                                        rel.token_counts(), size, nonce_source=source))


def _check_sample(checked: CheckedRelease, drawn: list[str], oms_read: _OmsList | None,
                  oms_path: Path) -> tuple[list[str], int, int]:
    """`--sample`: every index record (release.integrity.check_index), and each drawn entry's file, every
    tensor re-hashed, while its shard is held: one pass over the index, no shard read twice."""
    wanted = set(drawn)
    done: list[CheckedEntry] = []

    def each(entry: Entry) -> None:
        if entry["id"] in wanted:
            done.append(_check_entry(checked, entry["id"], True, oms_read, oms_path))

    index_bytes = check_index(checked.release, each)
    return (list(drawn), checked.tensors + sum(one.tensors for one in done),
            checked.bytes_hashed + index_bytes + sum(one.bytes_hashed for one in done))


@dataclass
class _Read:
    """What the signature files said: the signature's status, the statement (None: unsigned or OMS alone)."""

    signature: SignatureStatus
    statement: attest.Statement | None = None
    warnings: list[str] = field(default_factory=list)
    source: str = "manifest"
    bundle_raw: bytes | None = None


def _oms_path(root: Path, policy: VerifyPolicy, files: _Signatures) -> Path:
    """Where the OpenSSF model signing signature is read from: RELEASE/model.sig, or the detached one named."""
    oms_path = root / attest.OMS_NAME
    if policy.oms_signature is None:
        return oms_path
    detached = Path(policy.oms_signature)
    inside, named = files.look(oms_path), files.look(detached)
    if inside is not None and named is not None and stat.S_ISLNK(named.st_mode):
        # Only a link is looked through, to see whether it names the release's own model.sig: a link is never read.
        named = jsonio.stat_or_none(detached, follow=True)
    if inside is not None and named is not None and os.path.samestat(inside, named):
        return oms_path  # the release's own model.sig, named: the one read anyway
    if inside is not None:
        raise InputError(f"{oms_path}: the release holds an OMS signature and --oms-signature names another "
                         f"({policy.oms_signature}); give one of them")
    files.read(detached, "an OMS signature")  # absent: exit 2 here
    return detached


def _read_bundle(root: Path, policy: VerifyPolicy, given: list[keys.PublicKey], oms_path: Path,
                 files: _Signatures) -> _Read:
    """Step 1: release.sigstore.json, its signature checked as the policy asks, its statement parsed."""
    bundle_path = files.bundle_path
    read = _Read(SignatureStatus("not checked"))
    signature, identity, issuer = read.signature, policy.identity, policy.issuer
    oms_present = files.present(oms_path)
    if files.present(bundle_path):
        # read_bounded refuses a link or a special file before opening it
        bundle = attest.parse_bundle(files.read(bundle_path, "a bundle"), str(bundle_path))
        read.bundle_raw = bundle.raw
        signature.bundle = str(bundle_path)
        signature.bundle_sha256 = sha256_hex(bundle.raw)
        payload_type, payload = bundle.payload_type, bundle.payload
        if given:
            try:
                signature.key_id = attest.verify_with_any(bundle, given)
            except VerificationError as exc:
                # Advice only where it helps: the key given is the other signature's signer (a wrong key on a
                # release one signer signed twice is just a wrong key).
                if oms_present and _verifies(oms_path, given, files):
                    raise VerificationError(f"{exc}; the release has two signatures ({attest.BUNDLE_NAME} and "
                                            f"{oms_path.name}): give --key for each signer") from None
                raise
            signature.status, signature.method = "verified", "key"
        elif identity is not None and issuer is not None:
            if not bundle.has_certificate:
                raise VerificationError(f"{bundle_path}: the release is signed with key {bundle.key_hint}, not a Sigstore "
                                        f"certificate; verify it with --key")
            verified = verify_sigstore_bundle(None, bundle.raw, identity=identity, issuer=issuer, trust=policy.trust,
                                              where=str(bundle_path))
            assert verified.payload_type is not None and verified.payload is not None
            payload_type, payload = verified.payload_type, verified.payload
            signature.status, signature.method = "verified", "sigstore"
            signature.identity, signature.issuer = identity, issuer
            signature.signed_time = integrated_time(bundle.raw)
        else:
            read.warnings.append("the signature was not checked (no --key or Sigstore identity given); the statement "
                                 "in the bundle was compared with the files")
        signature.signatures.append(SignatureFile(file=str(bundle_path), kind="kvgraft", sha256=signature.bundle_sha256,
                                                  status=signature.status, key_id=signature.key_id))
        read.statement = attest.parse_statement(payload_type, payload, str(bundle_path))
        read.source = "signed statement" if signature.status == "verified" else "statement (signature not checked)"
    elif oms_present and identity is None:
        pass  # an OpenSSF model signing signature alone: read next
    elif given or identity is not None:
        wanted = "--key" if given else "--certificate-identity"
        raise VerificationError(f"{root}: the release is unsigned (no {attest.BUNDLE_NAME}) but {wanted} "
                                f"requires a signature")
    else:
        read.warnings.append(f"the release is unsigned (no {attest.BUNDLE_NAME}): only its bytes against its manifest "
                             f"were checked")
    return read


def _verifies(oms_path: Path, given: list[keys.PublicKey], files: _Signatures) -> bool:
    """Whether one of the keys verifies the OMS signature (only to word an error: a failure here says no)."""
    try:
        files.oms(oms_path, given)
    except Error:
        return False
    return True


def _read_oms_signature(root: Path, policy: VerifyPolicy, given: list[keys.PublicKey], read: _Read, oms_path: Path,
                        scope: str, files: _Signatures) -> _OmsList | None:
    """Step 1's other signature: model.sig read (and checked with the keys) when there is one and this scope reads it;
    signed with it alone, its file list plays the statement's part."""
    signature = read.signature
    if (scope != "all" and read.bundle_raw is not None and files.present(oms_path)
            and policy.oms_signature is None and len(given) <= 1):
        # Opening a release signed with kvgraft's bundle does not read model.sig: OMS lists every file
        # of the folder (its cost grows with the entries), and the bundle already binds every byte.
        # `kvgraft verify` (everything) and `model_signing verify` check it; so does opening with a
        # second key given for it, or a detached OMS signature named.
        signature.oms_signature = str(oms_path)
        return None
    oms_read = _read_oms(oms_path, given, signature, read.bundle_raw is not None, files)
    if oms_read is not None and read.statement is None:
        # Signed only with OpenSSF model signing: its file list plays the statement's part.
        if given and signature.oms_verified:
            signature.status, signature.method = "verified", "key"
            signature.key_id = signature.signatures[-1].key_id
        if policy.require_signature and signature.status != "verified":
            raise VerificationError(f"{root}: --require-signature: the OpenSSF model signing signature was not checked")
        read.warnings[:] = [] if signature.status == "verified" else [
            f"the OpenSSF model signing signature ({oms_path.name}) was not checked (no --key given); its file "
            f"list was compared with the files"]
        read.source = "OMS signature" if signature.status == "verified" else "OMS signature (not checked)"
    return oms_read


def _every_key_verifies_a_signature(root: Path, given: list[keys.PublicKey], signature: SignatureStatus) -> None:
    used = {s.key_id for s in signature.signatures if s.status == "verified"}
    for k in given:
        if keys.key_id(k) not in used:
            whose = "; ".join(f"{Path(s.file).name}: {'key ' + s.key_id if s.key_id else 'not checked'}"
                              for s in signature.signatures)
            raise VerificationError(f"{root}: key {keys.key_id(k)} verifies no signature of the release ({whose})")


def _check_files(src: Source, policy: VerifyPolicy, read: _Read, oms_read: _OmsList | None,
                 oms_path: Path, scope: str, deep: bool) -> CheckedRelease:
    """Steps 2-7 (scope "all") or what opening checks, against the statement or else the OMS file list."""
    root = src.root
    oms_files = oms_read[0] if oms_read is not None else None
    # Files beside the release (a Hub card, README.md) are accepted only when an OMS signature lists them and
    # it was verified, or when nothing is verified at all (then nothing is authenticated, as the warnings say).
    beside_ok = read.signature.oms_verified or not policy.checks_signature
    # So are files in the paths it says it ignores (model_signing --ignore-paths), under the same rule.
    ignored = oms_read[2] if oms_read is not None and beside_ok else ()
    signed = read.signature.status == "verified"
    source = read.source
    if read.statement is not None:
        # The statement's subjects pin manifest.json and the files it binds; its predicate is checked against
        # the parsed manifest (step 3, before the folder).
        statement = read.statement
        subjects, attested = attest.subjects(statement), statement["predicate"]["root_digest"]
        listing = Listing(subjects, source, vouched=signed,
                          manifest_note=f"the statement attests the release with root digest {attested}",
                          also=attest.predicate_check(root, statement, source))
        if scope == "all":
            beside = ({n: d for n, d in oms_files.items() if n not in subjects}
                      if oms_files is not None and beside_ok else {})
            return check_release(root, listing, beside=Beside(f"OMS signature ({oms_path.name})", beside, ignored),
                                 deep=deep, keep_files=oms_files is not None, source=src)
        return open_release(root, listing, src)
    # An OMS file list (or none) plays the statement's part; it names every file of the folder, and what it
    # names beyond the release's files lies beside it (when it may: beside_ok).
    every = (Listing(oms_files, source, every_file=True, keeps_beside=beside_ok, vouched=signed)
             if oms_files is not None else None)
    if scope == "all":
        return check_release(root, every, beside=Beside(source, excused=ignored), deep=deep,
                             keep_files=oms_files is not None, source=src)
    # Signed with OMS alone: opening compares the files opening reads (manifest.json, which binds the rest,
    # and the index files), each entry's file when it is checked.
    return open_release(root, every, src)


def _check_entries(checked: CheckedRelease, entries: Sequence[str], deep: bool,
                   oms_read: _OmsList | None, oms_path: Path) -> tuple[list[str], int, int]:
    """`--entry ID`: those entries' files (size, SHA-256, header), and against the OMS file list when there is one."""
    tensors, hashed = checked.tensors, checked.bytes_hashed
    for eid in entries:
        one = _check_entry(checked, eid, deep, oms_read, oms_path)
        tensors, hashed = tensors + one.tensors, hashed + one.bytes_hashed
    return list(entries), tensors, hashed


def _check_entry(checked: CheckedRelease, eid: str, deep: bool, oms_read: _OmsList | None,
                 oms_path: Path) -> CheckedEntry:
    one = check_entry(checked.release, eid, deep=deep)
    oms_files = oms_read[0] if oms_read is not None else None
    if oms_files is not None:
        meta = checked.release.file_meta(one.entry)
        if oms_files.get(one.entry["file"]) != meta["sha256"]:
            raise VerificationError(f"{oms_path}: the OpenSSF model signing signature lists "
                                    f"{one.entry['file']} (entry {eid!r}) with sha256 "
                                    f"{oms_files.get(one.entry['file'])}, the manifest {meta['sha256']}")
    return one


def _compare_oms_list(oms_read: _OmsList, checked: CheckedRelease, read: _Read,
                      oms_path: Path, scope: str) -> None:
    """The OMS signature's file list against the files checked: after the release's own checks, which say
    more precisely what changed."""
    oms_files, listed_bundle, _ = oms_read
    has = {**checked.files, **checked.beside}
    compared = oms_files if scope == "all" else {n: sha for n, sha in oms_files.items() if n in has}
    if compared != has:
        differs = sorted(n for n in set(oms_files) | set(has) if oms_files.get(n) != has.get(n))
        raise VerificationError(f"{oms_path}: the OpenSSF model signing signature lists other files "
                                f"or digests than the release has ({', '.join(differs[:3])})")
    actual_bundle = sha256_hex(read.bundle_raw) if read.bundle_raw is not None else None
    if listed_bundle != actual_bundle:
        raise VerificationError(f"{oms_path}: the OpenSSF model signing signature lists "
                                f"{attest.BUNDLE_NAME} with sha256 {listed_bundle}, the release has {actual_bundle}")
    read.signature.oms_beside_release = sorted(checked.beside)
    read.signature.oms_ignored = list(checked.ignored)
    if checked.ignored:
        read.warnings.append(f"files the OMS signature ({oms_path.name}) says it ignores, which no signature covers: "
                             f"{', '.join(checked.ignored[:5])}{' ...' if len(checked.ignored) > 5 else ''}")
    if checked.beside and not read.signature.oms_verified:
        read.warnings.append(f"files beside the release, listed only by the OMS signature (not checked): "
                             f"{', '.join(sorted(checked.beside)[:5])}")


def verified(root: Path | str | Source, policy: VerifyPolicy) -> VerifiedRelease:
    """`verify(root, policy, OPEN)`: what opening a release checks, under `policy` (docs/verification.md), the one
    verification every consumer of a release's bytes goes through (graft, run, audits, the vLLM connector,
    the Ray worker). `SignatureNotChecked()` is what `kvgraft verify` does without options; `OwnOutput` for a
    release kvgraft wrote in this process. The signature, the statement and the manifest (format 2: its
    index); no entry byte is read. Each entry's bytes are checked when read, before any is used, against the
    digests the signed root binds (graft.read_entry_tensors: size, safetensors header against the record's
    tensor table, every tensor's SHA-256 in the same pass as the read). Raises as `verify` does.
    """
    return verify(root, policy, OPEN)


def signature_statement(result: VerifyResult) -> results.ReleaseSignature:
    """What a report or a single check's result states of the release's signature (`release_signature`): checked
    (with which key ids, or which Sigstore identity and issuer, and the log's time where there is one), or not
    checked and why. Made from what verification found, never from what was asked."""
    s = result.signature
    if s.status == "verified":
        ids = sorted({x.key_id for x in s.signatures if x.status == "verified" and x.key_id})
        if not ids and s.key_id:
            ids = [s.key_id]
        return results.ReleaseSignature(checked=True, method=s.method, key_ids=ids if s.method == "key" else [],
                                        identity=s.identity, issuer=s.issuer, signed_time=s.signed_time, reason=None)
    if isinstance(result.policy, OwnOutput):
        why = f"written by {result.policy.made_by} and read back (its digests were checked)"
    elif s.bundle is None and s.oms_signature is None:
        why = "the release is unsigned"
    else:
        why = "no key or Sigstore identity was given"
    return results.ReleaseSignature(checked=False, method=None, key_ids=[], identity=None, issuer=None, signed_time=None,
                                    reason=why)


def signature_sentence(statement: dict[str, Any] | None) -> str:
    """`release_signature` in words, e.g. 'checked: key 3f2a...' or 'not checked (the release is unsigned)'."""
    if statement is None:
        return "not stated (a report written before reports stated it)"
    if not statement["checked"]:
        return f"not checked ({statement['reason']})"
    when = f", signed {statement['signed_time']}" if statement.get("signed_time") else ""
    if statement["method"] == "sigstore":
        return f"checked: Sigstore identity {statement['identity']} via {statement['issuer']}{when}"
    ids = statement["key_ids"]
    return f"checked: key{'s' if len(ids) > 1 else ''} {', '.join(ids)}{when}"
