"""Releases whose files arrive when they are first read: a local folder standing for a release stored elsewhere.

A release at an http(s)://, hf:// or s3:// location (kvgraft.remote) is read through a local folder that
holds its manifest.json and signature files. The readers of this package call `fetch` before opening a
file the manifest (format 2: an index shard) lists; the folder's source puts the file in place, its bytes
checked against the digest and size the signed chain states for it, or raises naming the location, the
file and the byte range. For a folder without a source `fetch` does nothing. Imports no torch.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol


class Source(Protocol):
    location: str  # what a message names: the URL the folder stands for
    notes: list[str]  # what a verification should say about the source (what it could not check), one line each

    def fetch(self, name: str, sha256: str, size: int, what: str, entry: dict[str, Any] | None) -> None:
        """Put the release file `name` in place; `entry`: the record that binds it (to locate a mismatch)."""

    def fetch_all(self) -> None:
        """Put every file the manifest lists in place (and, where the source can tell, the files beside them)."""


_SOURCES: dict[str, Source] = {}


def register(root: Path, source: Source) -> None:
    _SOURCES[os.path.abspath(root)] = source


def unregister(root: Path) -> None:
    _SOURCES.pop(os.path.abspath(root), None)


def of(root: Path) -> Source | None:
    """The source of the folder `root`, None for an ordinary local release."""
    return _SOURCES.get(os.path.abspath(root)) if _SOURCES else None


def fetch(root: Path, name: str, sha256: str, size: int, what: str, entry: dict[str, Any] | None = None) -> None:
    source = of(root)
    if source is not None:
        source.fetch(name, sha256, size, what, entry)
