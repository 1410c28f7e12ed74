"""Where a single-check command runs its units (--executor, --ray-address, --workers, --ship), as one value; no Ray."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from kvgraft.execution.executor import Executor, ModelSpec


@dataclass(frozen=True)
class ExecutorOptions:
    """The executor a command's options ask for; `make` starts it for a model (kvgraft.execution.executor.from_options)."""

    kind: str = "local"
    address: str | None = None
    workers: int | None = None
    ship: bool = False

    def make(self, model: ModelSpec) -> Executor:
        from kvgraft.execution.executor import from_options

        return from_options(self.kind, model, address=self.address, workers=self.workers, ship=self.ship)
