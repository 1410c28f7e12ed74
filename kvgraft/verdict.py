"""The statuses a check can reach and the process exit code of each.

`audit run` and the single-audit commands (`audit recompute`, `audit generalization`, `audit determinism`,
`audit claims`) map a status to the exit code here, so one check cannot pass in one command and fail in
another. Each kind's status rule and result schema are parts of its module in kvgraft/audit/checks/ (the
registry seals a result there); this module stays at the bottom of the layers, importing nothing of kvgraft's
but its errors.
"""

from __future__ import annotations

from kvgraft.errors import EXIT_INCOMPLETE, EXIT_NOT_EXACT, EXIT_OK, InputError

STATUSES = ("passed", "failed", "incomplete")
# passed: the audit ran and found nothing wrong; failed: it ran and found a failure; incomplete: it ran but could
# not reach a verdict (nothing to judge, or a control that shows its power failed).
# A report's check may also be skipped (not run, with its reason): it has no exit code of its own.
CHECK_STATUSES = (*STATUSES, "skipped")
EXIT_CODES = {"passed": EXIT_OK, "failed": EXIT_NOT_EXACT, "incomplete": EXIT_INCOMPLETE}


def exit_code(status_: str) -> int:
    if status_ not in EXIT_CODES:
        raise InputError(f"unknown status {status_!r} (one of {', '.join(STATUSES)})")
    return EXIT_CODES[status_]
