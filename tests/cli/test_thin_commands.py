"""Every command function is thin: it parses, builds a settings object, calls the library and renders, in at most
MAX_LINES lines (its signature and docstring included; a long --help text is a constant passed as `help=`)."""

from __future__ import annotations

import ast
from pathlib import Path

import typer.main

from kvgraft.cli import app

CLI = Path(__file__).resolve().parents[2] / "kvgraft" / "cli"
MAX_LINES = 40


def command_functions() -> dict[str, int]:
    """Each function of kvgraft/cli/ decorated as a command (`@x.command(...)`), by file and name: its lines."""
    found = {}
    for path in sorted(CLI.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef) and any(
                    isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.func.attr == "command"
                    for d in node.decorator_list):
                found[f"{path.name}:{node.name}"] = (node.end_lineno or node.lineno) - node.lineno + 1
    return found


def leaf_commands(group: object) -> int:
    commands = getattr(group, "commands", None)
    return 1 if commands is None else sum(leaf_commands(c) for c in commands.values())


def test_every_command_function_is_at_most_max_lines() -> None:
    found = command_functions()
    # every command the app registers is one of the functions measured: none is missed by the walk
    assert len(found) == leaf_commands(typer.main.get_command(app))
    long = {name: n for name, n in sorted(found.items(), key=lambda kv: -kv[1]) if n > MAX_LINES}
    assert not long, f"command functions over {MAX_LINES} lines (move the work into the library): {long}"
