"""The models' base classes and the JSON Schema a kind's result file is generated from (Draft 2020-12).

A kind's schema file holds two shapes: its result (the root: what the check writes, every member it always
writes required), and under `$defs/data` what a report's check of that kind must hold (what the
renderers read; a report's `$ref` points there). A member that may be absent is `T | None = None` in a model and
absent-or-T in the schema, never null; `nullable()` marks the few that may also be null.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, JsonValue, WithJsonSchema
from pydantic.config import JsonDict
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue, models_json_schema

DRAFT = "https://json-schema.org/draft/2020-12/schema"
BASE = "https://kvgraft.dev/schemas/"
SHA256 = r"^[0-9a-f]{64}$"
Sha256 = Annotated[str, Field(pattern=SHA256)]
Count = Annotated[int, Field(ge=0)]
Fraction = Annotated[float, Field(ge=0, le=1)]
# A JSON object whose members the schema leaves open (a condition's settings, an environment).
JsonObject = Annotated[dict[str, JsonValue], WithJsonSchema({"type": "object"})]
_NULLABLE = "x-kvgraft-nullable"  # read and removed by the generator: never in a published schema
_SUBSCHEMAS = ("items", "additionalProperties", "not", "if", "then", "else", "contains")
_SCHEMA_LISTS = ("anyOf", "oneOf", "allOf", "prefixItems")


class Open(BaseModel):
    """An object whose schema allows members it does not name (a report's data: a reader ignores what it does not
    know, and the renderers list it by name)."""

    model_config = ConfigDict(frozen=True, populate_by_name=True)


class Closed(Open):
    """An object whose schema accepts no member it does not name."""

    model_config = ConfigDict(extra="forbid")


def nullable(**kw: Any) -> Any:
    """An optional member that, when present, may be null."""
    return Field(default=None, json_schema_extra={_NULLABLE: True}, **kw)


class _Generate(GenerateJsonSchema):
    def field_title_should_be_set(self, schema: Any) -> bool:
        return False


def _tidy(node: Any) -> Any:
    """A generated schema made plain: no titles or defaults, optional members not null (unless nullable), a
    union of bare types as a list of types, a dict's key pattern a rule on every key."""
    if not isinstance(node, dict):
        return node
    node = dict(node)
    node.pop("title", None)
    if "default" in node:
        default = node.pop("default")
        if default is None and not node.pop(_NULLABLE, False) and "anyOf" in node:
            node["anyOf"] = [b for b in node["anyOf"] if b != {"type": "null"}]
    node.pop(_NULLABLE, None)
    for key in ("properties", "$defs"):
        if key in node:
            node[key] = {name: _tidy(s) for name, s in node[key].items()}
    for key in _SUBSCHEMAS:
        if isinstance(node.get(key), dict):
            node[key] = _tidy(node[key])
    for key in _SCHEMA_LISTS:
        if key in node:
            node[key] = [_tidy(s) for s in node[key]]
    patterns = node.pop("patternProperties", None)
    if patterns is not None:  # a dict whose keys are constrained: every key must match (no other key passes)
        ((pattern, value),) = patterns.items()
        node["propertyNames"] = {"pattern": pattern}
        node["additionalProperties"] = _tidy(value)
    branches = node.get("anyOf")
    if branches is not None:
        if len(branches) == 1:
            node = {**{k: v for k, v in node.items() if k != "anyOf"}, **branches[0]}
        elif all(set(b) == {"type"} and isinstance(b["type"], str) for b in branches):
            del node["anyOf"]
            node["type"] = [b["type"] for b in branches]
    return node


def _renamed(node: Any, old: str, new: str) -> Any:
    if isinstance(node, dict):
        return {k: (new if k == "$ref" and v == old else _renamed(v, old, new)) for k, v in node.items()}
    if isinstance(node, list):
        return [_renamed(v, old, new) for v in node]
    return node


def schema_file(file: str, title: str, result: type[Open], data: type[Open], *, root: JsonDict | None = None,
                also: tuple[type[Open], ...] = ()) -> JsonSchemaValue:
    """The schema file of a kind: `result` at the root (its docstring the description), `data` at `$defs/data`.
    A file holding more than one document names them in `also` and says at `root` which is which."""
    models = [(m, "validation") for m in (result, data, *also)]
    _, top = models_json_schema(models, ref_template="#/$defs/{model}", schema_generator=_Generate)  # type: ignore[arg-type]
    defs = {name: _tidy(s) for name, s in top["$defs"].items()}
    if root is None:
        root = defs.pop(result.__name__)
    defs["data"] = defs.pop(data.__name__)
    head = {"$schema": DRAFT, "$id": BASE + file, "title": title}
    first = [k for k in ("description", "type", "required", "additionalProperties") if k in root]
    ordered = {**head, **{k: root[k] for k in first}, **{k: v for k, v in root.items() if k not in first}, "$defs": defs}
    out: JsonSchemaValue = _renamed(ordered, f"#/$defs/{data.__name__}", "#/$defs/data")
    out["$defs"] = reachable(out, also=("data",))  # `data` is referred to from the report schema
    return out


def _refs(node: Any) -> set[str]:
    """The names of this document's $defs that `node` refers to."""
    if isinstance(node, dict):
        own = {node["$ref"][len("#/$defs/"):]} if str(node.get("$ref", "")).startswith("#/$defs/") else set()
        return own.union(*(_refs(v) for v in node.values()))
    if isinstance(node, list):
        return set().union(*(_refs(v) for v in node))
    return set()


def reachable(doc: JsonSchemaValue, also: tuple[str, ...] = ()) -> JsonSchemaValue:
    """The $defs entries the schema refers to, directly or through another (and those named `also`, which other
    files refer to)."""
    defs = doc["$defs"]
    seen: set[str] = set()
    todo = _refs({k: v for k, v in doc.items() if k != "$defs"}) | set(also)
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo |= _refs(defs[name])
    return {name: d for name, d in defs.items() if name in seen}


@dataclass(frozen=True)
class Typed:
    """A kind's typed result: its schema file under schemas/ (generated from these models), the result a check
    writes, and the data a report's check holds, which the kind's face, details and HTML read."""

    file: str
    title: str
    result: type[Open]
    data: type[Open]
    root: JsonDict | None = None  # a file of more than one document: which is which (else the result is the root)
    also: tuple[type[Open], ...] = ()  # the file's other documents

    def schema(self) -> JsonSchemaValue:
        return schema_file(self.file, self.title, self.result, self.data, root=self.root, also=self.also)


def document_schema(file: str, title: str, model: type[Open]) -> JsonSchemaValue:
    """The schema file of a document that is no check kind's result (no report data part): `model` at the root,
    its docstring the description."""
    _, top = models_json_schema([(model, "validation")], ref_template="#/$defs/{model}", schema_generator=_Generate)
    defs = {name: _tidy(s) for name, s in top["$defs"].items()}
    root = defs.pop(model.__name__)
    head = {"$schema": DRAFT, "$id": BASE + file, "title": title}
    first = [k for k in ("description", "type", "required", "additionalProperties") if k in root]
    out: JsonSchemaValue = {**head, **{k: root[k] for k in first}, **{k: v for k, v in root.items() if k not in first},
                            "$defs": defs}
    out["$defs"] = reachable(out)
    return out
