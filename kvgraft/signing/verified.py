"""A release that passed verification, as every consumer of release bytes is handed it: the release, what was
checked, under which policy, and where it came from (kvgraft.signing.verify makes it; nothing else does).

Kept apart from the verifier: reading a `VerifiedRelease` (its attributes, its `with`) runs nothing of a
verification. Imports no torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from kvgraft.errors import Error
from kvgraft.release.format import Release
from kvgraft.release.models import Manifest
from kvgraft.release.sources import Source
from kvgraft.signing.policy import VerifyPolicy

if TYPE_CHECKING:
    from kvgraft.signing.verify import VerifyResult


@dataclass(frozen=True)
class Origin:
    """Where a verified release came from and how it was checked."""

    location: str  # the folder or URL as given: what its messages and results name
    policy: VerifyPolicy
    scope: str  # what was read: "open", "all", "entries" or "sample" (kvgraft.signing.policy.Scope.name)
    checked_entries: tuple[str, ...]  # the entries whose files were checked ("entries", "sample")
    cache: Path | None  # the verified cache its files arrive through (None: a local folder)


@dataclass(frozen=True)
class VerifiedRelease:
    """A release that passed what its scope checks (`verify`), carrying where it came from and under which policy.

    The only way a consumer of release bytes (graft, recompute, the audits, the generalization and
    control libraries, the vLLM connector, the Ray worker) is handed a release: their parameters are
    typed so, and only the edges (the CLI, `verify` itself) turn a path into one. `release` is the opened
    release its consumer reads through; each entry's bytes are checked when read. Used as a context
    manager by whoever verified it: an error raised inside names its location, and a release read from
    elsewhere has its folder removed at the end (`close`)."""

    release: Release
    checked: VerifyResult
    source: Source = field(repr=False, compare=False)
    owns_source: bool = field(default=True, repr=False, compare=False)  # closing it closes the source
    # Plain attributes, not properties: reading them calls nothing in this module.
    origin: Origin = field(init=False, compare=False)
    policy: VerifyPolicy = field(init=False, compare=False)
    warnings: list[str] = field(init=False, compare=False)
    root: Path = field(init=False, compare=False)
    manifest: Manifest = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        c = self.checked
        set_ = object.__setattr__  # a frozen dataclass's derived fields
        set_(self, "origin", Origin(self.source.location, c.policy, c.scope, tuple(c.checked_entries), self.source.cache))
        set_(self, "policy", c.policy)
        set_(self, "warnings", c.warnings)
        set_(self, "root", self.release.root)
        set_(self, "manifest", self.release.manifest)

    @property
    def location(self) -> str:
        return self.source.location

    def close(self) -> None:
        if self.owns_source:
            self.source.close()

    def __enter__(self) -> VerifiedRelease:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        if isinstance(exc, Error):
            self.source.name(exc)
        self.close()
