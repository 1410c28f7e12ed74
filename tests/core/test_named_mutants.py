"""mutation/named_mutants.py stays runnable: each named check's source anchor occurs exactly once where it says,
and each killing test exists. (The script itself breaks each check and runs its test: `make mutate`, minutes; a
refactor that moved a check once left an anchor matching nothing, found only when the script ran.)"""

from __future__ import annotations

import ast
import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _mutants() -> list[tuple[str, list[tuple[str, str, str]], str]]:
    spec = importlib.util.spec_from_file_location("named_mutants", ROOT / "mutation" / "named_mutants.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.MUTANTS  # type: ignore[no-any-return]


def _test_names(path: Path) -> set[str]:
    return {n.name for n in ast.parse(path.read_text()).body if isinstance(n, ast.FunctionDef)}


def test_every_anchor_occurs_once_and_every_killing_test_exists() -> None:
    mutants = _mutants()
    assert len(mutants) >= 17  # the named checks of the security and verdict core
    for name, edits, test in mutants:
        for file, old, new in edits:
            assert (ROOT / file).read_text().count(old) == 1, f"{name}: {file} does not hold its anchor once"
            assert old != new
        path, _, function = test.partition("::")
        assert function in _test_names(ROOT / path), f"{name}: no test {test}"

