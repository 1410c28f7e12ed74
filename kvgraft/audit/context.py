"""What every check of an audit reads: plan, model, release, executor, and the sealed results of earlier checks."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from kvgraft.audit.plan import Plan
from kvgraft.execution.executor import Executor
from kvgraft.inference import models
from kvgraft.results.base import JsonObject

if TYPE_CHECKING:
    from kvgraft.signing.verify import VerifiedRelease

Progress = Callable[[str], None]
T = TypeVar("T")


class Lazy(Generic[T]):
    """A member loaded when a check first reads it: a single-check command provides what its check needs and
    loads nothing else (`audit claims` has no model, no release)."""

    def __init__(self, load: Callable[[], T]) -> None:
        self._load: Callable[[], T] | None = load
        self._value: T | None = None

    def get(self) -> T:
        if self._load is not None:
            self._value, self._load = self._load(), None
        return self._value  # type: ignore[return-value]


def absent(what: str) -> Lazy[Any]:
    """A member this command does not provide: reading it is a bug of the check or the command."""

    def refuse() -> Any:
        raise AssertionError(f"this command provides no {what} to its check")

    return Lazy(refuse)


class Context:
    """What every check reads. Nothing in it is written by a check: a check's result, sealed, is what later
    checks read of it (`results`, by kind name, read-only); what it adds to the report it returns (Ran)."""

    def __init__(self, plan: Plan, lm: models.LoadedModel | Lazy[models.LoadedModel], out: Path, say: Progress,
                 ex: Executor | Lazy[Executor], release: VerifiedRelease | Lazy[VerifiedRelease]) -> None:
        self.plan, self.out, self.say = plan, out, say
        self._lm, self._ex, self._release = lm, ex, release
        self._results: dict[str, JsonObject] = {}

    @property
    def results(self) -> Mapping[str, JsonObject]:
        """The sealed results of the checks that ran before, by kind: a read-only view."""
        return MappingProxyType(self._results)

    def sealed(self, kind: str, result: JsonObject) -> None:
        """The runner's (audit run, a single-check command): `result` of `kind` ran and is sealed."""
        self._results[kind] = result

    @property
    def lm(self) -> models.LoadedModel:
        return self._lm.get() if isinstance(self._lm, Lazy) else self._lm

    @property
    def ex(self) -> Executor:
        return self._ex.get() if isinstance(self._ex, Lazy) else self._ex

    @property
    def release(self) -> VerifiedRelease:
        return self._release.get() if isinstance(self._release, Lazy) else self._release
