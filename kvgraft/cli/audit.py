"""The `audit` commands on a release and on claims: `audit recompute`, `audit sample`, `audit determinism`, `audit claims`;
`audit kinds`, the check kinds installed.

(`audit run` is in audit_run.py, `audit generalization` in generalization.py.)
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, cast

import typer

from kvgraft.cli._base import (
    JsonOpt,
    ModelOpt,
    OutOpt,
    QuietOpt,
    ReleaseArg,
    ReleaseModelOpt,
    audit_app,
    echo_json,
    err,
    exit_with,
    handled,
    held,
    load_model,
    out,
    say,
)
from kvgraft.cli.trust import IdentityOpt, IssuerOpt, KeysOpt, OfflineOpt, OmsSignatureOpt, RequireSignatureOpt, Trust
from kvgraft.errors import InputError

if TYPE_CHECKING:
    from kvgraft.results.base import JsonObject

ExecutorOpt = Annotated[str, typer.Option("--executor", help="local: this process; ray: Ray actors that each hold the "
                                                             "model (a local Ray instance, or the cluster of --ray-address).")]
RayAddressOpt = Annotated[str | None, typer.Option("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else "
                                                                         "start a local Ray instance).")]
ShipOpt = Annotated[bool, typer.Option("--ship", help="Ship the release to the Ray workers through the object store "
                                                      "(default: they read it from the same path).")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="Ray workers (default: one per GPU, else one per CPU).")]
# `audit recompute`'s options beside the shared ones: the conditions replayed (None: the recorded one), what is judged.
ReplayDeviceOpt = Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: the recorded one where this "
                                                                      "machine has it).")]
ReplayDtypeOpt = Annotated[str | None, typer.Option("--dtype", help="Override the recorded dtype.")]
ReplayAttnOpt = Annotated[str | None, typer.Option("--attn", help="Override the recorded attention kernel (eager, sdpa).")]
ReplayThreadsOpt = Annotated[int | None, typer.Option("--threads", help="Override the recorded torch thread count.")]
ChunkOpt = Annotated[int | None, typer.Option("--chunk", help="Recompute in chunks of N (overrides the recorded schedule).")]
OneShotOpt = Annotated[bool, typer.Option("--one-shot", help="Recompute one-shot (overrides the recorded schedule).")]
RequireOpt = Annotated[str, typer.Option("--require", help="exact: every entry byte-exact (the preprint's claim); "
                                                           "consistent: byte-exact or inside the noise bound measured here.")]
EntriesOpt = Annotated[list[str] | None, typer.Option("--entry", "-e", metavar="ID", help="Audit only this entry (repeatable).")]
ProbeTextOpt = Annotated[str | None, typer.Option("--probe", help="Probe text (default: the entry's recorded probe tokens).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Compare even with a model of another identity.")]
SampleOpt = Annotated[int | None, typer.Option("--sample", help="Audit N entries drawn from the release's root digest and "
                                                                "--nonce (uniform over entries); the result bounds how many "
                                                                "entries of the release fail.")]
SampleNonceOpt = Annotated[str | None, typer.Option("--nonce", help="The auditor's nonce for --sample (default: a fresh "
                                                                    "random one, recorded in the result).")]
TargetFractionOpt = Annotated[float | None, typer.Option(
    "--target-fraction", help="Sample as many entries as a 95% bound of F (e.g. 0.01) needs when none fail.")]
JournalOpt = Annotated[Path | None, typer.Option(
    "--journal", help="Record each judged entry here and resume from it (default with --out: OUT.json.journal).")]
PrefixOpt = Annotated[int | None, typer.Option(
    "--prefix", help="Also judge a prefix graft of each audited entry's first N tokens (what `kvgraft run --prefix` and the "
                     "vLLM connector graft): under its recorded schedule, and against a prefill of the N tokens alone.")]
RECOMPUTE_HELP = """Recompute fresh KV states and compare them with the release, bit for bit, by KL and by the noise bound.

