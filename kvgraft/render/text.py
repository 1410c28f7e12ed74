"""The renderers' shared vocabulary: status colours, one way to write a number, text that wraps and never truncates."""

from __future__ import annotations

import json
import re
import textwrap
import unicodedata
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from pydantic import BaseModel
from rich.console import Console, RenderableType
from rich.measure import Measurement
from rich.table import Table
from rich.text import Text

if TYPE_CHECKING:
    from kvgraft.inference.graft import Ledger

STATUS_STYLE = {"passed": "bold green", "failed": "bold red", "skipped": "yellow", "incomplete": "bold yellow"}
STATUS_MARK = {"passed": "✓", "failed": "✗", "skipped": "–", "incomplete": "?"}
VERDICT_STYLE = {
    "supported": "green", "consistent": "green", "contradicted": "bold red", "inconsistent": "bold red",
    "unsupported": "yellow", "not-testable": "cyan", "needs-measurement": "cyan", "byte-exact": "green",
}
WORDS = {**VERDICT_STYLE, **STATUS_STYLE}  # every word a renderer colours wherever it appears


def plain(text: object) -> str:
    """`text` as one printable line: control and format characters (newlines, ESC, bidi overrides)
    become visible escapes, so attacker-chosen names cannot add lines or drive the terminal. Markup is
    never interpreted either: the consoles print with markup off, and renderers build rich Text."""
    s = str(text)
    if s.isascii() and s.isprintable():  # the usual case, at C speed
        return s
    return "".join(_escape(c) if _hidden(c) else c for c in s)


def _hidden(c: str) -> bool:
    """A control, format (bidi overrides), separator (U+2028) or unassigned character: shown escaped."""
    return c != " " and unicodedata.category(c)[0] in "CZ"


def _escape(c: str) -> str:
    o = ord(c)
    return f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}"


_NOT_ASCII = re.compile("[\x7f-\U0010ffff]")  # json.dumps escapes the C0 controls itself


def json_text(doc: Any) -> str:
    """`doc` as indented JSON to print (every --json): text as it is, but each character `plain` escapes in text
    mode (C1 controls, bidi overrides, U+2028...) written as a JSON \\u escape. Such a character can only be
    inside a string there, where the escape stands for the same character: the document parses the same."""
    text = json.dumps(doc, indent=2, ensure_ascii=False)
    return _NOT_ASCII.sub(_json_escape, text)


def _json_escape(m: re.Match[str]) -> str:
    c = m.group()
    if not _hidden(c):
        return c
    o = ord(c)
    if o < 0x10000:
        return f"\\u{o:04x}"
    o -= 0x10000  # beyond the BMP: a UTF-16 surrogate pair, as JSON writes it
    return f"\\u{0xD800 + (o >> 10):04x}\\u{0xDC00 + (o & 0x3FF):04x}"


def plain_tree(doc: Any) -> Any:
    """A copy of a JSON document (a release's, a report's, a result's) with every string, keys included,
    made `plain`: what every renderer draws from, so no field it shows can add a line or an escape."""
    if isinstance(doc, str):
        return plain(doc)
    if isinstance(doc, dict):
        return {plain(k) if isinstance(k, str) else k: plain_tree(v) for k, v in doc.items()}
    if isinstance(doc, list):
        return [plain_tree(v) for v in doc]
    if isinstance(doc, tuple):
        return tuple(plain_tree(v) for v in doc)
    return doc


M = TypeVar("M", bound=BaseModel)


def plain_model(model: M) -> M:
    """A copy of a model with every string in it made `plain`, as plain_tree copies a document. Built without
    validating again: a string made plain may no longer match a pattern the original did (a digest or a date
    with a newline at its end, which a schema's `$` lets through)."""
    values = {name: _plain_value(getattr(model, name)) for name in type(model).model_fields}
    extra = {plain(k): _plain_value(v) for k, v in (model.model_extra or {}).items()}
    return model.model_construct(_fields_set=model.model_fields_set, **values, **extra)


def _plain_value(value: Any) -> Any:
    if isinstance(value, BaseModel):
        return plain_model(value)
    if isinstance(value, list):
        return [_plain_value(v) for v in value]
    return plain_tree(value)


def num(x: Any, spec: str | None = None) -> str:
    """The one way a report writes a number: integers with thousands separators; floats with four significant
    digits (separators from 1,000, exponent below 0.001, so a p-value or a KL keeps its magnitude); None as "-"."""
    if x is None:
        return "-"
    if isinstance(x, int) and not isinstance(x, bool):
        return f"{x:,}"
    if not isinstance(x, float):
        return str(x)
    if spec is not None:
        return format(x, spec)
    if x == 0 or 1e-3 <= abs(x) < 1e15:
        return f"{x:,.0f}" if abs(x) >= 1000 else f"{x:.4g}"
    return f"{x:.3g}"


