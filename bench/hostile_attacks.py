"""The attacks of bench/hostile_campaign.py on a format-2 release, and what each command must answer.

The pristine release holds 5 entries in 3 index shards (2, 2, 1), signed with key k1. A case copies it
and applies one attack of a class:

- content attacks change bytes (a bit flip, a cut, a swap, a special file, ...) and leave k1's signature
  as it was; the release is verified with --key k1;
- structure attacks edit records as an attacker holding their own key k3 would: every digest in the
  chain is recomputed (records, shard and prefix-index digests and sizes, the root digest) and the
  release is re-signed with k3 (release.sigstore.json and model.sig), so only a bound the format sets can
  refuse it; it is verified with --key k3.

Each attack names the parts of the release it violates: files by their release-relative name, and
"folder" (what is in the folder beside the listed files) and "records" (what only every record together
shows: a file two entries share, the token count), which only a whole-release verify reads. A command
that reads a violated part must refuse (exit 1 or 2); exit 0 there is a miss. A command that reads none
may answer 0 (inspect does not verify, `verify --entry` reads one entry). A control must verify (exit 0).
"""

from __future__ import annotations

import base64
import datetime
import hashlib
import json
import os
import random
import shutil
import socket
import struct
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kvgraft._internal import jsonio
from kvgraft._internal.digest import digest_json, sha256_hex
from kvgraft.release import index as release_index
from kvgraft.release.records import MANIFEST, entry_digest, root_digest, token_ids_digest
from kvgraft.signing import attest, keys, oms
from kvgraft.signing.attest import BUNDLE_NAME, OMS_NAME

PREFIX = release_index.PREFIX_FILE
RECORD = release_index.RECORD.size
FORGED = "FORGED-LINE"  # planted after a newline: an output line starting with it was injected
# Raw in output these drive a terminal or reorder what it shows: C0 (but newline and tab), DEL, C1, bidi.
HOSTILE_CHARS = "\x1b[31m\x07\r\x85\x9b\u202e\u2066\u200f\u061c\u2028\ufeff"


@dataclass
class Base:
    """The pristine release and what attacks need: keys, a certificate, a folder outside the release."""

    folder: Path
    root: Path
    k1: Path  # public keys
    k3: Path
    k3_private: Path
    cert_key: Path  # a private key that signs the certificates of the certificate attacks
    manifest: dict[str, Any] = field(default_factory=dict)

    @property
    def outside(self) -> Path:
        return self.folder / "outside"

    @property
    def cache(self) -> Path:
        return self.folder / "digests"


def build_base(folder: Path, seed: int) -> Base:
    """Write k1, k3, the pristine release (signed with k1) and a copy of it outside any case folder."""
    import sys

    from kvgraft.signing import sign

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from release_factory import make_release

    folder.mkdir(parents=True, exist_ok=True)
    k1_private, _ = keys.write_keypair(folder / "k1")
    for name in ("k3", "ca"):  # the attacker's key; the key of the certificates (load_base names them)
        keys.write_keypair(folder / name)
    root = folder / "pristine"
    make_release(root, entries=5, layers=2, heads=2, tokens=40, head_dim=8, seed=seed, format_version=2,
                 shard_entries=2)
    sign.sign_release(root, keys.load_private_key(k1_private))
    shutil.copytree(root, folder / "outside")  # symlink targets: the same bytes, outside the release
    (folder / "digests").mkdir()
    return load_base(folder)


def load_base(folder: Path) -> Base:
    base = Base(folder, folder / "pristine", folder / "k1.pub.pem", folder / "k3.pub.pem", folder / "k3.key.pem",
                folder / "ca.key.pem")
    base.manifest = json.loads((base.root / MANIFEST).read_text())
    return base


# ------------------------------------------------------------------------------------------- the attack


@dataclass
class Attack:
    what: str
    signer: str  # "k1" (content attacks) or "k3" (re-signed)
    parts: set[str]  # what it violates (module docstring)
    control: bool = False  # every command must verify, but those in `verdicts`
    verdicts: dict[str, str] = field(default_factory=dict)  # command -> "refuse", "any" or "accept"
    ids: list[str] | None = None  # entry ids after the attack (None: the pristine ones)
    where: dict[str, tuple[str, str]] = field(default_factory=dict)  # id -> (its shard file, its entry file)
    focus: str | None = None  # the entry the attack edited: most entry commands name it


