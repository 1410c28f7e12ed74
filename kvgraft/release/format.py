"""The cache-release format: manifest model, digests, safe paths, reading and atomic writing.

Reading imports no torch: `kvgraft verify` runs on CI machines without it.
"""

from __future__ import annotations

import datetime
import os
import shutil
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft import __version__
from kvgraft._internal import jsonio
from kvgraft.errors import FormatVersionError, InputError, IntegrityError
from kvgraft.release import safetensors_header as stfile
from kvgraft.release.hashing import digest_json, hash_file
from kvgraft.schema import CACHE_MANIFEST, validate

if TYPE_CHECKING:
    import torch

FORMAT = "kvgraft-cache-release"
FORMAT_VERSION = 1
MANIFEST = "manifest.json"
# Beside the data, a release folder may hold its signatures: these files are no part of what they sign.
BUNDLE_NAME = "release.sigstore.json"
OMS_NAME = "model.sig"  # an OpenSSF model signing v1.0 signature of the folder (kvgraft.signing.oms)
# A release kept in a git (or Hugging Face Hub) repository: the repository's metadata at the folder's root,
# which the model_signing CLI leaves out of what it signs, is no part of the release either.
REPOSITORY_METADATA = frozenset({".git", ".gitattributes", ".github", ".gitignore"})
MAX_MANIFEST_BYTES = 256 * 1024 * 1024


def entry_digest(entry: dict[str, Any]) -> str:
    return digest_json({k: v for k, v in entry.items() if k != "digest"})


def root_digest(manifest: dict[str, Any]) -> str:
    return digest_json({k: v for k, v in manifest.items() if k != "root_digest"})


def token_ids_digest(ids: list[int]) -> str:
    return digest_json(ids)


def source_record(kind: str, value: Any) -> dict[str, Any]:
    """Where an entry's tokens came from: `text` (a string) or `messages` (a chat), with its digest."""
    return {"kind": kind, "sha256": digest_json(value), kind: value}


def new_entry(entry_id: str, token_ids: list[int], source: dict[str, Any], layers: list[dict[str, Any]],
              next_token: dict[str, Any]) -> dict[str, Any]:
    """An entry's manifest record before ReleaseWriter adds its file, tensors and digest; every capture
    (kvgraft's own, the vLLM connector's) builds its entries here."""
    return {"id": entry_id, "num_tokens": len(token_ids), "token_ids": token_ids,
            "token_ids_sha256": token_ids_digest(token_ids), "source": source, "layers": layers,
            "next_token": next_token}


def check_relpath(name: Any, where: str) -> str:
    """The one rule for a release-relative file name: forward slashes, no '..', '.', empty parts or absolute paths."""
    if not isinstance(name, str):
        raise InputError(f"{where}: file name {name!r} is not a string")
    parts = name.split("/")
    if (not name or name.startswith("/") or "\\" in name or "\x00" in name or len(name) > 4096
            or any(p in ("", ".", "..") for p in parts)):
        raise InputError(f"{where}: unsafe file name {name!r} (absolute, '..' or empty parts are refused)")
    return name


def safe_path(root: Path, rel: str, what: str) -> Path:
    """Resolve a release-relative path (check_relpath), refusing symlinks on the way."""
    path = root
    for part in check_relpath(rel, f"{root}: {what}").split("/"):
        path = path / part
        st = jsonio.stat_or_none(path)
        if st is not None and stat.S_ISLNK(st.st_mode):
            raise InputError(f"{path}: {what} is a symlink; releases may not contain links")
    return path


def tensor_mismatch(where: str, name: str, start: int, end: int, actual: str, expected: str) -> str:
    """The one wording of a tensor whose bytes [start, end) do not hash to the manifest's sha256."""
    return f"{where} tensor {name!r} bytes [{start}, {end}): sha256 {actual}, the manifest says {expected}"


def load_manifest(root: Path) -> dict[str, Any]:
    """Read, bound, parse (no duplicate keys), version-check and schema-validate a manifest."""
    path = safe_path(root, MANIFEST, "manifest")
    if (st := jsonio.stat_or_none(path, follow=True)) is None or not stat.S_ISREG(st.st_mode):
        raise InputError(f"{path}: missing manifest (is {root} a cache release?)")
    return check_manifest(jsonio.loads_strict(jsonio.read_bounded(path, MAX_MANIFEST_BYTES, "a manifest"), str(path)),
                          path)


