"""Index shards decode in one typed pass (kvgraft.release.models), as strictly as the reference reader.

The reference is the strict JSON reader and the shard's JSON Schema (`jsonio.loads_strict`, then
`schema.validate`): on every valid shard the typed decode gives the same records, and takes its fast path
for what kvgraft writes (canonical JSON); every input the reference refuses the typed decode refuses with
the same one line. The published schema of a shard and its records is the types' (`models.shard_schema`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, NotRequired, get_origin

import pytest
from pydantic_core import to_json
from typing_extensions import get_type_hints

from kvgraft import inspection
from kvgraft._internal import jsonio
from kvgraft._internal.digest import digest_json, sha256_hex
from kvgraft.errors import Error, InputError
from kvgraft.release import models
from kvgraft.release.format import Release
from kvgraft.release.records import MANIFEST, entry_digest, root_digest, token_ids_digest
from kvgraft.schema import CACHE_INDEX_SHARD, CACHE_MANIFEST, load_schema, validate

WHERE = "/releases/r/index/00003.json"
H = hashlib.sha256(b"kvgraft").hexdigest()


def record(i: int, **extra: Any) -> dict[str, Any]:
    """A record as kvgraft's writer makes it (2 layers), its digest over the rest."""
    ids = [7 * i + k for k in range(1, 9)]
    text = extra.pop("text", f"record {i}")
    layers = [{"index": k, "kind": "full", "keys": f"layer.{k}.keys", "values": f"layer.{k}.values",
               "positions": [0, len(ids)]} for k in range(2)]
    tensors = {f"layer.{k}.{part}": {"dtype": "float32", "shape": [1, 1, len(ids), 2], "sha256": H,
                                     "byte_range": [100 + 64 * (2 * k + j), 164 + 64 * (2 * k + j)]}
               for k in range(2) for j, part in enumerate(("keys", "values"))}
    entry = {"id": f"e{i}", "file": f"entries/{i:03d}.safetensors", "num_tokens": len(ids), "token_ids": ids,
             "token_ids_sha256": token_ids_digest(ids), "source": {"kind": "text", "sha256": digest_json(text), "text": text},
             "layers": layers, "tensors": tensors, "header_sha256": H,
             "next_token": {"logits_sha256": H, "argmax": 3, "dtype": "float32"}, **extra}
    entry["digest"] = entry_digest(entry)
    return entry


def shard(entries: list[dict[str, Any]]) -> dict[str, Any]:
    return {"format": "kvgraft-cache-index-shard", "format_version": 2, "entries": entries,
            "files": {e["file"]: {"sha256": H, "size": 420} for e in entries}}


def written(entries: list[dict[str, Any]]) -> bytes:
    """The shard's bytes as kvgraft's writer writes them (canonical JSON)."""
    return jsonio.canonical(shard(entries))


def reference(raw: bytes) -> Any:
    doc = jsonio.loads_strict(raw, WHERE)
    if not isinstance(doc, dict) or doc.get("format") != "kvgraft-cache-index-shard":
        raise InputError(f"{WHERE}: not a kvgraft index shard")
    validate(doc, CACHE_INDEX_SHARD, WHERE)
    return doc


def refusal(decode: Any, raw: bytes) -> str:
    with pytest.raises(InputError) as info:
        decode(raw)
    return str(info.value)


