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
    """A schema file; one naming `x-kvgraft-defs-from` gets that schema's $defs, and its top-level
    properties as `v1_<name>` defs, beside its own: the v2 release files reuse the v1 entry record."""
    schema: dict[str, Any] = load_file(schema_dir() / name)
    base = schema.get("x-kvgraft-defs-from")
    if isinstance(base, str):
        other = load_schema(base)
        defs = {**other.get("$defs", {}), **{f"v1_{k}": v for k, v in other.get("properties", {}).items()}}
        schema = {**schema, "$defs": {**defs, **schema.get("$defs", {})}}
    return schema


@cache
def _validator(name: str) -> Any:
    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema)


@cache
def _fast(name: str) -> Any:
    """A compiled validator (jsonschema-rs) when installed: ~500x faster on large manifests."""
    try:
        import jsonschema_rs
    except ImportError:
        return None
    return jsonschema_rs.validator_for(load_schema(name))


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
    """A validator of one part of a schema (`pointer`: its keys, /-separated), with the schema's $defs."""
    from jsonschema import Draft202012Validator

    schema = load_schema(name)
    part: Any = schema
    for key in pointer.split("/"):
        part = part[key]
    return Draft202012Validator({"$defs": schema.get("$defs", {}), **part})


def validate_part(doc: Any, name: str, pointer: str, where: str) -> None:
    """`validate` against one part of a schema, e.g. one entry of a result ("properties/entries/items")."""
    from jsonschema.exceptions import best_match

    _refuse(best_match(_part_validator(name, pointer).iter_errors(doc)), where)
