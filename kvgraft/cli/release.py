"""Commands on releases: capture and run (graft + continue)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any

import typer

from kvgraft.cli._base import (
    RELEASE_HELP,
    AttnOpt,
    DeviceOpt,
    DtypeOpt,
    IdentityOpt,
    IssuerOpt,
    KeysOpt,
    ModelOpt,
    OfflineOpt,
    ReleaseModelOpt,
    RequireSignatureOpt,
    app,
    echo_json,
    err,
    handled,
    held,
    load_model,
    out,
    say,
)
from kvgraft.errors import InputError
from kvgraft.render.text import plain


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


@app.command("run")
@handled
def run_cmd(
    release: Annotated[str, typer.Argument(metavar="RELEASE", help=RELEASE_HELP)],
    entry: Annotated[str | None, typer.Option("--entry", "-e", help="Entry id to graft.")] = None,
    prompt: Annotated[str, typer.Option("--prompt", "-p", help="Text to feed after the grafted prefix (with --prefix: "
                                                               "the whole prompt).")] = "",
    prefix: Annotated[bool, typer.Option("--prefix", help="Instead of --entry: graft the longest block-aligned prefix "
                                                          "of the prompt that some entry starts with, prefill the "
                                                          "rest.")] = False,
    max_new_tokens: Annotated[int, typer.Option("--max-new-tokens", "-n", help="Decode at most N tokens after the "
                                                                               "graft (0: graft only).")] = 64,
    model: ReleaseModelOpt = None,
    device: DeviceOpt = "auto",
    dtype: Annotated[str | None, typer.Option("--dtype", help="float32, bfloat16 or float16 (default: the release's "
                                                              "recorded dtype).")] = None,
    attn: Annotated[str | None, typer.Option("--attn", help="eager or sdpa (default: the release's recorded attention "
                                                            "kernel).")] = None,
    force: Annotated[bool, typer.Option("--force", help="Graft even into a model with another identity.")] = False,
    key: KeysOpt = None,
    identity: IdentityOpt = None,
    issuer: IssuerOpt = None,
    offline: OfflineOpt = False,
    require_signature: RequireSignatureOpt = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the result as JSON.")] = False,
) -> None:
    """Check the release, graft a stored cache, then continue greedily; print the continuation and token ledger.

    Checks what opening a release checks (its signature under --key or a Sigstore identity, the
    statement, manifest.json and the index: docs/verification.md), then the grafted entry's file: its
    size, header and every tensor's SHA-256 as it is read. Other entries' files are not read: `kvgraft
    verify` checks every file. Replays the release's recorded dtype and attention kernel unless --dtype or --attn says otherwise,
    as `audit recompute` does, and says which recorded conditions differ here. With --prefix it says
    which entry's first N tokens it grafted and the schedule of those rows (a prefill of all the
    entry's tokens), or that nothing matched and the whole prompt was prefilled.
    """
    from kvgraft.inference.models import check_options

    # Refused before anything heavy is imported (torch alone takes seconds): a typo costs nothing.
    check_options(device=device, dtype=dtype, attn=attn)
    if max_new_tokens < 0:
        raise InputError(f"--max-new-tokens {max_new_tokens}: expected 0 or more")
    from kvgraft.inference import graft, reapply
    from kvgraft.inference.models import for_release
    from kvgraft.signing.policy import keys_policy
    from kvgraft.signing.sigstore import SigstoreTrust
    from kvgraft.signing.verify import verified

    # Verified before the model loads: a release verify refuses costs no model load, and grafts nothing.
    policy = keys_policy(key, identity=identity, issuer=issuer, trust=SigstoreTrust(offline=offline),
                         require_signature=require_signature)
    if prefix == (entry is not None):
        raise InputError("name an entry to graft (--entry), or graft the prompt's longest prefix (--prefix): one of them")
    checked = held(verified(release, policy))
    rel = checked.release
    if entry is not None:
        rel.entry(entry)  # an unknown entry is refused before the model loads
    else:
        graft.check_prefix_usable(rel)  # so is a release no prefix can be grafted from
    spec = for_release(rel.manifest["model"], model, force=force)
    _, dt, at = reapply.load_options(rel.manifest["environment"], device=device, dtype=dtype, attn=attn)
    lm = load_model(spec, device, dt, at)
    result = graft.run(checked, entry, lm, prompt, max_new_tokens=max_new_tokens, force=force,
                       attn=attn, dtype=dtype, prefix=prefix)
    for warning in checked.warnings:  # after success: a failed run prints its one error line only
        say(f"kvgraft: note: {warning}", error=True)
    say(f"kvgraft: note: conditions: {reapply.summary(result.ledger['conditions'])}", error=True)
    if prefix:
        say(f"kvgraft: note: {prefix_words(result.ledger)}", error=True)
    if as_json:
        grafted = entry if not prefix else (result.ledger["prefix"] or {}).get("entry")
        echo_json({"entry": grafted, "token_ids": result.token_ids, "text": result.text, "ledger": result.ledger})
        return
    from kvgraft.render.text import ledger_table

    # The continuation's own lines, each shown as text (model output can hold ESC or other controls).
    out.print("\n".join(plain(line) for line in result.text.split("\n")))
    out.print(ledger_table(result.ledger))


def prefix_words(ledger: dict[str, Any]) -> str:
    """What `kvgraft run --prefix` grafted, in one line (the ledger's `prefix`)."""
    p = ledger.get("prefix")
    if not p:
        return f"prefix graft: no entry starts with the prompt's first block; {ledger['prompt_tokens']} tokens prefilled"
    return (f"prefix graft: entry {plain(str(p['entry']))!r}, its first {p['tokens']} of {p['of']} tokens ({p['rows']}); "
            f"{ledger['prompt_tokens']} prompt tokens prefilled after them")
