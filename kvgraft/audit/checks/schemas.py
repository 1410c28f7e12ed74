"""The schemas the check registry decides, generated from it: each typed kind's own schema file (from its models,
kvgraft.results.<kind>), the report schema (from its models, kvgraft.results.report) with its kind list and its
rule per built-in kind (the check's `data` is that kind's report data, by `$ref` to the `data` part of the kind's
schema file), and the plan schema's `checks` tables in the registry's order. The report compare result's schema
file is generated here too, from its models (kvgraft.results.compare).

`python -m kvgraft.audit.checks.schemas --write` rewrites a file whose generated parts differ from the
registry; `--check` (what tests/audit/test_check_kinds.py runs) names the files that differ and exits 1.
"""

from __future__ import annotations

import copy
import json
import sys

from pydantic.json_schema import JsonSchemaValue

from kvgraft.audit.checks import BUILTIN, NAME, OTHER
from kvgraft.audit.checks.kind import CheckKind
from kvgraft.results import compare, report
from kvgraft.results.base import reachable
from kvgraft.schema import load_schema, schema_dir

REPORT = "audit-report.v1.json"
PLAN = "audit-plan.v1.json"


def data_ref(k: CheckKind) -> str:
    """Where the report schema finds a built-in kind's report data: the `data` part of the kind's schema file."""
    if k.typed is None:
        raise ValueError(f"built-in check kind {k.name!r} has no typed result: its report data has no schema")
    return f"{k.typed.file}#/$defs/data"


def report_schema() -> JsonSchemaValue:
    """The report's models' schema (kvgraft.results.report), with the registry's kind list and its rule per
    built-in kind."""
    doc = report.schema()
    check = doc["$defs"]["check"]
    kind = check["properties"]["kind"]
    kind["examples"] = [*(k.name for k in BUILTIN), OTHER]
    kind["pattern"] = f"^{NAME.pattern}$"
    check["allOf"] = check.get("allOf", []) + [
        {"if": {"properties": {"kind": {"const": k.name}}},
         "then": {"properties": {"data": {"$ref": data_ref(k)}}}}
        for k in BUILTIN if isinstance(k.schema, str)]
    # a typed kind's old shape, now in its own file, is dropped: one copy of each shape
    doc["$defs"] = reachable(doc)
    return doc


def plan_schema() -> JsonSchemaValue:
    """The plan's `checks`: a table per built-in kind, in the registry's order (a kind's settings are written in
    the file; a kind with none written takes `enabled` alone), and any registered name for a plugin's."""
    doc = copy.deepcopy(load_schema(PLAN))
    checks = doc["properties"]["checks"]
    written = checks["properties"]
    bare = {"type": "object", "additionalProperties": False, "properties": {"enabled": {"type": "boolean"}}}
    checks["properties"] = {k.name: written.get(k.name, bare) for k in BUILTIN}
    checks["propertyNames"] = {"pattern": f"^{NAME.pattern}$"}
    return doc


def generated() -> dict[str, JsonSchemaValue]:
    kinds = {k.typed.file: k.typed.schema() for k in BUILTIN if k.typed is not None}
    return {**kinds, REPORT: report_schema(), PLAN: plan_schema(),
            compare.FILE: compare.schema()}


def stale() -> list[str]:
    """The schema files whose generated parts differ from what the registry generates."""
    return [name for name, doc in generated().items() if load_schema(name) != doc]


def main(argv: list[str]) -> int:
    if argv == ["--check"]:
        names = stale()
        for name in names:
            print(f"schemas/{name} differs from the check registry: run python -m kvgraft.audit.checks.schemas --write")
        return 1 if names else 0
    if argv == ["--write"]:
        docs = generated()
        for name in stale():
            (schema_dir() / name).write_text(json.dumps(docs[name], indent=2, ensure_ascii=False) + "\n")
            print(f"wrote schemas/{name}")
        return 0
    print("usage: python -m kvgraft.audit.checks.schemas --check | --write", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
