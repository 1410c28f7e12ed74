"""`inspect --json` comes from the models in kvgraft.results.inspect; schemas/inspect-result.v1.json (written by hand:
it says which document is which with if/then/else and oneOf) names the same members and requires the same ones."""

from __future__ import annotations

import json
from typing import Any

import pytest
from test_attest import schema_validator

from kvgraft import inspection
from kvgraft.results import inspect as models
from kvgraft.results.base import Open
from kvgraft.schema import load_schema

SCHEMA = load_schema("inspect-result.v1.json")
ENTRY = SCHEMA["dependentSchemas"]["entry"]["properties"]["entry"]["allOf"][1]
# What the schema names of each document or part: (its members, those required of every such document).
PARTS: dict[str, tuple[type[Open], set[str], set[str]]] = {
    "row": (models.Row, set(SCHEMA["$defs"]["row"]["properties"]), set(SCHEMA["$defs"]["row"]["required"])),
    "signature": (models.Signature, set(SCHEMA["$defs"]["signature"]["properties"]),
                  set(SCHEMA["$defs"]["signature"]["required"])),
    "entries": (models.Page, set(SCHEMA["dependentSchemas"]["entries"]["properties"]["entries"]["properties"]),
                set(SCHEMA["dependentSchemas"]["entries"]["properties"]["entries"]["required"])),
    "entry": (models.Detail, set(ENTRY["properties"]) | set(SCHEMA["$defs"]["row"]["properties"]),
              set(ENTRY["required"]) | set(SCHEMA["$defs"]["row"]["required"])),
    "listing": (models.Listing, (set(SCHEMA["properties"]) | set(SCHEMA["dependentSchemas"])
                                 | set(SCHEMA["else"]["oneOf"][0]["required"])) - {"ok", "exit_code", "error", "entry"},
                set(SCHEMA["required"]) | set(SCHEMA["else"]["required"]) | set(SCHEMA["else"]["oneOf"][0]["required"])),
    "entry document": (models.EntryInspection, set(SCHEMA["required"]) | set(SCHEMA["else"]["required"]) | {"entry"},
                       set(SCHEMA["required"]) | set(SCHEMA["else"]["required"]) | {"entry"}),
    "refusal": (models.Refusal, set(SCHEMA["required"]) | {"ok", "exit_code", "error"},
                set(SCHEMA["required"]) | {"ok"} | set(SCHEMA["then"]["required"])),
}
# Members a model writes that the schema leaves open (its objects allow members they do not name).
OPEN = {"signature": {"bytes", "certificate", "transparency_log_entries"},
        "entry": {"next_token", "probe_tokens", "token_ids_head", "token_ids_sha256", "source", "answer", "meta"}}

# Members a model always writes that the schema does not require (it requires them of no document inspect wrote
# before they were written).
ALWAYS = {"entry": {"probe_tokens", "layers_total", "tensors_total"}}


def required(model: type[Open]) -> set[str]:
    return {name for name, f in model.model_fields.items() if f.is_required()}


@pytest.mark.parametrize("part", list(PARTS))
def test_each_model_names_and_requires_what_the_schema_does(part: str) -> None:
    model, named, must = PARTS[part]
    fields = set(model.model_fields)
    assert named <= fields, f"{part}: the schema names members the model lacks: {sorted(named - fields)}"
    assert fields - named == OPEN.get(part, set()), f"{part}: members the schema does not name"
    assert required(model) == must | ALWAYS.get(part, set()), \
        f"{part}: required differs: model {sorted(required(model))}, schema {sorted(must)}"


def test_a_refusal_validates_whatever_its_status() -> None:
    """The document is written whatever the error (a status the schema does not list is still written, and named)."""
    validator = schema_validator("inspect-result.v1.json")
    doc = inspection.failure("rel", "kvgraft: rel: no manifest.json", 2).as_json()
    assert list(validator.iter_errors(json.loads(json.dumps(doc)))) == []
    assert doc == {"format": "kvgraft-inspect-result", "format_version": 1, "kvgraft_version": doc["kvgraft_version"],
                   "release": "rel", "ok": False, "exit_code": 2, "error": "kvgraft: rel: no manifest.json"}
    odd: Any = inspection.failure("rel", "busy", 8).as_json()
    assert [e.validator for e in validator.iter_errors(odd)] == ["enum"]
