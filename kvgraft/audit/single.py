"""The single-check audits on a release (`audit recompute`, `audit generalization`): one check of a one-check plan.

Each takes its command's settings (a frozen dataclass built from the options), the policy the release must pass
(built when it is verified, so option errors come in the order the command checks them) and the callbacks
through which the command loads the model, shows progress and writes notes; it returns the sealed result.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft.errors import InputError
from kvgraft.inference.reapply import DEFAULT_CONDITIONS, Conditions
from kvgraft.results.base import JsonObject

if TYPE_CHECKING:
    from kvgraft.execution.options import ExecutorOptions
    from kvgraft.inference.models import LoadedModel
    from kvgraft.signing.policy import VerifyPolicy
    from kvgraft.signing.verify import VerifiedRelease

Load = Callable[[str, str, str, str], "LoadedModel"]  # (model, device, dtype, attention) -> the loaded model
Policy = Callable[[], "VerifyPolicy"]
Note = Callable[[str], None]
# A bar entered once the model is loaded; it takes the recompute's counts (done, total, tokens_done, ...).
RecomputeBar = Callable[[], contextlib.AbstractContextManager[Callable[[dict[str, int]], None]]]


@dataclass(frozen=True)
class RecomputeSettings:
    """`audit recompute`'s options: the release, the model, the conditions replayed, what is judged, where it goes."""

    release: str
    model: str | None = None
    conditions: Conditions = Conditions()
    require: str = "exact"
    entries: list[str] | None = None
    probe: str | None = None
    force: bool = False
    sample: int | None = None
    nonce: str | None = None
    target_fraction: float | None = None
    journal: Path | None = None
    out: Path | None = None
    prefix: int | None = None

    @property
    def journal_path(self) -> Path | None:
        """--journal, else (with --out) OUT.journal beside the result."""
        return self.journal or (Path(f"{self.out}.journal") if self.out else None)


def recompute(s: RecomputeSettings, *, policy: Policy, executor: ExecutorOptions, load: Load, progress: RecomputeBar,
              note: Note) -> dict[str, Any]:
    """The recompute check as `audit run` runs it (kvgraft.audit.checks.recompute), its settings from `s`; the
    release verified before any model loads. With a journal, each judged entry is recorded as it lands and the
    journal is removed once the result is complete and written (to `s.out`)."""
    s.conditions.checked()  # before torch is imported
    from kvgraft._internal.jsonio import check_writable

    for output in (s.out, s.journal):  # before torch or a model loads (the default journal is beside --out)
        if output is not None:
            check_writable(output)
    journal = s.journal_path
    if journal is not None:
        from kvgraft.execution.journal import header

        header(journal)  # absent, or a journal: never a file kvgraft did not write
    from kvgraft import sampling
    from kvgraft.inference.models import for_release
    from kvgraft.recompute import audit as recompute_audit
    from kvgraft.signing.verify import verified

    recompute_audit.check_requirement(s.require)
    if s.prefix is not None:
        from kvgraft.recompute.prefix import check_tokens

        check_tokens(s.prefix)
    # Verified as `kvgraft verify` does, before any model loads: recompute.audit takes this VerifiedRelease.
    checked = verified(s.release, policy())
    with checked:  # closed when done (a remote release: its folder removed); an error inside names its location
        rel = checked.release
        model = for_release(rel.manifest["model"], s.model, force=s.force)
        sample = s.sample
        if s.target_fraction is not None:
            if sample is not None:
                raise InputError("--sample and --target-fraction exclude each other")
            sample = sampling.sample_size(s.target_fraction, rel.num_entries)
            note(f"--target-fraction {s.target_fraction:g}: a sample of {sample:,} of {rel.num_entries:,} entries bounds "
                 f"the failing entries at {sampling.pct(s.target_fraction)} (95%) when none of them fails")
        recorded = rel.manifest["environment"]
        schedule = s.conditions.schedule(rel.manifest["schedule"])
        dev, dt, at = s.conditions.load_options(recorded)
        settings: dict[str, Any] = {"entries": s.entries, "probe": s.probe, "force": s.force, "schedule": schedule,
                                    "overrides": s.conditions.overrides(recorded), "require": s.require, "sample": sample,
                                    "nonce": s.nonce, "journal": journal, "prefix": s.prefix}
        result = _run_recompute(checked, settings, model, replace(s.conditions, device=dev, dtype=dt, attn=at),
                                executor=executor, load=load, progress=progress, note=note)
        resumed = recompute_audit.resumed_statement(result["cost"])
        if resumed:  # even with --quiet: results this run did not compute are in what it reports
            note(f"kvgraft: note: {resumed}")
        if s.out:
            from kvgraft._internal.jsonio import write_json

            write_json(s.out, result)
        if journal is not None:
            journal.unlink(missing_ok=True)  # the result is complete and written: nothing to resume
        return result


