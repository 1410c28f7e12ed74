"""The registry of check kinds: the built-in modules and the plugins' entry points, in the order an audit runs them.

Layering (pyproject [tool.importlinter]): a kind module sits above the producers it runs (recompute,
determinism, generalization, kvgraft.claims), the renderers' parts (kvgraft.render) and the report document
(kvgraft.report); what renders a report by kind (audit.face, render_report, render_html) sits above the registry,
and the audit run above them. So the status rule and schema of a kind live in its module with the rest of it,
and no producer seals its own result: a result is sealed once, by `seal`, where it becomes a verdict (the audit
run, or a single-check command, both through the kind's `run`).

Every kind registers through the entry-point group `kvgraft.check_kinds` (the entry point's name is the kind's
name, its value a `CheckKind`): the built-in ones are kvgraft's own entry points (pyproject.toml), a third-party
kind its package's; a program or test may also `register` one. No name is registered twice.

The built-in entry points are also declared here (BUILTIN_ENTRY_POINTS, equal to pyproject's table: a test
compares them), and the built-in kinds load from this list, not from the installed metadata: kvgraft runs from
a source tree with no metadata (`python -m kvgraft.cli` in a copied tree) or with the metadata of an older
install, and the kinds that run must be this source's. The group's entries of kvgraft's own distribution are
therefore skipped when the plugins load, so the built-in kinds are registered once, first, in this order.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import metadata
from typing import Any

from kvgraft.audit.checks.kind import CheckKind, Ran
from kvgraft.audit.context import Context
from kvgraft.errors import InputError
from kvgraft.results.base import JsonObject
from kvgraft.schema import validate, validate_with
from kvgraft.verdict import CHECK_STATUSES, STATUSES

ENTRY_POINTS = "kvgraft.check_kinds"
DISTRIBUTION = "kvgraft"
# Every built-in check a plan can name, as pyproject.toml's [project.entry-points."kvgraft.check_kinds"] declares
# it, in the order they run and appear in the report: claims come after the checks whose results they read. The
# report schema's `kind` list and the plan schema's `checks` are generated from it (kvgraft.audit.schemas).
BUILTIN_ENTRY_POINTS: tuple[tuple[str, str], ...] = (
    ("verify", "kvgraft.audit.checks.verify:KIND"),
    ("recompute", "kvgraft.audit.checks.recompute:KIND"),
    ("determinism", "kvgraft.audit.checks.determinism:KIND"),
    ("generalization", "kvgraft.audit.checks.generalization:KIND"),
    ("controls", "kvgraft.audit.checks.controls:KIND"),
    ("claims", "kvgraft.audit.checks.claims:KIND"),
)


def _load(ep: metadata.EntryPoint) -> CheckKind:
    """The CheckKind an entry point names; one that does not load, is not a CheckKind or is named differently
    from its entry point is refused, naming the entry point."""
    where = f"entry point {ep.name} = {ep.value} (group {ENTRY_POINTS})"
    try:
        k = ep.load()
    except Exception as exc:  # a plugin's import error, whatever it is, names the plugin
        raise InputError(f"{where}: does not load: {type(exc).__name__}: {exc}") from exc
    if not isinstance(k, CheckKind):
        raise InputError(f"{where}: is a {type(k).__name__}, not a CheckKind")
    if k.name != ep.name:
        raise InputError(f"{where}: names kind {k.name!r}, not {ep.name!r}")
    return k


BUILTIN: tuple[CheckKind, ...] = tuple(_load(metadata.EntryPoint(name, value, ENTRY_POINTS))
                                       for name, value in BUILTIN_ENTRY_POINTS)
# The registered kinds: the built-in ones, then the others in the order registered (by `register`, and the entry
# points' on the registry's first use), so they run after the built-in ones, claims included.
KINDS: dict[str, CheckKind] = {k.name: k for k in BUILTIN}
# A report may also hold checks of kind "other" (written by other tools), and of kinds a reader has not
# registered: both are shown by their summary alone.
OTHER = "other"
# A kind's name, as the report schema's `kind` pattern and the plan schema's `checks` names accept it.
NAME = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_plugins_loaded = False


def register(k: CheckKind) -> CheckKind:
    """Add a check kind after the registered ones; a name already registered (or "other") is refused."""
    if not isinstance(k, CheckKind):
        raise InputError(f"a check kind is a kvgraft.audit.checks.kind.CheckKind, not {type(k).__name__}")
    if not NAME.fullmatch(k.name):
        raise InputError(f"check kind {k.name!r}: a name is a lower-case letter, then up to 63 of a-z, 0-9, _ and -")
    if k.name in KINDS or k.name == OTHER:
        raise InputError(f"check kind {k.name!r} is registered already ({_origin(KINDS.get(k.name))})")
    KINDS[k.name] = k
    return k


def _origin(k: CheckKind | None) -> str:
    return "reserved for checks written by other tools" if k is None else f"by {k.run.__module__}"


def load_plugins() -> None:
    """Register the kinds of the entry-point group `kvgraft.check_kinds` but kvgraft's own, once: a kind that
    does not load, is not a CheckKind, is named differently from its entry point or takes a registered name is
    refused."""
    global _plugins_loaded
    if _plugins_loaded:
        return
    _plugins_loaded = True
    for ep in metadata.entry_points(group=ENTRY_POINTS):
        if _is_kvgraft(ep):
            continue  # a built-in kind, registered already (from BUILTIN_ENTRY_POINTS, whatever the metadata says)
        k = _load(ep)
        try:
            register(k)
        except InputError as exc:
            raise InputError(f"entry point {ep.name} = {ep.value} (group {ENTRY_POINTS}): {exc}") from None


def _is_kvgraft(ep: metadata.EntryPoint) -> bool:
    return ep.dist is not None and ep.dist.name == DISTRIBUTION


@dataclass(frozen=True)
class Installed:
    """One registered kind as `audit kinds` lists it: the distribution it comes from and its version (None
    where a program registered a kind of no installed distribution)."""

    name: str
    package: str
    version: str | None


def installed() -> list[Installed]:
    """Every registered kind, in the order an audit runs them, with the distribution that provides it."""
    from kvgraft import __version__

    plugins = {ep.name: ep.dist for ep in metadata.entry_points(group=ENTRY_POINTS) if not _is_kvgraft(ep)}
    builtin = {k.name: k for k in BUILTIN}
    out = []
    for name, k in kinds().items():
        dist = plugins.get(name)
        if builtin.get(name) is k:
            out.append(Installed(name, DISTRIBUTION, __version__))  # this source's, whatever metadata is installed
        elif dist is not None:
            out.append(Installed(name, dist.name, dist.version))
        else:
            out.append(_registered(name, k))
    return out


def _registered(name: str, k: CheckKind) -> Installed:
    """A kind a program registered: the distribution of the module that defines its run, if one is installed."""
    top = k.run.__module__.split(".")[0]
    dists = metadata.packages_distributions().get(top, [])
    if not dists:
        return Installed(name, top, None)
    return Installed(name, dists[0], metadata.version(dists[0]))


def kinds() -> dict[str, CheckKind]:
    """Every registered kind, in the order an audit runs them (the plugins' loaded on first use)."""
    load_plugins()
    return KINDS


def kind(name: str) -> CheckKind:
    known = kinds()
    if name not in known:
        raise InputError(f"no check kind {name!r} is registered (one of {', '.join(known)}; a third-party kind "
                         f"registers through the entry-point group {ENTRY_POINTS})")
    return known[name]


def view(k: CheckKind, data: JsonObject) -> Any:
    """A check's data as its kind's face, details and html take it: its typed data model, else the dict. The
    data passed the kind's schema (validate_report, seal), which is generated from that model: it builds."""
    return k.typed.data.model_validate(data) if k.typed is not None else data


def status(name: str, result: JsonObject) -> str:
    """The status of one audit result, by its kind's rule."""
    s = kind(name).status(result)
    if s not in STATUSES:
        raise AssertionError(f"{name} status {s!r} is not one of {STATUSES}")
    return s


def seal(name: str, result: JsonObject, where: str | None = None) -> JsonObject:
    """Stamp `result` with its status (for kinds whose result carries it) and validate it against its kind's
    schema; returns it. The one place a result gets its status."""
    k = kind(name)
    s = status(name, result)
    if k.stamps_status:
        result["status"] = s
    if isinstance(k.schema, str):
        validate(result, k.schema, where or f"{name} result")
    else:
        validate_with(result, k.schema, where or f"{name} result")
    return result


def run_check(ctx: Context, name: str, settings: dict[str, Any], where: str | None = None) -> Ran:
    """One check, as `audit run` runs each and a single-check command its one: the kind's run under `settings`,
    its result sealed, and left for the checks after it (`ctx.results`)."""
    ran = kind(name).run(ctx, settings)
    ctx.sealed(name, seal(name, ran.result, where))
    return ran


def make_check(name: str, kind: str, status: str, summary: str, data: JsonObject | None = None, *,
               reason: str | None = None) -> JsonObject:
    """One entry of `checks`; a skipped check must say why."""
    if kind not in kinds() and kind != OTHER:
        raise InputError(f"check {name!r}: unknown kind {kind!r} (one of {', '.join([*KINDS, OTHER])})")
    if status not in CHECK_STATUSES:
        raise InputError(f"check {name!r}: unknown status {status!r} (one of {', '.join(CHECK_STATUSES)})")
    if status == "skipped" and not reason:
        raise InputError(f"check {name!r}: a skipped check needs a reason")
    check: JsonObject = {"name": name, "kind": kind, "status": status, "summary": summary, "data": data or {}}
    if reason:
        check["reason"] = reason
    return check
