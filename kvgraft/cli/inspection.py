"""`inspect`: a release's header, signature files (named, not verified), entries table, or one entry in detail.

Every string from the release is data: it goes into rich Text objects (never markup) through `plain`, which
shows control characters as escapes, so a hostile id or text cannot add lines or drive the terminal.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable, Iterator
from typing import TYPE_CHECKING, Annotated

import typer
from rich.console import Console, RenderableType
from rich.table import Table
from rich.text import Text

from kvgraft.cli._base import EXIT_INTERNAL, RELEASE_HELP, app, echo_json, handled, out
from kvgraft.errors import Error
from kvgraft.render.text import fitted, hanging, json_text, kv_lines, natural_width, num, plain

if TYPE_CHECKING:
    from kvgraft.results.base import JsonObject
    from kvgraft.results.inspect import EntryInspection, Listing, Page, Row, Signature

# The narrowest "first words" column worth showing; narrower, the entries are listed as paragraphs.
MIN_PREVIEW = 16

# Rows of an entry's layers and tensors tables: rich lays out a row in 1-2 ms, so two tables of this many
# stay well under a second (a 64-layer model's 128 tensors are shown whole); `--json` lists more.
SHOWN_ROWS = 128


@app.command("inspect")
@handled
def inspect_cmd(
    release: Annotated[str, typer.Argument(metavar="RELEASE", help=RELEASE_HELP)],
    entry: Annotated[str | None, typer.Argument(
        metavar="ENTRY", help="Show this entry in detail: layers, tensors, shapes, digests.")] = None,
    limit: Annotated[int, typer.Option("--limit", help="Entries to list (0: all).")] = 20,
    offset: Annotated[int, typer.Option("--offset", help="Skip this many entries first.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print the inspection as JSON (schemas/inspect-result.v1.json).")]
    = False,
) -> None:
    """Show what a release holds without verifying it: model, identity, schedule, environment, signature files
    and whom they name, and its entries; reads the manifest only, no tensor bytes. `kvgraft verify` checks it."""
    from kvgraft import inspection

    try:
        _inspect(release, entry, limit, offset, as_json)
    except Exception as exc:
        if as_json:  # as `verify --json`: the document and the exit status come from the same value
            code, text = ((exc.exit_code, exc.diagnostics()) if isinstance(exc, Error)
                          else (EXIT_INTERNAL, f"internal error: {type(exc).__name__}: {exc}"))
            echo_json(inspection.failure(release, text, code).as_json())
        raise


def _inspect(release: str, entry: str | None, limit: int, offset: int, as_json: bool) -> None:
    from kvgraft import inspection

    if entry is not None:
        detail = inspection.inspect_entry(release, entry)
        if as_json:
            echo_json(detail.as_json())
            return
        for r in entry_renderables(detail, out):
            out.print(r)
        return
    # The rows are printed as they are read: listing every entry holds a few index shards, not every record.
    doc, rows = inspection.listing(release, offset=offset, limit=limit or None)
    if as_json:
        echo_streamed(doc, rows)
        return
    for r in renderables(doc, rows, out):
        out.print(r)


def echo_streamed(doc: Listing, rows: Iterator[Row]) -> None:
    """Print `doc` with `rows` as its entries' rows, the text echo_json gives (render.json_text: hidden
    characters escaped). Each row is made into text as it is read (one index shard held at a time; a row's
    text is a few hundred bytes) and nothing is printed until the last is: a shard refused midway leaves
    stdout empty, never half a document."""
    marker = "\x00rows"  # split at its last occurrence: the rows are the document's last member, after any text
    whole = doc.as_json()
    entries = whole["entries"]
    assert isinstance(entries, dict)
    head, tail = json_text({**whole, "entries": {**entries, "rows": marker}}).rsplit(json.dumps(marker), 1)
    texts = [json_text(row.as_json()).replace("\n", "\n      ") for row in rows]
    body = "[\n      " + ",\n      ".join(texts) + "\n    ]" if texts else "[]"
    typer.echo(head + body + tail)


def _lines(width: int, title: str, rows: list[tuple[str, str]]) -> Text:
    return Text("\n".join(kv_lines(width, title, [(k, plain(v)) for k, v in rows])))


def _signer(s: Signature) -> str:
    if s.problem and not s.method:
        return f"cannot be read: {s.problem}"
    if s.method == "key":
        from kvgraft.signing.keys import KEY_ID_IS

        who = f"key {s.signer} ({KEY_ID_IS})" if s.signer else "a key it does not name"
    else:
        who = f"{s.signer or '?'} via {s.issuer or '?'} (Sigstore certificate)"
    named = s.names_this_manifest
    stmt = "" if named is None else ("; its statement names this manifest's root digest" if named
                                     else "; its statement names ANOTHER root digest (stale or foreign)")
    return f"{s.what}, names {who}{stmt}; NOT verified" + (f"; {s.problem}" if s.problem else "")


def _object(value: object) -> JsonObject:
    """A member of the header that the manifest's schema says is an object (cut to size, still an object)."""
    return value if isinstance(value, dict) else {}