@pytest.fixture
def fast_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The strict reader made unreachable from the typed decode: what decodes here took the fast path."""
    def refused(raw: bytes, where: str) -> Any:
        raise AssertionError("the typed decode fell back to the strict reader")
    monkeypatch.setattr(models, "_reference", refused)


# ---------------------------------------------------------------------------------------------- valid shards

CHAT = [{"role": "user", "content": "Qu'est-ce que \"KV\" ?\n\t\u2028 \U0001f600"}, {"role": "assistant", "content": None}]
VALID = {
    "text": [record(i) for i in range(3)],
    "escapes and non-ASCII text": [record(0, text="tab\t nl\n quote\" back\\ nul\x00 del\x7f é 中 \U0001f600 \u2028")],
    "chat": [record(0, source={"kind": "messages", "sha256": digest_json(CHAT), "messages": CHAT})],
    "meta and answers": [record(0, meta={"b": [1, {"z": None, "a": True}], "a": "x"}, answer="42"),
                         record(1, answer=42), record(2, answer=None), record(3, meta={"n": -3})],
    # A fraction's canonical text is RFC 8785's (ECMAScript's), not the typed serializer's: read by the reference.
    "fractions": [record(0, answer=2.5), record(1, meta={"score": 0.125, "big": 1e300})],
    "probe": [record(0, probe={"token_ids": [1, 2, 3]})],
}


def _with_layers(entry: dict[str, Any], layers: list[dict[str, Any]]) -> dict[str, Any]:
    entry = {**entry, "layers": layers}
    entry["digest"] = entry_digest(entry)
    return entry


VALID["sliding and shared layers"] = [_with_layers(record(0), [
    {"index": 0, "kind": "sliding", "keys": "layer.0.keys", "values": "layer.0.values", "positions": [2, 8],
     "sliding_window": 6, "cumulative_length": 8, "stores": "window"},
    {"index": 1, "kind": "shared", "shared_with": 0}])]


@pytest.mark.parametrize("name", sorted(VALID))
def test_typed_decode_equals_the_reference_on_valid_shards(name: str) -> None:
    raw = written(VALID[name])
    doc, canonical = models.decode_shard(raw, WHERE)
    assert doc == reference(raw)
    assert json.dumps(doc, sort_keys=True) == json.dumps(reference(raw), sort_keys=True)  # also types: 2 is not 2.0
    for entry in doc["entries"]:
        if entry["id"] in canonical:
            assert sha256_hex(canonical[entry["id"]]) == entry_digest(entry) == entry["digest"]


@pytest.mark.parametrize("name", sorted(set(VALID) - {"fractions"}))
def test_kvgraft_written_shards_take_the_typed_path(name: str, fast_only: None) -> None:
    doc, _ = models.decode_shard(written(VALID[name]), WHERE)
    assert [e["id"] for e in doc["entries"]] == [e["id"] for e in VALID[name]]


def test_the_typed_digest_covers_plain_records() -> None:
    """Records without free-form members have their canonical bytes from the typed serializer (the speed)."""
    _, canonical = models.decode_shard(written(VALID["text"]), WHERE)
    assert sorted(canonical) == ["e0", "e1", "e2"]


def test_a_shard_kvgraft_would_not_write_is_read_by_the_reference() -> None:
    """Spaces, escapes kvgraft does not write, members out of order: valid, read by the strict reader, the same."""
    doc = shard([record(0), record(1)])
    for raw in (json.dumps(doc, indent=1).encode(), json.dumps(doc).encode(), json.dumps(doc, sort_keys=True,
                separators=(",", ":")).replace('"e0"', '"\\u0065\\u0030"').encode()):
        got, canonical = models.decode_shard(raw, WHERE)
        assert got == reference(raw) and canonical == {}


def _unordered(entry: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`entry` with tensors named `names` in that order, its digest the canonical one (over sorted names)."""
    tensors = dict(zip(names, entry["tensors"].values(), strict=False))
    entry = {**entry, "tensors": tensors, "layers": [{"index": 0, "kind": "shared", "shared_with": 1},
                                                     {**entry["layers"][1], "keys": names[0], "values": names[1]}]}
    entry["digest"] = entry_digest(entry)
    return entry


@pytest.mark.parametrize("names", [["b", "a", "c", "d"], ["a", "b", "\uffff", "\U00010000"]],
                         ids=["unsorted", "beyond the BMP (UTF-16 order differs)"])
def test_records_whose_names_the_typed_serializer_would_not_sort_are_digested_by_the_reference(names: list[str]) -> None:
    entry = _unordered(record(0), names)
    raw = to_json(models.SHARD.validate_python(shard([entry])))  # members sorted, tensors in the order given
    doc, canonical = models.decode_shard(raw, WHERE)
    assert doc == reference(raw) and list(doc["entries"][0]["tensors"]) == names
    assert all(sha256_hex(canonical[e["id"]]) == entry_digest(e) for e in doc["entries"] if e["id"] in canonical)


# ---------------------------------------------------------------------------------------------- refusals

def _break(old: bytes, new: bytes) -> bytes:
    raw = written([record(0), record(1)])
    assert raw.count(old) >= 1, old
    return raw.replace(old, new, 1)


def _meta(value: str) -> bytes:
    """A shard whose first record's meta is the JSON text `value` (its digest left as it was: the parse refuses first)."""
    raw = written([record(0, meta={"m": 0}), record(1)])
    return raw.replace(b'"meta":{"m":0}', b'"meta":' + value.encode(), 1)