def pct(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{100 * x:.{digits}f}%"


class KN(Protocol):
    """k of n (solved of asked)."""

    @property
    def k(self) -> int: ...

    @property
    def n(self) -> int: ...


def kn(a: KN | None) -> str:
    """k/n of an accuracy, "-" when it has no n."""
    return f"{a.k}/{a.n}" if a is not None and a.n else "-"


def ratio(k: int, n: int) -> str:
    """k/n, "-" when n is 0."""
    return f"{k}/{n}" if n else "-"


def hanging(label: str, value: str, width: int, *, indent: int = 2, label_width: int = 0) -> list[str]:
    """`label value` wrapped to `width`, continuation lines aligned under the value.

    A word longer than the room beside the label (a digest, a path) starts its own line further in, whole:
    ids are wrapped, never cut. A word longer than the whole line is cut into pieces, each on its own line
    under the same indent: a terminal that folded it would start a line at column 0 with whatever text
    a release put there.
    """
    head = " " * indent + (label.ljust(label_width) + " " if label or label_width else "")
    room = width - len(head)
    words = value.split()
    if room < 16 or any(len(w) > room for w in words):
        lines = [head.rstrip()] if head.strip() else []
        inner = " " * (indent + 2)
        return lines + _wrap(value, width, inner)
    wrapped = _wrap(value, width, " " * len(head))
    return [head + wrapped[0].lstrip(), *wrapped[1:]] if wrapped else [head.rstrip()]


def _wrap(value: str, width: int, prefix: str) -> list[str]:
    return textwrap.wrap(value, max(width, len(prefix) + 1), initial_indent=prefix, subsequent_indent=prefix,
                         break_long_words=True, break_on_hyphens=False) or [prefix.rstrip()]


def styled(lines: list[str], words: dict[str, str] | None = None, style: str = "") -> Text:
    """Lines as one Text; each word in `words` (a verdict, a status) in its style wherever it appears whole."""
    text = Text("\n".join(lines), style=style)
    for word, st in (words or {}).items():
        text.highlight_regex(rf"(?<![\w-]){word}(?![\w-])", st)
    return text


def natural_width(console: Console, renderable: RenderableType) -> int:
    """The width `renderable` takes unconstrained (Console.measure clamps to the console's width; measured
    against a wide one, it says what the renderable needs)."""
    return Measurement.get(console, console.options.update_width(1 << 16), renderable).maximum


def fitted(console: Console, table: Table, headers: list[str], rows: list[list[str]]) -> RenderableType:
    """The table when it fits the console at its natural width; else one paragraph per row, so no cell is cut.

    The paragraph names the row by its first cell and lists the others as `header value`.
    """
    if natural_width(console, table) <= console.width:
        return table
    lines: list[str] = []
    for row in rows:
        rest = "; ".join(f"{h} {v}" for h, v in zip(headers[1:], row[1:], strict=True) if v not in ("", "-"))
        lines += hanging(str(row[0]), rest, console.width, indent=0)
    return styled(([table.title] if isinstance(table.title, str) else []) + lines, WORDS)


def table(console: Console, title: str, headers: list[str], rows: list[list[str]],
          right: tuple[int, ...] = ()) -> RenderableType:
    """A table of strings that fits `console`, else its rows as paragraphs (see fitted); verdict words coloured."""
    t = Table(title=title or None, title_justify="left")
    for i, h in enumerate(headers):
        t.add_column(h, justify="right" if i in right else "left")
    for row in rows:
        t.add_row(*[styled([c], WORDS) for c in row])
    return fitted(console, t, headers, rows)


def kv_lines(width: int, title: str, rows: list[tuple[str, str]]) -> list[str]:
    """`label value` lines under a title, values aligned and wrapped (see hanging)."""
    label_width = min(max((len(k) for k, _ in rows), default=0), 28)
    out = [title] if title else []
    for k, v in rows:
        out += hanging(k, v, width, label_width=label_width)
    return out


def ledger_table(graft: Ledger) -> Table:
    """The token ledger of one graft (`kvgraft run`); its condition names and values come from the release."""
    ledger = plain_tree(graft)
    t = Table(title="token ledger", show_header=False, title_justify="left")
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("tokens restored from the graft", str(ledger["restored_tokens"]))
    if "prefix" in ledger:  # kvgraft run --prefix
        p = ledger["prefix"]
        t.add_row("prefix graft", f"{p['entry']}: {p['rows']}" if p else "no entry matched")
    t.add_row("prompt tokens prefilled", str(ledger["prompt_tokens"]))
    t.add_row("decode tokens", str(ledger["decode_tokens"]))
    t.add_row("KV bytes verified (the entry's, read whole)", f"{ledger['kv_bytes_verified']:,}")
    t.add_row("KV bytes grafted", f"{ledger['kv_bytes_grafted']:,}")
    t.add_row("restore / prefill / decode s",
              f"{ledger['restore_seconds']:.4f} / {ledger['prefill_seconds']:.4f} / {ledger['decode_seconds']:.4f}")
    if ledger.get("forced_model"):
        t.add_row(Text("model identity", style="red"), Text("differs (forced)", style="red"))
    for key, (was, now) in ledger.get("conditions_differing", {}).items():
        label = Text(key, style="yellow")
        label.append(" differs")
        t.add_row(label, Text(f"release {was} / now {now}"))
    return t
