"""Every command's --help shows each option's and argument's help text whole: nothing is eaten as rich markup."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import typer
from typer.testing import CliRunner

from kvgraft.cli import app

runner = CliRunner()


def commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every command under `cmd` (typer's own click: groups are told by their `commands` member)."""
    yield path, cmd
    if isinstance(getattr(cmd, "commands", None), dict):
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, (*path, name))


def squash(text: str) -> str:
    """Without whitespace and frames: help wraps lines (at spaces and after hyphens) and may frame them, which
    loses no character; markup eats characters, which this still shows."""
    return "".join(text.replace("│", " ").split())


def test_every_help_string_is_shown_whole() -> None:
    root = typer.main.get_command(app)
    checked = 0
    for path, cmd in commands(root):
        r = runner.invoke(app, [*path, "--help"], env={"COLUMNS": "4000", "NO_COLOR": "1", "TERM": "dumb"})
        assert r.exit_code == 0, (path, r.output)
        shown = squash(r.output)
        for param in cmd.params:
            text = getattr(param, "help", None)
            if not text or getattr(param, "hidden", False):
                continue
            assert squash(text) in shown, f"kvgraft {' '.join(path)} --help: {param.name}'s help {text!r} is not shown whole"
            checked += 1
    assert checked > 50  # every command was reached


def test_markup_in_a_help_string_would_be_caught() -> None:
    """The positive control: a help string holding [brackets] unescaped loses them in the rendering."""
    demo = typer.Typer()

    @demo.command()
    def cmd(x: str = typer.Option("", help="from the plan's [executor] table")) -> None:
        del x

    r = runner.invoke(demo, ["--help"], env={"COLUMNS": "4000", "NO_COLOR": "1", "TERM": "dumb"})
    assert "from the plan's [executor] table" not in squash(r.output)
