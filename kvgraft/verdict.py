"""One verdict per check: each audit result's status, the schema it must satisfy, and the exit code of a status.

`audit run` and the single-audit commands (`audit recompute`, `audit generalization`, `audit determinism`,
`audit claims`) take the status from here and map it to the process exit code here, so one check cannot pass
in one command and fail in another.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kvgraft.errors import EXIT_INCOMPLETE, EXIT_NOT_EXACT, EXIT_OK, InputError
from kvgraft.schema import validate

STATUSES = ("passed", "failed", "incomplete")
SCHEMAS = {"recompute": "recompute-result.v1.json", "generalization": "generalization-result.v1.json",
           "determinism": "determinism-result.v1.json", "claims": "claims.v1.json", "controls": "controls-result.v1.json"}
# passed: the audit ran and found nothing wrong; failed: it ran and found a failure; incomplete: it ran but could
# not reach a verdict (nothing to judge, or a control that shows its power failed).
EXIT_CODES = {"passed": EXIT_OK, "failed": EXIT_NOT_EXACT, "incomplete": EXIT_INCOMPLETE}


# Each kind's rule, here beside its schema and exit code so the check modules import this one and not the reverse.


def _recompute(result: dict[str, Any]) -> str:
    """passed when the result's requirement is met (byte-exact, or consistent under `consistent`), else failed."""
    return "passed" if result["passed"] else "failed"


def _generalization(result: dict[str, Any]) -> str:
    """failed when a prompt-text condition (d) did not reproduce its graft's tokens (the graft is not the same
    computation as its text); incomplete when nothing ran; else passed."""
    if any(eq["equal"] != eq["n"] for eq in result["equality"].values()):
        return "failed"
    return "passed" if result["runs"] else "incomplete"


def _determinism(result: dict[str, Any]) -> str:
    """The matrix describes; it fails nothing. Incomplete when fewer than two conditions were compared."""
    return "passed" if len(result["conditions"]) >= 2 else "incomplete"


def _claims(result: dict[str, Any]) -> str:
    """failed when a claim is contradicted or inconsistent; incomplete when no claim could be judged."""
    if result["failed"]:
        return "failed"
    judged = sum(n for v, n in result["counts"].items() if v != "not-testable")
    return "passed" if judged else "incomplete"


def _controls(result: dict[str, Any]) -> str:
    """passed when every control shows what it expects; incomplete when one does not (the audit could not
    show its power, or reported a difference where none was planted); failed is left to the checks that
    judge the graft itself."""
    return "passed" if all(c["shows"] for c in result["controls"]) else "incomplete"


STATUS_OF: dict[str, Callable[[dict[str, Any]], str]] = {
    "recompute": _recompute, "generalization": _generalization, "determinism": _determinism,
    "claims": _claims, "controls": _controls,
}


def status(kind: str, result: dict[str, Any]) -> str:
    """The status of one audit result, by its kind's rule in STATUS_OF."""
    if kind not in STATUS_OF:
        raise InputError(f"no audit result of kind {kind!r} (one of {', '.join(SCHEMAS)})")
    s = STATUS_OF[kind](result)
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
