"""Shared CLI pieces: the Typer app, consoles, common options, error-to-exit-code mapping."""

from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, NoReturn, TypeVar

import typer
from rich.console import Console
from rich.text import Text
from typer.core import TyperArgument

from kvgraft import __version__
from kvgraft._internal.jsonio import WRITE_ERRNOS, io_failure
from kvgraft.errors import Error
from kvgraft.render.text import json_text, plain

if TYPE_CHECKING:
    from rich.progress import Progress


# Help is plain text (rich_markup_mode=None): as rich markup, "[executor]" in a help string vanished; nothing
# written in a help string may be read as markup (tests/cli/test_help.py renders every one).
PLAIN_HELP = None
# -h as well as --help, on every command (a group's settings are its commands' defaults).
HELP_NAMES = {"help_option_names": ["-h", "--help"]}
app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=PLAIN_HELP,
                  context_settings=HELP_NAMES, help="Capture, graft, recompute and verify KV-cache releases.")
audit_app = typer.Typer(no_args_is_help=True, rich_markup_mode=PLAIN_HELP,
                        help="Audits: recompute, determinism, generalization, claims, run.")
report_app = typer.Typer(no_args_is_help=True, rich_markup_mode=PLAIN_HELP, help="Show and verify audit reports.")


def _usage_name(self: TyperArgument) -> str:
    """An argument in the usage line as click writes it (RELEASE, [ENTRY]): typer 0.29 writes {RELEASE},
    which reads as a template to fill in (tests/cli/test_first_contact.py checks the line)."""
    name = self.display_name_raw if self.required else f"[{self.display_name_raw}]"
    return name + ("..." if self.nargs != 1 else "")


TyperArgument._usage_display_name = _usage_name  # type: ignore[method-assign]
_display_type = TyperArgument.display_type


def _element_type(self: TyperArgument, ctx: Any) -> str:
    """A repeated argument's type in help as its items' (REPORT... <str>): typer writes <list[str]>, a Python type."""
    shown = _display_type(self, ctx)
    return f"<{shown[len('<list['):-len(']>')]}>" if shown.startswith("<list[") and shown.endswith("]>") else shown


TyperArgument.display_type = _element_type  # type: ignore[method-assign,assignment]
app.add_typer(audit_app, name="audit")
app.add_typer(report_app, name="report")
EXIT_INTERNAL = 70
EXIT_PIPE = 141  # 128 + SIGPIPE: the status a shell shows for a Unix tool whose reader stopped reading


def reader_gone() -> NoReturn:
    """The reader of our output closed it (`kvgraft verify ... | head -1`): stop quietly, as Unix tools do.
    Output still buffered, and the flush at exit, go to /dev/null instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # not a file descriptor (a test runner's captured stream)
            os.dup2(devnull, stream.fileno())
    raise typer.Exit(EXIT_PIPE)


class _Console(Console):
    def on_broken_pipe(self) -> None:  # rich's own exits with status 1
        self.quiet = True
        reader_gone()


# Markup and emoji codes off: a string printed is shown as written (names, fields and paths come from
# files an attacker may have chosen); styles come from rich Text objects.
out = _Console(highlight=False, markup=False, emoji=False)
err = _Console(stderr=True, highlight=False, markup=False, emoji=False)
_state = {"verbose": False}
F = TypeVar("F", bound=Callable[..., Any])


def say(text: object, *, error: bool = False) -> None:
    """Print one line of plain text: no markup, emoji codes or highlighting are interpreted."""
    typer.echo(plain(text), err=error)


def echo_json(doc: Any) -> None:
    """The one way a --json document is printed: indented, every control, bidi or separator character escaped
    (render.text.json_text), as text mode shows them escaped."""
    typer.echo(json_text(doc))


# The resources of the command running now (set by `handled` for the length of one call, and reset after it).
_HELD: contextvars.ContextVar[contextlib.ExitStack] = contextvars.ContextVar("kvgraft_cli_held")
_R = TypeVar("_R", bound=contextlib.AbstractContextManager[Any])


def held(resource: _R) -> _R:
    """`resource` (a VerifiedRelease) held until the command running now ends: then closed (a release read from
    elsewhere: its folder removed, the cache kept within its limit), an error raised before naming its location."""
    _HELD.get().enter_context(resource)  # LookupError outside a command wrapped by `handled`: a bug
    return resource


def handled(fn: F) -> F:
    """Library errors become one line on stderr and their exit code; tracebacks only with --verbose.

    The line is written as plain text (see `plain`): error messages quote file names and bundle
    fields that an attacker chose.
    """

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            with contextlib.ExitStack() as stack:
                running = _HELD.set(stack)  # what `held` hands over: closed as this command ends
                try:
                    return fn(*args, **kwargs)
                finally:
                    _HELD.reset(running)
        except BrokenPipeError:
            reader_gone()
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
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="Print kvgraft's version and exit.")] = False,
) -> None:
    _state["verbose"] = verbose


# A RELEASE argument: a folder, or a location a release is published at (kvgraft.remote); a string, not a
# Path, which would fold the scheme's "//".
RELEASE_HELP = "Cache release: a folder, or an http(s)://, hf:// or s3:// location (docs/remote.md)."
ReleaseArg = Annotated[str, typer.Argument(metavar="RELEASE", help=RELEASE_HELP)]


ModelOpt = Annotated[str, typer.Option("--model", "-m", help="A preset (smollm2-135m, gemma3-270m: `kvgraft models`), a "
                                                           "model folder, a .gguf file or a hub id (owner/name).")]
ReleaseModelOpt = Annotated[str | None, typer.Option(
    "--model", "-m", help="The model to load (default: the one the release records): a preset (`kvgraft models`), a "
                          "model folder, a .gguf file or a hub id (owner/name).")]
DeviceOpt = Annotated[str, typer.Option("--device", help="auto, cpu or cuda.")]
DtypeOpt = Annotated[str, typer.Option("--dtype", help="float32, bfloat16 or float16.")]
AttnOpt = Annotated[str, typer.Option("--attn", help="eager or sdpa.")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="torch CPU threads (default: torch's choice).")]
QuietOpt = Annotated[bool, typer.Option("--quiet", "-q", help="No progress bar and no rendering of the result.")]
# One convention for every command: --json prints JSON on stdout, --out FILE writes it to a file.
JsonOpt = Annotated[bool, typer.Option("--json", help="Print the result as JSON on stdout instead of rendering it.")]
OutOpt = Annotated[Path | None, typer.Option("--out", metavar="FILE", help="Also write the result as JSON to FILE.")]


def exit_with(status: str) -> None:
    """The one exit of an audit command: its result's status, mapped by kvgraft.verdict (passed 0, failed 4,
    incomplete 6)."""
    from kvgraft.verdict import exit_code

    code = exit_code(status)
    if code:
        raise typer.Exit(code)


def model_progress(message: str) -> None:
    """A step of loading a model (converting, downloading), dim on stderr."""
    err.print(Text(plain(message), style="dim"))


def load_model(model: str, device: str, dtype: str, attn: str) -> Any:
    from kvgraft.inference import models

    return models.load(model, device=device, dtype=dtype, attn=attn, progress=model_progress)


def progress(quiet: bool) -> Progress:
    """A bar on stderr with its description, done of all, elapsed and remaining time (hidden with --quiet)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=True, disable=quiet)
