"""Names in the documents and schemas point at something real: every `kvgraft.X` name imports, every repository
path cited exists, and no document cites a file outside the repository. And the documents, benches, code and tests
speak of kvgraft, not of how it is being developed: no work rounds, issue numbers, sessions or lent machines."""

from __future__ import annotations

import importlib
import importlib.util
import os
import re
from pathlib import Path

from third_party import SIGSTORE_BUNDLES

ROOT = Path(__file__).resolve().parents[2]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "schemas").glob("*.json")),
             ROOT / "bench/RESULTS.md"]
DOTTED = re.compile(r"(?<![\w/.-])kvgraft(?:\.[A-Za-z_]\w*)+")
# Not module names: the attestation's URI host, mutmut's generated mutant names (docs/mutation.md), the entry-point
# group third-party check kinds register in (tested to be the registry's ENTRY_POINTS below).
NOT_NAMES = re.compile(r"kvgraft\.dev\b|\.x_\w*|^kvgraft\.check_kinds$")
# Paths inside the repository as documents cite them (in backticks or as a link target).
CITED = re.compile(r"(?:`|\]\()((?:kvgraft|docs|bench|tests|schemas|audit|mutation|manifests)/[\w./-]*\w)")
# Patterns and placeholders, not files: globs, a RELEASE/… layout, the wheel folder built by `make gpu-wheels`.
NOT_FILES = re.compile(r"[*]|[A-Z]{3,}|bench/wheels/|tests/<|out/")
# A path outside the repository: up out of it, or an absolute path of a development machine. The one folder outside it
# that documents may name is where the third-party test data lies (tests/third_party.py), never read from here.
OUTSIDE = re.compile(r"\.\./[\w.-]+/[\w/.-]*\w|/work/[\w/.-]*\w")
THIRD_PARTY = Path(os.path.relpath(SIGSTORE_BUNDLES.parent, ROOT)).as_posix()


# How kvgraft is being developed, not what it is: a reader learns nothing from these. A machine is described by what
# it is (CPU model, cores, load), a change by its commit. Only this file holds the list.
DEVELOPMENT = re.compile("|".join(re.escape(p) for p in (
    "this session", "other sessions", "sessions'", "session machine", "this project's vm", "this project's machine",
    "this project's ci", "project's machines", "round one", "round two", "round three", "round-three", "round_three",
    "round_two", "helpers' ", "helper's clean", "issue #", "this issue", "the issue's", "lent to this", "been lent",
    "the lent ", "this worktree", "this branch", "on branch h", "workplace", "device time")), re.IGNORECASE)
WRITTEN = [ROOT / "README.md", ROOT / "Makefile", *(ROOT / "docs").rglob("*.md"), *(ROOT / "bench").glob("*.md"),
           *(ROOT / "bench").glob("*.py"), *(ROOT / "bench").glob("*.sh"), *(ROOT / "bench").glob("*.txt"),
           *(ROOT / "kvgraft").rglob("*.py"), *(ROOT / "mutation").glob("*.py"),
           *(p for p in (ROOT / "tests").rglob("*") if p.suffix in (".py", ".md") and p != Path(__file__).resolve())]


def development_wording(text: str) -> list[str]:
    return sorted({m.group(0).lower() for m in DEVELOPMENT.finditer(text)})


def outside(text: str) -> list[str]:
    return [p for p in OUTSIDE.findall(text) if not p.startswith(THIRD_PARTY)]


def resolves(name: str) -> bool:
    parts = name.split(".")
    for i in range(len(parts), 1, -1):
        module = ".".join(parts[:i])
        try:
            spec = importlib.util.find_spec(module)
        except ModuleNotFoundError:
            continue
        if spec is None:
            continue
        if i == len(parts):
            return True
        try:
            obj = importlib.import_module(module)
        except ImportError:  # kvgraft.vllm.connector needs vLLM: the module is there, its names cannot be looked up
            return True
        for attr in parts[i:]:
            if not hasattr(obj, attr):
                return False
            obj = getattr(obj, attr)
        return True
    return False


def dead_names(text: str) -> list[str]:
    return sorted({n.rstrip(".") for n in DOTTED.findall(text) if not NOT_NAMES.search(n) and not resolves(n.rstrip("."))})


def missing_paths(text: str) -> list[str]:
    return sorted({p for p in CITED.findall(text) if not NOT_FILES.search(p) and not (ROOT / p.split("#")[0]).exists()})


def test_every_kvgraft_name_in_documents_and_schemas_imports() -> None:
    found = {d.relative_to(ROOT).as_posix(): dead_names(d.read_text()) for d in DOCUMENTS}
    assert {k: v for k, v in found.items() if v} == {}


def test_every_repository_path_a_document_cites_exists() -> None:
    found = {d.relative_to(ROOT).as_posix(): missing_paths(d.read_text()) for d in DOCUMENTS}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_document_cites_a_file_outside_the_repository() -> None:
    found = {d.relative_to(ROOT).as_posix(): outside(d.read_text()) for d in DOCUMENTS}
    assert {k: v for k, v in found.items() if v} == {}


def test_no_document_code_or_test_speaks_of_how_kvgraft_is_developed() -> None:
    found = {d.relative_to(ROOT).as_posix(): development_wording(d.read_text()) for d in WRITTEN}
    assert {k: v for k, v in found.items() if v} == {}


def test_the_checks_find_what_is_planted() -> None:
    assert dead_names("see kvgraft.prefix_audit and kvgraft.report.compute_verdict") == [
        "kvgraft.prefix_audit", "kvgraft.report.compute_verdict"]
    assert dead_names("kvgraft.recompute.prefix, kvgraft.report.document.compute_verdict, kvgraft.dev/x") == []
    assert missing_paths("`docs/no-such-page.md` and [x](bench/RESULTS.md)") == ["docs/no-such-page.md"]
    assert outside(f"../elsewhere/DESIGN.md, /work/x, {THIRD_PARTY}/sigstore/") == ["../elsewhere/DESIGN.md", "/work/x"]
    assert development_wording("Round three: measured on this project's VM, shared with other sessions") == [
        "other sessions", "round three", "this project's vm"]
    assert development_wording("a 2-core Intel Xeon under other load; a round of tests; helper threads") == []


def test_the_entry_point_group_the_documents_name_is_the_registrys() -> None:
    from kvgraft.audit import checks

    assert checks.ENTRY_POINTS == "kvgraft.check_kinds"