def _run_recompute(checked: VerifiedRelease, settings: dict[str, Any], model: str, conditions: Conditions, *,
                   executor: ExecutorOptions, load: Load, progress: RecomputeBar, note: Note) -> dict[str, Any]:
    from kvgraft.audit import plan
    from kvgraft.audit.checks import run_check
    from kvgraft.audit.context import Context
    from kvgraft.execution.executor import ModelSpec, NotAuditedError

    dev, dt, at = conditions.load_options({})
    journal = settings["journal"]
    with executor.make(ModelSpec(model, conditions)) as ex:
        # Ray actors start with the recorded thread count (num_cpus = threads)
        ex.reapply_threads(conditions.thread_count(checked.release.manifest["environment"], dev))
        lm = ex.model(lambda: load(model, dev, dt, at))
        with progress() as tick:
            ctx = Context(plan.single("recompute", settings, model=model), lm, Path.cwd(), silent, ex, checked)
            try:
                return run_check(ctx, "recompute", {**settings, "on_progress": tick}).result
            except (KeyboardInterrupt, NotAuditedError):
                if journal is not None and journal.exists():
                    note(f"kvgraft: audit interrupted; the entries judged so far are recorded in {journal}: rerun the "
                         "same command to resume (no result was written)")
                raise


def silent(_message: str) -> None:
    """A single-check command's progress lines: none (its bar and its result say what happens)."""


@dataclass(frozen=True)
class GeneralizationSettings:
    """`audit generalization`'s options: the library, the queries, the conditions and the model they run on."""

    library: Path
    source: str | None = None
    limit: int | None = None
    synthetic: int = 0
    synthetic_seed: int = 1
    salt: str | None = None
    library_fraction: float | None = None
    policy: str = "nearest"
    max_new_tokens: int = 64
    samples: int = 1
    temperature: float = 0.0
    seed: int = 0
    budget: int | None = None
    force: bool = False
    model: str = "smollm2-135m"
    conditions: Conditions = DEFAULT_CONDITIONS
    out: Path | None = None
    preamble: str = ""

    def check_settings(self) -> JsonObject:
        """The generalization check's settings (kvgraft.audit.checks.generalization), as a plan would give them."""
        return {k: getattr(self, k) for k in ("synthetic", "policy", "max_new_tokens", "samples", "temperature", "source",
                                              "limit", "library_fraction", "salt", "synthetic_seed", "seed", "force",
                                              "budget", "preamble")}


def generalization(s: GeneralizationSettings, *, policy: Policy, executor: ExecutorOptions, load: Load,
                   progress: Callable[[], contextlib.AbstractContextManager[Callable[[int, int, str], None]]]) -> dict[str, Any]:
    """The generalization check as `audit run` runs it, its settings from `s`. It prepares the queries before it
    reads the model: the executor, the model and the progress start only then, in that order."""
    from kvgraft._internal.jsonio import check_writable
    from kvgraft.audit import plan
    from kvgraft.audit.checks import run_check
    from kvgraft.audit.context import Context, Lazy
    from kvgraft.execution.executor import ModelSpec
    from kvgraft.signing.verify import verified

    if s.out is not None:
        check_writable(s.out)
    settings = s.check_settings()
    # Verified as `kvgraft verify` does with the same options, before any model loads (without --key: a stale
    # statement fails, the signature is not checked; each entry's bytes are checked when read).
    rel = verified(s.library, policy())
    with contextlib.ExitStack() as stack:
        stack.enter_context(rel)  # closed last; an error inside names the release's location
        # The executor sets --threads around each run (or sizes each Ray actor by it) and checks it.
        ex = Lazy(lambda: stack.enter_context(executor.make(ModelSpec(s.model, s.conditions))))
        lm = Lazy(lambda: ex.get().model(lambda: load(s.model, *s.conditions.load_options({}))))
        bar = Lazy(lambda: stack.enter_context(progress()))

        def tick(i: int, n: int, label: str) -> None:
            bar.get()(i, n, label)

        ctx = Context(plan.single("generalization", settings, model=s.model), lm, Path.cwd(), silent, ex, rel)
        result = run_check(ctx, "generalization", {**settings, "progress": tick}).result
    if s.out:
        from kvgraft._internal.jsonio import write_json

        write_json(s.out, result)
    return result
