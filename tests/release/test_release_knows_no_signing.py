"""release/ knows files and digests; signing/ knows statements, OMS and Sigstore: no signing concept below signing/.

release/'s code and messages (string literals and identifiers; docstrings and comments aside) name no signing
concept: what lists a release's files reaches it as a `Listing` or `Beside` whose label the caller writes. The
one exception is the folder layout's SIDE_FILES, the names of the files a release keeps beside its manifest.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from kvgraft.release.format import SIDE_FILES
from kvgraft.signing import attest, oms

RELEASE = Path(__file__).resolve().parents[2] / "kvgraft" / "release"
WORDS = re.compile(r"(?i)(?<![a-z])(statements?|oms|sigstore|signatures?|bundles?)(?![a-z])")


def _docstrings(tree: ast.AST) -> set[int]:
    found: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            body = node.body
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
                found.add(id(body[0].value))
    return found


def _side_file_names(tree: ast.AST) -> set[int]:
    """The string constants assigned to SIDE_FILES: file names of the layout, not concepts."""
    return {id(c) for node in ast.walk(tree) if isinstance(node, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == "SIDE_FILES" for t in node.targets)
            for c in ast.walk(node.value) if isinstance(c, ast.Constant)}


def _identifiers(node: ast.AST) -> list[str]:
    if isinstance(node, ast.Name):
        return [node.id]
    if isinstance(node, ast.Attribute):
        return [node.attr]
    if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return [node.name]
    if isinstance(node, ast.arg):
        return [node.arg]
    if isinstance(node, ast.keyword) and node.arg is not None:
        return [node.arg]
    if isinstance(node, ast.alias):
        return [node.name, node.asname or ""]
    if isinstance(node, ast.ImportFrom):
        return [node.module or ""]
    return []


def signing_words(source: str) -> list[str]:
    """Each signing word in `source`'s string literals and identifiers (docstrings and comments aside), as
    'line: word'."""
    tree = ast.parse(source)
    skip = _docstrings(tree) | _side_file_names(tree)
    found: list[str] = []
    for node in ast.walk(tree):
        texts = _identifiers(node)
        texts = [re.sub(r"([a-z])([A-Z])", r"\1 \2", t) for t in texts]  # camelCase: its words apart
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
            texts.append(node.value)
        found += [f"{getattr(node, 'lineno', '?')}: {m.group(0)}" for t in texts for m in WORDS.finditer(t)]
    return found


def test_the_check_finds_a_planted_word_and_passes_over_docstrings_and_comments() -> None:
    planted = '''"""A signed statement's subjects (a docstring)."""
# an OMS signature (a comment)
SIDE_FILES = ("release.sigstore.json", "model.sig")


def check(subjects, source="signed statement"):
    """What the Sigstore bundle lists."""
    raise ValueError(f"{subjects}: the OMS list")


BUNDLE_NAME = "x"
omsList = sigstoreTrust = unsigned = 1
'''
    assert sorted(signing_words(planted)) == ["11: BUNDLE", "12: oms", "12: sigstore", "6: statement", "8: OMS"]


def test_release_names_no_signing_concept_in_its_code_or_messages() -> None:
    found = {p.name: words for p in sorted(RELEASE.glob("*.py")) if (words := signing_words(p.read_text()))}
    assert found == {}, f"signing words in release/ (pass them in through a Listing's or Beside's label): {found}"


def test_release_imports_nothing_of_signing() -> None:
    for path in sorted(RELEASE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not [n for n in names if n.startswith("kvgraft.signing")], f"{path.name} imports {names}"


def test_the_layouts_side_files_are_the_release_s_two_signature_files() -> None:
    """signing/ names them (attest.BUNDLE_NAME, oms.OMS_NAME); the layout keeps them beside the manifest."""
    assert SIDE_FILES == (attest.BUNDLE_NAME, attest.OMS_NAME) and oms.OMS_NAME == attest.OMS_NAME
