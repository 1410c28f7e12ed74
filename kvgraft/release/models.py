"""The typed models of an index shard and its entry records: the one source of their schema
(schemas/cache-index-shard.v2.json and cache-manifest.v1.json's `$defs/entry`; tests/release/test_index_models.py
fails when the two differ) and of the decoder that reads a shard in one typed pass (msgspec, over twins of
these types: `_twin`).

They are TypedDicts, so that a decoded record is the plain dict every reader of a release already takes.
Members are declared in RFC 8785 order (sorted), as the encoder writes them back (`_canonical` says when
that is a record's canonical JSON). Imports no torch.
"""

from __future__ import annotations

import functools
import operator
import re
import types
from typing import Annotated, Any, Literal, NotRequired, Union, cast, get_args, get_origin

import annotated_types
import msgspec
from pydantic import (
    AfterValidator,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    TypeAdapter,
    ValidationError,
    WithJsonSchema,
    with_config,
)
from pydantic.fields import FieldInfo
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaMode, JsonSchemaValue
from pydantic_core import CoreSchema, PydanticCustomError, core_schema
from typing_extensions import TypedDict, get_type_hints, is_typeddict

from kvgraft._internal import jsonio
from kvgraft.errors import InputError, SchemaError
from kvgraft.results.base import JsonObject

MAX_INT = jsonio.MAX_INT  # I-JSON (RFC 7493): what a canonical digest can hold

_STRICT = ConfigDict(extra="forbid", strict=True)

SHA256 = r"^[0-9a-f]{64}$"
Sha256 = Annotated[str, StringConstraints(pattern=SHA256)]
RELPATH = r"^(?!/)(?!.*(^|/)\.\.?(/|$))[A-Za-z0-9._/-]{1,200}$"
_RELPATH = re.compile(RELPATH)


def _relpath(name: str) -> str:
    # Checked with Python's `re`: the pattern looks ahead, which the typed decoder's regex engine cannot. A
    # full match, so that `$` does not pass a name ending in a newline (as the compiled schema validator).
    if _RELPATH.fullmatch(name) is None:
        raise PydanticCustomError("string_pattern_mismatch", "String should match pattern '{pattern}'", {"pattern": RELPATH})
    return name


RelPath = Annotated[str, AfterValidator(_relpath), WithJsonSchema({
    "type": "string", "description": "A path relative to the release folder: forward slashes, no '..', not absolute.",
    "pattern": RELPATH})]
Count = Annotated[int, Field(ge=0, le=MAX_INT)]
DType = Literal["float64", "float32", "float16", "bfloat16", "float8_e4m3fn", "float8_e5m2", "int64", "int32",
                "int16", "int8", "uint8", "bool"]
Span = Annotated[list[Count], Field(min_length=2, max_length=2)]


DTYPES: tuple[str, ...] = get_args(DType)


def dtype(name: str) -> DType:
    """`name` as a dtype a record may state (ValueError for another)."""
    if name not in DTYPES:
        raise ValueError(f"dtype {name!r} is none a release records ({', '.join(DTYPES)})")
    return cast(DType, name)


@with_config(_STRICT)
class Tensor(TypedDict):
    byte_range: Span
    dtype: DType
    sha256: Sha256
    shape: Annotated[list[Annotated[int, Field(ge=0, le=1099511627776)]], Field(max_length=8)]


@with_config(_STRICT)
class Layer(TypedDict):
    cumulative_length: NotRequired[Count]
    index: Count
    keys: NotRequired[str]
    kind: Literal["full", "sliding", "shared"]
    positions: NotRequired[Span]
    shared_with: NotRequired[Count]
    sliding_window: NotRequired[Annotated[int, Field(ge=1, le=MAX_INT)]]
    stores: NotRequired[Literal["window", "all"]]
    values: NotRequired[str]


@with_config(_STRICT)
class NextToken(TypedDict):
    argmax: Count
    dtype: DType
    logits_sha256: Sha256


@with_config(_STRICT)
class Probe(TypedDict):
    token_ids: list[Count]


@with_config(_STRICT)
class Source(TypedDict):
    kind: Literal["text", "messages"]
    messages: NotRequired[list[Any]]
    sha256: Sha256
    text: NotRequired[str]


@with_config(_STRICT)
class Entry(TypedDict):
    answer: NotRequired[str | int | float | None]
    digest: Sha256
    file: RelPath
    header_sha256: NotRequired[Sha256]
    id: Annotated[str, StringConstraints(min_length=1, max_length=256)]
    layers: list[Layer]
    meta: NotRequired[JsonObject]
    next_token: NextToken
    num_tokens: Annotated[int, Field(ge=1, le=MAX_INT)]
    probe: NotRequired[Probe]
    source: Source
    tensors: dict[str, Tensor]
    token_ids: list[Count]
    token_ids_sha256: Sha256


