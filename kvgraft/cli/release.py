"""Commands on releases: capture and run (graft + continue)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from kvgraft.cli._base import (
    AttnOpt,
    DeviceOpt,
    DtypeOpt,
    ModelOpt,
    ReleaseArg,
    ReleaseModelOpt,
    app,
    echo_json,
    err,
    handled,
    load_model,
    model_progress,
    out,
    say,
)
from kvgraft.cli.trust import IdentityOpt, IssuerOpt, KeysOpt, OfflineOpt, RequireSignatureOpt, Trust
from kvgraft.errors import InputError
from kvgraft.render.text import plain

if TYPE_CHECKING:
    from kvgraft.inference.graft import Ledger


@app.command()
@handled
def capture(
    source: Annotated[Path, typer.Argument(metavar="SOURCE", help='JSONL records {"id", "text"} or {"id", "messages"}.')],
    out_dir: Annotated[Path, typer.Option("--out", "-o", help="Release folder to create.")],
    model: ModelOpt = "smollm2-135m",
    device: DeviceOpt = "auto",
    dtype: DtypeOpt = "float32",
    attn: AttnOpt = "sdpa",
    chunk: Annotated[int | None, typer.Option("--chunk", help="Prefill in chunks of N tokens (default one-shot).")] = None,
    probe: Annotated[int, typer.Option("--probe", help="Greedy probe tokens recorded per entry.")] = 8,
    overwrite: Annotated[bool, typer.Option("--overwrite", help="Replace an existing release.")] = False,
    sliding: Annotated[str, typer.Option("--sliding-layers", help="What sliding-window layers store: window (the "
                                                                  "positions the model keeps) or all (every position; "
                                                                  "needed for prefix grafts).")] = "window",
) -> None:
    """Capture KV states of each record into a cache release."""
    from rich.progress import Progress

    from kvgraft.inference.models import check_options

    check_options(device=device, dtype=dtype, attn=attn)  # before torch is imported
    from kvgraft._internal.jsonio import check_writable, refuse_existing
    from kvgraft.inference.capture import SLIDING_LAYOUTS, read_records
    from kvgraft.inference.capture import capture as do_capture
    from kvgraft.inference.runtime import Schedule

    if sliding not in SLIDING_LAYOUTS:
        raise InputError(f"--sliding-layers {sliding}: expected one of {', '.join(SLIDING_LAYOUTS)}")
    records = read_records(source)
    refuse_existing(out_dir, overwrite)  # before the model loads, not after
    check_writable(out_dir)
    lm = load_model(model, device, dtype, attn)
    with Progress(console=err, transient=True) as bar:
        task = bar.add_task("capturing", total=len(records))
        manifest = do_capture(lm, records, out_dir, schedule=Schedule(chunk_tokens=chunk), probe_tokens=probe,
                              overwrite=overwrite, progress=lambda i, n: bar.update(task, completed=i),
                              sliding=sliding)
    tokens = sum(e["num_tokens"] for e in manifest["entries"])  # the writer's whole-release document
    out.print(f"captured {len(manifest['entries'])} entries, {tokens} tokens → {out_dir}")
    out.print(f"root digest {manifest['root_digest']}")


RUN_HELP = """Check the release, graft a stored cache, then continue greedily; print the continuation and token ledger.

Checks what opening a release checks (its signature under --key or a Sigstore identity, the
statement, manifest.json and the index: docs/verification.md), then the grafted entry's file: its
size, header and every tensor's SHA-256 as it is read. Other entries' files are not read: `kvgraft
verify` checks every file. Replays the release's recorded dtype and attention kernel unless --dtype or --attn says otherwise,
as `audit recompute` does, and says which recorded conditions differ here. With --prefix it says
which entry's first N tokens it grafted and the schedule of those rows (a prefill of all the
entry's tokens), or that nothing matched and the whole prompt was prefilled."""
EntryOpt = Annotated[str | None, typer.Option("--entry", "-e", help="Entry id to graft.")]
PromptOpt = Annotated[str, typer.Option("--prompt", "-p", help="Text to feed after the grafted prefix (with --prefix: the "
                                                                "whole prompt).")]
PrefixOpt = Annotated[bool, typer.Option("--prefix", help="Instead of --entry: graft the longest block-aligned prefix of the "
                                                          "prompt that some entry starts with, prefill the rest.")]
MaxNewTokensOpt = Annotated[int, typer.Option("--max-new-tokens", "-n", help="Decode at most N tokens after the graft (0: "
                                                                              "graft only).")]
RecordedDtypeOpt = Annotated[str | None, typer.Option("--dtype", help="float32, bfloat16 or float16 (default: the release's "
                                                                      "recorded dtype).")]
RecordedAttnOpt = Annotated[str | None, typer.Option("--attn", help="eager or sdpa (default: the release's recorded attention "
                                                                    "kernel).")]
ForceOpt = Annotated[bool, typer.Option("--force", help="Graft even into a model with another identity.")]


@app.command("run", help=RUN_HELP)
@handled
def run_cmd(
    release: ReleaseArg, entry: EntryOpt = None, prompt: PromptOpt = "", prefix: PrefixOpt = False,
    max_new_tokens: MaxNewTokensOpt = 64, model: ReleaseModelOpt = None, device: DeviceOpt = "auto",
    dtype: RecordedDtypeOpt = None, attn: RecordedAttnOpt = None, force: ForceOpt = False, key: KeysOpt = None,
    identity: IdentityOpt = None, issuer: IssuerOpt = None, offline: OfflineOpt = False,
    require_signature: RequireSignatureOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """`kvgraft run` (RUN_HELP): kvgraft.inference.run.run with these options, its continuation and ledger shown."""
    from kvgraft.inference.reapply import Conditions
    from kvgraft.inference.run import RunSettings, run

    settings = RunSettings(release, entry, prompt, prefix, max_new_tokens, model, Conditions(device, dtype, attn), force)
    trust = Trust(key, identity, issuer, offline, require_signature=require_signature)
    checked, result = run(settings, trust.policy, progress=model_progress)
    for warning in checked.warnings:  # after success: a failed run prints its one error line only
        say(f"kvgraft: note: {warning}", error=True)
    from kvgraft.inference.reapply import summary

    say(f"kvgraft: note: conditions: {summary(result.ledger['conditions'])}", error=True)
    if prefix:
        say(f"kvgraft: note: {prefix_words(result.ledger)}", error=True)
    if as_json:
        hit = result.ledger.get("prefix")
        grafted = entry if not prefix else hit["entry"] if hit else None
        echo_json({"entry": grafted, "token_ids": result.token_ids, "text": result.text, "ledger": result.ledger})
        return
    from kvgraft.render.text import ledger_table

    # The continuation's own lines, each shown as text (model output can hold ESC or other controls).
    out.print("\n".join(plain(line) for line in result.text.split("\n")))
    out.print(ledger_table(result.ledger))


def prefix_words(ledger: Ledger) -> str:
    """What `kvgraft run --prefix` grafted, in one line (the ledger's `prefix`)."""
    p = ledger.get("prefix")
    if not p:
        return f"prefix graft: no entry starts with the prompt's first block; {ledger['prompt_tokens']} tokens prefilled"
    return (f"prefix graft: entry {plain(str(p['entry']))!r}, its first {p['tokens']} of {p['of']} tokens ({p['rows']}); "
            f"{ledger['prompt_tokens']} prompt tokens prefilled after them")