Replays the recorded conditions (device where present, dtype, attention, threads, deterministic
flags, schedule); options override one and are recorded as overrides. Each entry is byte-exact,
consistent (inside the noise bound measured here) or inconsistent. Exit 0 when the --require
is met, 4 when not, 3 for a model of another identity, 2 when the release cannot be read (or, with
--executor ray, when entries could not be run), 1 when stored bytes do not match their commitments.
With --out (or --journal) each judged entry is recorded as it lands: an interrupted audit, rerun
with the same command, resumes from it and judges no entry twice; no result is written until every
entry is judged. A resumed journal must match this run (release root, entries, settings, nonce) and
each result read back is re-judged from its recorded comparisons; the output says how many results
were resumed and from which file, and a nonce taken from it is reported as such. With --prefix N a
graft of each entry's first N tokens is judged as well (journaled with the entries): under the schedule
that made its rows (a prefill of all the entry's tokens), and against a prefill of the N tokens alone;
its verdict counts in the release's."""


@audit_app.command("recompute", help=RECOMPUTE_HELP)
@handled
def recompute_cmd(
    release: ReleaseArg, model: ReleaseModelOpt = None, device: ReplayDeviceOpt = None, dtype: ReplayDtypeOpt = None,
    attn: ReplayAttnOpt = None, threads: ReplayThreadsOpt = None, require: RequireOpt = "exact", entry: EntriesOpt = None,
    probe: ProbeTextOpt = None, force: ForceOpt = False, chunk: ChunkOpt = None, one_shot: OneShotOpt = False,
    json_out: OutOpt = None, as_json: JsonOpt = False, quiet: QuietOpt = False,
    executor: ExecutorOpt = "local", ray_address: RayAddressOpt = None, ship: ShipOpt = False, workers: WorkersOpt = None,
    key: KeysOpt = None, identity: IdentityOpt = None, issuer: IssuerOpt = None, offline: OfflineOpt = False,
    oms_signature: OmsSignatureOpt = None, require_signature: RequireSignatureOpt = False,
    sample: SampleOpt = None, nonce: SampleNonceOpt = None, target_fraction: TargetFractionOpt = None,
    journal: JournalOpt = None, prefix: PrefixOpt = None,
) -> None:
    """`audit recompute` (RECOMPUTE_HELP): kvgraft.audit.single.recompute with these options, its result rendered."""
    from kvgraft.audit import single
    from kvgraft.execution.options import ExecutorOptions
    from kvgraft.inference.reapply import Conditions

    settings = single.RecomputeSettings(release, model, Conditions(device, dtype, attn, threads, chunk, one_shot), require,
                                        entry, probe, force, sample, nonce, target_fraction, journal, json_out, prefix)
    trust = Trust(key, identity, issuer, offline, oms_signature, require_signature)
    result = single.recompute(settings, policy=trust.policy, executor=ExecutorOptions(executor, ray_address, workers, ship),
                              load=load_model, progress=lambda: progress_bar(quiet), note=lambda m: say(m, error=True))
    if as_json:
        echo_json(result)
    elif not quiet:
        _render_recompute(result)
    exit_with(result["status"])


def _render_recompute(result: dict[str, Any]) -> None:
    from kvgraft.audit.checks.recompute import cost_line
    from kvgraft.audit.render_report import check_renderables
    from kvgraft.results.recompute import RecomputeResult
    from kvgraft.signing.verify import signature_sentence

    for r in check_renderables("recompute", result, out):
        out.print(r)
    line = cost_line(RecomputeResult.model_validate(result))
    if line:
        say(line)
    say(f"release signature: {signature_sentence(result.get('release_signature'))}")


@contextlib.contextmanager
def progress_bar(quiet: bool) -> Iterator[Callable[[dict[str, int]], None]]:
    """A bar over entries on stderr, with tokens/s over this run's recomputed tokens and the ETA they give."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    started = time.perf_counter()
    columns = (TextColumn("recomputing"), BarColumn(), MofNCompleteColumn(), TextColumn("entries"),
               TextColumn("{task.fields[rate]}"), TextColumn("{task.fields[eta]}"))
    with Progress(*columns, console=err, transient=True, disable=quiet) as bar:
        task = bar.add_task("recomputing", total=None, rate="", eta="")

        def tick(s: dict[str, int]) -> None:
            rate, eta = speed(s, time.perf_counter() - started)
            bar.update(task, completed=s["done"], total=s["total"], rate=rate, eta=eta)

        yield tick


def speed(s: dict[str, int], elapsed: float) -> tuple[str, str]:
    """(tokens/s, ETA) for the bar: the rate over tokens recomputed in this run (resumed ones took no time)."""
    now = s["tokens_done"] - s["tokens_resumed"]
    rate = now / elapsed if now and elapsed > 0 else 0.0
    left = s["tokens_total"] - s["tokens_done"]
    resumed = f" ({s['resumed']} resumed)" if s["resumed"] else ""
    return f"{rate:,.0f} tokens/s{resumed}", (f"ETA {_duration(left / rate)}" if rate else "ETA -")


def _duration(seconds: float) -> str:
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}" if s >= 3600 else f"{s // 60}:{s % 60:02d}"


SAMPLE_HELP = """Re-derive an audit's sample from the release's root digest and the nonce (kvgraft.sampling).

With --check, the sample a result or report records is derived again from this release and compared
(exit 0 when equal, 1 when not); with --nonce and --size, the sample is printed, one entry id a line.
Needs no model and no torch. The release is opened as `kvgraft verify` opens it, under the same trust
options (exit 1 for a wrong signer, a missing or stale signature); --check states what was checked of its
signature."""
CheckSampleOpt = Annotated[Path | None, typer.Option("--check", help="A recompute result or audit report: re-derive its "
                                                                     "sample from this release and compare.")]


@audit_app.command("sample", help=SAMPLE_HELP)
@handled
def sample_cmd(
    release: ReleaseArg, nonce: Annotated[str | None, typer.Option("--nonce", help="The auditor's nonce.")] = None,
    size: Annotated[int | None, typer.Option("--size", help="Sample size (with --nonce).")] = None,
    check: CheckSampleOpt = None, key: KeysOpt = None, identity: IdentityOpt = None, issuer: IssuerOpt = None,
    offline: OfflineOpt = False, oms_signature: OmsSignatureOpt = None, require_signature: RequireSignatureOpt = False,
) -> None:
    """`audit sample` (SAMPLE_HELP)."""
    from kvgraft import sampling
    from kvgraft._internal.jsonio import load_file
    from kvgraft.signing.verify import signature_sentence, signature_statement, verified

    # Opened as `kvgraft verify` opens it with the same options: signature, statement, manifest (no entry bytes).
    checked = held(verified(release, Trust(key, identity, issuer, offline, oms_signature, require_signature).policy()))
    rel = checked.release
    # Ids and token counts come from the manifest (the root binds them): no index shard is read.
    root, ids = str(rel.manifest["root_digest"]), rel.entry_ids()
    if check is None:
        if nonce is None or size is None:
            raise InputError("pass --nonce and --size, or --check RESULT.json")
        for drawn in sampling.drawn_ids(root, sampling.check_nonce(nonce), ids, size, option="--size"):
            say(drawn)
        return
    doc = load_file(check)
    recorded = _recorded_sample(doc, check)
    problems = sampling.check_sample(recorded, root, ids, rel.token_counts())
    if problems:
        say(f"kvgraft: {check}: sample NOT re-derived: " + "; ".join(problems), error=True)
        raise typer.Exit(1)
    say(f"sample re-derived: {recorded['size']:,} of {recorded['population']:,} entries from root {root} and nonce "
        f"{recorded['nonce']!r} ({recorded['method']}): identical; release signature: "
        f"{signature_sentence(signature_statement(checked.checked).model_dump(mode='json'))}")


def _recorded_sample(doc: Any, where: Path) -> JsonObject:
    """The sample a recompute result, or an audit report's recompute check, records."""
    if isinstance(doc, dict) and isinstance(doc.get("sample"), dict):
        return cast("JsonObject", doc["sample"])
    for c in doc.get("checks", []) if isinstance(doc, dict) else []:
        data = c.get("data") if isinstance(c, dict) else None
        if isinstance(data, dict) and c.get("kind") == "recompute" and isinstance(data.get("sample"), dict):
            return cast("JsonObject", data["sample"])
    raise InputError(f"{where}: records no sample (a recompute result or audit report from a sampled audit)")


@audit_app.command("claims")
@handled
def claims_cmd(
    claims_file: Annotated[Path, typer.Argument(
        metavar="CLAIMS", help="Claims TOML (format kvgraft-claims), e.g. audit/claims/*.toml.")],
    measured: Annotated[Path | None, typer.Option(
        "--measured", help="Measured-results JSON: keys named by each claim's `measure`.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON (schemas/claims.v1.json).")] = False,
) -> None:
    """Check claims for internal consistency and, with --measured, against measurements.

    Exit 0 when passed, 4 when failed (a claim is contradicted or inconsistent), 6 when incomplete (no claim
    could be judged), 2 on unusable input.
    """
    from kvgraft.audit import plan
    from kvgraft.audit.checks import run_check
    from kvgraft.audit.context import Context, absent
    from kvgraft.audit.single import silent

    # The claims check as `audit run` runs it (kvgraft.audit.checks.claims), against --measured instead of this
    # audit's recompute check; it reads no model and no release.
    settings: JsonObject = {"file": str(claims_file), "measured": None if measured is None else str(measured)}
    ctx = Context(plan.single("claims", settings), absent("model"), Path.cwd(), silent, absent("executor"),
                  absent("release"))
    result = run_check(ctx, "claims", settings, "claims check result").result
    if as_json:
        echo_json(result)
    else:
        from kvgraft.audit.render_report import claims_check_renderables

        for r in claims_check_renderables(result, out):
            out.print(r)
    exit_with(str(result["status"]))


@audit_app.command("determinism")
@handled
def determinism_cmd(
    model: ModelOpt = "smollm2-135m",
    length: Annotated[int, typer.Option("--length", help="Prefix length in tokens.")] = 300,
    gpu: Annotated[bool, typer.Option("--gpu/--no-gpu", help="Include CUDA conditions when a GPU is present.")] = True,
    json_out: OutOpt = None,
    as_json: JsonOpt = False,
) -> None:
    """Run one prefix under varied conditions and show which give byte-identical KV states.

    Exit 0 when the matrix ran (it describes, it fails nothing), 6 when fewer than two conditions ran.
    """
    from rich.progress import Progress

    from kvgraft._internal.jsonio import check_writable
    from kvgraft.audit import plan
    from kvgraft.audit.checks import run_check
    from kvgraft.audit.context import Context, absent
    from kvgraft.audit.render_report import check_renderables
    from kvgraft.audit.single import silent

    if json_out is not None:
        check_writable(json_out)
    # The determinism check as `audit run` runs it (kvgraft.audit.checks.determinism): it loads its own models.
    settings: JsonObject = {"length": length, "gpu": gpu}
    ctx = Context(plan.single("determinism", settings, model=model), absent("model"), Path.cwd(), silent,
                  absent("executor"), absent("release"))
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("conditions", total=None)
        result = run_check(ctx, "determinism", {**settings, "progress": lambda i, n: bar.update(task, completed=i,
                                                                                                  total=n)}).result
    if json_out:
        from kvgraft._internal.jsonio import write_json

        write_json(json_out, result)
    if as_json:
        echo_json(result)
    else:
        for r in check_renderables("determinism", result, out):
            out.print(r)
    exit_with(str(result["status"]))


@audit_app.command("kinds")
@handled
def kinds_cmd(as_json: JsonOpt = False) -> None:
    """List the check kinds installed (built-in and from the entry-point group kvgraft.check_kinds), in the order
    an audit runs them: each kind's name, the package that provides it and its version."""
    from kvgraft.audit.checks import installed

    found = installed()
    if as_json:
        echo_json({"kinds": [{"name": k.name, "package": k.package, "version": k.version} for k in found]})
        return
    width = max(len(k.name) for k in found)
    for k in found:
        out.print(f"{k.name:<{width}}  {k.package} {k.version or '(version unknown)'}", highlight=False)