def check_manifest(doc: Any, path: Path) -> dict[str, Any]:
    """Version-check and schema-validate a parsed manifest (read from `path`)."""
    if not isinstance(doc, dict):
        raise InputError(f"{path}: manifest is not a JSON object")
    if doc.get("format") != FORMAT:
        raise FormatVersionError(f"{path}: not a kvgraft cache release (format {doc.get('format')!r})")
    if doc.get("format_version") != FORMAT_VERSION:
        raise FormatVersionError(
            f"{path}: format version {doc.get('format_version')!r} is not supported; "
            f"this kvgraft {__version__} reads version {FORMAT_VERSION}"
        )
    validate(doc, CACHE_MANIFEST, str(path))
    return doc


def check_commitments(root: Path, manifest: dict[str, Any]) -> None:
    """Internal consistency of a manifest: digests, references, bounds. No file bytes read."""
    where = root / MANIFEST
    seen: set[str] = set()
    for entry in manifest["entries"]:
        eid = entry["id"]
        if eid in seen:
            raise InputError(f"{where}: entry id {eid!r} appears twice")
        seen.add(eid)
        if entry_digest(entry) != entry["digest"]:
            raise IntegrityError(f"{where}: entry {eid!r}: digest {entry['digest']} does not match its content "
                                 f"({entry_digest(entry)})")
        if entry["file"] not in manifest["files"]:
            raise InputError(f"{where}: entry {eid!r}: file {entry['file']!r} is not listed in files")
        if len(entry["token_ids"]) != entry["num_tokens"]:
            raise InputError(f"{where}: entry {eid!r}: num_tokens {entry['num_tokens']} but "
                             f"{len(entry['token_ids'])} token ids")
        if token_ids_digest(entry["token_ids"]) != entry["token_ids_sha256"]:
            raise IntegrityError(f"{where}: entry {eid!r}: token_ids_sha256 does not match the token ids")
        for layer in entry["layers"]:
            for key in ("keys", "values"):
                if key in layer and layer[key] not in entry["tensors"]:
                    raise InputError(f"{where}: entry {eid!r} layer {layer['index']}: tensor "
                                     f"{layer[key]!r} is not listed")
    actual = root_digest(manifest)
    if actual != manifest["root_digest"]:
        raise IntegrityError(f"{where}: root_digest {manifest['root_digest']} does not match the manifest ({actual})")


@dataclass
class Release:
    """An opened release: a checked manifest; bytes are read and verified on demand."""

    root: Path
    manifest: dict[str, Any]
    # entry id -> (its tensor table, header bytes that passed tensor_layout against it, their layout)
    _checked_headers: dict[str, tuple[Any, bytes, dict[str, stfile.TensorInfo]]] = field(
        default_factory=dict, repr=False, compare=False)
    # The kvgraft.verify.VerifyResult this release passed (verify.verified sets it): from then on an
    # entry's header must be byte-identical to the one checked then, whose file digest was verified.
    verification: Any = field(default=None, repr=False, compare=False)

    @classmethod
    def open(cls, root: Path | str) -> Release:
        root = Path(root)
        if not jsonio.is_folder(root):
            raise InputError(f"{root}: not a folder")
        manifest = load_manifest(root)
        check_commitments(root, manifest)
        return cls(root, manifest)

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self.manifest["entries"])

    def entry(self, entry_id: str) -> dict[str, Any]:
        for e in self.manifest["entries"]:
            if e["id"] == entry_id:
                return dict(e)
        known = ", ".join(e["id"] for e in self.manifest["entries"][:10])
        raise InputError(f"{self.root}: no entry {entry_id!r} (entries: {known})")

    def entry_file(self, entry: dict[str, Any]) -> Path:
        path = safe_path(self.root, entry["file"], f"entry {entry['id']!r}")
        if (st := jsonio.stat_or_none(path, follow=True)) is None or not stat.S_ISREG(st.st_mode):
            raise IntegrityError(f"{path}: entry {entry['id']!r}: file is missing")
        return path

    def tensor_layout(self, entry: dict[str, Any], fd: int | None = None) -> dict[str, stfile.TensorInfo]:
        """The file's safetensors header, checked against the manifest's tensor table.

        With `fd`, the header is read from that open file, the one the caller then reads tensors from.
        Header bytes identical to ones that already passed this check (for this entry, in this opened
        release) are not parsed again: the check is a function of those bytes and the manifest.
        """
        path = self.entry_file(entry)
        expected_size = self.manifest["files"][entry["file"]]["size"]
        size, n, raw = stfile.read_raw_header(path, fd)
        if size != expected_size:
            raise IntegrityError(f"{path}: entry {entry['id']!r}: {size} bytes, manifest says {expected_size}")
        tensors = entry["tensors"]
        seen = self._checked_headers.get(entry["id"])
        if seen is not None and (seen[0] is tensors or seen[0] == tensors) and seen[1] == raw:
            return seen[2]
        if self.verification is not None:
            raise IntegrityError(f"{path}: entry {entry['id']!r}: the safetensors header changed after the release "
                                 f"was verified")
        parsed, _ = stfile.parse_header(path, size, n, raw)
        if set(parsed) != set(tensors):
            extra = sorted(set(parsed) - set(tensors))
            missing = sorted(set(tensors) - set(parsed))
            raise IntegrityError(f"{path}: entry {entry['id']!r}: tensors differ from the manifest "
                                 f"(missing {missing}, unexpected {extra})")
        for name, t in tensors.items():
            info = parsed[name]
            if (info.dtype, list(info.shape), [info.start, info.end]) != (t["dtype"], t["shape"], t["byte_range"]):
                raise IntegrityError(
                    f"{path}: entry {entry['id']!r} tensor {name!r}: header says {info.dtype} {list(info.shape)} "
                    f"bytes [{info.start}, {info.end}), manifest says {t['dtype']} {t['shape']} bytes {t['byte_range']}")
        self._checked_headers[entry["id"]] = (tensors, raw, parsed)
        return parsed


