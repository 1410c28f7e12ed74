"""The `kvgraft` command: parse, call the library, render, map errors to exit codes."""

from __future__ import annotations

from kvgraft.cli import release  # noqa: F401  (commands register on `app` when imported)
from kvgraft.cli._base import app


def entrypoint() -> None:
    import logging

    logging.getLogger("transformers").setLevel(logging.ERROR)
    app()


__all__ = ["app", "entrypoint"]
