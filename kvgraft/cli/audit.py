"""Audit commands: recompute and determinism."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvgraft.cli._base import ModelOpt, audit_app, err, exit_with, handled, load_model, out

if TYPE_CHECKING:
    from kvgraft.executor import Executor

ExecutorOpt = Annotated[str, typer.Option("--executor", help="local: this process; ray: Ray actors that each hold the "
                                                             "model (a local Ray instance, or the cluster of --ray-address).")]
RayAddressOpt = Annotated[str | None, typer.Option("--ray-address", help="Ray cluster to join (default: $RAY_ADDRESS, else "
                                                                         "start a local Ray instance).")]
ShipOpt = Annotated[bool, typer.Option("--ship", help="Ship the release to the Ray workers through the object store "
                                                      "(default: they read it from the same path).")]
WorkersOpt = Annotated[int | None, typer.Option("--workers", help="Ray workers (default: one per GPU, else one per CPU).")]


def make_executor(kind: str, model: str, device: str, dtype: str, attn: str, *, address: str | None, workers: int | None,
                  ship: bool, threads: int | None = None) -> Executor:
    from kvgraft.executor import ModelSpec, from_options

    return from_options(kind, ModelSpec(model, device, dtype, attn, threads), address=address, workers=workers, ship=ship)


@audit_app.command("recompute")
@handled
def recompute_cmd(
    release: Annotated[Path, typer.Argument(help="Cache release folder.")],
    model: ModelOpt = "smollm2-135m",
    device: Annotated[str | None, typer.Option("--device", help="cpu or cuda (default: the recorded one where this "
                                                                "machine has it).")] = None,
    dtype: Annotated[str | None, typer.Option("--dtype", help="Override the recorded dtype.")] = None,
    attn: Annotated[str | None, typer.Option("--attn", help="Override the recorded attention kernel (eager, sdpa).")] = None,
    threads: Annotated[int | None, typer.Option("--threads", help="Override the recorded torch thread count.")] = None,
    require: Annotated[str, typer.Option("--require", help="exact: every entry byte-exact (the preprint's claim); "
                                                           "consistent: byte-exact or inside the measured noise "
                                                           "envelope.")] = "exact",
    entry: Annotated[list[str] | None, typer.Option("--entry", "-e", help="Audit only these entries.")] = None,
    probe: Annotated[str | None, typer.Option("--probe", help="Probe text (default: the entry's recorded probe tokens).")]
    = None,
    force: Annotated[bool, typer.Option("--force", help="Compare even with a model of another identity.")] = False,
    chunk: Annotated[int | None, typer.Option("--chunk", help="Recompute in chunks of N (overrides the recorded schedule).")]
    = None,
    one_shot: Annotated[bool, typer.Option("--one-shot", help="Recompute one-shot (overrides the recorded schedule).")]
    = False,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the result as JSON to this file.")] = None,
    quiet: Annotated[bool, typer.Option("--quiet", "-q")] = False,
    executor: ExecutorOpt = "local",
    ray_address: RayAddressOpt = None,
    ship: ShipOpt = False,
    workers: WorkersOpt = None,
    key: Annotated[Path | None, typer.Option("--key", "-k", help="PEM public key the release's signature must verify with.")]
    = None,
    require_signature: Annotated[bool, typer.Option(
        "--require-signature", help="Refuse a release that is unsigned or whose signature is not checked.")] = False,
) -> None:
    """Recompute fresh KV states and compare them with the release, bit for bit, by KL and by envelope.

    Replays the recorded conditions (device where present, dtype, attention, threads, deterministic
    flags, schedule); options override one and are recorded as overrides. Each entry is byte-exact,
    consistent (inside the noise envelope measured here) or inconsistent. Exit 0 when the --require
    is met, 4 when not, 3 for a model of another identity, 2 when the release cannot be read (or, with
    --executor ray, when entries could not be run), 1 when stored bytes do not match their commitments.
    """
    from rich.progress import Progress

    from kvgraft import recompute, replay
    from kvgraft.verify import VerifyPolicy, verified

    recompute.check_requirement(require)
    # Verified as `kvgraft verify` does, before any model loads (recompute.audit keeps this verification).
    rel = verified(release, VerifyPolicy(key=key, require_signature=require_signature))
    override = replay.schedule_override(rel.manifest["schedule"], chunk=chunk, one_shot=one_shot)
    recorded = rel.manifest["environment"]
    dev, dt, at = replay.load_options(recorded, device=device, dtype=dtype, attn=attn)
    overrides = replay.overrides_given(recorded, device=device, dtype=dtype, attn=attn, threads=threads)
    n_threads = replay.thread_count(recorded, dev, threads=threads, executor=executor)
    with make_executor(executor, model, dev, dt, at, address=ray_address, workers=workers, ship=ship,
                       threads=n_threads) as ex:
        lm = ex.model(lambda: load_model(model, dev, dt, at))
        with Progress(console=err, transient=True, disable=quiet) as bar:
            n = len(entry) if entry else len(rel.entries)
            task = bar.add_task("recomputing", total=n)
            result = recompute.audit(rel, lm, entries=entry, probe_text=probe, force=force, schedule=override,
                                     progress=lambda i, _n: bar.update(task, completed=i), executor=ex,
                                     overrides=overrides, require=require)
    from kvgraft.verdict import seal

    seal("recompute", result)
    if json_out:
        from kvgraft._internal.jsonio import write_json

        write_json(json_out, result)
    if not quiet:
        from kvgraft.reporting.render_report import check_renderables

        for r in check_renderables("recompute", result, out):
            out.print(r)
    exit_with(result["status"])


@audit_app.command("determinism")
@handled
def determinism_cmd(
    model: ModelOpt = "smollm2-135m",
    length: Annotated[int, typer.Option("--length", help="Prefix length in tokens.")] = 300,
    gpu: Annotated[bool, typer.Option("--gpu/--no-gpu", help="Include CUDA conditions when a GPU is present.")] = True,
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the matrix as JSON to this file.")] = None,
) -> None:
    """Run one prefix under varied conditions and show which give byte-identical KV states.

    Exit 0 when the matrix ran (it describes, it fails nothing), 6 when fewer than two conditions ran.
    """
    from rich.progress import Progress

    from kvgraft import determinism
    from kvgraft.reporting.render_report import check_renderables

    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("conditions", total=None)
        result = determinism.matrix(model, length=length, include_gpu=gpu,
                                    progress=lambda i, n: bar.update(task, completed=i, total=n))
    if json_out:
        from kvgraft._internal.jsonio import write_json

        write_json(json_out, result)
    for r in check_renderables("determinism", result, out):
        out.print(r)
    exit_with(result["status"])
