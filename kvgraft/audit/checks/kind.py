"""The one protocol every check kind implements: run, status rule, result schema, face, details, HTML, known data.

Why one dataclass and not seven tables: a check kind was spread over the audit run, the verdict module, the
report's kind list, the face, the terminal details, the HTML page and the list of data members the renderers
draw. Each kind is now one `CheckKind`: a built-in one a module under kvgraft/audit/checks/, a third-party
one an entry point; the registry (kvgraft/audit/checks/__init__.py) lists them, and the audit run, the
single-check commands, verdict, face and both renderers dispatch through it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from rich.console import Console, RenderableType

    from kvgraft.audit.context import Context
    from kvgraft.render.figures import Face
    from kvgraft.results.base import JsonObject, Typed


@dataclass(frozen=True)
class Ran:
    """What a check's run returns: its result (sealed by the registry afterwards, not by the run), the summary
    line of its report entry, and the entry's `data` when that is not the result itself (generalization keeps
    a short form beside the whole result, which it holds by reference, so sealing the result reaches it).
    What it adds to the report beside its entry: lines of the token ledger, and claim verdicts (the claims
    check's). A run writes nothing into the Context: later checks read its sealed result (`ctx.results`)."""

    result: JsonObject
    summary: str
    data: JsonObject | None = None
    ledger: dict[str, str] = field(default_factory=dict)
    claims: list[JsonObject] = field(default_factory=list)


@dataclass(frozen=True)
class CheckKind:
    """Every part of one check kind. A kind without one of these parts is refused (tests/test_check_kinds.py)."""

    name: str  # the kind's word in plans and reports (the registry's NAME pattern; built-in ones listed in the schemas)
    schema: str | JsonObject  # the JSON schema its result satisfies: a file under schemas/, or (a plugin's) the schema
    status: Callable[[JsonObject], str]  # passed | failed | incomplete, from its result alone
    stamps_status: bool  # whether its result carries its status as a member (verify's document does not)
    run: Callable[[Context, dict[str, Any]], Ran]  # run it under a plan's settings (audit run, or a one-check command)
    # face, details and html each take the kind's report data: its `typed` data model when it has one (the
    # registry's `view` builds it), else its own TypedDict (RecomputeData, …). `Any` here, at the registry
    # boundary, is where that data enters typed: data reaches them only from a report that passed validate_report
    # (load_report, new_report) or a result that passed seal, and the report schema's rule for the kind (a $ref to
    # the data part of the kind's schema file, or its own $defs) requires every member the type requires.
    face: Callable[[Any], Face]  # its verdict line and deciding figures, from the report check's data
    details: Callable[[Any, Console], list[RenderableType]]  # terminal details (`report show --detail`)
    html: Callable[[Any], str]  # its details section of the HTML page
    known_data: tuple[str, ...]  # the data members details and HTML draw; others are listed by name, not dropped
    # Its typed result (kvgraft.results.<kind>): the models its schema file is generated from; face, details and
    # html then take the report data as that model (the registry's `view`). None: they take the data as a dict.
    typed: Typed | None = None
