"""Where a release's files come from: a local folder, or a folder standing for a release stored elsewhere.

Every release is read through a local folder (`root`). A `Source` is that folder together with where it came
from: `Folder`, a release on this machine, whose files are in place; a remote one (kvgraft.remote: http(s)://,
hf://, s3://, one class per kind of store behind this interface), whose folder holds its manifest.json and
signature files and whose other files arrive when first read. The readers of this package call
`Release.source.fetch` before opening a file the manifest (format 2: an index shard) lists; a remote source
puts the file in place, its bytes checked against the digest and size the signed chain states for it, or
raises naming the location, the file and the byte range.

A source is used as a context manager by whoever opened it: an error raised inside is named by the location
the person gave, not the folder (`name`), and a remote source's folder is removed at the end (`close`, which
also keeps its cache within its size limit). Nothing of a source is kept beside it: two releases from two
locations in one process are two objects. Imports no torch.
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from kvgraft.errors import Error

if TYPE_CHECKING:
    from kvgraft.release.models import Entry


class Source:
    """A release's folder and where it came from (module docstring). What it does by default is what a local
    folder needs: nothing to fetch, nothing to close."""

    remote = False  # whether files arrive when first read (fetch) rather than lying in the folder

    def __init__(self, root: Path, location: str | None = None) -> None:
        self.root = Path(root)
        self.location = location if location is not None else str(root)  # what a message or a result names
        self.notes: list[str] = []  # what a verification should say about the source (what it could not check)

    @property
    def cache(self) -> Path | None:
        """The verified cache its files arrive through (None: a local folder reads none)."""
        return None

    def fetch(self, name: str, sha256: str, size: int, what: str, entry: Entry | None = None) -> None:
        """Put the release file `name` in place; `entry`: the record that binds it (to locate a mismatch)."""

    def fetch_all(self) -> None:
        """Put every file the manifest lists in place (and, where the source can tell, the files beside them)."""

    def shown(self, text: str) -> str:
        """`text` naming the location where it names the folder."""
        return text.replace(str(self.root), self.location) if self.location != str(self.root) else text

    def name(self, exc: Error) -> Error:
        """`exc`, its message naming the location where it names the folder."""
        return exc.named(str(self.root), self.location)

    def close(self) -> None:
        """Nothing to release for a local folder."""

    def __enter__(self) -> Source:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, Error):
            self.name(exc)
        self.close()


class Folder(Source):
    """A release on this machine: its files are in place, and messages name its folder."""
