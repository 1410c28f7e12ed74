"""`models`: the presets `--model` takes by name, whether each is installed and converted, and its disk."""

from __future__ import annotations

from typing import Annotated

import typer
from rich.table import Table

from kvgraft.cli._base import app, echo_json, handled, out
from kvgraft.render.text import num


@app.command("models")
@handled
def models_cmd(
    as_json: Annotated[bool, typer.Option("--json", help="Print the list as JSON.")] = False,
) -> None:
    """List the models --model takes by name: installed (its data wheels), converted (once, into $KVGRAFT_HOME),
    and the disk its converted folder uses. --model also takes a model folder, a .gguf file or a hub id."""
    from kvgraft.inference.presets import home, listing

    rows = listing()
    if as_json:
        echo_json({"home": str(home()), "models": rows})
        return
    table = Table(box=None, pad_edge=False)
    for col in ("name", "installed", "converted", "disk", "model"):
        table.add_column(col)
    for r in rows:
        table.add_row(r["name"], "yes" if r["installed"] else "no", "yes" if r["converted"] else "no",
                      f"{num(round(r['bytes'] / 1e6))} MB" if r["bytes"] else "-", r["model"])
    out.print(table)
    for r in rows:
        if not r["installed"]:
            out.print(f"{r['name']}: {r['install']}")
    out.print(f"converted models live in {home() / 'models'}")
