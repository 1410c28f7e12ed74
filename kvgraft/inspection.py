"""Look inside a release without verifying it: model, conditions, signature files and who they name, entries.

`kvgraft inspect` answers "what is in this release?" from the manifest alone. Nothing here reads a
tensor byte or checks a signature: the manifest is parsed and its internal digests checked (as every
reader of a release does), the signature files are parsed only to name their signers, and the result
says plainly that neither the files nor the signatures were verified (`kvgraft verify` does that).

All reading of the release goes through `Listing`, one small class over `kvgraft.release.format`, so
that a release format with an index and per-entry records changes this one class, not its callers.
Imports no torch.
"""

from __future__ import annotations

import base64
import binascii
import heapq
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Final

from pydantic import JsonValue, TypeAdapter

from kvgraft import __version__
from kvgraft._internal.jsonio import collector_paused
from kvgraft.errors import Error, InputError
from kvgraft.release import models as records
from kvgraft.release.format import Release
from kvgraft.release.sources import Source
from kvgraft.results.base import JsonObject
from kvgraft.results.inspect import (
    Certificate,
    Detail,
    EntryInspection,
    EntrySource,
    Page,
    Refusal,
    ReleaseFormat,
    Row,
    Signature,
    Tensor,
)
from kvgraft.results.inspect import Listing as ListingDoc
from kvgraft.schema import CACHE_MANIFEST, load_schema
from kvgraft.signing.attest import BUNDLE_NAME, OMS_NAME

RESULT_FORMAT: Final = "kvgraft-inspect-result"
RESULT_VERSION: Final = 1
NOT_VERIFIED = ("not verified: the manifest was parsed and its own digests checked; no entry file was read and no "
                "signature was checked (run kvgraft verify)")
PREVIEW_WORDS = 8
PREVIEW_CHARS = 60
# What one inspection holds is bounded whatever the release holds (its records are the author's): an
# entry's text and answer are cut at DETAIL_TEXT_CHARS (flagged `truncated`), every other string at
# FIELD_CHARS (ending "…"), an entry's layers and tensors at DETAIL_ROWS rows (`layers_total` and
# `tensors_total` count them all; the terminal shows fewer, kvgraft.cli.inspection.SHOWN_ROWS), and a
# free-form member (`meta`, an environment's extra keys) at FIELD_VALUES values. `--json` is then at most
# a few hundred KB, whatever the record.
DETAIL_TEXT_CHARS = 2000
FIELD_CHARS = 200
DETAIL_ROWS = 1024
FIELD_VALUES = 64
# Fulcio certificate extensions naming the OIDC issuer: v2 (a DER UTF8String), then v1 (raw bytes; deprecated).
_FULCIO_ISSUER_V2 = "1.3.6.1.4.1.57264.1.8"
_FULCIO_ISSUER_V1 = "1.3.6.1.4.1.57264.1.1"
_OBJECT: TypeAdapter[JsonObject] = TypeAdapter(JsonObject)  # a record's object (its next token, a layer) as JSON