class Draft(TypedDict):
    """An entry's record before ReleaseWriter writes its file: what `Entry` holds but its file, tensor table,
    header digest and digest (kvgraft.release.records.new_entry)."""

    answer: NotRequired[str | int | float | None]
    id: str
    layers: list[Layer]
    meta: NotRequired[JsonObject]
    next_token: NextToken
    num_tokens: int
    probe: NotRequired[Probe]
    source: Source
    token_ids: list[int]
    token_ids_sha256: str


@with_config(_STRICT)
class FileMeta(TypedDict):
    sha256: Sha256
    size: Count


@with_config(_STRICT)
class Shard(TypedDict):
    entries: list[Entry]
    files: dict[RelPath, FileMeta]
    format: Literal["kvgraft-cache-index-shard"]
    format_version: Literal[2]


SHARD = TypeAdapter(Shard)


class ShardListing(TypedDict):
    """One index shard as manifest.json lists it (schemas/cache-manifest.v2.json, `index.shards`)."""

    file: str
    ids: list[str]
    num_tokens: NotRequired[list[int]]
    sha256: str
    size: int


class PrefixListing(TypedDict):
    """The prefix index as manifest.json lists it (schemas/cache-manifest.v2.json, `index.prefix`)."""

    block_tokens: int
    file: str
    records: int
    sha256: str
    size: int


class Identity(TypedDict):
    """A model's identity as a manifest records it (schemas/cache-manifest.v1.json, `model.identity`)."""

    config_sha256: str
    num_parameters: int
    num_tensors: int
    sha256: str
    tokenizer_sha256: str
    weights_sha256: str


class ModelRecord(TypedDict):
    """The model a release was captured from (schemas/cache-manifest.v1.json, `model`)."""

    architecture: str
    identity: Identity
    model_type: str
    num_hidden_layers: int
    spec: str


class ScheduleRecord(TypedDict):
    """The prefill schedule a release was captured under (schemas/cache-manifest.v1.json, `schedule`)."""

    add_generation_prompt: bool
    add_special_tokens: bool
    batch_size: Literal[1]
    chunk_tokens: int | None
    mode: Literal["one-shot", "chunked"]


class IndexListing(TypedDict):
    """A format-2 manifest's index (schemas/cache-manifest.v2.json, `index`)."""

    entries: int
    prefix: NotRequired[PrefixListing]
    shards: list[ShardListing]
    tokens: int


class Header(TypedDict):
    """What a capture records about its model and conditions: the members a manifest holds beside its format,
    its entries and its digest."""

    environment: JsonObject  # open: a device's extra facts are recorded beside the required ones
    model: ModelRecord
    schedule: ScheduleRecord


class Manifest(Header):
    """manifest.json (schemas/cache-manifest.v1.json and v2): format 1 holds `entries` and `files`, format 2 its
    `index`. Also the shape of a release as one document (`Release.flat`): format 1's members with format 2's
    header."""

    created: str
    entries: NotRequired[list[Entry]]
    files: NotRequired[dict[str, FileMeta]]
    format: Literal["kvgraft-cache-release"]
    format_version: Literal[1, 2]
    index: NotRequired[IndexListing]
    kvgraft_version: str
    root_digest: str


def as_json(record: Entry | Draft | Manifest | Header | ModelRecord | Identity | ScheduleRecord | Source) -> JsonObject:
    """A record of these types as the JSON object it is: every member a JSON value, which a TypedDict does not
    tell a type checker."""
    return cast(JsonObject, record)


class Published(GenerateJsonSchema):
    """JSON Schema as schemas/ states it: no titles; an enum or const without the type it implies; a map with
    constrained names as propertyNames and additionalProperties; a union of bare types as one type list;
    no keyword that only states its default (`additionalProperties: true`, `items: {}`)."""

    def literal_schema(self, schema: core_schema.LiteralSchema) -> JsonSchemaValue:
        out = super().literal_schema(schema)
        out.pop("type", None)
        return out

    def dict_schema(self, schema: core_schema.DictSchema) -> JsonSchemaValue:
        out = super().dict_schema(schema)
        if out.pop("patternProperties", None) is not None and "values_schema" in schema:
            out["propertyNames"] = self.generate_inner(schema["keys_schema"])
            out["additionalProperties"] = self.generate_inner(schema["values_schema"])
        return out

    def generate(self, schema: CoreSchema, mode: JsonSchemaMode = "validation") -> JsonSchemaValue:
        out: JsonSchemaValue = _plainer(super().generate(schema, mode))
        return out