@dataclass
class Ctx:
    rng: random.Random
    root: Path  # the case's copy of the pristine release
    base: Base
    shard_files: list[str] = field(default_factory=list)
    entry_files: list[str] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    where: dict[str, tuple[str, str]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        m = self.base.manifest
        self.shard_files = [s["file"] for s in m["index"]["shards"]]
        for s in m["index"]["shards"]:
            shard = json.loads((self.base.root / s["file"]).read_text())
            for e in shard["entries"]:
                self.ids.append(e["id"])
                self.where[e["id"]] = (s["file"], e["file"])
                self.entry_files.append(e["file"])

    def base_ids(self, k: int) -> list[str]:
        """The pristine ids of shard k."""
        return [i for i in self.ids if self.where[i][0] == self.shard_files[k]]

    def kinds(self) -> dict[str, list[str]]:
        return {"manifest": [MANIFEST], "shard": self.shard_files, "prefix": [PREFIX], "entry": self.entry_files,
                "bundle": [BUNDLE_NAME], "oms": [OMS_NAME]}


# --------------------------------------------------------------------------------- re-signing with k3


@dataclass
class Draft:
    """An attacker's working copy of a release's records: edit, then `reseal` with their own key."""

    root: Path
    manifest: dict[str, Any]
    shards: list[dict[str, Any]]
    prefix: bytes
    raw: dict[int, bytes] = field(default_factory=dict)  # shard k's bytes as given (not canonical JSON)
    known: dict[str, tuple[str, int]] = field(default_factory=dict)  # name -> (sha256, size): not rewritten
    subst: dict[str, str] = field(default_factory=dict)  # '"sentinel"' -> raw JSON text, in records and shards
    keep: set[str] = field(default_factory=set)  # what reseal leaves as the attack set it: "counts", "ids:k", "prefix"
    manifest_bytes: Callable[[dict[str, Any]], bytes] | None = None

    @classmethod
    def open(cls, root: Path) -> Draft:
        manifest = json.loads((root / MANIFEST).read_text())
        shards = [json.loads((root / s["file"]).read_text()) for s in manifest["index"]["shards"]]
        return cls(root, manifest, shards, (root / PREFIX).read_bytes())

    def canonical(self, obj: Any) -> bytes:
        data = jsonio.canonical(obj)
        for sentinel, text in self.subst.items():
            data = data.replace(sentinel.encode(), text.encode())
        return data

    def reseal(self, private: Path) -> None:
        index = self.manifest["index"]
        # The prefix index first: an entry may name it as its file (shared_file).
        if "prefix" in index and "prefix" not in self.keep:
            if PREFIX in self.known:
                sha, size = self.known[PREFIX]
            else:
                (self.root / PREFIX).write_bytes(self.prefix)
                sha, size = sha256_hex(self.prefix), len(self.prefix)
            index["prefix"].update(sha256=sha, size=size, records=size // RECORD)
        for k, shard in enumerate(self.shards):
            for e in shard["entries"]:
                e["token_ids_sha256"] = token_ids_digest(e["token_ids"])
                src = e["source"]
                if src.get("kind") in src:
                    src["sha256"] = digest_json(src[src["kind"]])
                e.pop("digest", None)
                e["digest"] = sha256_hex(self.canonical(e)) if self.subst else entry_digest(e)
            for name in shard["files"]:
                shard["files"][name] = dict(zip(("sha256", "size"), self._digest(name), strict=True))
            meta = index["shards"][k]
            if meta["file"] in self.known:
                meta["sha256"], meta["size"] = self.known[meta["file"]]
            else:
                data = self.raw.get(k, self.canonical(shard))
                (self.root / meta["file"]).write_bytes(data)
                meta["sha256"], meta["size"] = sha256_hex(data), len(data)
            if f"ids:{k}" not in self.keep:
                meta["ids"] = [e["id"] for e in shard["entries"]]
                if "num_tokens" in meta:  # the token counts the manifest lists beside the ids
                    meta["num_tokens"] = [int(e["num_tokens"]) for e in shard["entries"]]
        if "counts" not in self.keep:
            index["entries"] = sum(len(s["entries"]) for s in self.shards)
            index["tokens"] = sum(int(e["num_tokens"]) for s in self.shards for e in s["entries"])
        self.manifest["root_digest"] = root_digest(self.manifest)
        data = (self.manifest_bytes or (lambda m: json.dumps(m, indent=2).encode()))(self.manifest)
        (self.root / MANIFEST).write_bytes(data)
        sign_as_attacker(self.root, keys.load_private_key(private), self.manifest, data, self.known)

    def _digest(self, name: str) -> tuple[str, int]:
        if name in self.known:
            return self.known[name]
        data = (self.root / name).read_bytes()
        return sha256_hex(data), len(data)


def sign_as_attacker(root: Path, key: keys.PrivateKey, manifest: dict[str, Any], manifest_data: bytes,
                     known: dict[str, tuple[str, int]]) -> None:
    """kvgraft's statement and an OMS signature over the folder as it is, made without kvgraft's checks
    (`sign_release` would refuse a damaged release; an attacker uses their own tools)."""
    stmt = attest.statement(manifest, sha256_hex(manifest_data), len(manifest_data))
    payload = attest.statement_bytes(stmt)
    signature = keys.sign(key, attest.pae(attest.PAYLOAD_TYPE, payload))
    bundle = (json.dumps(attest.key_bundle(payload, signature, keys.key_id(key)), indent=2) + "\n").encode()
    (root / BUNDLE_NAME).write_bytes(bundle)
    digests: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        name = str(path.relative_to(root))
        if name == OMS_NAME or path.is_symlink() or not path.is_file():
            continue
        digests[name] = known[name][0] if name in known else sha256_hex(path.read_bytes())
    oms.sign(root, key, digests)


def resign(ctx: Ctx, edit: Callable[[Draft], None]) -> Draft:
    draft = Draft.open(ctx.root)
    edit(draft)
    draft.reseal(ctx.base.k3_private)
    return draft


def sparse_digest(base: Base, head: bytes, size: int) -> str:
    """SHA-256 of `head` followed by zeros up to `size` bytes, computed once and kept in base.cache."""
    tag = base.cache / f"{sha256_hex(head)}-{size}"
    if tag.exists():
        return tag.read_text()
    h = hashlib.sha256(head)
    zeros = bytes(64 << 20)
    left = size - len(head)
    while left > 0:
        h.update(zeros[:min(left, len(zeros))])
        left -= min(left, len(zeros))
    tag.write_text(h.hexdigest())
    return h.hexdigest()


def all_parts(ctx: Ctx) -> set[str]:
    return {MANIFEST, *ctx.shard_files, PREFIX, *ctx.entry_files, BUNDLE_NAME, OMS_NAME, "folder", "records"}


# ------------------------------------------------------------------------------------ content attacks


def _flip(kind: str) -> Callable[[Ctx], Attack]:
    def attack(ctx: Ctx) -> Attack:
        name = ctx.rng.choice(ctx.kinds()["entry" if kind.startswith("entry") else kind])
        path = ctx.root / name
        data = bytearray(path.read_bytes())
        lo, hi = 0, len(data)
        if kind.startswith("entry"):
            (n,) = struct.unpack_from("<Q", data)
            lo, hi = (0, 8 + n) if kind == "entry-header" else (8 + n, len(data))
        bits = ctx.rng.randint(1, 3)
        for _ in range(bits):
            data[ctx.rng.randrange(lo, hi)] ^= 1 << ctx.rng.randrange(8)
        path.write_bytes(bytes(data))
        return Attack(f"flip {bits} bit(s) of {name}", "k1", {name})
    return attack


def cut_or_grow(ctx: Ctx) -> Attack:
    name = ctx.rng.choice([n for names in ctx.kinds().values() for n in names])
    path = ctx.root / name
    size = path.stat().st_size
    how = ctx.rng.choice(["truncate", "truncate", "append", "sparse"])
    if how == "truncate":
        data = path.read_bytes()
        n = ctx.rng.randrange(size)
        while n > 0 and not data[n:].strip():
            n -= 1  # a JSON file cut at its trailing newline only is the same document: cut into it
        os.truncate(path, n)
        return Attack(f"truncate {name} to {n} of {size} bytes", "k1", {name})
    if how == "append":
        extra = b"x" + ctx.rng.randbytes(ctx.rng.randint(0, 64))  # not whitespace: JSON may be re-formatted
        with path.open("ab") as f:
            f.write(extra)
        return Attack(f"append {len(extra)} bytes to {name}", "k1", {name})
    grown = size + ctx.rng.choice([1 << 30, 5 << 30, 1 << 40])  # a hole: costs no disk
    os.truncate(path, grown)
    return Attack(f"grow {name} to {grown} bytes (sparse)", "k1", {name})


def swap(ctx: Ctx) -> Attack:
    kind = ctx.rng.choice(["shard", "shard", "entry", "json"])
    pool = {"shard": ctx.shard_files, "entry": ctx.entry_files,
            "json": [MANIFEST, *ctx.shard_files, BUNDLE_NAME, OMS_NAME]}[kind]
    a, b = ctx.rng.sample(pool, 2)
    da, db = (ctx.root / a).read_bytes(), (ctx.root / b).read_bytes()
    (ctx.root / a).write_bytes(db)
    (ctx.root / b).write_bytes(da)
    return Attack(f"swap {a} and {b}", "k1", {a, b})


def special_file(ctx: Ctx) -> Attack:
    """A FIFO, socket, folder or symlink (to the same bytes outside the release) in place of a file."""
    kind = ctx.rng.choice(["fifo", "fifo", "socket", "folder", "link", "link", "link-folder", "link-dev"])
    if kind == "link-folder":
        name = ctx.rng.choice(["index", "entries/00000"])
        shutil.rmtree(ctx.root / name)
        (ctx.root / name).symlink_to(ctx.base.outside / name)
        parts = {n for n in all_parts(ctx) if n.startswith(name + "/")}
        return Attack(f"{name}/ is a symlink to a copy outside the release", "k1", parts)
    name = ctx.rng.choice([n for names in ctx.kinds().values() for n in names])
    path = ctx.root / name
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(path))
        s.close()
    elif kind == "folder":
        path.mkdir()
    elif kind == "link":
        path.symlink_to(ctx.base.outside / name)
    else:
        path.symlink_to("/dev/zero")
    return Attack(f"{name} is a {kind}", "k1", {name})


def non_utf8(ctx: Ctx) -> Attack:
    """A JSON file that is not UTF-8: a byte 0xff inside a string (k1), or the same re-signed by k3 with
    every digest over the new bytes, or a whole shard or manifest in UTF-16 (k3)."""
    how = ctx.rng.choice(["byte", "byte", "resigned-byte", "resigned-utf16", "resigned-bom"])
    if how == "byte":
        name = ctx.rng.choice([MANIFEST, *ctx.shard_files, BUNDLE_NAME, OMS_NAME])
        data = bytearray((ctx.root / name).read_bytes())
        quotes = [i for i, c in enumerate(data) if c == 0x22]
        at = ctx.rng.choice(quotes[:-1]) + 1
        data[at] = 0xFF
        (ctx.root / name).write_bytes(bytes(data))
        return Attack(f"byte 0xff at {at} of {name}", "k1", {name})
    k = ctx.rng.randrange(len(ctx.shard_files))
    target = ctx.rng.choice(["shard", "manifest"]) if how == "resigned-utf16" else "shard"

    def edit(d: Draft) -> None:
        if target == "manifest":
            d.manifest_bytes = lambda m: json.dumps(m, indent=2).encode("utf-16")
            return
        d.shards[k]["entries"][0]["answer"] = "SENTINEL"
        data = jsonio.canonical(d.shards[k])
        if how == "resigned-byte":
            data = data.replace(b'"SENTINEL"', b'"caf\xe9 \xff"')
        elif how == "resigned-utf16":
            data = data.decode().encode(ctx.rng.choice(["utf-16", "utf-16-le", "utf-32"]))
        else:
            data = b"\xef\xbb\xbf" + data
        d.raw[k] = data

    resign(ctx, edit)
    name = MANIFEST if target == "manifest" else ctx.shard_files[k]
    return Attack(f"{how} {name} (re-signed with k3)", "k3", {name})


def hostile_name(ctx: Ctx) -> Attack:
    """An extra file whose name is not UTF-8 or holds a newline, an escape or a bidi override."""
    name = ctx.rng.choice([b"\xff\xfe-not-utf8", f"a\n{FORGED} kvgraft: verified".encode(), b"\x1b[31mred\x1b[0m",
                           "\u202egnp.exe".encode(), "x\x85y\x9b2J".encode()])
    folder = ctx.rng.choice([b"", b"index/", b"entries/00000/"])
    fd = os.open(bytes(ctx.root) + b"/" + folder + name, os.O_WRONLY | os.O_CREAT, 0o644)
    os.write(fd, b"x")
    os.close(fd)
    return Attack(f"extra file {(folder + name)!r}", "k1", {"folder"})


def _certificate(base: Base, san: list[str], issuer: str) -> bytes:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509.oid import NameOID

    key = keys.load_private_key(base.cert_key)
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "sigstore-intermediate")])
    now = datetime.datetime(2026, 1, 1, tzinfo=datetime.UTC)
    issuer_der = b"\x0c" + _der_length(len(issuer.encode())) + issuer.encode()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(7).not_valid_before(now).not_valid_after(now + datetime.timedelta(minutes=10))
            .add_extension(x509.SubjectAlternativeName([x509.RFC822Name(s) for s in san]), critical=True)
            .add_extension(x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8"), issuer_der),
                           critical=False)
            .sign(key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.DER)


