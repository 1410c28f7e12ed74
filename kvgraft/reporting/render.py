"""Rich renderings shared by commands."""

from __future__ import annotations

from typing import Any

from rich.table import Table


def ledger_table(ledger: dict[str, Any]) -> Table:
    t = Table(title="token ledger", show_header=False, title_justify="left")
    t.add_column("what")
    t.add_column("value", justify="right")
    t.add_row("tokens restored from the graft", str(ledger["restored_tokens"]))
    t.add_row("prompt tokens prefilled", str(ledger["prompt_tokens"]))
    t.add_row("decode tokens", str(ledger["decode_tokens"]))
    t.add_row("KV bytes restored (verified)", f"{ledger['kv_bytes_restored']:,}")
    t.add_row("restore / prefill / decode s",
              f"{ledger['restore_seconds']:.4f} / {ledger['prefill_seconds']:.4f} / {ledger['decode_seconds']:.4f}")
    if ledger.get("forced_model"):
        t.add_row("[red]model identity[/]", "[red]differs (forced)[/]")
    for key, (was, now) in ledger.get("conditions_differing", {}).items():
        t.add_row(f"[yellow]{key}[/] differs", f"release {was} / now {now}")
    return t
