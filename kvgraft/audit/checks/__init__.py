"""The registry of check kinds: one module per kind, in the order an audit runs them; seal, status, report entry.

Layering (pyproject [tool.importlinter]): a kind module sits above the producers it runs (recompute,
determinism, generalization, kvgraft.claims), the renderers' parts (kvgraft.render) and the report document
(kvgraft.report); what renders a report by kind (audit.face, render_report, render_html) sits above the registry,
and the audit run above them. So the status rule and schema of a kind live in its module with the rest of it,
and no producer seals its own result: a result is sealed once, by `seal`, where it becomes a verdict (the audit
run, or the single-audit CLI command).
"""

from __future__ import annotations

from typing import Any

from kvgraft.audit.checks import claims, controls, determinism, generalization, recompute, verify
from kvgraft.audit.checks.kind import CheckKind
from kvgraft.errors import InputError
from kvgraft.schema import validate
from kvgraft.verdict import CHECK_STATUSES, STATUSES

# Every check a plan can name, in the order they run and appear in the report: claims come after the
# checks whose measurements they read.
KINDS: dict[str, CheckKind] = {k.name: k for k in (verify.KIND, recompute.KIND, determinism.KIND,
                                                    generalization.KIND, controls.KIND, claims.KIND)}
# A report may also hold checks of kind "other" (written by other tools): shown by their summary alone.
OTHER = "other"
CHECK_KINDS = (*KINDS, OTHER)


def kind(name: str) -> CheckKind:
    if name not in KINDS:
        raise InputError(f"no audit result of kind {name!r} (one of {', '.join(KINDS)})")
    return KINDS[name]


def status(name: str, result: dict[str, Any]) -> str:
    """The status of one audit result, by its kind's rule."""
    s = kind(name).status(result)
    if s not in STATUSES:
        raise AssertionError(f"{name} status {s!r} is not one of {STATUSES}")
    return s


def seal(name: str, result: dict[str, Any], where: str | None = None) -> dict[str, Any]:
    """Stamp `result` with its status (for kinds whose result carries it) and validate it against its kind's
    schema; returns it. The one place a result gets its status."""
    k = kind(name)
    s = status(name, result)
    if k.stamps_status:
        result["status"] = s
    validate(result, k.schema, where or f"{name} result")
    return result


def make_check(name: str, kind: str, status: str, summary: str, data: dict[str, Any] | None = None, *,
               reason: str | None = None) -> dict[str, Any]:
    """One entry of `checks`; a skipped check must say why."""
    if kind not in CHECK_KINDS:
        raise InputError(f"check {name!r}: unknown kind {kind!r} (one of {', '.join(CHECK_KINDS)})")
    if status not in CHECK_STATUSES:
        raise InputError(f"check {name!r}: unknown status {status!r} (one of {', '.join(CHECK_STATUSES)})")
    if status == "skipped" and not reason:
        raise InputError(f"check {name!r}: a skipped check needs a reason")
    check: dict[str, Any] = {"name": name, "kind": kind, "status": status, "summary": summary, "data": data or {}}
    if reason:
        check["reason"] = reason
    return check