def header_renderables(doc: Listing, console: Console) -> list[RenderableType]:
    m, env, sched = doc.model, doc.environment, doc.schedule
    ident = _object(m["identity"])
    mode = "one-shot" if sched.get("chunk_tokens") is None else f"chunks of {sched['chunk_tokens']} tokens"
    rows = [
        ("release", doc.release), ("root digest", doc.root_digest),
        ("created", f"{doc.created} by kvgraft {doc.release_format.kvgraft_version} "
                    f"(format {doc.release_format.version})"),
        ("model", f"{m['spec']} ({m['architecture']}, {m['model_type']}, {m['num_hidden_layers']} layers)"),
        ("model identity", str(ident["sha256"])),
        ("weights", f"{ident['weights_sha256']} ({num(ident['num_tensors'])} tensors, "
                      f"{num(ident['num_parameters'])} parameters)"),
        ("tokenizer", str(ident["tokenizer_sha256"])), ("config", str(ident["config_sha256"])),
        ("schedule", f"{mode}, batch {sched['batch_size']}, special tokens "
                     + ("added" if sched["add_special_tokens"] else "not added")
                     + (", generation prompt" if sched.get("add_generation_prompt") else "")),
        ("environment", f"{env['device']} ({env['device_name']}), {env['dtype']}, {env['attn_implementation']}, "
                        f"{num(env['threads'])} thread{'' if env['threads'] == 1 else 's'}, deterministic "
                        + ("on" if env["deterministic_algorithms"] else "off")),
        ("versions", f"python {env['python']}, torch {env['torch']}, transformers {env['transformers']}, "
                       f"kvgraft {env['kvgraft']}, {env['platform']}"),
    ]
    rows += [(f"signature {s.file}", _signer(s)) for s in doc.signatures] or [("signature", "none: the release is unsigned")]
    out: list[RenderableType] = [_lines(console.width, "", rows)]
    out.append(Text("\n".join(hanging("", doc.note, console.width, indent=0)), style="yellow"))
    return out


def entries_renderable(e: Page, page: list[Row], console: Console, *, titled: bool = True) -> RenderableType:
    """A block of the entries table (`page`), titled with where it lies among the release's entries (`e`)."""
    first, last = e.offset + 1, e.offset + e.shown
    title = (f"entries {first}-{last} of {num(e.total)}" if e.shown else
             f"no entries shown (offset {e.offset} of {num(e.total)})") if titled else None
    headers = ["id", "tokens", "bytes", "source", "first words"]
    rows = [[plain(r.id), num(r.num_tokens), num(r.bytes), plain(r.source_kind), plain(r.preview)] for r in page]

    def table(preview_width: int | None) -> Table:
        t = Table(title=title, title_justify="left", show_header=titled)
        for i, h in enumerate(headers[:-1]):
            t.add_column(h, justify="right" if i in (1, 2) else "left")
        t.add_column(headers[-1], no_wrap=True, overflow="ellipsis", max_width=preview_width)
        for row in rows:
            t.add_row(*[Text(c) for c in row])
        return t

    # The first words are only a preview: cut to the terminal's width (…) rather than lose the table.
    t, spare = table(None), console.width - natural_width(console, table(1)) + 1
    if natural_width(console, t) > console.width and spare >= MIN_PREVIEW:
        t = table(spare)
    return fitted(console, t, headers, rows)


BLOCK_ROWS = 1000  # rows laid out as one table: a listing of every entry is printed a block at a time