HOSTILE = {
    "duplicate key in a record": _break(b'"num_tokens":8,', b'"num_tokens":8,"num_tokens":8,'),
    "duplicate key in a layer": _break(b'"kind":"full",', b'"kind":"full","kind":"full",'),
    "duplicate key at the top": _break(b'"format_version":2}', b'"format_version":2,"format_version":2}'),
    "duplicate key in meta": _meta('{"m":1,"m":1}'),
    "depth in meta": _meta('{"m":' + "[" * 62 + "]" * 62 + "}"),
    "depth beyond the typed parser's limit": _meta('{"m":' + "[" * 5000 + "]" * 5000 + "}"),
    "NaN in meta": _meta('{"m":NaN}'),
    "Infinity in meta": _meta('{"m":-Infinity}'),
    "a number that overflows in meta": _meta('{"m":1e999}'),
    "long integer in meta": _meta('{"m":90071992547409921}'),
    "long integer in token ids": _break(b'"token_ids":[1,', b'"token_ids":[90071992547409921,'),
    "long negative integer": _break(b'"argmax":3', b'"argmax":-90071992547409921'),
    "lone surrogate in text": _break(b'"text":"record 0"', b'"text":"record \\ud800"'),
    "lone surrogate in meta key": _meta('{"\\udc00":1}'),
    "not UTF-8": _break(b'"text":"record 0"', b'"text":"record \xff"'),
    "UTF-8 byte order mark": b"\xef\xbb\xbf" + written([record(0)]),
    "wrong type": _break(b'"num_tokens":8', b'"num_tokens":"8"'),
    "boolean for an integer": _break(b'"argmax":3', b'"argmax":true'),
    "missing member": _break(b'"file":"entries/000.safetensors",', b""),
    "extra member in a record": _break(b'"num_tokens":8,', b'"num_tokens":8,"owner":"x",'),
    "extra member in a layer": _break(b'"kind":"full",', b'"kind":"full","colour":"red",'),
    "digest not hex": _break(b'"header_sha256":"' + H[:4].encode(), b'"header_sha256":"' + b"ABCD"),
    "unsafe file name": _break(b'"file":"entries/000.safetensors"', b'"file":"../000.safetensors"'),
    "unknown dtype": _break(b'"dtype":"float32"', b'"dtype":"float31"'),
    "wrong format": _break(b'"format":"kvgraft-cache-index-shard"', b'"format":"kvgraft-cache-index-chard"'),
    "wrong version": _break(b'"format_version":2', b'"format_version":3'),
    # each bound of the types, as the typed decoder has it (models._twin)
    "id too long": _break(b'"id":"e0"', b'"id":"' + b"e" * 257 + b'"'),
    "empty id": _break(b'"id":"e0"', b'"id":""'),
    "no tokens": _break(b'"num_tokens":8', b'"num_tokens":0'),
    "negative layer index": _break(b'"index":1,', b'"index":-1,'),
    "byte range of three": _break(b'"byte_range":[100,164]', b'"byte_range":[100,164,200]'),
    "byte range of one": _break(b'"byte_range":[100,164]', b'"byte_range":[100]'),
    "shape of nine": _break(b'"shape":[1,1,8,2]', b'"shape":[1,1,8,2,1,1,1,1,1]'),
    "shape beyond 2^40": _break(b'"shape":[1,1,8,2]', b'"shape":[1,1,8,1099511627777]'),
    "sliding window of 0": written(VALID["sliding and shared layers"]).replace(b'"sliding_window":6', b'"sliding_window":0'),
    "unknown layer kind": _break(b'"kind":"full"', b'"kind":"fill"'),
    "trailing data": written([record(0)]) + b"x",
    "not an object": b"[]",
    "truncated": written([record(0)])[:-7],
}


@pytest.mark.parametrize("name", sorted(HOSTILE))
def test_typed_decode_refuses_what_the_reference_refuses_with_its_line(name: str) -> None:
    raw = HOSTILE[name]
    expected = refusal(reference, raw)
    assert refusal(lambda r: models.decode_shard(r, WHERE), raw) == expected
    assert expected.startswith(WHERE + ": ") and "\n" not in expected


def test_each_digest_not_hex_is_refused_with_the_references_line() -> None:
    """Every 64-hex-digit string of a written shard (whatever member holds it), made not hex in turn: the typed
    decoder checks their digits in one pass over all digests, which must not miss one."""
    raw = written([record(0, probe={"token_ids": [1]}), record(1)])
    spots = [m.start() + 1 for m in re.finditer(rb'"[0-9a-f]{64}"', raw)]
    assert len(spots) == 2 * (5 + 4) + 2  # each record: digest, header, token ids, source, logits + 4 tensors; files
    for at in spots:
        for bad in (b"A", b"g", "é".encode()):
            broken = raw[:at + 5] + bad + raw[at + 6:]
            expected = refusal(reference, broken)
            assert refusal(lambda r: models.decode_shard(r, WHERE), broken) == expected, broken[at - 30:at + 70]


