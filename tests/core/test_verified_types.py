"""Verification is in the types: every consumer of release bytes takes a `VerifiedRelease`, and only the edges open one.

mypy --strict proves the types (every consumer's parameter is `VerifiedRelease`, and a `Release`, a path
or a string given to one is a type error); this test keeps the two things mypy cannot see:

- no module outside the edges opens a release itself (`Release.open(...)`, `Release(...)`, or the
  integrity functions that return an opened one): the only way a consumer gets a release is a
  `VerifiedRelease` someone verified under a policy;
- the consumers' parameters stay `VerifiedRelease`, never a union with `Release`, `Path` or `str`.

Read from the source (ast), so it imports neither torch nor vLLM.
"""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "kvgraft"

# Where a release may be opened without a VerifiedRelease: the format itself, what verifies it, where its
# bytes come from, and the edges that turn a path into one.
EDGE_DIRS = {
    "release": "the format: opening a release is what it defines",
    "signing": "verify.verified opens the release it checks, under the policy it is given",
    "remote": "a published release's local mirror (a layer below signing): verify reads through it",
    "cli": "the command line: each command verifies under the policy its options give, or reads a manifest only",
}
# Single files, with the number of openings each may hold (a new one fails until it is justified here).
EDGE_FILES = {
    "inspection.py": (1, "kvgraft inspect: the manifest alone, no entry byte, and says it checks no signature"),
}
OPENERS = {"open_release", "check_release"}  # kvgraft.release.integrity: each returns an opened Release

# Consumers of release bytes: (module, function, parameter) typed VerifiedRelease.
CONSUMERS = [
    ("inference/graft.py", "check_model", "release"),
    ("inference/graft.py", "read_entry_tensors", "verified"),
    ("inference/graft.py", "restore", "checked"),
    ("inference/graft.py", "restore_prefix", "checked"),
    ("inference/graft.py", "load_cache", "release"),
    ("inference/graft.py", "model_for", "release"),
    ("inference/graft.py", "run", "checked"),
    ("recompute/audit.py", "compare_layers", "checked"),
    ("recompute/audit.py", "audit_entry", "checked"),
    ("recompute/audit.py", "entry_unit", "checked"),
    ("recompute/audit.py", "audit", "checked"),
    ("recompute/prefix.py", "judge_prefix", "checked"),
    ("recompute/prefix.py", "prefix_unit", "checked"),
    ("recompute/prefix.py", "audit_prefix", "checked"),
    ("recompute/prefix.py", "prefix_grafts", "checked"),
    ("recompute/prefix.py", "audit", "checked"),
    ("generalization/audit.py", "Library.__init__", "release"),
    ("generalization/audit.py", "run_query", "release"),
    ("generalization/audit.py", "prepare", "release"),
    ("generalization/audit.py", "aggregate", "release"),
    ("generalization/audit.py", "audit", "rel"),
    ("generalization/controls.py", "run", "release"),
    ("execution/executor.py", "Executor.map", "release"),
    ("execution/executor.py", "LocalExecutor.map", "release"),
    ("execution/executor.py", "RayExecutor.map", "release"),
    ("execution/ray_worker.py", "Worker.release", "return"),
    ("audit/context.py", "Context.release", "return"),  # what a check reads (loaded when first read)
]