def _plainer(node: Any) -> Any:
    if isinstance(node, list):
        return [_plainer(x) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: _plainer(v) for k, v in node.items() if k != "title"}
    if out.get("additionalProperties") is True:
        del out["additionalProperties"]
    if out.get("items") == {}:
        del out["items"]
    choices = out.get("anyOf")
    if choices and all(set(c) == {"type"} and isinstance(c["type"], str) for c in choices):
        types = [c["type"] for c in out.pop("anyOf")]
        out["type"] = [t for t in types if not (t == "integer" and "number" in types)]
    return out


def shard_schema() -> JsonObject:
    """The index shard's JSON Schema written from the types (`$defs` by type name)."""
    return SHARD.json_schema(schema_generator=Published)


# ------------------------------------------------------------------------------------------------ decoding

_FREE_FORM_DEPTH = 4  # the containers above a free-form member: shard, entries, entry, source


def _anchored(pattern: str) -> str:
    # msgspec matches with re.search, whose final `$` also passes a string ending in a newline.
    return pattern[:-1] + r"\Z" if pattern.endswith("$") else pattern


def _meta(bound: object) -> msgspec.Meta | None:
    """The msgspec bound of one of the models' pydantic bounds (None: one that only shapes the schema)."""
    if isinstance(bound, FieldInfo):
        found = {_BOUNDS[type(b)]: getattr(b, _BOUNDS[type(b)]) for b in bound.metadata}
        return msgspec.Meta(**found)
    if isinstance(bound, StringConstraints):
        if bound.pattern == SHA256:  # hex digits checked for all digests at once (_hex_digests): a search each was half a decode
            return msgspec.Meta(min_length=64, max_length=64)
        pattern = None if bound.pattern is None else _anchored(str(bound.pattern))
        return msgspec.Meta(pattern=pattern, min_length=bound.min_length, max_length=bound.max_length)
    if isinstance(bound, AfterValidator) and bound.func is _relpath:
        return msgspec.Meta(pattern=_anchored(RELPATH))
    if isinstance(bound, WithJsonSchema):
        return None
    raise TypeError(f"no msgspec bound for {bound!r}: kvgraft.release.models must say how the typed decoder checks it")


_BOUNDS = {annotated_types.Ge: "ge", annotated_types.Le: "le", annotated_types.MinLen: "min_length",
           annotated_types.MaxLen: "max_length"}
_TWINS: dict[type, Any] = {}


def _twin(tp: Any) -> Any:
    """The type the typed decoder (msgspec) reads for model type `tp`: the same members, kinds and bounds, so
    that the models stay the one source of both the published schema and the decoder."""
    if tp is JsonValue:  # free-form JSON, which msgspec reads untyped: _free_form_plain checks it as the strict reader
        return Any
    if is_typeddict(tp):
        if tp not in _TWINS:
            hints = get_type_hints(tp, include_extras=True)
            _TWINS[tp] = TypedDict(tp.__name__, {k: _twin(v) for k, v in hints.items()})  # type: ignore[operator]
        return _TWINS[tp]
    args = get_args(tp)
    origin = get_origin(tp)
    if origin is Annotated:
        bounds = [m for m in map(_meta, tp.__metadata__) if m is not None]
        return Annotated[(_twin(args[0]), *bounds)] if bounds else _twin(args[0])
    if origin in (NotRequired, list, dict):
        return origin[tuple(map(_twin, args)) if len(args) > 1 else _twin(args[0])]
    if origin in (Union, types.UnionType):
        return functools.reduce(operator.or_, map(_twin, args))
    return tp


_DECODER = msgspec.json.Decoder(_twin(Shard))
_ENCODER = msgspec.json.Encoder(order="sorted")


def decode_shard(raw: bytes, where: str) -> tuple[Shard, dict[str, bytes]]:
    """An index shard's bytes decoded in one typed pass, refusing what `jsonio.loads_strict` and the schema
    refuse (duplicate keys, depth, integers beyond I-JSON, lone surrogates, NaN, bytes that are not UTF-8),
    with the same message; and, by entry id, each record's canonical JSON without its digest where the
    typed encoder wrote it (the bytes records.entry_digest hashes).

    The typed decoder (msgspec, over `_twin(Shard)`) keeps the last of duplicate keys and drops members it
    does not know, so its result stands only when writing it back, members sorted, gives the very bytes
    read: a dropped duplicate or member, an escape or a space the writer would not write, members out of
    order all change them. kvgraft writes shards as canonical JSON, which round-trips; any other shard is
    read by the strict reader, then typed (its message, or the model's, names the member).
    """
    try:
        doc = _DECODER.decode(raw)
        records = [_ENCODER.encode(e) for e in doc["entries"]]
        same = _written_as(raw, records, _ENCODER.encode(doc["files"])) and _hex_digests(doc)
    except (msgspec.MsgspecError, RecursionError):
        same = False
    if same and _free_form_plain(doc["entries"]):
        canonical = {e["id"]: b"{" + r[_DIGEST_MEMBER:] for e, r in zip(doc["entries"], records, strict=True)
                     if _canonical(e)}
        return doc, canonical
    return _reference(raw, where), {}