@dataclass
class Listing:
    """What inspect reads of a release: its header, its entry count, a page of entries, one entry, a file's size.

    Over `Release.open` (one manifest read; format 2: an index shard for each page's records, never an
    entry file). The only class here that knows how a release is stored. Used as a context manager: a
    release read from elsewhere has its folder removed at the end, and an error raised inside names its URL.
    """

    root: Path
    _release: Release
    shown: str = ""  # the release as given (a remote location's URL; its local folder is `root`)
    source: Source | None = None  # where its files come from (None: a folder, nothing to close)

    @classmethod
    def open(cls, root: Path | str) -> Listing:
        from kvgraft.remote import open_source

        source = open_source(root)
        try:
            return cls(source.root, Release.open(source.root, source), str(root), source)
        except BaseException as exc:
            source.__exit__(type(exc), exc, exc.__traceback__)
            raise

    def __enter__(self) -> Listing:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if self.source is not None:
            self.source.__exit__(kind, exc, tb)

    def header(self) -> Header:
        """The manifest's header, each member `clipped` (the environment's own keys first: it may hold more)."""
        m = self._release.manifest
        env = m["environment"]
        own = load_schema(CACHE_MANIFEST)["properties"]["environment"]["required"]
        return Header(
            ReleaseFormat.model_validate(clipped({"format": m["format"], "version": m["format_version"],
                                                  "kvgraft_version": m["kvgraft_version"]})),
            created=cut(m["created"]), model=clipped_object(records.as_json(m["model"])),
            schedule=clipped_object(records.as_json(m["schedule"])),
            root_digest=m["root_digest"], environment=clipped_object({**{k: env[k] for k in own if k in env}, **env}))

    def count(self) -> int:
        return self._release.num_entries

    def files(self) -> int:
        if self._release.index is None:
            return len(self._release.manifest["files"])
        # Format 2: the index files, and one file per entry (the writer's layout; counted without
        # reading every shard).
        return len(self._release.subject_files()) + self._release.num_entries

    # The records a release hands out were validated when it read them (its manifest's schema, an index
    # shard's models): here they are the records kvgraft.release.models describes.

    def page(self, offset: int, limit: int | None) -> list[records.Entry]:
        return list(self.iter_page(offset, limit))

    def iter_page(self, offset: int, limit: int | None) -> Iterator[records.Entry]:
        """A page's records, each read as it is consumed (format 2: a few shards held at a time)."""
        end = None if limit is None else offset + limit
        if self._release.index is None:
            yield from self._release.manifest["entries"][offset:end]
            return
        with collector_paused():  # as Index.all_entries: records hold no cycles, and a resume per shard costs
            for eid in self._release.entry_ids()[offset:end]:
                yield self._release.entry(eid)

    def entry(self, entry_id: str) -> records.Entry:
        return self._release.entry(entry_id)

    def file_record(self, entry: records.Entry) -> records.FileMeta:
        """The manifest's {sha256, size} of the entry's file (the file itself is not opened)."""
        return self._release.file_meta(entry)


@dataclass(frozen=True)
class Header:
    """A release's header as inspect shows it: each member cut to a bounded size."""

    release_format: ReleaseFormat
    created: str
    model: JsonObject
    schedule: JsonObject
    root_digest: str
    environment: JsonObject


def cut(text: str, chars: int = FIELD_CHARS) -> str:
    """`text`, or its first `chars` characters and "…" when longer."""
    return text if len(text) <= chars else text[:chars] + "…"


def clipped(value: JsonValue, chars: int = FIELD_CHARS, values: int = FIELD_VALUES) -> JsonValue:
    """A copy of a JSON value to show: strings (keys too) cut to `chars` characters, and at most `values`
    values in all; a list or object cut short ends with a string saying how many more it holds."""
    left = values

    def walk(v: JsonValue) -> JsonValue:
        nonlocal left
        left -= 1
        if isinstance(v, str):
            return cut(v, chars)
        if isinstance(v, list):
            items: list[JsonValue] = []
            for x in v:
                if left <= 0:
                    return [*items, f"… {len(v) - len(items)} more"]
                items.append(walk(x))
            return items
        if isinstance(v, dict):
            members: JsonObject = {}
            for k, x in v.items():
                if left <= 0:
                    members["…"] = f"{len(v) - len(members)} more"
                    break
                members[cut(k, chars)] = walk(x)
            return members
        return v

    return walk(value)


def clipped_object(value: JsonObject, chars: int = FIELD_CHARS, values: int = FIELD_VALUES) -> JsonObject:
    """`clipped` of a JSON object: an object still."""
    out = clipped(value, chars, values)
    assert isinstance(out, dict)
    return out


