"""Entry records and release-relative paths: the digests a record carries and the checks it makes on its own.

Shared by both release layouts (kvgraft.release.format, kvgraft.release.index). Imports no torch.
"""

from __future__ import annotations

import operator
import stat
from collections.abc import Callable, Mapping
from itertools import repeat
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from kvgraft._internal import jsonio
from kvgraft._internal.digest import digest_json
from kvgraft.errors import InputError, IntegrityError, short_int

if TYPE_CHECKING:
    from kvgraft.release.models import Draft, Entry, FileMeta, Layer, Manifest, NextToken, Source

MANIFEST = "manifest.json"


def entry_digest(entry: Entry) -> str:
    return digest_json({k: v for k, v in entry.items() if k != "digest"})


def root_digest(manifest: Manifest) -> str:
    return digest_json({k: v for k, v in manifest.items() if k != "root_digest"})


def token_ids_digest(ids: list[int]) -> str:
    return digest_json(ids)


def source_record(kind: Literal["text", "messages"], value: Any) -> Source:
    """Where an entry's tokens came from: `text` (a string) or `messages` (a chat), with its digest."""
    if kind == "text":
        return {"kind": kind, "sha256": digest_json(value), "text": value}
    return {"kind": kind, "sha256": digest_json(value), "messages": value}


def new_entry(entry_id: str, token_ids: list[int], source: Source, layers: list[Layer],
              next_token: NextToken) -> Draft:
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


_INDEX, _KIND = operator.itemgetter("index"), operator.itemgetter("kind")
_KEYS, _VALUES = operator.itemgetter("keys"), operator.itemgetter("values")


def check_layers(where: Path, entry: Entry, num_layers: int) -> None:
    """An entry's layer map against the model the manifest records: layer i at position i, every one of its
    `num_layers` layers once; a layer that stores states names both tensors, one that shares reads another."""
    layers = entry["layers"]
    # The usual map (every layer in place, none shared, each naming both tensors) passes at C speed; any
    # other is walked layer by layer, which also words the refusal.
    if (len(layers) == num_layers and list(map(_INDEX, layers)) == list(range(num_layers))
            and "shared" not in map(_KIND, layers) and all(map(operator.contains, layers, repeat("keys")))
            and all(map(operator.contains, layers, repeat("values")))):
        return
    _walk_layers(where, entry, num_layers)


def _walk_layers(where: Path, entry: Entry, num_layers: int) -> None:
    eid, layers = entry["id"], entry["layers"]
    if len(layers) != num_layers:
        raise InputError(f"{where}: entry {eid!r}: {len(layers)} layers, the manifest's model has {num_layers}")
    for position, layer in enumerate(layers):
        at = f"{where}: entry {eid!r} layer {short_int(layer['index'])}"
        if layer["index"] != position:
            raise InputError(f"{at}: at position {position} of the layer map (layers are listed 0 to "
                             f"{num_layers - 1}, in order)")
        if layer["kind"] == "shared":
            source = layer.get("shared_with")
            if source is None or source >= num_layers or source == position or layers[source]["kind"] == "shared":
                raise InputError(f"{at}: shared with {short_int(source) if isinstance(source, int) else source}, "
                                 f"which is no layer of the model that stores states")
        elif "keys" not in layer or "values" not in layer:
            raise InputError(f"{at}: a {layer['kind']} layer names no keys or no values tensor")


def check_entry_record(where: Path, entry: Entry, files: Mapping[str, FileMeta], num_layers: int, *,
                       digest: Callable[[Any], str] = entry_digest) -> None:
    """One entry record's own commitments: its digest, token ids, file listed, layer map (check_layers),
    layers' tensors listed. `digest`: entry_digest's value found faster where the record's type is known
    (Index.shard: the typed serializer's bytes of the record)."""
    eid = entry["id"]
    if digest(entry) != entry["digest"]:
        raise IntegrityError(f"{where}: entry {eid!r}: digest {entry['digest']} does not match its content "
                             f"({digest(entry)})")
    if entry["file"] not in files:
        raise InputError(f"{where}: entry {eid!r}: file {entry['file']!r} is not listed in files")
    if len(entry["token_ids"]) != entry["num_tokens"]:
        raise InputError(f"{where}: entry {eid!r}: num_tokens {entry['num_tokens']} but "
                         f"{len(entry['token_ids'])} token ids")
    if token_ids_digest(entry["token_ids"]) != entry["token_ids_sha256"]:
        raise IntegrityError(f"{where}: entry {eid!r}: token_ids_sha256 does not match the token ids")
    check_layers(where, entry, num_layers)
    tensors, layers = entry["tensors"], entry["layers"]
    try:  # the usual map, every layer naming both tensors, at C speed
        named = [*map(_KEYS, layers), *map(_VALUES, layers)]
    except KeyError:
        named = [layer[key] for layer in layers for key in ("keys", "values") if key in layer]
    if not all(map(tensors.__contains__, named)):
        layer = next(layer for layer in entry["layers"] for key in ("keys", "values")
                     if key in layer and layer[key] not in tensors)
        key = next(key for key in ("keys", "values") if key in layer and layer[key] not in tensors)
        raise InputError(f"{where}: entry {eid!r} layer {layer['index']}: tensor "
                         f"{layer[key]!r} is not listed")