_SHA256_OF = operator.itemgetter("sha256")


def _hex_digests(doc: Shard) -> bool:
    """Whether every digest of a decoded shard is lowercase hex (the decoder checked their length), in one
    C-speed pass over them all. tests/release/test_index_models.py changes each digest of a shard in turn."""
    parts: list[str] = list(map(_SHA256_OF, doc["files"].values()))
    for e in doc["entries"]:
        parts += map(_SHA256_OF, e["tensors"].values())
        parts += (e["digest"], e["token_ids_sha256"], e["source"]["sha256"], e["next_token"]["logits_sha256"],
                  e.get("header_sha256", ""))
    joined = "".join(parts)
    return joined.isascii() and not joined.encode().translate(None, b"0123456789abcdef")


_OPEN, _FILES = b'{"entries":[', b'],"files":'
_CLOSE = b',"format":"kvgraft-cache-index-shard","format_version":2}'


def _written_as(raw: bytes, records: list[bytes], files: bytes) -> bool:
    """Whether `raw` is the shard written from these encoded records and files: compared in place, piece by
    piece, without joining a copy of the shard."""
    if len(raw) != len(_OPEN) + sum(map(len, records)) + max(len(records) - 1, 0) + len(_FILES) + len(files) + len(_CLOSE):
        return False
    at = len(_OPEN)
    if not raw.startswith(_OPEN):
        return False
    for k, r in enumerate(records):
        if k and raw[at] != 0x2C:  # ","
            return False
        at += k > 0
        if not raw.startswith(r, at):
            return False
        at += len(r)
    return raw.startswith(_FILES, at) and raw.startswith(files, at + len(_FILES)) and raw.endswith(_CLOSE)


# `{"digest":"<64 hex>",` opens the serialized record when it has no `answer` (the one member sorted before).
_DIGEST_MEMBER = len('{"digest":"",') + 64


def _reference(raw: bytes, where: str) -> Shard:
    """The strict reader and the schema, then the types."""
    from kvgraft.schema import CACHE_INDEX_SHARD, validate

    doc = jsonio.loads_strict(raw, where)
    if not isinstance(doc, dict) or doc.get("format") != "kvgraft-cache-index-shard":
        raise InputError(f"{where}: not a kvgraft index shard")
    validate(doc, CACHE_INDEX_SHARD, where)
    try:
        return SHARD.validate_python(doc)
    except ValidationError as exc:  # what the schema allows and the types do not (an integer written 1.0)
        first = exc.errors()[0]
        path = "$" + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in first["loc"])
        raise SchemaError(where, path, first["msg"]) from None


def _free_form_plain(entries: list[Entry]) -> bool:
    """The free-form members (meta, source.messages, answer) hold no float and no integer beyond I-JSON, and
    nest within jsonio.MAX_DEPTH: what the strict reader would check in them (the typed members' own types
    and bounds exclude the rest)."""
    for e in entries:
        for value in (e.get("meta"), e["source"].get("messages"), e.get("answer")):
            if value is not None and not (jsonio.is_plain(value) and _depth(value) + _FREE_FORM_DEPTH <= jsonio.MAX_DEPTH):
                return False
    return True


def _depth(value: Any) -> int:
    deepest, stack = 0, [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, (dict, list)):
            deepest = max(deepest, d)
            stack.extend((x, d + 1) for x in (v.values() if isinstance(v, dict) else v))
    return deepest


def _canonical(entry: Entry) -> bool:
    """Whether the typed encoder writes this decoded record's canonical JSON: members sorted (by code points:
    the record round-tripped), `digest` first, tensor names within the Basic Multilingual Plane (where RFC
    8785's order by UTF-16 units is the same), no free-form member (left to the canonical writer, which the
    digest is defined by)."""
    joined = "".join(entry["tensors"])
    return not ("meta" in entry or "answer" in entry or "messages" in entry["source"]
                or not (joined.isascii() or max(map(ord, joined)) <= 0xFFFF))