def preview(source: records.Source, *, words: int = PREVIEW_WORDS, chars: int = PREVIEW_CHARS) -> str:
    """The first words of an entry's text (for a chat: of its first message, after its role)."""
    if source.get("kind") == "messages":
        msgs = [m for m in source.get("messages") or [] if isinstance(m, dict)]
        first = msgs[0] if msgs else {}
        content = first.get("content")
        text = content if isinstance(content, str) else "" if content is None else str(content)
        text = f"{first.get('role', '?')}: {text}" if msgs else ""
    else:
        text = source["text"] if isinstance(source.get("text"), str) else ""
    parts = str(text).split()
    out = " ".join(parts[:words])
    if len(out) > chars:
        out = out[:chars].rstrip()
    return out + ("…" if out != " ".join(parts) else "")


def tensor_bytes(entry: records.Entry) -> int:
    spans = list(map(_BYTE_RANGE, entry["tensors"].values()))  # C speed: a 48-layer record names 96 tensors
    total: int = sum(map(_END, spans)) - sum(map(_START, spans))
    return total


_BYTE_RANGE, _START, _END = operator.itemgetter("byte_range"), operator.itemgetter(0), operator.itemgetter(1)


def entry_row(listing: Listing, entry: records.Entry) -> Row:
    """One line of the entries table: id, tokens, bytes (of its file, from the manifest), source kind, first words."""
    return Row(id=entry["id"], num_tokens=entry["num_tokens"], bytes=listing.file_record(entry)["size"],
               tensor_bytes=tensor_bytes(entry), source_kind=entry["source"]["kind"], preview=preview(entry["source"]))


def entry_detail(listing: Listing, entry_id: str) -> Detail:
    """One entry in full: its file, layers, tensors (dtype, shape, bytes, digest), tokens and source."""
    e = listing.entry(entry_id)
    source = e["source"]
    text = source.get("text") if source.get("kind") == "text" else None
    # The first DETAIL_ROWS by position in the file: a selection, not a sort of every tensor.
    first = heapq.nsmallest(DETAIL_ROWS, e["tensors"].items(), key=lambda kv: kv[1]["byte_range"][0])
    tensors = [Tensor(name=cut(name), dtype=t["dtype"], shape=list(t["shape"]), byte_range=list(t["byte_range"]),
                      bytes=int(t["byte_range"][1]) - int(t["byte_range"][0]), sha256=t["sha256"]) for name, t in first]
    src = EntrySource(kind=source["kind"], sha256=source["sha256"])
    if isinstance(text, str):
        src = src.model_copy(update={"text": text[:DETAIL_TEXT_CHARS], "truncated": len(text) > DETAIL_TEXT_CHARS})
    elif source["kind"] == "messages":
        src = src.model_copy(update={"messages": len(source.get("messages") or [])})
    row = entry_row(listing, e)
    probe = e.get("probe")
    out = Detail(
        id=row.id, num_tokens=row.num_tokens, bytes=row.bytes, tensor_bytes=row.tensor_bytes,
        source_kind=row.source_kind, preview=row.preview, file=cut(e["file"]),
        file_sha256=listing.file_record(e)["sha256"], digest=e["digest"], token_ids_sha256=e["token_ids_sha256"],
        token_ids_head=e["token_ids"][:16], source=src, next_token=_OBJECT.validate_python(e["next_token"]),
        probe_tokens=len(probe.get("token_ids") or []) if probe else 0,
        layers=[clipped_object(_OBJECT.validate_python(layer)) for layer in e["layers"][:DETAIL_ROWS]],
        layers_total=len(e["layers"]),
        tensors=tensors, tensors_total=len(e["tensors"]))
    more: dict[str, JsonValue] = {}  # members the entry may lack: absent here too
    if "answer" in e:
        answer = e["answer"]
        more["answer"] = answer[:DETAIL_TEXT_CHARS] if isinstance(answer, str) else answer
        more["answer_truncated"] = isinstance(answer, str) and len(answer) > DETAIL_TEXT_CHARS
    if "meta" in e:
        more["meta"] = clipped(e["meta"])
    return out.model_copy(update=more) if more else out


