"""`audit run`: the main job."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvgraft.cli._base import DeviceOpt, audit_app, echo_json, err, exit_with, handled, out
from kvgraft.cli.audit import RayAddressOpt, ShipOpt, WorkersOpt
from kvgraft.render.text import plain

if TYPE_CHECKING:
    from kvgraft.audit.run import Outcome


RUN_HELP = """Run every check a plan names; write, sign and show one audit report.

Exit 0 when the report's verdict is passed; 4 when the audit completed and its verdict is failed
(a check failed, or a claim is contradicted or inconsistent); 6 when it is incomplete (a check reached
no verdict); 1 when verification failed before a report could be made; 2 on unusable input; 3 for a
model of another identity."""
PlanExecutorOpt = Annotated[str | None, typer.Option("--executor", help="local or ray (default: the plan's [executor] table, "
                                                                        "else local).")]


@audit_app.command("run", help=RUN_HELP)
@handled
def audit_run_cmd(
    plan_file: Annotated[Path, typer.Argument(metavar="PLAN", help="Audit plan TOML, e.g. audit/demo.toml.")],
    out_dir: Annotated[Path | None, typer.Option("--out", help="Output folder (default: the plan's, else out/NAME).")] = None,
    device: DeviceOpt = "auto",
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="No progress and no report rendering.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report JSON instead of rendering it.")] = False,
    executor: PlanExecutorOpt = None, ray_address: RayAddressOpt = None, ship: ShipOpt = False, workers: WorkersOpt = None,
) -> None:
    """`audit run` (RUN_HELP): kvgraft.audit.run.run on the plan, its report shown."""
    import time

    from rich.text import Text

    from kvgraft.audit import plan
    from kvgraft.audit import run as auditrun

    p = plan.load(plan_file)
    t0 = time.perf_counter()

    def say(message: str) -> None:
        if not quiet and not as_json:
            line = Text(f"{time.perf_counter() - t0:6.1f}s", style="dim")
            err.print(line.append(f" {plain(message)}"))  # names are data

    outcome = auditrun.run(p, out_dir=out_dir, device=None if device == "auto" else device, say=say,
                           executor={"kind": executor, "address": ray_address, "workers": workers, "ship": ship or None})
    if as_json:
        echo_json(outcome.report.as_json())
    elif not quiet:
        _show(outcome)
    exit_with(outcome.report.verdict.status)


def _show(outcome: Outcome) -> None:
    """The report rendered, where its files are, and the command that checks it."""
    from kvgraft.audit.render_report import print_report

    print_report(outcome.report, out, path=str(outcome.report_path))
    out.print(f"report   {outcome.report_path}")
    out.print(f"html     {outcome.html}")
    if outcome.bundle_path:
        out.print(f"signed   {outcome.bundle_path}")
        key = f" --key {outcome.public_key}" if outcome.public_key else ""
        # One line however narrow the terminal: a command wrapped by us would break when pasted.
        out.print(f"check it: kvgraft report verify {outcome.report_path}{key} --release {outcome.release}",
                  soft_wrap=True)