def renderables(doc: Listing, rows: Iterable[Row], console: Console) -> Iterator[RenderableType]:
    """The whole inspection: header, signatures, entries (`rows`, consumed a block at a time); the command to
    page on when more remain."""
    yield from header_renderables(doc, console)
    it = iter(rows)
    block = list(itertools.islice(it, BLOCK_ROWS))
    yield entries_renderable(doc.entries, block, console)
    while block := list(itertools.islice(it, BLOCK_ROWS)):
        yield entries_renderable(doc.entries, block, console, titled=False)
    e = doc.entries
    rest = e.total - e.offset - e.shown
    if rest > 0:
        yield Text(f"{num(rest)} more: --offset {e.offset + e.shown}; one entry in detail: "
                   "kvgraft inspect RELEASE ID", style="dim")


def entry_renderables(doc: EntryInspection, console: Console) -> list[RenderableType]:
    """One entry: its file and digests, source, tokens, then its layers and tensors."""
    e = doc.entry
    src = e.source
    rows = [("entry", e.id), ("release", doc.release), ("root digest", doc.root_digest),
            ("tokens", f"{num(e.num_tokens)} (token ids sha256 {e.token_ids_sha256})"),
            ("first token ids", ", ".join(str(t) for t in e.token_ids_head)
             + (", …" if e.num_tokens > len(e.token_ids_head) else "")),
            ("file", f"{e.file}: {num(e.bytes)} bytes, sha256 {e.file_sha256}"),
            ("tensor bytes", num(e.tensor_bytes)), ("entry digest", e.digest),
            ("source", f"{src.kind}, sha256 {src.sha256}"),
            ("next token", f"argmax {e.next_token['argmax']}, logits sha256 {e.next_token['logits_sha256']}"),
            ("probe tokens", num(e.probe_tokens))]
    if "answer" in e.model_fields_set:
        rows.append(("answer", str(e.answer) + (" …(cut for display)" if e.answer_truncated else "")))
    if src.text is not None:
        rows.append(("text", src.text + (" …(cut for display)" if src.truncated else "")))
    elif src.messages is not None:
        rows.append(("messages", f"{src.messages} messages; first: {e.preview}"))
    out: list[RenderableType] = [_lines(console.width, "", rows)]
    lt = Table(title=f"layers ({num(e.layers_total)})", title_justify="left")
    lheads = ["layer", "kind", "keys", "values", "positions", "window / seen / shared with"]
    for i, h in enumerate(lheads):
        lt.add_column(h, justify="right" if i == 0 else "left")
    lrows = []
    for layer in e.layers[:SHOWN_ROWS]:
        pos = layer.get("positions")
        extra = " / ".join(str(layer[k]) if k in layer else "-" for k in ("sliding_window", "cumulative_length", "shared_with"))
        lrows.append([str(layer["index"]), plain(str(layer["kind"])), plain(str(layer.get("keys", "-"))),
                      plain(str(layer.get("values", "-"))),
                      f"[{pos[0]}, {pos[1]})" if isinstance(pos, list) and len(pos) == 2 else "-", extra])
    for row in lrows:
        lt.add_row(*[Text(c) for c in row])
    out.append(fitted(console, lt, lheads, lrows))
    out += _more(e.layers_total - len(lrows), "layers")
    tt = Table(title=f"tensors ({num(e.tensors_total)})", title_justify="left")
    theads = ["tensor", "dtype", "shape", "bytes", "sha256"]
    for i, h in enumerate(theads):
        tt.add_column(h, justify="right" if i == 3 else "left", overflow="fold")
    trows = [[plain(t.name), t.dtype, "×".join(str(s) for s in t.shape), num(t.bytes), t.sha256]
             for t in e.tensors[:SHOWN_ROWS]]
    for row in trows:
        tt.add_row(*[Text(c) for c in row])
    out.append(fitted(console, tt, theads, trows))
    out += _more(e.tensors_total - len(trows), "tensors (by position in the file)")
    out.append(Text("\n".join(hanging("", doc.note, console.width, indent=0)), style="yellow"))
    return out


def _more(rest: int, what: str) -> list[RenderableType]:
    """The line under a table cut at SHOWN_ROWS rows."""
    from kvgraft.inspection import DETAIL_ROWS

    return [Text(f"… {num(rest)} more {what} not shown (--json lists up to {num(DETAIL_ROWS)})", style="dim")] \
        if rest > 0 else []
