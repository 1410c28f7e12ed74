"""The `kvgraft` command: parse, call the library, render, map errors to exit codes."""

from __future__ import annotations

import kvgraft.cli.signing  # noqa: F401
from kvgraft.cli import audit, audit_run, inspection, models, release  # noqa: F401  (commands register on `app` when imported)
from kvgraft.cli import generalization as generalization  # registers `library build`, `audit generalization`
from kvgraft.cli import remote as remote  # registers `pull`, `cache ls`, `cache prune`
from kvgraft.cli import report as report  # registers `report show`, `report verify`
from kvgraft.cli._base import app


def entrypoint() -> None:
    import os

    # transformers' own progress bars and advisory logs would interleave with ours.
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("HF_HUB_DISABLE_PROGRESS_BARS", "1")
    # OpenMP threads that spin while waiting slow every step many-fold when other processes share
    # the cores; sleeping waits change no result (same threads, same work split). Set before torch loads.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        app()
    except SystemExit as exc:
        _reader_gone_status(exc)
        raise


def _reader_gone_status(exc: SystemExit) -> None:
    """Typer ends with status 1 when what it prints itself (help, usage) meets a closed pipe, and then wraps
    the standard streams to keep the exit quiet: `kvgraft --help | head -1` asked for help and got what it
    read (status 0); any other such end is a reader gone, as the commands end it (EXIT_PIPE)."""
    import sys

    from kvgraft.cli._base import EXIT_PIPE

    # click's wrapper, as Typer vendors it (typer._click): known by its name, not a private import
    if exc.code == 1 and type(sys.stdout).__name__ == "PacifyFlushWrapper":
        raise SystemExit(0 if "--help" in sys.argv[1:] or len(sys.argv) == 1 else EXIT_PIPE) from None


__all__ = ["app", "entrypoint"]
