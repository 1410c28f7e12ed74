"""Every command reads only the index it needs, and sampled verification for CI.

Index shard reads are counted by `Index.shards_read` of every Index opened while a command runs (the
`opened` fixture): the draw and bound of a sampled audit come from the ids and token counts the signed
manifest lists per shard, so only the judged entries' shards are read; `verify --sample` reads every
shard (the whole index is checked) and the files of the drawn entries only.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Callable
from math import comb
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import sampling
from kvgraft._internal import jsonio
from kvgraft.cli import app
from kvgraft.errors import InputError, IntegrityError
from kvgraft.release import format as release_format
from kvgraft.release import index as release_index
from kvgraft.release.format import Release
from kvgraft.release.records import MANIFEST, root_digest
from kvgraft.signing.policy import Entries, Everything, Sample, SignatureNotChecked
from kvgraft.signing.verify import verified
from tests.verifying import verify_result

from release_factory import make_release, release_fixtures

runner = CliRunner()
ENTRIES, SHARD = 10, 3  # shards of 3, 3, 3 and 1 entries


base, rel = release_fixtures(entries=ENTRIES, format_version=2, shard_entries=SHARD, seed=5)


@pytest.fixture
def opened(monkeypatch: pytest.MonkeyPatch) -> list[release_index.Index]:
    """Every Index opened from here on (their shards_read say which shards were read)."""
    found: list[release_index.Index] = []
    real = release_index.Index.__init__

    def init(self: release_index.Index, *a: Any, **k: Any) -> None:
        real(self, *a, **k)
        found.append(self)

    monkeypatch.setattr(release_index.Index, "__init__", init)
    return found


def shards_read(opened: list[release_index.Index]) -> set[int]:
    return {k for idx in opened for k in idx.shards_read}


def owner(root: Path, entry_id: str) -> int:
    shards = json.loads((root / MANIFEST).read_text())["index"]["shards"]
    return next(k for k, s in enumerate(shards) if entry_id in s["ids"])


def edit_manifest(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    """Change an (unsigned) format-2 manifest in place and recompute its root digest."""
    m = json.loads((root / MANIFEST).read_text())
    change(m)
    m["root_digest"] = root_digest(m)
    (root / MANIFEST).write_text(json.dumps(m))


def root_of(root: Path) -> str:
    return str(json.loads((root / MANIFEST).read_text())["root_digest"])


def test_the_manifest_lists_each_shards_token_counts(base: Path, opened: list[release_index.Index]) -> None:
    r = Release.open(base)
    counts = r.token_counts()
    assert shards_read(opened) == set()  # from the manifest
    assert counts == [e["num_tokens"] for e in r.entries] and sum(counts) == r.manifest["index"]["tokens"]
    assert [len(s["num_tokens"]) for s in r.manifest["index"]["shards"]] == [3, 3, 3, 1]


def test_audit_sample_reads_no_shard(base: Path, opened: list[release_index.Index], tmp_path: Path) -> None:
    ids = Release.open(base).entry_ids()
    r = runner.invoke(app, ["audit", "sample", str(base), "--nonce", "n-1", "--size", "4"])
    assert r.exit_code == 0, r.output
    assert r.output.split() == [ids[i] for i in sampling.draw(root_of(base), "n-1", ENTRIES, 4)]
    assert opened and shards_read(opened) == set()
    counts = Release.open(base).token_counts()
    recorded = {"sample": sampling.sample_record(root_of(base), "n-1", ids, counts, 4, nonce_source="given")}
    (tmp_path / "r.json").write_text(json.dumps(recorded))
    r = runner.invoke(app, ["audit", "sample", str(base), "--check", str(tmp_path / "r.json")])
    assert r.exit_code == 0 and "identical" in r.output, r.output
    assert opened and shards_read(opened) == set()


def test_verify_entry_reads_only_its_shard(base: Path, opened: list[release_index.Index]) -> None:
    result = verify_result(base, None, Entries(("rec-007",)))
    assert result.checked_entries == ["rec-007"] and shards_read(opened) == {owner(base, "rec-007")} == {2}
    r = runner.invoke(app, ["verify", str(base), "--entry", "rec-001"])
    assert r.exit_code == 0, r.output
    assert shards_read(opened) == {0, 2}


def test_a_tampered_token_count_is_caught_when_its_shard_is_read(rel: Path) -> None:
    def lie(m: dict[str, Any]) -> None:
        m["index"]["shards"][1]["num_tokens"][2] += 1  # rec-005
        m["index"]["tokens"] += 1

    edit_manifest(rel, lie)
    r = Release.open(rel)  # consistent in itself: the manifest alone cannot tell
    assert r.entry("rec-001")["id"] == "rec-001"  # another shard reads as before
    with pytest.raises(IntegrityError, match=r"index shard 1: entry 'rec-005' has 6 tokens, the manifest lists 7"):
        r.entry("rec-003")
    # A sampled verification reads every shard: caught whichever entries are drawn.
    out = runner.invoke(app, ["verify", str(rel), "--sample", "1", "--nonce", "x"])
    assert out.exit_code == 1 and "the manifest lists 7" in out.output, out.output
    # Counts that do not add up to the index's total, or do not match the ids, are refused at opening.
    edit_manifest(rel, lambda m: m["index"].update(tokens=m["index"]["tokens"] - 1))
    with pytest.raises(InputError, match="token counts sum to"):
        Release.open(rel)
    edit_manifest(rel, lambda m: m["index"]["shards"][0]["num_tokens"].pop())
    with pytest.raises(InputError, match="index shard 0: 2 token counts for 3 entries"):
        Release.open(rel)


def test_a_manifest_without_token_counts_is_read_from_its_shards(rel: Path, opened: list[release_index.Index]) -> None:
    """A release written before the counts were listed: the same draw and bound, its shards read for the counts."""
    want = Release.open(rel).token_counts()

    def strip(m: dict[str, Any]) -> None:
        for s in m["index"]["shards"]:
            del s["num_tokens"]

    edit_manifest(rel, strip)
    opened.clear()
    r = Release.open(rel)
    assert r.token_counts() == want and shards_read(opened) == {0, 1, 2, 3}
    out = runner.invoke(app, ["verify", str(rel), "--sample", "3", "--nonce", "old", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert doc["sample"]["population_tokens"] == sum(want)
    assert doc["checked_entries"] == [r.entry_ids()[i] for i in sampling.draw(root_of(rel), "old", ENTRIES, 3)]


def _independent_bound(n: int, population: int, damaged: int) -> tuple[int, float]:
    """The largest D not rejected by 0 of n at 95%, and P(catch) with `damaged` bad: from math.comb directly."""
    most = max(d for d in range(population + 1) if 20 * comb(population - d, n) > comb(population, n))
    return most, 1 - comb(population - damaged, n) / comb(population, n)


def test_verify_sample_checks_the_index_and_the_drawn_entries(base: Path, opened: list[release_index.Index],
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    out = runner.invoke(app, ["verify", str(base), "--sample", "4", "--nonce", "c0ffee", "--json"])
    assert out.exit_code == 0, out.output
    doc = json.loads(out.output)
    assert shards_read(opened) == {0, 1, 2, 3}  # the whole index
    # The draw of `audit sample` and of a sampled recompute audit.
    printed = runner.invoke(app, ["audit", "sample", str(base), "--nonce", "c0ffee", "--size", "4"]).output.split()
    from kvgraft.recompute.audit import choose

    chosen, record = choose(Release.open(base), sample=4, nonce="c0ffee")
    assert record is not None
    assert doc["checked_entries"] == printed == record.entries == [e["id"] for e in chosen]
    assert doc["scope"] == "sample" and doc["sample"]["positions"] == record.positions
    # One pass over the index: each drawn entry's file is checked while its shard is held, none read twice.
    opened.clear()
    monkeypatch.setattr(release_index.Index, "CACHED_SHARDS", 1)
    assert verify_result(base, None, Sample(4, "c0ffee")).checked_entries == record.entries
    assert sorted(k for idx in opened for k in idx.shards_read) == [0, 1, 2, 3]
    monkeypatch.undo()
    most, caught = _independent_bound(4, ENTRIES, 1)  # 1% of 10 entries, rounded up: 1
    b = doc["bound"]
    assert (b["max_damaged_entries"], b["if_damaged_entries"]) == (most, 1)
    assert b["detection_probability"] == pytest.approx(caught) and b["detection_at_least"] == "40.0%"
    text = runner.invoke(app, ["verify", str(base), "--sample", "4", "--nonce", "c0ffee"], env={"COLUMNS": "400"})
    assert text.exit_code == 0
    line = " ".join(text.output.split())
    assert (f"0 of 4 sampled entries damaged: at most {sampling.pct(most / ENTRIES)} of 10 entries are damaged "
            f"({most}), 95% one-sided, exact hypergeometric; if 1% of the entries (1) were damaged, this check would "
            "have caught one with probability ≥ 40.0%") in line
    assert "4 of 10 entries drawn from the root digest and nonce 'c0ffee'" in line


def test_the_bound_is_the_exact_hypergeometric_one() -> None:
    for n, population in ((20, 10_000), (300, 100_000), (7, 50), (50, 50)):
        b = sampling.check_bound(n, population)
        damaged = -(-population // 100)
        most, caught = _independent_bound(n, population, damaged) if population <= 10_000 else (None, None)
        if most is not None:
            assert b.max_damaged_entries == most and b.detection_probability == pytest.approx(caught)
        assert b.max_damaged_entries == sampling.upper_bound(0, n, population)
        floor = float(b.detection_at_least.rstrip("%")) / 100
        assert floor <= b.detection_probability < floor + 0.001  # rounded down, to 0.1%


@pytest.mark.parametrize("inside", [True, False])
def test_verify_sample_catches_a_damaged_sampled_entry(rel: Path, inside: bool) -> None:
    """Positive control: a changed tensor byte in a drawn entry fails the check; outside the sample it is not
    read (the full verify finds it), which is what a sample is."""
    r = Release.open(rel)
    drawn = [r.entry_ids()[i] for i in sampling.draw(root_of(rel), "ci-42", ENTRIES, 3)]
    victim = drawn[1] if inside else next(e for e in r.entry_ids() if e not in drawn)
    entry = r.entry(victim)
    start = entry["tensors"]["layer.1.keys"]["byte_range"][0]
    path = rel / entry["file"]
    data = bytearray(path.read_bytes())
    data[start + 5] ^= 1
    path.write_bytes(bytes(data))
    out = runner.invoke(app, ["verify", str(rel), "--sample", "3", "--nonce", "ci-42"])
    if inside:
        assert out.exit_code == 1 and f"entry {victim!r}" in out.output and "layer.1.keys" in out.output, out.output
    else:
        assert out.exit_code == 0, out.output
        assert runner.invoke(app, ["verify", str(rel)]).exit_code == 1


def test_verify_sample_options_are_checked(base: Path) -> None:
    for args, message in ((["--nonce", "x"], "--nonce draws a sample"),
                          (["--sample", "2", "--entry", "rec-001"], "exclude each other"),
                          (["--sample", "11"], "--sample 11: expected 1 to 10"),
                          (["--sample", "2", "--nonce", "has space"], "--nonce 'has space'")):
        out = runner.invoke(app, ["verify", str(base), *args])
        assert out.exit_code == 2 and message in out.output, (args, out.output)
    drawn = runner.invoke(app, ["verify", str(base), "--sample", "2", "--json"])
    assert drawn.exit_code == 0 and json.loads(drawn.output)["sample"]["nonce_source"] == "drawn"


def test_verify_all_and_inspect_hold_no_list_of_records(base: Path, monkeypatch: pytest.MonkeyPatch,
                                                         opened: list[release_index.Index]) -> None:
    def refused(self: Release) -> None:
        raise AssertionError("every record read into one list")

    monkeypatch.setattr(Release, "entries", property(refused))
    monkeypatch.setattr(release_index.Index, "CACHED_SHARDS", 1)
    monkeypatch.setattr(release_format, "CHECKED_HEADERS", 2)
    result = verify_result(base, None, Everything(deep=True))
    assert result.tensors == 4 * ENTRIES and result.opened is not None
    assert len(result.opened._checked_headers) == 2 and all(len(i._cache) <= 1 for i in opened)
    full = runner.invoke(app, ["inspect", str(base), "--limit", "0", "--json"])
    assert full.exit_code == 0, full.output
    monkeypatch.undo()
    assert json.loads(full.output) == json.loads(runner.invoke(app, ["inspect", str(base), "--limit", "0",
                                                                       "--json"]).output)


def test_inspect_json_streams_the_document_json_dumps_gives(base: Path) -> None:
    from kvgraft import inspection

    for args, limit in ((["--limit", "0"], None), (["--limit", "3", "--offset", "9"], 3), (["--offset", "10"], 20)):
        offset = int(args[args.index("--offset") + 1]) if "--offset" in args else 0
        out = runner.invoke(app, ["inspect", str(base), *args, "--json"])
        assert out.exit_code == 0, out.output
        want = inspection.inspect(base, offset=offset, limit=limit)
        assert out.output == json.dumps(want, indent=2, ensure_ascii=False) + "\n"


def test_the_rate_printed_is_the_rate(base: Path) -> None:
    """bytes hashed over seconds, in a unit that shows it (a small release once printed '0.00 GiB/s')."""
    out = runner.invoke(app, ["verify", str(base)], env={"COLUMNS": "200"})
    assert out.exit_code == 0, out.output
    m = re.search(r"hashed\s+([\d.]+) (KiB|MiB|GiB|bytes) in ([\d.]+) s \(([\d.]+) (KiB|MiB|GiB|bytes)/s\)", out.output)
    assert m is not None, out.output
    unit = {"bytes": 1, "KiB": 2**10, "MiB": 2**20, "GiB": 2**30}
    hashed = verify_result(base).bytes_hashed
    assert float(m[1]) * unit[m[2]] == pytest.approx(hashed, rel=0.01)
    assert float(m[4]) > 0 and float(m[1]) > 0


# ------------------------------------------------------------------ with a model: the judged entries' shards only


@pytest.fixture(scope="module")
def captured(tiny_lm: Callable[[str], Any], tmp_path_factory: pytest.TempPathFactory) -> Path:
    from kvgraft.inference import capture
    from kvgraft.recompute.determinism import threads

    import tiny

    out = tmp_path_factory.mktemp("captured") / "rel"
    text = " ".join(tiny._CORPUS)
    records = [("t", {"id": f"s{i}", "text": text[i * 17: i * 17 + 30 + 3 * i]}) for i in range(8)]
    with pytest.MonkeyPatch.context() as mp, threads(1):
        mp.setattr(capture, "ReleaseWriter", functools.partial(release_format.ReleaseWriter, shard_entries=SHARD))
        capture.capture(tiny_lm("llama"), records, out, probe_tokens=2)
    assert len(json.loads((out / MANIFEST).read_text())["index"]["shards"]) == 3
    return out


def test_recompute_reads_only_the_judged_entries_shards(tiny_lm: Callable[[str], Any], captured: Path,
                                                       opened: list[release_index.Index],
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    from kvgraft.recompute import audit as recompute

    lm = tiny_lm("llama")
    one = recompute.audit(verified(captured, SignatureNotChecked()), lm, entries=["s4"])
    assert [e["id"] for e in one["entries"]] == ["s4"] and shards_read(opened) == {owner(captured, "s4")} == {1}
    opened.clear()
    # Each judged shard is read once, though one parsed shard is kept: the records it hands out are kept (a
    # few), so grafting and reading an entry later does not parse its shard again.
    monkeypatch.setattr(release_index.Index, "CACHED_SHARDS", 1)
    # The root digest commits this machine's KV bytes, so the draw differs per machine: take the first nonce
    # whose sample spans two shards here.
    rel = Release.open(captured)
    root, ids = str(rel.manifest["root_digest"]), rel.entry_ids()
    nonce = next(n for n in (f"judged-only-{k}" for k in range(100))
                 if len({owner(captured, ids[i]) for i in sampling.draw(root, n, len(ids), 3)}) > 1)
    drawn = recompute.audit(verified(captured, SignatureNotChecked()), lm, sample=3, nonce=nonce)
    picked = drawn["sample"]["entries"]
    assert len({owner(captured, e) for e in picked}) > 1  # else one cached shard would hide a second read
    assert sorted(k for idx in opened for k in idx.shards_read) == sorted({owner(captured, e) for e in picked})
    counts = rel.token_counts()
    assert drawn["bound"]["population_tokens"] == drawn["cost"]["library_tokens"] == sum(counts)
    assert drawn["bound"]["max_failing_entries"] == sampling.upper_bound(0, 3, 8)


def test_cli_recompute_entry_reads_one_shard(captured: Path, tiny_dir: Callable[[str], Path],
                                             opened: list[release_index.Index]) -> None:
    r = runner.invoke(app, ["audit", "recompute", str(captured), "--model", str(tiny_dir("llama")), "--entry", "s7",
                            "--quiet"])
    assert r.exit_code == 0, r.output
    assert shards_read(opened) == {2}


def test_a_shard_closes_at_its_byte_bound_as_well_as_its_record_count(tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of many layers make shards of fewer entries: what one lookup parses stays near SHARD_BYTES.
    A record larger than the bound gets a shard of its own; the release reads as any other."""
    def shards(name: str) -> list[dict[str, Any]]:
        make_release(tmp_path / name, entries=6, layers=2, format_version=2, seed=3)
        return list(json.loads((tmp_path / name / MANIFEST).read_text())["index"]["shards"])

    small = shards("small")
    assert [len(s["ids"]) for s in small] == [6]  # far below both bounds
    opened = Release.open(tmp_path / "small")
    sizes = [len(jsonio.canonical(opened.entry(i))) for i in small[0]["ids"]]

    def expected(bound: int) -> list[int]:  # the rule, written out: close once the records reach the bound
        out, n, held = [], 0, 0
        for size in sizes:
            n, held = n + 1, held + size
            if held >= bound:
                out, n, held = [*out, n], 0, 0
        return out + ([n] if n else [])

    monkeypatch.setattr(release_index, "SHARD_BYTES", sizes[0] + sizes[1] + 1)
    big = shards("big")
    assert [len(s["ids"]) for s in big] == expected(sizes[0] + sizes[1] + 1) and len(big[0]["ids"]) == 3
    assert all(s["size"] < 4 * max(sizes) + 1024 for s in big)
    monkeypatch.setattr(release_index, "SHARD_BYTES", min(sizes) // 2)
    alone = shards("alone")
    assert [len(s["ids"]) for s in alone] == [1] * 6
    assert verify_result(tmp_path / "alone").tensors == 6 * 4  # every entry of 2 layers, keys and values


def test_verify_all_keeps_a_window_of_hashes_in_flight_not_one_per_file(base: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """A pending hash (a future) costs ~1 KB: one per entry file held at once was 100 MB at 100,000 entries."""
    from kvgraft.release import integrity

    real = integrity.pool()
    pending: set[Any] = set()
    most = [0]

    class Counting:
        def submit(self, *a: Any, **k: Any) -> Any:
            future = real.submit(*a, **k)
            pending.add(future)
            most[0] = max(most[0], len(pending))
            original = future.result

            def result(*ra: Any, **rk: Any) -> Any:
                pending.discard(future)
                return original(*ra, **rk)

            future.result = result  # type: ignore[method-assign]
            return future

    monkeypatch.setattr(integrity, "pool", lambda: Counting())
    monkeypatch.setattr(integrity, "HASH_WINDOW", 3)
    assert verify_result(base).tensors == 4 * ENTRIES
    assert 0 < most[0] <= 3  # ENTRIES entry files (and the index files) hashed, three at a time
