"""`kvgraft library build` and `kvgraft audit generalization`."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from kvgraft.cli._base import (
    PLAIN_HELP,
    AttnOpt,
    DeviceOpt,
    DtypeOpt,
    IdentityOpt,
    IssuerOpt,
    JsonOpt,
    KeysOpt,
    ModelOpt,
    OfflineOpt,
    OmsSignatureOpt,
    OutOpt,
    QuietOpt,
    RequireSignatureOpt,
    app,
    audit_app,
    echo_json,
    err,
    exit_with,
    handled,
    load_model,
    out,
    say,
)
from kvgraft.cli.audit import ExecutorOpt, RayAddressOpt, ShipOpt, WorkersOpt, make_executor, release_policy

if TYPE_CHECKING:
    from rich.progress import Progress

library_app = typer.Typer(no_args_is_help=True, rich_markup_mode=PLAIN_HELP,
                          help="Build solution libraries: cache releases of traces whose final answer was checked.")
app.add_typer(library_app, name="library")

ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="torch CPU threads (default: torch's choice).")]
SourceOpt = Annotated[str, typer.Option("--source",
                                        help="gsm8k, synthetic, arithmetic, aime2025, champ, or a FILE.jsonl of problems.")]


def _progress(quiet: bool) -> Progress:
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    TextColumn("ETA"), TimeRemainingColumn(), console=err, transient=True, disable=quiet)


@library_app.command("build")
@handled
def build_cmd(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Release folder to create.")],
    source: SourceOpt = "gsm8k",
    limit: Annotated[int | None, typer.Option("--limit", help="Use the first N problems of the source.")] = None,
    library_fraction: Annotated[float, typer.Option("--library-fraction", help="Share of problems in the library.")] = 0.5,
    salt: Annotated[str, typer.Option("--salt", help="Salt of the library / held-out split.")] = "kvgraft",
    synthetic_seed: Annotated[int, typer.Option("--synthetic-seed", help="Seed of --source synthetic or arithmetic.")] = 0,
    attempts: Annotated[int, typer.Option("--attempts", help="Sampled attempts after the greedy one.")] = 3,
    temperature: Annotated[float, typer.Option("--temperature", help="Temperature of sampled attempts.")] = 0.7,
    seed: Annotated[int, typer.Option("--seed", help="Seed of sampled attempts.")] = 0,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Tokens per generation attempt.")] = 256,
    no_reference: Annotated[bool, typer.Option("--no-reference", help="Ignore reference solutions; generate.")] = False,
    no_generate: Annotated[bool, typer.Option("--no-generate", help="Reference solutions only; never generate.")] = False,
    chunk: Annotated[int | None, typer.Option("--chunk", help="Capture prefill in chunks of N (default one-shot).")] = None,
    probe: Annotated[int, typer.Option("--probe", help="Greedy probe tokens recorded per entry.")] = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing release.")] = False,
    model: ModelOpt = "smollm2-135m",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    attn: AttnOpt = "sdpa",
    threads: ThreadsOpt = None,
    quiet: QuietOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build result as JSON instead of rendering it.")]
    = False,
) -> None:
    """Verify a solution trace for each library problem against its answer and capture the solved ones.

    The reference solution when the source has one (accepted only if the answer checker agrees), else
    the model's greedy and then sampled generations. Problems without a solved trace are listed.
    """
    from kvgraft._internal.jsonio import check_writable, refuse_existing
    from kvgraft.errors import InputError
    from kvgraft.generalization import library
    from kvgraft.inference import runtime
    from kvgraft.render.generalization import build_renderables

    if no_reference and no_generate:
        raise InputError("--no-reference and --no-generate leave no way to obtain a trace")
    refuse_existing(out_dir, overwrite)  # before the model loads, not after
    check_writable(out_dir)
    problems, source_rec = library.load_problems(source, limit, synthetic_seed=synthetic_seed)
    settings = library.BuildSettings(attempts=attempts, temperature=temperature, seed=seed, max_new_tokens=max_new_tokens,
                                     use_reference=not no_reference, generate=not no_generate)
    if threads is not None and threads < 1:
        raise InputError(f"--threads must be >= 1, got {threads}")
    with runtime.threads(threads):
        lm = load_model(model, device, dtype, attn)
        with _progress(quiet) as bar:
            task = bar.add_task("solving library problems", total=None)
            result = library.build(lm, problems, out_dir, library_fraction=library_fraction, salt=salt,
                                   source=source_rec, settings=settings, schedule=runtime.Schedule(chunk_tokens=chunk),
                                   probe_tokens=probe, overwrite=overwrite,
                                   progress=lambda i, n: bar.update(task, completed=i, total=n))
    if as_json:
        echo_json(result)
    elif not quiet:
        for r in build_renderables(result, out):
            out.print(r)
    else:
        c = result["counts"]
        out.print(f"{c['reference'] + c['model']} solved entries, {c['unsolved']} unsolved → {out_dir}")


@audit_app.command("generalization")
@handled
def generalization_cmd(
    library_dir: Annotated[Path, typer.Option("--library", help="Library release built by `kvgraft library build`.")],
    source: Annotated[str | None, typer.Option("--source", help="Problem source (default: the library's).")] = None,
    limit: Annotated[int | None, typer.Option("--limit", help="First N problems of the source (default: the library's).")]
    = None,
    synthetic_n: Annotated[int, typer.Option("--synthetic", help="Also query M fresh synthetic problems.")] = 0,
    synthetic_seed: Annotated[int, typer.Option("--synthetic-seed", help="Seed of the synthetic queries.")] = 1,
    salt: Annotated[str | None, typer.Option("--salt", help="Split salt (default: the library's).")] = None,
    library_fraction: Annotated[float | None, typer.Option("--library-fraction", help="Split fraction (default: the library's).")]
    = None,
    policy: Annotated[str, typer.Option("--policy", help="none: a only; exact: + own entry (b, d); nearest / bm25: + nearest "
                                                        "other entry (c, d).")] = "nearest",
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", help="Decode at most N tokens per query.")] = 64,
    samples: Annotated[int, typer.Option("--samples", help="Samples per query (needs --temperature > 0).")] = 1,
    temperature: Annotated[float, typer.Option("--temperature", help="0 = greedy.")] = 0.0,
    seed: Annotated[int, typer.Option("--seed", help="Seed of the samples and the bootstrap.")] = 0,
    budget: Annotated[int | None, typer.Option("--budget", help="Decode-token budget per query (default: condition a's).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Graft even into a model of another identity.")] = False,
    model: ModelOpt = "smollm2-135m",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    attn: AttnOpt = "sdpa",
    threads: ThreadsOpt = None,
    json_out: OutOpt = None,
    as_json: JsonOpt = False,
    quiet: QuietOpt = False,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ship: ShipOpt = False,
    workers: WorkersOpt = None,
    key: KeysOpt = None,
    identity: IdentityOpt = None,
    issuer: IssuerOpt = None,
    offline: OfflineOpt = False,
    oms_signature: OmsSignatureOpt = None,
    require_signature: RequireSignatureOpt = False,
) -> None:
    """Replay vs generalization: no graft, own solution, nearest other entry, and the same tokens as text.

    Exit 0 when the audit passed, 4 when it failed (the prompt-text condition did not reproduce the graft's tokens),
    6 when incomplete (nothing ran),
    3 for a model of another identity, 2 for unusable input (or, with --executor ray, runs that could not be run).
    With --executor ray, --threads is the torch thread count of each worker (default 1 on CPU workers).
    """
    import contextlib

    from kvgraft._internal.jsonio import check_writable
    from kvgraft.audit import plan
    from kvgraft.audit.checks import run_check
    from kvgraft.audit.context import Context, Lazy
    from kvgraft.render.generalization import renderables
    from kvgraft.signing.verify import signature_sentence, verified

    if json_out is not None:
        check_writable(json_out)
    # The generalization check as `audit run` runs it (kvgraft.audit.checks.generalization), its settings from
    # these options. It prepares the queries before it reads the model: the executor, the model and the bar
    # start only then, in that order, as they did here.
    settings: dict[str, Any] = {
        "synthetic": synthetic_n, "policy": policy, "max_new_tokens": max_new_tokens, "samples": samples,
        "temperature": temperature, "source": source, "limit": limit, "library_fraction": library_fraction,
        "salt": salt, "synthetic_seed": synthetic_seed, "seed": seed, "force": force, "budget": budget}
    # Verified as `kvgraft verify` does with the same options, before any model loads (without --key: a stale
    # statement fails, the signature is not checked; each entry's bytes are checked when read).
    rel = verified(library_dir, release_policy(key, identity, issuer, offline, oms_signature, require_signature))
    with contextlib.ExitStack() as stack:
        # The executor sets --threads around each run (or sizes each Ray actor by it) and checks it.
        ex = Lazy(lambda: stack.enter_context(make_executor(executor, model, device, dtype, attn, address=ray_address,
                                                            workers=workers, ship=ship, threads=threads)))
        lm = Lazy(lambda: ex.get().model(lambda: load_model(model, device, dtype, attn)))
        bar = Lazy(lambda: stack.enter_context(_progress(quiet)))
        task = Lazy(lambda: bar.get().add_task("auditing", total=None))

        def tick(i: int, n: int, label: str) -> None:
            bar.get().update(task.get(), completed=i, total=n, description=f"auditing {label}")

        ctx = Context(plan.single("generalization", settings, model=model), lm, Path.cwd(), lambda _m: None, ex, rel)
        result = run_check(ctx, "generalization", {**settings, "progress": tick}).result
    if json_out:
        from kvgraft._internal.jsonio import write_json

        write_json(json_out, result)
    if as_json:
        echo_json(result)
    elif not quiet:
        for r in renderables(result, out):
            out.print(r)
        say(f"release signature: {signature_sentence(result.get('release_signature'))}")
    exit_with(result["status"])