@dataclass(frozen=True)
class _Signer:
    """Whom a Fulcio certificate names, and when it was valid; or why it cannot be read."""

    identity: str | None = None
    issuer: str | None = None
    problem: str | None = None
    certificate: Certificate | None = None


def _certificate_signer(material: JsonObject) -> _Signer:
    """The identities and OIDC issuer a Fulcio certificate names (read, not checked against any root).

    A certificate that cannot be read, or whose extensions do not parse (cryptography parses them when first
    read: a malformed SubjectAlternativeName raises there), is a `problem` the row shows."""
    from cryptography import x509

    cert = material.get("certificate")
    if not isinstance(cert, dict):
        chain = material.get("x509CertificateChain")
        certs = chain.get("certificates") if isinstance(chain, dict) else None
        cert = certs[0] if isinstance(certs, list) and certs and isinstance(certs[0], dict) else {}
    try:
        der = base64.b64decode(str(cert.get("rawBytes", "")), validate=True)
        c = x509.load_der_x509_certificate(der)
        extensions = c.extensions
    except (binascii.Error, ValueError) as exc:
        return _Signer(problem=f"certificate cannot be read: {' '.join(str(exc).split())[:200]}")
    names: list[str] = []
    try:
        san = extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        names = [str(v) for kind in (x509.RFC822Name, x509.UniformResourceIdentifier) for v in san.get_values_for_type(kind)]
    except x509.ExtensionNotFound:
        pass
    issuer = None
    for ext in extensions:
        if ext.oid.dotted_string in (_FULCIO_ISSUER_V2, _FULCIO_ISSUER_V1) and issuer is None:
            raw = getattr(ext.value, "value", b"")
            # v2 is a DER UTF8String (tag 0x0c, one length byte for any real issuer URL); v1 the bare bytes.
            if ext.oid.dotted_string == _FULCIO_ISSUER_V2 and raw[:1] == b"\x0c" and len(raw) > 2:
                raw = raw[2:]
            issuer = raw.decode("utf-8", "replace")
    return _Signer(", ".join(names) or None, issuer, certificate=Certificate(
        not_before=c.not_valid_before_utc.isoformat(), not_after=c.not_valid_after_utc.isoformat()))


def _signature_file(root: Path, name: str, what: str, manifest_root: str) -> Signature | None:
    """A signature file beside the data, parsed to name its signer; None when absent. Never verified."""
    from kvgraft._internal import jsonio
    from kvgraft.signing import attest

    path = root / name
    if not path.exists() and not path.is_symlink():
        return None
    info: JsonObject = {"file": name, "what": what, "verified": False}
    try:
        if path.is_symlink():
            raise InputError(f"{path}: is a symlink; releases may not contain links")
        bundle = attest.parse_bundle(jsonio.read_bounded(path, attest.MAX_BUNDLE_BYTES, "a bundle"), str(path))
    except Error as exc:
        info.update(method=None, signer=None, problem=exc.diagnostics())
        return Signature.model_validate(clipped_object(info, DETAIL_TEXT_CHARS))
    info["bytes"] = len(bundle.raw)
    if bundle.has_certificate:
        material = bundle.material
        cert = _certificate_signer(material)
        entries = material.get("tlogEntries")
        info.update(method="sigstore", signer=cert.identity, issuer=cert.issuer,
                    certificate=cert.certificate.as_json() if cert.certificate else {},
                    transparency_log_entries=len(entries) if isinstance(entries, list) else 0)
        if cert.problem is not None:
            info["problem"] = cert.problem
    else:
        info.update(method="key", signer=bundle.key_hint or bundle.keyid)
    if name == BUNDLE_NAME:
        try:
            stmt = attest.parse_statement(bundle.payload_type, bundle.payload, str(path))
            predicate = stmt.get("predicate")
            named = predicate.get("root_digest") if isinstance(predicate, dict) else None
            if named is not None and not isinstance(named, str):
                raise InputError(f"{path}: the statement's root digest is not a string")
            info["statement_root_digest"] = named
            info["names_this_manifest"] = named == manifest_root
        except Error as exc:
            info["problem"] = exc.diagnostics()
    return Signature.model_validate(clipped_object(info, DETAIL_TEXT_CHARS))


