"""What every check of an audit run reads (plan, model, release, executor), and what it leaves for later checks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft.audit.plan import Plan
from kvgraft.execution.executor import Executor
from kvgraft.inference import models

if TYPE_CHECKING:
    from kvgraft.signing.verify import VerifiedRelease

Progress = Callable[[str], None]


@dataclass
class Context:
    """What every check reads, and what checks leave for later ones and for the report."""

    plan: Plan
    lm: models.LoadedModel
    out: Path
    say: Progress
    ex: Executor
    release: VerifiedRelease  # verified once, under the run's policy, before any check reads it
    ledger: dict[str, Any] = field(default_factory=dict)
    measured: dict[str, Any] = field(default_factory=dict)  # for the claims check: what recompute measured
    natural_kl: float | None = None  # recompute's largest KL against a one-shot prefill without a cache
    claims: list[dict[str, Any]] = field(default_factory=list)  # the report's claims, from the claims check
