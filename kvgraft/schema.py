"""JSON Schemas of every file kvgraft writes, and validation with a JSON path in errors."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

from kvgraft._internal.jsonio import load_file
from kvgraft.errors import SchemaError

CACHE_MANIFEST = "cache-manifest.v1.json"
CACHE_MANIFEST_V2 = "cache-manifest.v2.json"
CACHE_INDEX_SHARD = "cache-index-shard.v2.json"


def schema_dir() -> Path:
    """Installed wheels carry the schemas inside the package; a checkout has them at the top."""
    here = Path(__file__).resolve().parent
    for candidate in (here / "schemas", here.parent / "schemas"):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError("kvgraft schemas folder not found")


@cache
def load_schema(name: str) -> dict[str, Any]:
    """A schema file as it is: every one names its `$id`, and refers to another by it (`$ref`)."""
    schema: dict[str, Any] = load_file(schema_dir() / name)
    return schema


@cache
def _resources() -> dict[str, dict[str, Any]]:
    """Every schema of the folder by its `$id`: the registry its cross-file `$ref`s resolve in (e.g. the v2
    release files' `cache-manifest.v1.json#/$defs/entry`, relative to their own `$id`)."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(schema_dir().glob("*.json")):
        schema = load_schema(path.name)
        sid = schema.get("$id")
        if not isinstance(sid, str) or sid in out:
            raise ValueError(f"schema {path.name}: $id {sid!r} missing or not unique")
        out[sid] = schema
    return out


@cache
def _registry() -> Any:
    """The folder as a `referencing` registry, for the reference validator (jsonschema)."""
    from referencing import Registry, Resource
    from referencing.jsonschema import DRAFT202012

    resources = [(sid, Resource.from_contents(s, default_specification=DRAFT202012)) for sid, s in _resources().items()]
    return Registry().with_resources(resources).crawl()


def _no_retrieval(uri: str) -> Any:
    """kvgraft's schemas refer only to one another: anything else is an error, never a download."""
    raise ValueError(f"{uri} is not a schema of {schema_dir()}")


@cache
def _validator(name: str) -> Any:
    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, registry=_registry())


@cache
def _fast(name: str) -> Any:
    """A compiled validator (jsonschema-rs) when installed: ~500x faster on large manifests."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    registry = jsonschema_rs.Registry(list(_resources().items()), retriever=_no_retrieval)
    return jsonschema_rs.validator_for(load_schema(name), registry=registry, retriever=_no_retrieval)


def validate(doc: Any, name: str, where: str) -> None:
    """Raise SchemaError naming the JSON path of the most relevant violation."""
    from jsonschema.exceptions import best_match

    fast = _fast(name)
    try:
        if fast is not None and fast.is_valid(doc):
            return
    except ValueError:
        pass  # a Python type the compiled validator cannot read (e.g. a str subclass): use the reference one
    # Invalid (or no fast validator): the reference implementation picks the error and its path.
    _refuse(best_match(_validator(name).iter_errors(doc)), where)


def validate_with(doc: Any, schema: dict[str, Any], where: str) -> None:
    """`validate` against a schema given as a document (a plugin's check kind may carry its own)."""
    from jsonschema import Draft202012Validator
    from jsonschema.exceptions import best_match

    Draft202012Validator.check_schema(schema)
    _refuse(best_match(Draft202012Validator(schema).iter_errors(doc)), where)


def _refuse(error: Any, where: str) -> None:
    if error is not None:
        message = error.message if len(error.message) < 200 else error.message[:200] + "..."
        raise SchemaError(where, error.json_path, message)


@cache
def _part_validator(name: str, pointer: str) -> Any:
    """A validator of one part of a schema (`pointer`: its keys, /-separated): a `$ref` to it by the
    schema's `$id`, so that its own refs resolve as in the whole."""
    from urllib.parse import quote

    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    part: Any = schema
    for key in pointer.split("/"):
        part = part[key]  # a KeyError here names a part that is not there
    fragment = "/".join(quote(key.replace("~", "~0"), safe="") for key in pointer.split("/"))
    return Draft202012Validator({"$ref": f"{schema['$id']}#/{fragment}"}, registry=_registry())


def validate_part(doc: Any, name: str, pointer: str, where: str) -> None:
    """`validate` against one part of a schema, e.g. one entry of a result ("properties/entries/items")."""
    from jsonschema.exceptions import best_match

    _refuse(best_match(_part_validator(name, pointer).iter_errors(doc)), where)