def signatures(root: Path, manifest_root: str) -> list[Signature]:
    """The release's signature files (its bundle, an OpenSSF model signing signature) and whom they name."""
    found = [_signature_file(root, BUNDLE_NAME, "kvgraft attestation (Sigstore bundle, DSSE)", manifest_root),
             _signature_file(root, OMS_NAME, "OpenSSF model signing v1.0 signature", manifest_root)]
    return [f for f in found if f is not None]


def inspect(root: Path | str, *, offset: int = 0, limit: int | None = 20) -> JsonObject:
    """The release's header, signature files and a page of its entries (`offset`, at most `limit`; None: all),
    as `inspect --json` prints it."""
    doc, rows = listing(root, offset=offset, limit=limit)
    return doc.model_copy(update={"entries": doc.entries.model_copy(update={"rows": list(rows)})}).as_json()


def listing(root: Path | str, *, offset: int = 0, limit: int | None = 20) -> tuple[ListingDoc, Iterator[Row]]:
    """`inspect`'s document with no rows yet, and the rows, each read as it is consumed: a listing of every
    entry printed as it is read holds a few index shards, whatever the number of entries."""
    if offset < 0 or (limit is not None and limit < 0):
        raise InputError(f"--offset {offset} / --limit {limit}: expected numbers of at least 0")
    lst = Listing.open(root)
    try:
        h = lst.header()
        total = lst.count()
        shown = max(0, total - offset) if limit is None else max(0, min(limit, total - offset))
        doc = ListingDoc(
            format=RESULT_FORMAT, format_version=RESULT_VERSION, kvgraft_version=__version__,
            release=lst.shown or str(lst.root), verified=False, note=NOT_VERIFIED, release_format=h.release_format,
            created=h.created, model=h.model, schedule=h.schedule, root_digest=h.root_digest,
            environment=h.environment, files=lst.files(), signatures=signatures(lst.root, h.root_digest),
            entries=Page(total=total, offset=offset, shown=shown, rows=[]))  # the rows: read as they are consumed
    except BaseException as exc:
        lst.__exit__(type(exc), exc, exc.__traceback__)
        raise
    return doc, _rows(lst, offset, limit)


def _rows(lst: Listing, offset: int, limit: int | None) -> Iterator[Row]:
    """The page's rows as they are read; the listing is closed when they are all read (or the reading stops)."""
    with lst:
        for e in lst.iter_page(offset, limit):
            yield entry_row(lst, e)


def failure(release: Path | str, error: str, exit_code: int) -> Refusal:
    """The `inspect --json` document of a release that could not be inspected: the one line printed on stderr,
    and the exit status."""
    return Refusal(format=RESULT_FORMAT, format_version=RESULT_VERSION, kvgraft_version=__version__,
                   release=str(release), ok=False, exit_code=exit_code, error=error)


def inspect_entry(root: Path | str, entry_id: str) -> EntryInspection:
    """One entry in detail, with the release it belongs to named (nothing verified)."""
    with Listing.open(root) as listing:
        return EntryInspection(format=RESULT_FORMAT, format_version=RESULT_VERSION, kvgraft_version=__version__,
                               release=listing.shown or str(listing.root), verified=False, note=NOT_VERIFIED,
                               root_digest=listing.header().root_digest, entry=entry_detail(listing, entry_id))
