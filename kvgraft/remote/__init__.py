"""Releases where they are published: over HTTP(S), on the Hugging Face Hub (hf://), in S3 (s3://).

`open_source` turns a RELEASE argument into the source the rest of kvgraft reads (kvgraft.release.sources):
a local path as a `Folder`, a remote location as a mirror folder holding its manifest and signatures, whose
other files are fetched, checked and cached when first read (kvgraft.remote.mirror); whoever opens one
closes it (`with open_source(...) as source:`). docs/remote.md describes the locations, the
cache and the settings. Imports no torch; the network libraries only when a remote location is opened.
"""

from __future__ import annotations

from pathlib import Path

from kvgraft.release.sources import Folder, Source
from kvgraft.remote.location import is_remote as is_remote


def open_source(release: str | Path) -> Source:
    """The source to read `release` through (module docstring). A remote location is opened anew on each
    call: its manifest and signature files are read now, into a folder removed when the source is closed."""
    if isinstance(release, Path) or not is_remote(release):
        return Folder(Path(release))
    from kvgraft.remote.location import parse
    from kvgraft.remote.mirror import open_mirror

    loc = parse(release)
    assert loc is not None
    return open_mirror(loc)