def test_a_member_the_schema_allows_and_the_types_do_not_is_refused_naming_it() -> None:
    """An integer written 1.0: JSON Schema counts it an integer, the types do not (kvgraft never writes one)."""
    raw = _break(b'"index":1,', b'"index":1.0,')
    reference(raw)  # the schema lets it through
    line = refusal(lambda r: models.decode_shard(r, WHERE), raw)
    assert line.startswith(f"{WHERE}: schema error at $.entries[0].layers[1].index: "), line


@pytest.mark.parametrize(("old", "new", "member"), [
    (b'"header_sha256":"' + H.encode(), b'"header_sha256":"' + H.encode() + b"\\n", "header_sha256"),
    (b'"file":"entries/000.safetensors"', b'"file":"entries/000.safetensors\\n"', "file")])
def test_a_pattern_passes_no_trailing_newline(old: bytes, new: bytes, member: str) -> None:
    """Stricter than the compiled schema validator, whose `$` passes a string ending in a newline."""
    raw = _break(old, new)
    reference(raw)
    line = refusal(lambda r: models.decode_shard(r, WHERE), raw)
    assert line.startswith(f"{WHERE}: schema error at $.entries[0].{member}: String should match pattern"), line


def test_random_mutations_are_refused_exactly_when_the_reference_refuses() -> None:
    """Bytes of a written shard changed at random (seeded): accepted with the reference's records, or refused
    with the reference's line."""
    import random

    rng = random.Random(44)
    base = written([record(0, meta={"k": [1, "é"]}), record(1)])
    tried = refused = 0
    for _ in range(400):
        raw = bytearray(base)
        for _ in range(rng.choice((1, 1, 2))):
            at = rng.randrange(len(raw))
            raw[at:at + 1] = rng.choice((b"", bytes([rng.randrange(256)]), b'"', b",", b"9" * 17, b"}", b"\\"))
        try:
            want: Any = reference(bytes(raw))
        except InputError as exc:
            want = str(exc)
            refused += 1
        try:
            got: Any = models.decode_shard(bytes(raw), WHERE)[0]
        except InputError as exc:
            got = str(exc)
        assert got == want, bytes(raw)
        tried += 1
    assert refused > tried // 2  # the mutations reach the refusals


# ---------------------------------------------------------------------------------------------- one source

