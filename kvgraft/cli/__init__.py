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
    app()


__all__ = ["app", "entrypoint"]
