"""Strings from a release, a bundle, a report or a plan are printed as text, never as markup.

One hostile string (a markup closing tag, a concealing tag, ANSI escapes, a newline) is planted in every
string field a release carries: entry ids, source text, answer, meta, and every environment string
(torch, transformers, device name, ...). Every command that prints them runs on it: `verify`, `run`
(the graft and its ledger), `library build` (capture's summary of a library), `audit recompute`,
`audit run` and `report show`. Before: `run` ended in exit 70 after the graft ran (rich's MarkupError on
"[/x]" in the ledger) and `[conceal]` hid text.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.records import root_digest
from kvgraft.render.text import plain
from kvgraft.signing import keys, sign

runner = CliRunner()
HOSTILE = "[/x] [conceal]hidden[/conceal] \x1b[31mred\x1b[0m line1\nline2"
SHOWN = plain(HOSTILE)  # as every command must show it: the tags literal, ESC and the newline escaped
ENV_STRINGS = ("torch", "transformers", "python", "platform", "device_name", "kvgraft")


def _check(r: Any, what: str, *, shows: bool = True, code: int = 0) -> None:
    assert r.exit_code == code, f"{what}: exit {r.exit_code}: {r.output[-3000:]}"
    text = r.output
    assert "internal error" not in text and "Traceback" not in text, f"{what}: {text[-3000:]}"
    assert "\x1b" not in text, f"{what}: an ESC reached the terminal"
    assert "line1\nline2" not in text, f"{what}: a planted newline started a line"
    # Tags shown as written, never interpreted: a concealed or closed span would leave the tag out.
    assert text.count("[conceal]") == text.count("[conceal]hidden[/conceal]"), what
    if shows:  # wrapped at any space, in a table cell or on a line of its own: compare the words
        words = " ".join(w for w in text.split() if w.strip("│┃|"))
        assert " ".join(SHOWN.split()) in words, f"{what}: not shown escaped: {text[-3000:]}"


@pytest.fixture(scope="module")
def hostile(tiny_dir: Callable[[str], Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("hostile-text")
    model = tiny_dir("llama")
    records = folder / "records.jsonl"
    records.write_text("".join(json.dumps(r) + "\n" for r in [
        {"id": HOSTILE, "text": f"one two three {HOSTILE} four", "answer": HOSTILE, "meta": {HOSTILE: HOSTILE}},
        {"id": "plain", "text": "five six seven eight nine ten"},
    ]))
    rel = folder / "rel"
    r = runner.invoke(app, ["capture", str(records), "--out", str(rel), "--model", str(model), "--probe", "3"])
    _check(r, "capture", shows=False)
    manifest = json.loads((rel / "manifest.json").read_text())
    for name in ENV_STRINGS:
        manifest["environment"][name] = f"{name} {HOSTILE}"
    manifest["root_digest"] = root_digest(manifest)
    (rel / "manifest.json").write_text(json.dumps(manifest, indent=2))
    private, public = keys.write_keypair(folder / "k")
    sign.sign_release(rel, keys.load_private_key(private))
    problems = folder / "problems.jsonl"
    problems.write_text("".join(json.dumps({"id": f"{HOSTILE} {i}", "problem": f"{HOSTILE} Mia has {i} apples.",
                                            "answer": str(i), "solution": f"{HOSTILE} She has {i}. #### {i}"}) + "\n"
                                for i in range(2, 4)))
    return {"folder": folder, "model": model, "release": rel, "public": public, "problems": problems}


def test_verify_prints_release_strings_as_text(hostile: dict[str, Path]) -> None:
    for extra in ((), ("--key", str(hostile["public"])), ("--deep",)):
        _check(runner.invoke(app, ["verify", str(hostile["release"]), *extra]), f"verify {extra}", shows=False)


def test_run_prints_the_ledger_and_continuation_as_text(hostile: dict[str, Path]) -> None:
    r = runner.invoke(app, ["run", str(hostile["release"]), "--entry", HOSTILE, "--prompt", "x", "--max-new-tokens", "2",
                            "--model", str(hostile["model"]), "--key", str(hostile["public"])])
    _check(r, "run")  # the ledger lists the environment strings that differ
    assert "torch differs" in r.output.replace("\n", " ")


def test_library_build_summary_prints_problem_strings_as_text(hostile: dict[str, Path]) -> None:
    r = runner.invoke(app, ["library", "build", "--source", str(hostile["problems"]), "--library-fraction", "1",
                            "--out", str(hostile["folder"] / "lib"), "--model", str(hostile["model"]), "--no-generate"])
    _check(r, "library build", shows=False)


def test_audit_recompute_prints_entry_ids_and_conditions_as_text(hostile: dict[str, Path]) -> None:
    r = runner.invoke(app, ["audit", "recompute", str(hostile["release"]), "--model", str(hostile["model"]),
                            "--device", "cpu", "--key", str(hostile["public"]), "--require", "consistent",
                            "--probe", HOSTILE])
    assert r.exit_code in (0, 4, 6), r.output
    _check(r, "audit recompute", code=r.exit_code)


def test_audit_run_and_report_show_print_report_strings_as_text(hostile: dict[str, Path]) -> None:
    folder = hostile["folder"]
    plan = folder / "plan.toml"
    plan.write_text(f"""
format = "kvgraft-audit-plan"
format_version = 1
name = {json.dumps(HOSTILE)}
out = "{folder / 'o[/x]'}"
[model]
spec = "{hostile['model']}"
[release]
path = "{hostile['release']}"
[checks.verify]
[checks.recompute]
require = "consistent"
[signing]
key = "ephemeral"
""")
    r = runner.invoke(app, ["audit", "run", str(plan)])
    assert r.exit_code in (0, 4, 6), r.output
    _check(r, "audit run", code=r.exit_code)  # the plan's name, and its out folder "o[" / "x]"
    assert "o[/x]/report.json" in r.output
    report = folder / "o[/x]" / "report.json"
    _check(runner.invoke(app, ["report", "show", str(report)]), "report show")
    _check(runner.invoke(app, ["report", "show", str(report), "--detail", "all"]), "report show --detail all")


def test_a_word_longer_than_the_line_is_cut_under_the_indent_never_folded_to_column_zero() -> None:
    """A release string with no spaces and longer than the terminal (an escaped newline before forged text)
    must not leave the terminal to fold it: a folded piece would start a line with the attacker's text."""
    from kvgraft.render.text import hanging, kv_lines

    forged = "a" * 75 + "FORGED-LINE kvgraft: verified"
    for lines in (hanging("answer", "x" * 100 + forged, 80), kv_lines(80, "entry", [("id", "y" * 90 + forged)])):
        body = lines[1:] if lines[0] == "entry" else lines
        assert all(len(line) <= 80 for line in lines), lines
        assert all(line.startswith(" ") for line in body), lines
    # Control: a long id that fits one line stays whole on its own line.
    digest = "f" * 64
    assert any(line.strip() == digest for line in hanging("sha256 of the release root", digest, 80))
