"""The schemas folder is standard JSON Schema: a stock Draft 2020-12 validator (the `jsonschema` package,
not kvgraft's loader) given the folder as a registry (each schema by its `$id`) validates what kvgraft
writes, following the `$ref`s across files. This is how a third party checks a release, a report or a plan."""

from __future__ import annotations

import copy
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from jsonschema import Draft202012Validator
from jsonschema.exceptions import ValidationError
from referencing import Registry, Resource
from referencing.exceptions import Unresolvable
from referencing.jsonschema import DRAFT202012

from release_factory import make_release

ROOT = Path(__file__).resolve().parents[2]
SCHEMAS = ROOT / "schemas"
DRAFT = "https://json-schema.org/draft/2020-12/schema"
BASE = "https://kvgraft.dev/schemas/"
NOT_SCHEMAS = ("const", "enum", "examples", "default")  # members whose values are data, not subschemas


def folder(schemas: dict[str, dict[str, Any]]) -> Registry[Any]:
    """The registry a third party builds: every schema as a resource under its `$id`."""
    return Registry().with_resources(
        (s["$id"], Resource.from_contents(s, default_specification=DRAFT202012)) for s in schemas.values())


def read_folder() -> dict[str, dict[str, Any]]:
    return {p.name: json.loads(p.read_text()) for p in sorted(SCHEMAS.glob("*.json"))}


def validator(schemas: dict[str, dict[str, Any]], name: str) -> Draft202012Validator:
    return Draft202012Validator(schemas[name], registry=folder(schemas))


