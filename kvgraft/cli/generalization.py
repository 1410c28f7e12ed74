"""`kvgraft library build` and `kvgraft audit generalization`."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated

import typer

from kvgraft.cli._base import (
    PLAIN_HELP,
    AttnOpt,
    DeviceOpt,
    DtypeOpt,
    JsonOpt,
    ModelOpt,
    OutOpt,
    QuietOpt,
    ThreadsOpt,
    app,
    audit_app,
    echo_json,
    exit_with,
    handled,
    load_model,
    out,
    progress,
    say,
)
from kvgraft.cli.audit import ExecutorOpt, RayAddressOpt, ShipOpt, WorkersOpt
from kvgraft.cli.trust import IdentityOpt, IssuerOpt, KeysOpt, OfflineOpt, OmsSignatureOpt, RequireSignatureOpt, Trust

library_app = typer.Typer(no_args_is_help=True, rich_markup_mode=PLAIN_HELP,
                          help="Build solution libraries: cache releases of traces whose final answer was checked.")
app.add_typer(library_app, name="library")

SourceOpt = Annotated[str, typer.Option("--source",
                                        help="gsm8k, synthetic, arithmetic, aime2025, champ, or a FILE.jsonl of problems.")]


LimitOpt = Annotated[int | None, typer.Option("--limit", help="Use the first N problems of the source.")]
FractionOpt = Annotated[float, typer.Option("--library-fraction", help="Share of problems in the library.")]
SaltOpt = Annotated[str, typer.Option("--salt", help="Salt of the library / held-out split.")]
SyntheticSeedOpt = Annotated[int, typer.Option("--synthetic-seed", help="Seed of --source synthetic or arithmetic.")]
CaptureChunkOpt = Annotated[int | None, typer.Option("--chunk", help="Capture prefill in chunks of N (default one-shot).")]
AttemptsOpt = Annotated[int, typer.Option("--attempts", help="Sampled attempts after the greedy one.")]
TemperatureOpt = Annotated[float, typer.Option("--temperature", help="Temperature of sampled attempts.")]
SeedOpt = Annotated[int, typer.Option("--seed", help="Seed of sampled attempts.")]
AttemptTokensOpt = Annotated[int, typer.Option("--max-new-tokens", help="Tokens per generation attempt.")]
ProbeTokensOpt = Annotated[int, typer.Option("--probe", help="Greedy probe tokens recorded per entry.")]
BUILD_HELP = """Verify a solution trace for each library problem against its answer and capture the solved ones.

The reference solution when the source has one (accepted only if the answer checker agrees), else
the model's greedy and then sampled generations. Problems without a solved trace are listed."""


@library_app.command("build", help=BUILD_HELP)
@handled
def build_cmd(
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Release folder to create.")], source: SourceOpt = "gsm8k",
    limit: LimitOpt = None, library_fraction: FractionOpt = 0.5, salt: SaltOpt = "kvgraft",
    synthetic_seed: SyntheticSeedOpt = 0, attempts: AttemptsOpt = 3, temperature: TemperatureOpt = 0.7, seed: SeedOpt = 0,
    max_new_tokens: AttemptTokensOpt = 256,
    no_reference: Annotated[bool, typer.Option("--no-reference", help="Ignore reference solutions; generate.")] = False,
    no_generate: Annotated[bool, typer.Option("--no-generate", help="Reference solutions only; never generate.")] = False,
    chunk: CaptureChunkOpt = None, probe: ProbeTokensOpt = 0,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing release.")] = False,
    model: ModelOpt = "smollm2-135m", device: DeviceOpt = "auto", dtype: DtypeOpt = "float32", attn: AttnOpt = "sdpa",
    threads: ThreadsOpt = None, quiet: QuietOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the build result as JSON instead of rendering it.")] = False,
) -> None:
    """`library build` (BUILD_HELP): kvgraft.generalization.library.build_from with these options, its result shown."""
    from kvgraft.generalization import library
    from kvgraft.inference.reapply import Conditions
    from kvgraft.render.generalization import build_renderables

    request = library.LibraryBuild(out_dir, source, limit, library_fraction, salt, synthetic_seed, attempts, temperature,
                                   seed, max_new_tokens, not no_reference, not no_generate, chunk, probe, overwrite, model,
                                   Conditions(device, dtype, attn, threads))
    result = library.build_from(request, load=load_model, progress=lambda: _solving(quiet))
    if as_json:
        echo_json(result)
    elif not quiet:
        for r in build_renderables(result, out):
            out.print(r)
    else:
        c = result["counts"]
        out.print(f"{c['reference'] + c['model']} solved entries, {c['unsolved']} unsolved → {out_dir}")


@contextlib.contextmanager
def _solving(quiet: bool) -> Iterator[Callable[[int, int], None]]:
    with progress(quiet) as bar:
        task = bar.add_task("solving library problems", total=None)
        yield lambda i, n: bar.update(task, completed=i, total=n)


