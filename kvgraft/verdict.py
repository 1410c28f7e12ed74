"""One verdict per check: each audit result's status, the schema it must satisfy, and the exit code of a status.

`audit run` and the single-audit commands (`audit recompute`, `audit generalization`, `audit determinism`,
`audit claims`) take the status from here and map it to the process exit code here, so one check cannot pass
in one command and fail in another.
"""

from __future__ import annotations

from typing import Any

from kvgraft.errors import EXIT_INCOMPLETE, EXIT_NOT_EXACT, EXIT_OK, InputError
from kvgraft.schema import validate

STATUSES = ("passed", "failed", "incomplete")
SCHEMAS = {"recompute": "recompute-result.v1.json", "generalization": "generalization-result.v1.json",
           "determinism": "determinism-result.v1.json", "claims": "claims.v1.json", "controls": "controls-result.v1.json"}
# passed: the audit ran and found nothing wrong; failed: it ran and found a failure; incomplete: it ran but could
# not reach a verdict (nothing to judge, or a control that shows its power failed).
EXIT_CODES = {"passed": EXIT_OK, "failed": EXIT_NOT_EXACT, "incomplete": EXIT_INCOMPLETE}


def status(kind: str, result: dict[str, Any]) -> str:
    """The status of one audit result, decided by the module that produced it."""
    if kind == "recompute":
        from kvgraft.recompute import status as of
    elif kind == "generalization":
        from kvgraft.generalization.audit import status as of
    elif kind == "determinism":
        from kvgraft.determinism import status as of
    elif kind == "claims":
        from kvgraft.reporting.claims import status as of
    elif kind == "controls":
        from kvgraft.generalization.controls import status as of
    else:
        raise InputError(f"no audit result of kind {kind!r} (one of {', '.join(SCHEMAS)})")
    s = of(result)
    if s not in STATUSES:
        raise AssertionError(f"{kind} status {s!r} is not one of {STATUSES}")
    return s


def seal(kind: str, result: dict[str, Any], where: str | None = None) -> dict[str, Any]:
    """Stamp `result` with its status and validate it against its schema; returns it. Idempotent."""
    result["status"] = status(kind, result)
    validate(result, SCHEMAS[kind], where or f"{kind} result")
    return result


def exit_code(status_: str) -> int:
    if status_ not in EXIT_CODES:
        raise InputError(f"unknown status {status_!r} (one of {', '.join(STATUSES)})")
    return EXIT_CODES[status_]
