"""docs/usage.md agrees with `--help` (every command and option it lists, nothing else); README's summary names every command.

docs/usage.md's Usage block lists one entry per command: a line `kvgraft COMMAND ...`, its continuation lines and the
comments under it. Each entry must name every long option its command's --help shows (hidden ones aside),
and no option that --help does not show; every command --help lists must have an entry.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import typer
from typer.testing import CliRunner

from kvgraft.cli import app

ROOT = Path(__file__).resolve().parents[2]
OPTION = re.compile(r"(?<![\w-])--[a-z][a-z0-9-]*")
# Every command takes --help; `kvgraft --version` is the root's own, not a command's.
IMPLIED = {"--help"}


def commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    """Every leaf command under `cmd`, by its path of names."""
    if isinstance(getattr(cmd, "commands", None), dict):
        for name, sub in sorted(cmd.commands.items()):
            yield from commands(sub, (*path, name))
    else:
        yield path, cmd


def help_options(path: tuple[str, ...], cmd: Any) -> set[str]:
    """The long options `kvgraft PATH --help` lists (and, checked here, shows)."""
    r = CliRunner().invoke(app, [*path, "--help"], env={"COLUMNS": "4000", "NO_COLOR": "1", "TERM": "dumb"})
    assert r.exit_code == 0, (path, r.output)
    listed = {o for p in cmd.params if not getattr(p, "hidden", False) for o in (*p.opts, *p.secondary_opts)
              if o.startswith("--")} - IMPLIED
    shown = set(OPTION.findall(r.output))
    assert listed <= shown, f"kvgraft {' '.join(path)} --help does not show {sorted(listed - shown)}"
    return listed


def usage_entries(readme: str) -> dict[tuple[str, ...], str]:
    """docs/usage.md's code block, as command path -> the text of its entry (lines, continuations, comments)."""
    section = readme.split("\n## Usage", 1)[1].split("\n## ", 1)[0]
    block = section.split("```sh\n", 1)[1].split("```", 1)[0]
    entries: dict[tuple[str, ...], list[str]] = {}
    current: list[str] | None = None
    for line in block.splitlines():
        if line.startswith("kvgraft "):
            words = line.split()[1:]
            path = tuple(w for w in words[:2] if re.fullmatch(r"[a-z]+", w))
            current = entries.setdefault(path, [])
            current.append(line)
        elif line.startswith((" ", "\t")) and current is not None:
            current.append(line)
        else:  # a blank line or a heading comment ends the entry
            current = None
    return {path: "\n".join(lines) for path, lines in entries.items()}


def matched(entries: dict[tuple[str, ...], str], path: tuple[str, ...]) -> str | None:
    """The entry of command `path` (a one-word command's entry is keyed by its first word)."""
    return entries.get(path) if len(path) > 1 else entries.get(path) or next(
        (text for p, text in entries.items() if p[:1] == path), None)


def disagreements(readme: str) -> list[str]:
    entries = usage_entries(readme)
    found: list[str] = []
    seen: set[tuple[str, ...]] = set()
    for path, cmd in commands(typer.main.get_command(app)):
        name = "kvgraft " + " ".join(path)
        text = matched(entries, path)
        if text is None:
            found.append(f"{name}: no entry in docs/usage.md")
            continue
        seen.add(path if path in entries else next(p for p in entries if p[:1] == path))
        listed, written = help_options(path, cmd), set(OPTION.findall(text))
        found += [f"{name}: {o} is in --help, not in docs/usage.md" for o in sorted(listed - written)]
        found += [f"{name}: {o} is in docs/usage.md, not in --help (stale)" for o in sorted(written - listed)]
    found += [f"kvgraft {' '.join(p)}: in docs/usage.md, not a command" for p in sorted(set(entries) - seen)]
    return found


def test_usage_agrees_with_help() -> None:
    assert disagreements((ROOT / "docs/usage.md").read_text()) == []


def summary_gaps(readme: str) -> list[str]:
    """Commands `--help` lists that README's Usage summary does not name (a line `kvgraft COMMAND ...` each)."""
    section = readme.split("\n## Usage", 1)[1].split("\n## ", 1)[0]
    named = {tuple(line.split()[1:3]) for line in section.splitlines() if line.startswith("kvgraft ")}
    gaps = []
    for path, _ in commands(typer.main.get_command(app)):
        key = path if len(path) > 1 else None
        found = (key in named) if key else any(n[:1] == path for n in named)
        if not found and path[0] == "cache":  # `kvgraft cache ls | prune`: one line for the group
            found = ("cache", "ls") in named
        if not found:
            gaps.append("kvgraft " + " ".join(path))
    return gaps


def test_readme_summary_names_every_command() -> None:
    readme = (ROOT / "README.md").read_text()
    assert summary_gaps(readme) == []
    # the control: a command left out is named
    left_out = "\n".join(line for line in readme.splitlines() if not line.startswith("kvgraft audit sample "))
    assert summary_gaps(left_out) == ["kvgraft audit sample"]


def test_a_stale_or_missing_option_would_be_caught() -> None:
    """Positive controls: an option removed from an entry, one added that no command has, a command left out."""
    readme = (ROOT / "docs/usage.md").read_text()
    assert "kvgraft audit sample RELEASE/ (--check" in readme and "[--offline] [--deep]" in readme
    assert disagreements(readme.replace("[--offline] [--deep]", "[--offline]")) == [
        "kvgraft verify: --deep is in --help, not in docs/usage.md"]
    assert disagreements(readme.replace("[--offline] [--deep]", "[--offline] [--deep] [--gpu]")) == [
        "kvgraft verify: --gpu is in docs/usage.md, not in --help (stale)"]
    left_out = "\n".join(line for line in readme.splitlines() if not line.startswith("kvgraft audit sample "))
    assert disagreements(left_out) == ["kvgraft audit sample: no entry in docs/usage.md"]