def openings(source: str) -> list[tuple[int, str]]:
    """(line, what) for each place `source` opens a release itself."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        f = node.func
        if isinstance(f, ast.Attribute) and f.attr == "open" and isinstance(f.value, ast.Name) and f.value.id == "Release":
            found.append((node.lineno, "Release.open("))
        elif isinstance(f, ast.Name) and f.id == "Release":
            found.append((node.lineno, "Release("))
        elif isinstance(f, ast.Name | ast.Attribute) and (f.id if isinstance(f, ast.Name) else f.attr) in OPENERS:
            found.append((node.lineno, f"{f.id if isinstance(f, ast.Name) else f.attr}("))
    return found


def _edge(rel: str) -> bool:
    return rel.split("/")[0] in EDGE_DIRS


def test_no_consumer_opens_a_release_itself() -> None:
    wrong, counts = [], {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        if _edge(rel):
            continue
        found = openings(path.read_text())
        if rel in EDGE_FILES:
            counts[rel] = len(found)
            continue
        wrong += [f"kvgraft/{rel}:{line}: {what}" for line, what in found]
    assert not wrong, ("a release opened outside the edges (take a VerifiedRelease; an edge calls "
                       "kvgraft.signing.verify.verified(path, policy)): " + "; ".join(wrong))
    for rel, (allowed, why) in EDGE_FILES.items():
        assert counts.get(rel) == allowed, f"kvgraft/{rel}: {counts.get(rel)} openings, {allowed} allowed ({why})"


def test_the_scan_finds_each_way_of_opening() -> None:
    planted = ("from kvgraft.release.format import Release\nfrom kvgraft.release import integrity\n"
               "a = Release.open(p)\nb = Release(p, m)\nc = integrity.open_release(p)\nd = check_release(p)\n"
               "e = verified(p, policy).release\n")
    assert [what for _, what in openings(planted)] == ["Release.open(", "Release(", "open_release(", "check_release("]


def _annotation(tree: ast.Module, qualname: str, param: str) -> str | None:
    scope: list[ast.stmt] = tree.body
    *outer, name = qualname.split(".")
    for cls in outer:
        scope = next(n for n in scope if isinstance(n, ast.ClassDef) and n.name == cls).body
    node = next(n for n in scope if isinstance(n, ast.FunctionDef | ast.ClassDef) and n.name == name)
    if isinstance(node, ast.ClassDef):  # a dataclass: its field
        field = next(n for n in node.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)
                     and n.target.id == param)
        return ast.unparse(field.annotation)
    if param == "return":
        return ast.unparse(node.returns) if node.returns is not None else None
    args = node.args.posonlyargs + node.args.args + node.args.kwonlyargs
    arg = next(a for a in args if a.arg == param)
    return ast.unparse(arg.annotation) if arg.annotation is not None else None


@pytest.mark.parametrize(("module", "function", "param"), CONSUMERS, ids=[f"{m}:{f}" for m, f, _ in CONSUMERS])
def test_each_consumer_takes_a_verified_release(module: str, function: str, param: str) -> None:
    tree = ast.parse((ROOT / module).read_text())
    assert _annotation(tree, function, param) == "VerifiedRelease"


def test_no_consumer_takes_a_union_with_a_verified_release() -> None:
    unions = []
    for path in sorted(ROOT.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            text = ast.unparse(node) if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitOr) else ""
            # A loader of one (the Context's Lazy, read as a VerifiedRelease) is no way around verification.
            if "VerifiedRelease" in text and set(text.split(" | ")) - {"VerifiedRelease", "Lazy[VerifiedRelease]"}:
                unions.append(f"kvgraft/{path.relative_to(ROOT).as_posix()}:{node.lineno}: {ast.unparse(node)}")
    assert not unions, "; ".join(unions)


def test_verified_needs_a_path_and_a_policy_and_remembers_nothing() -> None:
    from kvgraft.signing import verify

    params = inspect.signature(verify.verified).parameters
    assert [(p.name, p.annotation, p.default is inspect.Parameter.empty) for p in params.values()] == [
        ("root", "Path | str | Source", True), ("policy", "VerifyPolicy", True)]
    params = inspect.signature(verify.verify).parameters
    assert [(p.name, p.annotation) for p in params.values()] == [
        ("source", "str | Path | Source"), ("policy", "VerifyPolicy"), ("scope", "Scope")]
    # The policy and the check result travel in the VerifiedRelease, not in a map beside the verifier.
    module_maps = [n for n in ast.parse(Path(verify.__file__).read_text()).body
                   if isinstance(n, ast.Assign | ast.AnnAssign) and isinstance(n.value, ast.Dict)]
    assert not module_maps
    assert not hasattr(verify, "_CHECKED")


# Where a release came from is carried by its objects (kvgraft.release.sources.Source, the VerifiedRelease), never
# kept in the modules that open, read or name releases: two releases in one process do not see each other.
RELEASE_STATE_MODULES = ("errors.py", "release/sources.py", "remote/__init__.py", "remote/mirror.py",
                         "signing/verify.py", "release/format.py", "release/index.py", "release/integrity.py")


def module_state(source: str) -> list[str]:
    """Module-level mutable containers and locks in `source`, and any `atexit` use."""
    found = []
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign | ast.AnnAssign) and node.value is not None:
            v = node.value
            call = ast.unparse(v.func) if isinstance(v, ast.Call) else ""
            if isinstance(v, ast.Dict | ast.List | ast.Set) or call.split(".")[-1] in {
                    "dict", "list", "set", "Lock", "RLock", "WeakValueDictionary", "WeakKeyDictionary"}:
                found.append(f"{node.lineno}: {ast.unparse(node)[:60]}")
    found += [f"{n.lineno}: atexit" for n in ast.walk(ast.parse(source))
              if isinstance(n, ast.Name | ast.alias) and "atexit" in (n.id if isinstance(n, ast.Name) else n.name)]
    return found


def test_where_a_release_came_from_is_kept_in_no_module() -> None:
    held = {rel: module_state((ROOT / rel).read_text()) for rel in RELEASE_STATE_MODULES}
    assert not {rel: f for rel, f in held.items() if f}, held


def test_the_state_scan_finds_maps_locks_and_atexit() -> None:
    planted = "import atexit\nA: dict[str, str] = {}\nB = []\nC = threading.Lock()\nD = 3\n"
    assert [f.split(":")[0] for f in module_state(planted)] == ["2", "3", "4", "1"]