def refs(node: Any, at: str = "") -> Iterator[tuple[str, str]]:
    """Every `$ref` in a schema, with the JSON pointer of the subschema naming it."""
    if isinstance(node, dict):
        if isinstance(node.get("$ref"), str):
            yield at, node["$ref"]
        for key, value in node.items():
            if key not in NOT_SCHEMAS:
                yield from refs(value, f"{at}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from refs(value, f"{at}/{i}")


def unresolved(schemas: dict[str, dict[str, Any]]) -> list[str]:
    """The `$ref`s that do not resolve, each resolved against its own file's `$id` as the spec says."""
    registry = folder(schemas)
    out = []
    for name, schema in schemas.items():
        resolver = registry.resolver(base_uri=schema["$id"])
        for at, ref in refs(schema):
            try:
                resolver.lookup(ref)
            except Unresolvable as exc:
                out.append(f"{name}{at or '/'}: {ref} ({type(exc).__name__})")
    return out


def test_every_schema_is_a_draft_2020_12_schema_with_an_absolute_id_and_no_private_keyword() -> None:
    schemas = read_folder()
    assert {"cache-manifest.v1.json", "cache-manifest.v2.json", "cache-index-shard.v2.json",
            "audit-report.v1.json", "audit-plan.v1.json"} <= set(schemas)
    ids = [s["$id"] for s in schemas.values()]
    assert len(set(ids)) == len(ids), ids
    for name, schema in schemas.items():
        assert schema["$schema"] == DRAFT, name
        assert schema["$id"].startswith("https://kvgraft.dev/") and "#" not in schema["$id"], name
        # The predicate's $id is its in-toto predicateType; every other one is its file's URL.
        if name != "release-attestation-predicate.v1.json":
            assert schema["$id"] == BASE + name
        assert not any(k.startswith("x-kvgraft") for k in schema), name
        Draft202012Validator.check_schema(schema)


def test_every_ref_resolves_in_the_folder_and_the_old_private_keyword_would_not() -> None:
    schemas = read_folder()
    assert unresolved(schemas) == []
    cross = [(name, ref) for name, s in schemas.items() for _, ref in refs(s) if not ref.startswith("#")]
    assert ("cache-index-shard.v2.json", "cache-manifest.v1.json#/$defs/entry") in cross
    # Control: the v2 manifest as it was, borrowing v1's model through `x-kvgraft-defs-from`, is a
    # pointer to nowhere for a stock resolver; this test would say so.
    old = copy.deepcopy(schemas)
    old["cache-manifest.v2.json"]["x-kvgraft-defs-from"] = "cache-manifest.v1.json"
    old["cache-manifest.v2.json"]["properties"]["model"] = {"$ref": "#/$defs/v1_model"}
    assert unresolved(old) == ["cache-manifest.v2.json/properties/model: #/$defs/v1_model (PointerToNowhere)"]


@pytest.fixture
def release(tmp_path: Path) -> Path:
    """A tiny format-2 (indexed) release, written by kvgraft: a manifest and its index shards."""
    make_release(tmp_path / "rel", entries=3, layers=2, tokens=4, format_version=2, shard_entries=2)
    return tmp_path / "rel"


def test_a_stock_validator_accepts_a_release_a_report_and_a_plan(release: Path) -> None:
    schemas = read_folder()
    manifest = json.loads((release / "manifest.json").read_text())
    assert manifest["format_version"] == 2
    validator(schemas, "cache-manifest.v2.json").validate(manifest)
    shards = sorted((release / "index").glob("*.json"))
    assert len(shards) == 2 == len(manifest["index"]["shards"])
    for shard in shards:
        validator(schemas, "cache-index-shard.v2.json").validate(json.loads(shard.read_text()))
    report = json.loads((ROOT / "tests" / "fixtures" / "report-example.json").read_text())
    validator(schemas, "audit-report.v1.json").validate(report)
    plan = tomllib.loads((ROOT / "audit" / "demo.toml").read_text())
    validator(schemas, "audit-plan.v1.json").validate(plan)


@pytest.mark.parametrize(("name", "file", "plant", "path"), [
    # model and environment are v1's top-level properties; an entry record and its digests are v1's $defs
    ("cache-manifest.v2.json", "manifest.json", lambda d: d["environment"].update(threads="two"), "$.environment.threads"),
    ("cache-manifest.v2.json", "manifest.json", lambda d: d["model"]["identity"].update(sha256="ABC"),
     "$.model.identity.sha256"),
    ("cache-index-shard.v2.json", "index/00000.json", lambda d: d["entries"][1].update(num_tokens="4"),
     "$.entries[1].num_tokens"),
    ("cache-index-shard.v2.json", "index/00000.json",
     lambda d: d["entries"][0]["next_token"].update(logits_sha256="0" * 63), "$.entries[0].next_token.logits_sha256"),
    ("cache-index-shard.v2.json", "index/00000.json", lambda d: d["files"].update({"../x": {"sha256": "0" * 64, "size": 1}}),
     "$.files"),
])
def test_an_error_in_what_v2_borrows_from_v1_is_refused_by_the_stock_validator(
        release: Path, name: str, file: str, plant: Any, path: str) -> None:
    schemas = read_folder()
    doc = json.loads((release / file).read_text())
    validator(schemas, name).validate(doc)
    plant(doc)
    with pytest.raises(ValidationError) as exc:
        validator(schemas, name).validate(doc)
    assert exc.value.json_path == path


def test_the_docs_example_runs_as_written_without_kvgraft(release: Path, tmp_path: Path) -> None:
    """docs/release-format.md's example, run by a Python where kvgraft cannot be imported, beside `schemas/` and
    `RELEASE/`; then the same with an error planted in the manifest's environment (a v1 property)."""
    text = (ROOT / "docs" / "release-format.md").read_text()
    example = re.search(r"## Validating the files without kvgraft\n.*?```python\n(.*?)```", text, re.S)
    assert example is not None
    shutil.copytree(SCHEMAS, tmp_path / "schemas")
    shutil.copytree(release, tmp_path / "RELEASE")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = "import sys; sys.modules['kvgraft'] = None  # any import of kvgraft would raise\n"
    run = subprocess.run([sys.executable, "-c", probe + example.group(1)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    manifest = json.loads((tmp_path / "RELEASE" / "manifest.json").read_text())
    manifest["environment"]["threads"] = 0
    (tmp_path / "RELEASE" / "manifest.json").write_text(json.dumps(manifest))
    run = subprocess.run([sys.executable, "-c", probe + example.group(1)], cwd=tmp_path, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 1 and "ValidationError: 0 is less than the minimum of 1" in run.stderr, run.stderr
