"""`kvgraft run --prefix`: the longest block-aligned prefix of the prompt that an entry starts with is
grafted, the rest prefilled; what was grafted and the schedule of its rows are reported.
Hit, partial and miss on the transformers path."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release import index as release_index
from kvgraft.signing.policy import SignatureNotChecked
from kvgraft.signing.verify import VerifiedRelease, verified

runner = CliRunner()
TEXT = " ".join(f"w{i}" for i in range(50))
B = release_index.BLOCK_TOKENS


def _release(tiny_lm: Any, tmp_path: Path) -> VerifiedRelease:
    from kvgraft.inference import capture

    capture.capture(tiny_lm("llama"), [("t", {"id": "long", "text": TEXT})], tmp_path / "rel", probe_tokens=0)
    return verified(tmp_path / "rel", SignatureNotChecked())


def _run(tiny_dir: Any, rel: Path, *args: str, env: dict[str, str] | None = None) -> Any:
    return runner.invoke(app, ["run", str(rel), "--model", str(tiny_dir("llama")), "-n", "4", *args], env=env)


def test_run_prefix_hit_grafts_the_longest_prefix(tiny_dir: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """The prompt is the entry's text and more: its longest block-aligned prefix is grafted; the
    continuation is what rows [0, n) of a fresh prefill of the entry (the recorded schedule) give."""
    import torch

    from kvgraft.inference.runtime import Schedule, decode, encode, eos_ids, forward, prefill

    rel = _release(tiny_lm, tmp_path)
    lm = tiny_lm("llama")
    prompt = TEXT + " and then some more words"
    res = _run(tiny_dir, tmp_path / "rel", "--prefix", "--prompt", prompt, "--json")
    assert res.exit_code == 0, res.output
    doc = json.loads(res.stdout)
    whole = encode(lm, prompt, add_special_tokens=True)
    entry_ids = rel.release.entry("long")["token_ids"]
    common = next(i for i, (a, b) in enumerate(zip(whole, [*entry_ids, -1], strict=False)) if a != b)
    n = min(common, len(whole) - 1) // B * B
    p = doc["ledger"]["prefix"]
    assert doc["entry"] == "long" and p["entry"] == "long" and p["tokens"] == n and n >= 2 * B
    assert p["of"] == len(entry_ids) and p["schedule"] == rel.manifest["schedule"]
    assert p["rows"] == f"rows [0, {n}) of a one-shot prefill of all {len(entry_ids)} tokens"
    assert doc["ledger"]["restored_tokens"] == n and doc["ledger"]["prompt_tokens"] == len(whole) - n
    assert "prefix graft: entry 'long', its first" in res.stderr

    with torch.no_grad():
        cache, _ = prefill(lm, entry_ids, Schedule())
    cache.crop(n - len(entry_ids))  # rows [0, n) of the recorded prefill of all T tokens
    logits = forward(lm, cache, whole[n:])[-1]
    assert doc["token_ids"] == decode(lm, cache, logits, max_new_tokens=4, eos=eos_ids(lm)).token_ids


def test_run_prefix_partial_and_miss(tiny_dir: Any, tiny_lm: Any, tmp_path: Path) -> None:
    from kvgraft.inference import graft

    rel = _release(tiny_lm, tmp_path)
    lm = tiny_lm("llama")
    ids = rel.release.entry("long")["token_ids"]
    # partial: the prompt leaves the entry inside its second block
    partial_text = str(lm.tokenizer.decode(ids[:B + 5])) + " zz qq"
    out = graft.run(rel, None, lm, partial_text, max_new_tokens=2, prefix=True)
    assert out.ledger["prefix"]["tokens"] == B and out.ledger["restored_tokens"] == B

    res = _run(tiny_dir, tmp_path / "rel", "--prefix", "--prompt", "zz qq Problem: Mia has apples")
    assert res.exit_code == 0, res.output
    assert "no entry starts with the prompt's first block" in res.stderr and "no entry matched" in res.stdout
    miss = graft.run(rel, None, lm, "zz qq Problem: Mia has apples", max_new_tokens=2, prefix=True)
    assert miss.ledger["prefix"] is None and miss.ledger["restored_tokens"] == 0
    assert miss.ledger["kv_bytes_verified"] == miss.ledger["kv_bytes_grafted"] == 0

    both = _run(tiny_dir, tmp_path / "rel", "--prefix", "--entry", "long", "--prompt", "x")
    neither = _run(tiny_dir, tmp_path / "rel", "--prompt", "x")
    for r in (both, neither):
        assert r.exit_code == 2 and "--entry" in r.output and "--prefix" in r.output


def test_a_prefix_graft_s_ledger_says_the_bytes_verified_and_the_bytes_grafted_apart(
        tiny_dir: Any, tiny_lm: Any, tmp_path: Path) -> None:
    """Before the fix: "KV bytes restored (verified)" showed the whole entry's bytes (1,612,800 for 16 of 35 tokens). The whole
    entry is read and verified; rows [0, n) of each layer are grafted: n / T of its bytes (every layer of this model
    holds every position). The control: a graft of the whole entry grafts every byte it verified."""
    from kvgraft.inspection import tensor_bytes

    rel = _release(tiny_lm, tmp_path)
    entry = rel.release.entry("long")
    total = tensor_bytes(entry)
    prompt = str(tiny_lm("llama").tokenizer.decode(entry["token_ids"][:B + 5])) + " zz qq"
    res = _run(tiny_dir, tmp_path / "rel", "--prefix", "--prompt", prompt, "--json")
    assert res.exit_code == 0, res.output
    ledger = json.loads(res.stdout)["ledger"]
    n, of = ledger["prefix"]["tokens"], ledger["prefix"]["of"]
    assert n < of and ledger["kv_bytes_verified"] == total
    assert ledger["kv_bytes_grafted"] == total * n // of < total
    table = _run(tiny_dir, tmp_path / "rel", "--prefix", "--prompt", prompt, env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in table.stdout.splitlines()
            if line.count("│") == 3}
    assert rows["KV bytes verified (the entry's, read whole)"] == f"{total:,}"
    assert rows["KV bytes grafted"] == f"{total * n // of:,}"
    whole = _run(tiny_dir, tmp_path / "rel", "--entry", "long", "--prompt", "and more", "--json")
    assert whole.exit_code == 0, whole.output
    full = json.loads(whole.stdout)["ledger"]
    assert full["kv_bytes_verified"] == full["kv_bytes_grafted"] == total