def now_utc() -> str:
    return datetime.datetime.now(datetime.UTC).replace(microsecond=0).isoformat().replace("+00:00", "Z")


class ReleaseWriter:
    """Builds a release in a temp folder beside the target and renames it into place.

    An interrupted capture leaves at most a hidden temp folder, never a release.
    """

    def __init__(self, out: Path, *, overwrite: bool = False) -> None:
        self.out = Path(out)
        jsonio.refuse_existing(self.out, overwrite)
        self.out.parent.mkdir(parents=True, exist_ok=True)
        self.tmp = Path(tempfile.mkdtemp(prefix=f".{self.out.name}.", suffix=".partial", dir=self.out.parent))
        self.tmp.chmod(0o755)
        (self.tmp / "entries").mkdir()
        self.entries: list[dict[str, Any]] = []
        self.files: dict[str, dict[str, Any]] = {}

    def add_entry(self, entry: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
        """Write one entry's tensors; fill in file, tensor table and digest; return the entry."""
        from safetensors.torch import save_file

        from kvgraft.tensors import tensor_sha256

        rel = f"entries/{len(self.entries):05d}.safetensors"
        path = self.tmp / rel
        contiguous = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
        save_file(contiguous, str(path), metadata={"kvgraft_entry": entry["id"]})
        with path.open("rb") as fh:
            os.fsync(fh.fileno())
        header, _ = stfile.read_header(path)
        entry = dict(entry)
        entry["file"] = rel
        entry["tensors"] = {
            name: {"dtype": header[name].dtype, "shape": list(header[name].shape),
                   "sha256": tensor_sha256(t), "byte_range": [header[name].start, header[name].end]}
            for name, t in sorted(contiguous.items())
        }
        entry["digest"] = entry_digest(entry)
        sha, size = hash_file(path)
        self.files[rel] = {"sha256": sha, "size": size}
        self.entries.append(entry)
        return entry

    def finish(self, header: dict[str, Any]) -> dict[str, Any]:
        """Write manifest.json, fsync, rename the folder into place; return the manifest."""
        manifest: dict[str, Any] = {
            "format": FORMAT, "format_version": FORMAT_VERSION, "kvgraft_version": __version__,
            "created": now_utc(), **header, "entries": self.entries, "files": self.files,
        }
        manifest["root_digest"] = root_digest(manifest)
        validate(manifest, CACHE_MANIFEST, str(self.out / MANIFEST))
        jsonio.write_json(self.tmp / MANIFEST, manifest)
        jsonio.fsync_dir(self.tmp / "entries")
        if self.out.exists():
            old = self.out.with_name(f".{self.out.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(self.out, old)
            os.replace(self.tmp, self.out)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(self.tmp, self.out)
        jsonio.fsync_dir(self.out.parent)
        return manifest

    def abort(self) -> None:
        shutil.rmtree(self.tmp, ignore_errors=True)
