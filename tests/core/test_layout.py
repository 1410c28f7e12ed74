"""The package layout: the torch-free core, no upward imports or cycles, one-line module docstrings, the map in docs/layout.md.

The import contracts live in pyproject.toml ([tool.importlinter]) and are checked with import-linter's
`lint-imports`; the torch-free core is also checked by importing it where torch cannot be imported.
"""

from __future__ import annotations

import ast
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "kvgraft"
CORE = ("kvgraft._internal", "kvgraft.release", "kvgraft.remote", "kvgraft.signing", "kvgraft.inspection", "kvgraft.sampling")
# At most this many modules lie flat in kvgraft/ (its __init__ included); the rest live in role packages.
MAX_FLAT = 8

NO_TORCH = r"""
import importlib, json, pkgutil, sys

class _NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in ("torch", "transformers"):
            raise ImportError(f"{name} is blocked: the torch-free core must not import it")
        return None

sys.meta_path.insert(0, _NoTorch())
loaded = []
for name in sys.argv[1:]:
    mod = importlib.import_module(name)
    loaded.append(name)
    for info in pkgutil.walk_packages(getattr(mod, "__path__", []), name + "."):
        importlib.import_module(info.name)
        loaded.append(info.name)
print("RESULT " + json.dumps({"loaded": loaded, "torch": "torch" in sys.modules}))
"""


def modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts)


def test_core_imports_without_torch(tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "cache")}
    proc = subprocess.run([sys.executable, "-c", NO_TORCH, *CORE], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])
    assert result["torch"] is False
    loaded = set(result["loaded"])
    assert {"kvgraft.release.format", "kvgraft.signing.attest", "kvgraft.signing.oms", "kvgraft.signing.verify",
            "kvgraft.signing.sign", "kvgraft._internal.jsonio", "kvgraft._internal.digest"} <= loaded


def test_few_modules_lie_flat() -> None:
    flat = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(flat) <= MAX_FLAT, f"{len(flat)} modules flat in kvgraft/ (at most {MAX_FLAT}): {flat}"


def test_import_contracts_are_kept() -> None:
    # import-linter is a dev dependency `make test` installs: a missing one fails, it never skips.
    exe = shutil.which("lint-imports", path=str(Path(sys.executable).parent))
    assert exe is not None, "import-linter is not installed beside this Python (pip install -e '.[dev]')"
    proc = subprocess.run([exe], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "0 broken" in proc.stdout


def test_every_module_says_its_job_on_its_first_line() -> None:
    for path in modules():
        tree = ast.parse(path.read_text())
        doc = ast.get_docstring(tree, clean=False)
        assert doc, f"{path.relative_to(ROOT)}: no module docstring"
        assert path.read_text().startswith('"""'), f"{path.relative_to(ROOT)}: the docstring is not the first line"
        assert doc.splitlines()[0].strip(), f"{path.relative_to(ROOT)}: the docstring's first line is empty"


def test_the_layout_page_matches_the_tree() -> None:
    text = (ROOT / "docs/layout.md").read_text()
    section = text.split("\n## Layout", 1)[1].split("\n## ", 1)[0]
    named = set(re.findall(r"kvgraft/[\w/]+\.py", section))
    # every module is on the map (a package's __init__ only where it holds code), and the map names no other
    present = {p.relative_to(ROOT).as_posix() for p in modules() if p.name != "__init__.py" or p.parent == PACKAGE}
    assert not present - named, f"in the tree, not in docs/layout.md: {sorted(present - named)}"
    stale = sorted(n for n in named if not (ROOT / n).is_file())
    assert not stale, f"in docs/layout.md, not in the tree: {stale}"


def test_the_layers_name_every_package_once_each_on_one_line() -> None:
    """The package-level layers contract is the architecture: every package of kvgraft/ sits on exactly one of its
    lines, so `test_import_contracts_are_kept` proves that no module imports a package above its own."""
    import tomllib

    contracts = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]["contracts"]
    top = next(c for c in contracts if c["type"] == "layers" and "containers" not in c)
    named = [m.strip() for line in top["layers"] for m in line.replace("|", ":").split(":")]
    packages = {f"kvgraft.{p.name}" for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    flat = {f"kvgraft.{p.stem}" for p in PACKAGE.glob("*.py") if p.stem != "__init__"}
    assert len(named) == len(set(named)), f"a module on two lines: {named}"
    assert packages <= set(named), f"packages on no line of the layers: {sorted(packages - set(named))}"
    assert set(named) <= packages | flat, f"lines naming no package or flat module: {sorted(set(named) - packages - flat)}"
    assert not [m for m in named if m.count(".") > 1], "a line names a module inside a package, not the package"


# Test folders beside those named for a kvgraft package: the flat modules and the layout, the vLLM connector, bench/.
TEST_FOLDERS_BESIDE_PACKAGES = {"core", "serving", "bench"}


def test_tests_are_arranged_by_package() -> None:
    tests = ROOT / "tests"
    flat = sorted(p.name for p in tests.glob("test_*.py"))
    assert not flat, f"test files directly in tests/ (place each in tests/<package>/): {flat}"
    packages = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").is_file()}
    folders = {p.parent.name for p in tests.glob("*/test_*.py")}
    stray = sorted(folders - packages - TEST_FOLDERS_BESIDE_PACKAGES)
    assert not stray, f"test folders named for no kvgraft package: {stray}"
    assert len(folders) >= 8  # every package's tests were found


def cycles() -> list[list[str]]:
    """Import cycles among kvgraft's modules: strongly connected components of grimp's import graph."""
    import grimp

    graph = grimp.build_graph("kvgraft", exclude_type_checking_imports=True)
    edges = {m: {i for i in graph.find_modules_directly_imported_by(m) if i.startswith("kvgraft.")}
             for m in graph.modules if m.startswith("kvgraft")}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return found


def test_no_import_cycles() -> None:
    assert cycles() == []


if __name__ == "__main__":
    for component in cycles():
        print("cycle:", " <-> ".join(component))