GENERALIZATION_HELP = """Replay vs generalization: no graft, own solution, nearest other entry, and the same tokens as text.

Exit 0 when the audit passed, 4 when it failed (the prompt-text condition did not reproduce the graft's tokens),
6 when incomplete (nothing ran),
3 for a model of another identity, 2 for unusable input (or, with --executor ray, runs that could not be run).
With --executor ray, --threads is the torch thread count of each worker (default 1 on CPU workers)."""
LibraryOpt = Annotated[Path, typer.Option("--library", help="Library release built by `kvgraft library build`.")]
QuerySourceOpt = Annotated[str | None, typer.Option("--source", help="Problem source (default: the library's).")]
QueryLimitOpt = Annotated[int | None, typer.Option("--limit", help="First N problems of the source (default: the library's).")]
SyntheticOpt = Annotated[int, typer.Option("--synthetic", help="Also query M fresh synthetic problems.")]
QuerySeedOpt = Annotated[int, typer.Option("--synthetic-seed", help="Seed of the synthetic queries.")]
SplitSaltOpt = Annotated[str | None, typer.Option("--salt", help="Split salt (default: the library's).")]
SplitFractionOpt = Annotated[float | None, typer.Option("--library-fraction", help="Split fraction (default: the library's).")]
PolicyOpt = Annotated[str, typer.Option("--policy", help="none: a only; exact: + own entry (b, d); nearest / bm25: + nearest "
                                                         "other entry (c, d).")]
QueryTokensOpt = Annotated[int, typer.Option("--max-new-tokens", help="Decode at most N tokens per query.")]
SamplesOpt = Annotated[int, typer.Option("--samples", help="Samples per query (needs --temperature > 0).")]
QueryTemperatureOpt = Annotated[float, typer.Option("--temperature", help="0 = greedy.")]
QuerySampleSeedOpt = Annotated[int, typer.Option("--seed", help="Seed of the samples and the bootstrap.")]
BudgetOpt = Annotated[int | None, typer.Option("--budget", help="Decode-token budget per query (default: condition a's).")]
PreambleOpt = Annotated[str, typer.Option(
    "--preamble", help="Text put before every query in every condition alike, e.g. worked examples for a base model "
    "that otherwise writes no answer line (recorded in the result).")]
GraftForceOpt = Annotated[bool, typer.Option("--force", help="Graft even into a model of another identity.")]


@audit_app.command("generalization", help=GENERALIZATION_HELP)
@handled
def generalization_cmd(
    library_dir: LibraryOpt, source: QuerySourceOpt = None, limit: QueryLimitOpt = None, synthetic_n: SyntheticOpt = 0,
    synthetic_seed: QuerySeedOpt = 1, salt: SplitSaltOpt = None, library_fraction: SplitFractionOpt = None,
    policy: PolicyOpt = "nearest", max_new_tokens: QueryTokensOpt = 64, samples: SamplesOpt = 1,
    temperature: QueryTemperatureOpt = 0.0, seed: QuerySampleSeedOpt = 0, budget: BudgetOpt = None,
    preamble: PreambleOpt = "", force: GraftForceOpt = False, model: ModelOpt = "smollm2-135m", device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32", attn: AttnOpt = "sdpa", threads: ThreadsOpt = None, json_out: OutOpt = None,
    as_json: JsonOpt = False, quiet: QuietOpt = False, executor: ExecutorOpt = "local", ray_address: RayAddressOpt = None,
    ship: ShipOpt = False, workers: WorkersOpt = None, key: KeysOpt = None, identity: IdentityOpt = None,
    issuer: IssuerOpt = None, offline: OfflineOpt = False, oms_signature: OmsSignatureOpt = None,
    require_signature: RequireSignatureOpt = False,
) -> None:
    """`audit generalization` (GENERALIZATION_HELP): kvgraft.audit.single.generalization, its result rendered."""
    from kvgraft.audit import single
    from kvgraft.execution.options import ExecutorOptions
    from kvgraft.inference.reapply import Conditions
    from kvgraft.render.generalization import renderables
    from kvgraft.signing.verify import signature_sentence

    settings = single.GeneralizationSettings(
        library_dir, source, limit, synthetic_n, synthetic_seed, salt, library_fraction, policy, max_new_tokens, samples,
        temperature, seed, budget, force, model, Conditions(device, dtype, attn, threads), json_out, preamble)
    trust = Trust(key, identity, issuer, offline, oms_signature, require_signature)
    result = single.generalization(settings, policy=trust.policy, executor=ExecutorOptions(executor, ray_address, workers,
                                   ship), load=load_model, progress=lambda: _auditing(quiet))
    if as_json:
        echo_json(result)
    elif not quiet:
        for r in renderables(result, out):
            out.print(r)
        say(f"release signature: {signature_sentence(result.get('release_signature'))}")
    exit_with(result["status"])


@contextlib.contextmanager
def _auditing(quiet: bool) -> Iterator[Callable[[int, int, str], None]]:
    """The generalization audit's bar: runs done of all, the condition and problem of the last one."""
    with progress(quiet) as bar:
        task = bar.add_task("auditing", total=None)
        yield lambda i, n, label: bar.update(task, completed=i, total=n, description=f"auditing {label}")
