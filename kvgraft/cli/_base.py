"""Shared CLI pieces: the Typer app, consoles, common options, error-to-exit-code mapping."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Annotated, Any, TypeVar

import typer
from rich.console import Console
from rich.text import Text

from kvgraft import __version__
from kvgraft._internal.jsonio import WRITE_ERRNOS, io_failure
from kvgraft.errors import Error
from kvgraft.reporting.render import plain as plain  # re-exported: the CLI prints through it

# Help is plain text (rich_markup_mode=None): as rich markup, "[executor]" in a help string vanished; nothing
# written in a help string may be read as markup (tests/cli/test_help.py renders every one).
PLAIN_HELP = None
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=PLAIN_HELP,
                  help="Capture, graft, recompute and verify KV-cache releases.")
audit_app = typer.Typer(no_args_is_help=True, rich_markup_mode=PLAIN_HELP,
                        help="Audits: recompute, determinism, generalization, claims, run.")
report_app = typer.Typer(no_args_is_help=True, rich_markup_mode=PLAIN_HELP, help="Show and verify audit reports.")
app.add_typer(audit_app, name="audit")
app.add_typer(report_app, name="report")
# Markup and emoji codes off: a string printed is shown as written (names, fields and paths come from
# files an attacker may have chosen); styles come from rich Text objects.
out = Console(highlight=False, markup=False, emoji=False)
err = Console(stderr=True, highlight=False, markup=False, emoji=False)
EXIT_INTERNAL = 70
_state = {"verbose": False}
F = TypeVar("F", bound=Callable[..., Any])


def say(text: object, *, error: bool = False) -> None:
    """Print one line of plain text: no markup, emoji codes or highlighting are interpreted."""
    typer.echo(plain(text), err=error)


def handled(fn: F) -> F:
    """Library errors become one line on stderr and their exit code; tracebacks only with --verbose.

    The line is written as plain text (see `plain`): error messages quote file names and bundle
    fields that an attacker chose.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Error as exc:
            if _state["verbose"]:
                err.print_exception()
            say(f"kvgraft: error: {exc.diagnostics()}", error=True)
            raise typer.Exit(exc.exit_code) from None
        except KeyboardInterrupt:
            say("kvgraft: interrupted; nothing partial was left behind", error=True)
            raise typer.Exit(130) from None
        except (typer.Exit, typer.Abort):
            raise
        except Exception as exc:
            if _state["verbose"]:
                err.print_exception()
            if isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS:  # the system refused a write: not a bug
                failure = io_failure(exc.filename or "output", exc)
                say(f"kvgraft: error: {failure}", error=True)
                raise typer.Exit(failure.exit_code) from None
            say(f"kvgraft: internal error: {type(exc).__name__}: {exc} (rerun with --verbose)", error=True)
            raise typer.Exit(EXIT_INTERNAL) from None

    return wrapper  # type: ignore[return-value]


def _version(value: bool) -> None:
    if value:
        out.print(f"kvgraft {__version__}")
        raise typer.Exit(0)


@app.callback()
def main(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Show tracebacks on errors.")] = False,
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True)] = False,
) -> None:
    _state["verbose"] = verbose


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="Hub id, local folder, or smollm2-135m.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")]
AttnOpt = Annotated[str, typer.Option("--attn", help="eager or sdpa.")]


def exit_with(status: str) -> None:
    """The one exit of an audit command: its result's status, mapped by kvgraft.verdict (passed 0, failed 4,
    incomplete 6)."""
    from kvgraft.verdict import exit_code

    code = exit_code(status)
    if code:
        raise typer.Exit(code)


def load_model(model: str, device: str, dtype: str, attn: str) -> Any:
    from kvgraft.inference import models

    return models.load(model, device=device, dtype=dtype, attn=attn, progress=lambda m: err.print(Text(plain(m), style="dim")))