def _inline(node: Any, resolve: Any) -> Any:
    """`node` with every $ref replaced by what it names, and no description (prose, not types)."""
    if isinstance(node, list):
        return [_inline(x, resolve) for x in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return _inline({**resolve(node["$ref"]), **{k: v for k, v in node.items() if k != "$ref"}}, resolve)
    out = {k: _inline(v, resolve) for k, v in node.items() if k != "description"}
    if "required" in out:
        out["required"] = sorted(out["required"])  # a set, whatever order it is written in
    return out


def _pointer(doc: dict[str, Any], pointer: str) -> Any:
    for part in pointer.strip("/").split("/"):
        doc = doc[part]
    return doc


def test_the_published_shard_schema_is_the_types() -> None:
    """schemas/cache-index-shard.v2.json (its records: cache-manifest.v1.json's $defs/entry, and files) equals
    the schema pydantic writes from kvgraft.release.models: a member, a bound or a pattern changed on one
    side only fails here."""
    shard_file, manifest = load_schema(CACHE_INDEX_SHARD), load_schema(CACHE_MANIFEST)

    def resolve_file(ref: str) -> Any:
        name, _, pointer = ref.partition("#")
        return _pointer(manifest if name == CACHE_MANIFEST or not name else shard_file, pointer)

    published = _inline({k: v for k, v in shard_file.items() if k not in ("$schema", "$id", "title")}, resolve_file)
    generated = models.shard_schema()
    typed = _inline({k: v for k, v in generated.items() if k != "$defs"},
                    lambda ref: _pointer(generated, ref.partition("#")[2]))
    assert typed == published


# ---------------------------------------------------------------------------------------------- a release's records

def _rewrite_record(root: Path, change: Callable[[dict[str, Any]], None], *, redigest: bool) -> str:
    """Change the first record of shard 0 and recommit the shard's digest and size and the root digest (what
    an author altering a record would publish, but for the record's own digest unless `redigest`)."""
    manifest = json.loads((root / MANIFEST).read_text())
    meta = manifest["index"]["shards"][0]
    doc = json.loads((root / meta["file"]).read_bytes())
    change(doc["entries"][0])
    if redigest:
        doc["entries"][0]["digest"] = entry_digest(doc["entries"][0])
    data = jsonio.canonical(doc)
    (root / meta["file"]).write_bytes(data)
    meta.update(sha256=sha256_hex(data), size=len(data))
    manifest["root_digest"] = root_digest(manifest)
    (root / MANIFEST).write_text(json.dumps(manifest))
    return str(doc["entries"][0]["id"])


def _rename_keys(entry: dict[str, Any]) -> None:
    entry["layers"][0]["keys"] = "layer.0.keyz"


@pytest.mark.parametrize(("change", "redigest", "said"), [
    (lambda e: e["next_token"].update(argmax=e["next_token"]["argmax"] + 1), False, "digest {digest} does not match its content"),
    (_rename_keys, True, "layer 0: tensor 'layer.0.keyz' is not listed")], ids=["digest", "tensor not listed"])
def test_a_record_breaking_its_own_commitments_is_refused_when_read(tmp_path: Path, change: Any, redigest: bool,
                                                                     said: str) -> None:
    from release_factory import make_release

    root = tmp_path / "rel"
    make_release(root, entries=3, format_version=2, shard_entries=2, seed=44)
    eid = _rewrite_record(root, change, redigest=redigest)
    shard_file = json.loads((root / MANIFEST).read_text())["index"]["shards"][0]["file"]
    digest = json.loads((root / shard_file).read_bytes())["entries"][0]["digest"]
    with pytest.raises(Error) as info:
        Release.open(root).entry(eid)
    assert str(info.value).startswith(f"{root / shard_file}: entry {eid!r}") and said.format(digest=digest) in str(info.value)


def test_inspect_counts_a_records_tensor_bytes() -> None:
    entry = record(0)
    assert inspection.tensor_bytes(entry) == sum(b - a for a, b in (t["byte_range"] for t in entry["tensors"].values())) == 256


# ------------------------------------------------------------------------------------------ the manifest's types

def _members(schema: dict[str, Any], resolve: Callable[[str], Any]) -> tuple[set[str], set[str]]:
    while "$ref" in schema:
        schema = resolve(schema["$ref"])
    return set(schema["properties"]), set(schema.get("required", ()))


def _typed(td: Any) -> tuple[set[str], set[str]]:
    # The module's annotations are strings: which members are NotRequired is read from the evaluated hints.
    hints = get_type_hints(td, include_extras=True)
    return set(hints), {k for k, v in hints.items() if get_origin(v) is not NotRequired}


def test_the_manifest_types_name_what_the_manifest_schemas_name() -> None:
    """kvgraft.release.models' manifest TypedDicts (what every reader of a release is typed by) name the members
    schemas/cache-manifest.v1.json and v2 name, and require what both require: a member added to or dropped
    from one side only fails here."""
    v1, v2 = load_schema(CACHE_MANIFEST), load_schema("cache-manifest.v2.json")

    def resolve(ref: str) -> Any:
        name, _, pointer = ref.partition("#")
        return _pointer(v1 if name == CACHE_MANIFEST or not name else v2, pointer)

    (n1, r1), (n2, r2) = _members(v1, resolve), _members(v2, resolve)
    assert _typed(models.Manifest) == (n1 | n2, r1 & r2)
    assert _typed(models.Header) == ({"model", "schedule", "environment"}, {"model", "schedule", "environment"})
    assert _typed(models.ModelRecord) == _members(v1["properties"]["model"], resolve)
    assert _typed(models.Identity) == _members(v1["properties"]["model"]["properties"]["identity"], resolve)
    assert _typed(models.ScheduleRecord) == _members(v1["properties"]["schedule"], resolve)
    index = v2["properties"]["index"]
    assert _typed(models.IndexListing) == _members(index, resolve)
    assert _typed(models.ShardListing) == _members(index["properties"]["shards"]["items"], resolve)
    assert _typed(models.PrefixListing) == _members(index["properties"]["prefix"], resolve)
    drafted, _ = _typed(models.Draft)
    assert drafted == _typed(models.Entry)[0] - {"digest", "file", "tensors", "header_sha256"}


def test_a_dtype_a_record_may_not_state_is_refused() -> None:
    assert models.dtype("bfloat16") == "bfloat16"
    with pytest.raises(ValueError, match="float4"):
        models.dtype("float4_e2m1")