def _der_length(n: int) -> bytes:
    if n < 0x80:
        return bytes([n])
    raw = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes([0x80 | len(raw)]) + raw


def certificate_bundle(ctx: Ctx) -> Attack:
    """release.sigstore.json carrying a Fulcio-like certificate that is malformed or hostile where inspect
    reads it (its SAN, its issuer extension), the signed payload left as it was."""
    how = ctx.rng.choice(["san-set", "san-tag", "san-length", "san-bytes", "many-names", "issuer-controls",
                          "not-base64", "truncated-der", "chain"])
    san = ["attacker@example.com"]
    issuer = "https://accounts.example.com"
    if how == "many-names":
        san = [f"a{i}@example.com" for i in range(ctx.rng.randint(5_000, 40_000))]
    if how == "issuer-controls":
        issuer = f"https://ex.com/\u202e\x85\x1b[2J\n{FORGED}"
    der = bytearray(_certificate(ctx.base, san, issuer))
    at = der.find(b"\x06\x03\x55\x1d\x11")  # the SAN extension's OID, then critical TRUE, then its OCTET STRING
    inner = der.find(b"\x04", at + 5 + 3) + 2  # the OCTET STRING's content: a SEQUENCE of GeneralName
    if how == "san-set":
        der[inner] = 0x31  # SET, not SEQUENCE
    elif how == "san-tag":
        der[inner + 2] = 0x9F  # a GeneralName tag with the high-tag-number form
    elif how == "san-length":
        der[inner + 1] ^= 0x7F  # a SEQUENCE length that overruns its OCTET STRING
    elif how == "san-bytes":
        name = der.find(b"attacker@")
        der[name:name + 9] = b"\xff\xfe\x1b[31m\n\x85"[:9].ljust(9, b"\x00")
    raw = base64.b64encode(bytes(der)).decode()
    if how == "not-base64":
        raw = raw[:40] + "*" + raw[41:]
    elif how == "truncated-der":
        raw = base64.b64encode(bytes(der[: len(der) // 2])).decode()
    doc = json.loads((ctx.root / BUNDLE_NAME).read_text())
    cert = {"rawBytes": raw}
    doc["verificationMaterial"] = ({"x509CertificateChain": {"certificates": [cert]}} if how == "chain"
                                   else {"certificate": cert}) | {"tlogEntries": []}
    (ctx.root / BUNDLE_NAME).write_text(json.dumps(doc, indent=2))
    return Attack(f"bundle with a certificate: {how}", "k1", {BUNDLE_NAME})


# ----------------------------------------------------------------------------------- structure attacks


def duplicate_id(ctx: Ctx) -> Attack:
    same_shard = ctx.rng.random() < 0.3

    def edit(d: Draft) -> None:
        if same_shard:
            d.shards[0]["entries"][1]["id"] = d.shards[0]["entries"][0]["id"]
        else:
            a, b = ctx.rng.sample(range(len(d.shards)), 2)
            d.shards[b]["entries"][-1]["id"] = ctx.rng.choice(d.shards[a]["entries"])["id"]

    resign(ctx, edit)
    return Attack(f"an entry id twice ({'in one shard' if same_shard else 'across shards'}), re-signed", "k3",
                  {MANIFEST})


def shared_file(ctx: Ctx) -> Attack:
    """A file in two roles, re-signed. Two records naming one entry file is allowed (a format-1 release may
    share a file; its messages name the count): any verdict. An entry whose file is an index shard or the
    prefix index, or a prefix index that is a shard, is refused where that entry, or the index, is read."""
    how = ctx.rng.choice(["entries", "entries", "entry-is-shard", "entry-is-prefix", "prefix-is-shard"])
    i, j = sorted(ctx.rng.sample(range(len(ctx.shard_files)), 2))
    victim = ctx.base_ids(j)[-1]

    def edit(d: Draft) -> None:
        a, b = d.shards[i]["entries"][0], d.shards[j]["entries"][-1]
        if how == "prefix-is-shard":
            d.keep.add("prefix")
            (d.root / PREFIX).unlink()
            meta = d.manifest["index"]["prefix"]
            meta["file"] = ctx.shard_files[i]
            return
        del d.shards[j]["files"][b["file"]]
        (d.root / b["file"]).unlink()
        b["file"] = a["file"] if how == "entries" else ctx.shard_files[i] if how == "entry-is-shard" else PREFIX
        if how == "entries":
            b["tensors"], b["header_sha256"] = a["tensors"], a["header_sha256"]
        d.shards[j]["files"][b["file"]] = {}

    draft = resign(ctx, edit)
    if how == "prefix-is-shard":  # its digest and size as the shard's: only the shared name is wrong
        draft.manifest["index"]["prefix"].update(sha256=draft.manifest["index"]["shards"][i]["sha256"],
                                                 size=draft.manifest["index"]["shards"][i]["size"])
        draft.reseal(ctx.base.k3_private)
    parts = {"entries": set(), "prefix-is-shard": {MANIFEST}}.get(how, {f"entry:{victim}"})
    return Attack(f"{how}: shard {i} and shard {j}, re-signed", "k3", parts, focus=victim)


def _records(d: Draft) -> list[tuple[bytes, int, int]]:
    return [release_index.RECORD.unpack_from(d.prefix, i) for i in range(0, len(d.prefix), RECORD)]


def _pack(records: list[tuple[bytes, int, int]]) -> bytes:
    return b"".join(release_index.RECORD.pack(*r) for r in records)


def prefix_records(ctx: Ctx) -> Attack:
    """index/prefix.bin, re-signed: an entry ordinal out of range, a block count of 0 or beyond the
    entry's tokens, records out of order or repeated; or its manifest record count against its size."""
    how = ctx.rng.choice(["ordinal", "ordinal", "blocks-zero", "blocks-over", "unsorted", "repeated", "count"])
    parts = {PREFIX}

    def edit(d: Draft) -> None:
        recs = _records(d)
        i = ctx.rng.randrange(len(recs))
        h, o, k = recs[i]
        if how == "ordinal":
            recs[i] = (h, ctx.rng.choice([5, 6, 1000, 2**31, 2**32 - 1]), k)
        elif how == "blocks-zero":
            recs[i] = (h, o, 0)
        elif how == "blocks-over":
            recs[i] = (h, o, ctx.rng.choice([3, 100, 2**32 - 1]))  # each entry holds 40 tokens: 2 blocks
        elif how == "unsorted":
            recs[i], recs[i - 1] = recs[i - 1], recs[i]
        elif how == "repeated":
            recs.insert(i, recs[i])
        d.prefix = _pack(recs)
        if how == "count":
            d.keep.add("prefix")
            d.manifest["index"]["prefix"]["records"] += ctx.rng.choice([-1, 1, 1000])

    if how == "count":
        parts = {MANIFEST}
    resign(ctx, edit)
    return Attack(f"prefix index: {how}, re-signed", "k3", parts)


def index_listing(ctx: Ctx) -> Attack:
    """manifest.json's index, re-signed: counts, ids and shard files that disagree with the shards."""
    how = ctx.rng.choice(["entries", "tokens", "ids-order", "ids-other", "shard-twice", "shard-elsewhere"])
    k = ctx.rng.randrange(len(ctx.shard_files))
    parts = {MANIFEST}

    def edit(d: Draft) -> None:
        index = d.manifest["index"]
        if how in ("entries", "tokens"):
            d.keep.add("counts")
            index[how] = (sum(len(s["entries"]) for s in d.shards) + 1 if how == "entries"
                          else ctx.rng.choice([0, 1, 10**15]))
        elif how == "ids-order":
            d.keep.add("ids:0")
            index["shards"][0]["ids"] = index["shards"][0]["ids"][::-1]
        elif how == "ids-other":
            d.keep.add(f"ids:{k}")
            index["shards"][k]["ids"] = [f"ghost-{i}" for i in range(len(d.shards[k]["entries"]))]
        elif how == "shard-twice":
            index["shards"][1]["file"] = index["shards"][0]["file"]
            d.shards[1] = d.shards[0]
        else:
            (d.root / "entries" / "x.json").write_bytes((d.root / index["shards"][k]["file"]).read_bytes())
            (d.root / index["shards"][k]["file"]).unlink()
            index["shards"][k]["file"] = "entries/x.json"

    if how == "tokens":
        parts = {"records"}
    elif how == "ids-order":
        parts = {ctx.shard_files[0]}
    elif how == "ids-other":
        parts = {ctx.shard_files[k]}  # refused when the shard is read, or when one of its entries is asked for
    resign(ctx, edit)
    return Attack(f"index listing: {how}, re-signed", "k3", parts)


SHARD_SIZES = (release_index.MAX_SHARD_BYTES + 4096, 4 * 2**30 + 4096)
PREFIX_SIZES = (RECORD * (release_index.MAX_PREFIX_BYTES // RECORD + 1),)


def sparse_index_file(ctx: Ctx) -> Attack:
    """An index shard or the prefix index extended with a hole beyond the format's bound, its true size and
    SHA-256 in the manifest, re-signed: the size must be refused before the bytes are read."""
    prefix = ctx.rng.random() < 0.3
    size = ctx.rng.choice(PREFIX_SIZES if prefix else SHARD_SIZES)
    # Its digest is computed once per file and size: past 4 GiB, for one shard only.
    name = PREFIX if prefix else ctx.shard_files[0] if size > 2**32 else ctx.rng.choice(ctx.shard_files)
    head = (ctx.root / name).read_bytes()
    digest = sparse_digest(ctx.base, head, size)

    def edit(d: Draft) -> None:
        os.truncate(d.root / name, size)
        d.known[name] = (digest, size)

    resign(ctx, edit)
    return Attack(f"{name} of {size} bytes (a hole after its {len(head)} bytes), re-signed", "k3", {name})


def _hostile_text(rng: random.Random, length: int, newline_every: int) -> str:
    pieces, n = [], 0
    while n < length:
        piece = rng.choice(["ab", "cd ", HOSTILE_CHARS, f"\n{FORGED} kvgraft: verified\n", "é"]) * rng.randint(1, 8)
        pieces.append(piece)
        n += len(piece)
        if newline_every and rng.randrange(newline_every) == 0:
            pieces.append("\n")
    return "".join(pieces)[:length]


def hostile_strings(ctx: Ctx) -> Attack:
    """Strings holding newlines, escapes, bidi and C1 controls in every place a release has one, re-signed:
    legitimate content (any verdict), but shown as text, one line per field."""
    where = ctx.rng.choice(["id", "text", "answer", "meta", "environment", "spec"])
    k = ctx.rng.randrange(len(ctx.shard_files))
    text = _hostile_text(ctx.rng, ctx.rng.randint(20, 250), 10)
    attack = Attack(f"hostile {where} string, re-signed", "k3", set())

    def edit(d: Draft) -> None:
        e = ctx.rng.choice(d.shards[k]["entries"])
        attack.focus = e["id"]
        if where == "id":
            old = e["id"]
            e["id"] = attack.focus = text
            ids = [x if x != old else text for x in ctx.ids]
            attack.ids = ids
            attack.where = {**{i: w for i, w in ctx.where.items() if i != old}, text: ctx.where[old]}
        elif where == "text":
            e["source"]["text"] = text
        elif where == "answer":
            e["answer"] = text
        elif where == "meta":
            e["meta"] = {text: text, "n": [text] * 3}
        elif where == "environment":
            d.manifest["environment"][ctx.rng.choice(["device_name", "platform", "transformers"])] = text
        else:
            d.manifest["model"]["spec"] = text

    resign(ctx, edit)
    return attack


def hostile_record(ctx: Ctx) -> Attack:
    """One record costly to show: 10,000-20,000 layers, a multi-megabyte answer or source text with
    many newlines, a meta of many keys; re-signed, under 10 MB in all (any verdict, bounded cost)."""
    how = ctx.rng.choice(["layers", "layers", "answer", "text", "meta"])
    k = ctx.rng.randrange(len(ctx.shard_files))
    detail = ""
    attack = Attack("", "k3", set())

    def edit(d: Draft) -> None:
        nonlocal detail
        e = ctx.rng.choice(d.shards[k]["entries"])
        attack.focus = e["id"]
        if how == "layers":
            n = ctx.rng.randint(10_000, 20_000)
            names = sorted(e["tensors"])
            e["layers"] = [{"index": i, "kind": "full", "keys": names[(2 * i) % len(names)],
                            "values": names[(2 * i + 1) % len(names)], "positions": [0, e["num_tokens"]]}
                           for i in range(n)]
            detail = f"{n} layers"
        elif how in ("answer", "text"):
            n = ctx.rng.randint(100_000, 4_000_000)
            value = _hostile_text(ctx.rng, n, ctx.rng.choice([2, 50, 0]))
            if how == "answer":
                e["answer"] = value
            else:
                e["source"]["text"] = value
            detail = f"{n:,}-character {how}, {value.count(chr(10)):,} newlines"
        else:
            n = ctx.rng.randint(10_000, 150_000)
            e["meta"] = {f"k{i}\n{FORGED}": f"v{i}\u202e" for i in range(n)}
            detail = f"meta of {n} keys"

    resign(ctx, edit)
    attack.what = f"hostile record: {detail}, re-signed"
    return attack


def deep_json(ctx: Ctx) -> Attack:
    """A record's meta nested 20 to 100,000 levels deep, re-signed; deeper than the JSON bound (64 levels,
    the shard itself takes 4) is refused where the shard is read, shallower is content (any)."""
    depth = ctx.rng.choice([20, 55, 70, 500, 5_000, 100_000])
    k = ctx.rng.randrange(len(ctx.shard_files))

    def edit(d: Draft) -> None:
        d.shards[k]["entries"][0]["meta"] = {"deep": "@@DEEP@@"}
        d.subst['"@@DEEP@@"'] = "[" * depth + "]" * depth

    resign(ctx, edit)
    return Attack(f"meta nested {depth} levels, re-signed", "k3",
                  {ctx.shard_files[k]} if depth + 4 > jsonio.MAX_DEPTH else set(),
                  focus=ctx.base_ids(k)[0])


# ------------------------------------------------------------------------------------------- controls


def control_resigned(ctx: Ctx) -> Attack:
    """The positive control of the structure attacks: the attacker's re-signing alone (unchanged, shards in
    another order with the prefix index rebuilt, or an answer added) yields a release that verifies with k3
    (and not with k1). Without it a refusal could come from a broken re-signing, not from a bound."""
    how = ctx.rng.choice(["unchanged", "reordered", "answer"])

    def edit(d: Draft) -> None:
        if how == "reordered":
            order = list(range(len(d.shards)))
            while order == sorted(order):
                ctx.rng.shuffle(order)
            d.shards = [d.shards[i] for i in order]
            writer = release_index.PrefixWriter()
            for ordinal, e in enumerate(e for s in d.shards for e in s["entries"]):
                writer.add(ordinal, e["token_ids"])
            d.prefix = writer.data()
        elif how == "answer":
            d.shards[-1]["entries"][0]["answer"] = "42"

    resign(ctx, edit)
    return Attack(f"re-signed with k3, {how}", "k3", set(), control=True, verdicts={"verify-k1": "refuse"})


def two_keys(ctx: Ctx) -> Attack:
    """`run` given two keys on a release signed with k1 only: as `verify`, each key must verify a signature
    (k3 verifies none), before any model loads; `run --key k1` alone is the control (reaches the model)."""
    return Attack("pristine release, run with two keys", "k1", set(),
                  verdicts={"run-k1-k3": "refuse", "run-k3-k1": "refuse", "run-k3": "refuse", "run-k1": "accept"})


def pristine(ctx: Ctx) -> Attack:
    return Attack("pristine release", "k1", set())


def planted_miss(ctx: Ctx) -> Attack:
    """The judge's positive control (--plant): nothing is changed, yet a refusal is expected; a working
    judge reports every run of it as a miss."""
    return Attack("planted: nothing changed, a refusal expected", "k1", all_parts(ctx))


ATTACKS: dict[str, Callable[[Ctx], Attack]] = {
    "flip-manifest": _flip("manifest"), "flip-shard": _flip("shard"), "flip-prefix": _flip("prefix"),
    "flip-entry-header": _flip("entry-header"), "flip-entry-data": _flip("entry-data"),
    "flip-bundle": _flip("bundle"), "flip-oms": _flip("oms"), "cut-grow": cut_or_grow, "swap": swap,
    "special-file": special_file, "non-utf8": non_utf8, "hostile-name": hostile_name,
    "certificate": certificate_bundle, "duplicate-id": duplicate_id, "shared-file": shared_file,
    "prefix-records": prefix_records, "index-listing": index_listing, "sparse-index": sparse_index_file,
    "hostile-strings": hostile_strings, "hostile-record": hostile_record, "deep-json": deep_json,
    "control-k3": control_resigned, "run-two-keys": two_keys, "broken-pipe": pristine,
    "planted-miss": planted_miss, "planted-crash": pristine, "planted-hang": pristine,
}
