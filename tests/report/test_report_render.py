"""Audit report model and renderings: schema, verdict logic, terminal, self-contained HTML (and a Chromium look)."""

from __future__ import annotations

import copy
import html
import io
import json
import os
import shutil
import struct
import subprocess
import tempfile
import zlib
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from typer.testing import CliRunner

from kvgraft.audit import checks as registry
from kvgraft.audit.render_html import to_html
from kvgraft.audit.render_report import print_report
from kvgraft.cli import app
from kvgraft.errors import InputError, SchemaError
from kvgraft.generalization.stats import wilson_interval
from kvgraft.render.terminal import interval_bar
from kvgraft.render.views import HEAT, heatmap_model
from kvgraft.report import document as rp
from kvgraft.results.recompute import RecomputeData
from kvgraft.results.report import Check, Claim, Model

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "report-example.json"
VERDICT_WORDS = ("FAILED", "contradicted", "inconsistent", "unsupported", "supported", "consistent", "not-testable")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync"]


@pytest.fixture()
def example() -> dict[str, Any]:
    doc: dict[str, Any] = json.loads(FIXTURE.read_text())
    return doc


# --- model -----------------------------------------------------------------------------------------------------


def test_fixture_is_valid_and_marked(example: dict[str, Any]) -> None:
    assert "TEST FIXTURE" in example["note"] and "not a measurement" in example["note"]
    report = rp.load_report(FIXTURE)
    assert report.verdict.status == "failed"
    assert report.as_json() == example  # read as the model, written back member for member
    v = rp.compute_verdict(report.checks, report.claims)
    assert v == report.verdict
    assert v.checks.model_dump(exclude_none=True) == {"passed": 3, "failed": 1, "skipped": 1}
    assert v.claims.contradicted == 1 and v.claims.inconsistent == 3 and v.claims.supported == 1


def test_verdict_logic() -> None:
    ok = Check.model_validate(registry.make_check("verify", "verify", "passed", "ok", {"ok": True}))
    skipped = Check.model_validate(registry.make_check("energy", "other", "skipped", "energy", reason="no meter"))
    failed = Check.model_validate(registry.make_check("recompute", "recompute", "failed", "differs", {"entries": []}))
    claim = Claim(id="c", text="t", verdict="supported", reason="r")
    assert rp.compute_verdict([ok], []).status == "passed"
    assert rp.compute_verdict([ok, skipped], []).status == "incomplete"
    assert rp.compute_verdict([], []).status == "incomplete"
    assert rp.compute_verdict([ok, failed], [claim]).status == "failed"
    assert rp.compute_verdict([ok], [claim.model_copy(update={"verdict": "contradicted"})]).status == "failed"
    assert rp.compute_verdict([ok], [claim.model_copy(update={"verdict": "not-testable"})]).status == "passed"
    with pytest.raises(InputError, match="needs a reason"):
        registry.make_check("x", "other", "skipped", "s")
    with pytest.raises(InputError, match="unknown kind"):
        registry.make_check("x", "magic", "passed", "s")


def test_new_report_round_trip(tmp_path: Path) -> None:
    checks = [Check.model_validate(registry.make_check("verify", "verify", "passed", "ok", {"ok": True}))]
    r = rp.new_report(plan_name="p", plan_content="checks = ['verify']\n", environment={"device": "cpu"},
                      model=Model(spec="smollm2-135m"), release_root_digest="a" * 64, checks=checks,
                      release_attestation_digest="b" * 64)
    assert r.verdict.status == "passed"
    assert r.binding.model_dump() == {"release_attestation_digest": "b" * 64, "release_root_digest": "a" * 64}
    assert "release_signature" not in r.as_json() and "note" not in r.as_json()  # absent, never null
    rp.write_report(tmp_path / "r.json", r)
    assert rp.load_report(tmp_path / "r.json") == r
    assert json.loads((tmp_path / "r.json").read_text()) == r.as_json()


def test_tampered_reports_are_refused(example: dict[str, Any], tmp_path: Path) -> None:
    def bad(doc: dict[str, Any]) -> Path:
        p = tmp_path / "bad.json"
        p.write_text(json.dumps(doc))
        return p

    lie = copy.deepcopy(example)
    lie["verdict"]["status"] = "passed"
    with pytest.raises(InputError, match="does not follow"):
        rp.load_report(bad(lie))
    unbound = copy.deepcopy(example)
    unbound["binding"]["release_root_digest"] = "0" * 64
    with pytest.raises(InputError, match="binding"):
        rp.load_report(bad(unbound))
    extra = copy.deepcopy(example)
    extra["surprise"] = 1
    with pytest.raises(SchemaError):
        rp.load_report(bad(extra))
    no_reason = copy.deepcopy(example)
    del no_reason["checks"][-1]["reason"]
    with pytest.raises(SchemaError, match="reason"):
        rp.load_report(bad(no_reason))
    ragged = copy.deepcopy(example)
    ragged["checks"][2]["data"]["rows"][0]["classes"].pop()
    with pytest.raises(InputError, match="5 classes for 6 conditions"):
        rp.load_report(bad(ragged))
    plan = copy.deepcopy(example)
    plan["plan"]["content"]["model"] = "other"
    with pytest.raises(InputError, match=r"plan\.sha256"):
        rp.load_report(bad(plan))


def test_wilson_interval() -> None:
    lo, hi = wilson_interval(24, 30)
    assert lo == pytest.approx(0.6269, abs=1e-4) and hi == pytest.approx(0.9050, abs=1e-4)
    assert wilson_interval(0, 10)[0] == 0.0 and wilson_interval(10, 10)[1] == 1.0
    with pytest.raises(InputError):
        wilson_interval(3, 2)


def test_heatmap_model(example: dict[str, Any]) -> None:
    m = heatmap_model(RecomputeData.model_validate(example["checks"][1]["data"]))
    assert m["layers"] == 30 and m["metric"] == "ulp" and len(m["rows"]) == 4
    identical = m["rows"][0]["cells"]
    assert all(c["identical"] and c["level"] is None for c in identical.values())
    diverging = m["rows"][2]["cells"]
    assert all(diverging[i]["identical"] for i in range(9))
    levels = [diverging[i]["level"] for i in range(9, 30)]
    assert levels == sorted(levels) and levels[-1] == len(HEAT) - 1 and levels[0] <= 1


# --- terminal --------------------------------------------------------------------------------------------------


def _render(report: dict[str, Any], width: int, detail: str | None = None) -> tuple[str, str]:
    console = Console(file=io.StringIO(), width=width, record=True, color_system="truecolor")
    print_report(rp.read_report(report, "report"), console, detail=detail)
    return console.export_text(clear=False), console.export_html(inline_styles=True)


def test_terminal_details(example: dict[str, Any]) -> None:
    text, styled = _render(example, 160, detail="all")
    for word in VERDICT_WORDS[1:]:
        assert word in text, word
    assert "aime25-I-03  " + "·" * 30 in text  # byte-identical entry: a row of dots
    assert "·" * 9 + "000" in text  # the diverging entry: identical up to layer 9, then ULP digits
    assert "█" in text and "▓" in text and "░" in text  # interval bars
    assert "no power meter" in text
    assert "environment_differences" in text  # unknown data is named, not dropped (in full in the JSON)
    assert HEAT[-1] in styled  # the hottest heat-map colour is used


@pytest.mark.parametrize("width", [80, 120])
def test_face_each_check_once_nothing_cut(example: dict[str, Any], width: int) -> None:
    """What tmux showed at 80 and 120 columns, kept as text: one heading per check with its status, no JSON,
    no ellipsis, every id and verdict whole, no line wider than the terminal."""
    text, _ = _render(example, width)
    lines = text.splitlines()
    assert max(len(line) for line in lines) <= width
    for c in example["checks"]:
        heads = [line for line in lines if line.split(" ")[1:2] == [c["name"]] and line[:1] in "✓✗–?"]
        assert len(heads) == 1 and c["status"] in heads[0], (c["name"], heads)
        assert text.count(c["summary"]) <= 1  # a summary is never repeated (the face has its own verdict line)
    assert "…" not in text and "{" not in text and "more in the report JSON" not in text
    for digest in (example["release_root_digest"], example["plan"]["sha256"], example["model"]["identity"]["sha256"]):
        assert digest in text
    for claim in example["claims"]:
        assert any(claim["id"] in line and claim["verdict"] in line for line in lines), claim["id"]
    flat = " ".join(text.split())  # the failing entry, sized and located
    assert "aime25-II-07 differs: max |diff| 0.000124" in flat and "; first difference layer 9" in flat
    assert "FAILED:" in lines[1] and "--detail NAME" in text
    from kvgraft.audit.checks import KINDS, view

    for c in example["checks"]:  # called directly: the face's fallback to the summary must not hide a bug
        if c["kind"] in KINDS and c["status"] != "skipped":
            assert KINDS[c["kind"]].face(view(KINDS[c["kind"]], c["data"])).verdict


def test_details_never_cut_at_80_columns(example: dict[str, Any]) -> None:
    text, _ = _render(example, 80, detail="all")
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80
    for e in example["checks"][1]["data"]["entries"]:
        assert e["id"] in text
    wide, _ = _render(example, 200, detail="recompute")
    assert "┃ entry" in wide  # a table where it fits; paragraphs where it does not
    assert "┃ entry" not in _render(example, 80, detail="recompute")[0]


def test_detail_of_an_unknown_check_is_refused(example: dict[str, Any]) -> None:
    with pytest.raises(InputError, match=r"no check named 'nope'.*recompute"):
        _render(example, 80, detail="nope")


def test_interval_bar() -> None:
    bar = interval_bar(24, 30, 0.6269, 0.9050, width=20).plain
    assert len(bar) == 20 and bar.index("█") == 16
    assert bar[:12] == "░" * 12 and bar[12:16] == "▓" * 4 and bar[19] == "░"


def test_cli_show(tmp_path: Path) -> None:
    runner = CliRunner()
    res = runner.invoke(app, ["report", "show", str(FIXTURE)])
    assert res.exit_code == 0, res.output
    assert "FAILED" in res.stdout and "recompute" in res.stdout
    res = runner.invoke(app, ["report", "show", str(FIXTURE), "--detail", "recompute"])
    assert res.exit_code == 0 and "per-layer divergence" in res.stdout, res.output
    res = runner.invoke(app, ["report", "show", str(FIXTURE), "--detail", "nope"])
    assert res.exit_code == 2 and "no check named 'nope'" in res.stderr
    out = tmp_path / "r.html"
    res = runner.invoke(app, ["report", "show", str(FIXTURE), "--html", str(out)])
    assert res.exit_code == 0, res.output
    assert out.read_text().startswith("<!DOCTYPE html>")
    assert runner.invoke(app, ["report", "show", str(FIXTURE), "--html", str(out)]).exit_code == 5
    assert runner.invoke(app, ["report", "show", str(FIXTURE), "--html", str(out), "--overwrite"]).exit_code == 0
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    res = runner.invoke(app, ["report", "show", str(bad)])
    assert res.exit_code == 2 and "bad.json" in res.stderr


# --- HTML ------------------------------------------------------------------------------------------------------


class _Tags(HTMLParser):
    """The tags and attribute names a browser would see, and the CSS text."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: set[str] = set()
        self.attrs: set[str] = set()
        self.style = ""
        self._in_style = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.add(tag)
        self.attrs.update(name for name, _ in attrs)
        self.style += " ".join(v or "" for name, v in attrs if name == "style")
        self._in_style = tag == "style"

    def handle_endtag(self, tag: str) -> None:
        self._in_style = False

    def handle_data(self, data: str) -> None:
        if self._in_style:
            self.style += data


def test_html_is_self_contained_and_escaped(example: dict[str, Any]) -> None:
    evil = copy.deepcopy(example)
    evil["checks"][0]["summary"] = '<script>alert(1)</script><img src="https://example.com/x.png">'
    evil["checks"][1]["data"]["entries"][0]["id"] = '"><svg onload=alert(1)>'
    page = to_html(rp.read_report(evil, "report"))
    seen = _Tags()
    seen.feed(page)
    assert not seen.tags & {"script", "img", "link", "iframe", "object", "embed", "image", "use", "foreignobject", "a"}, seen.tags
    assert not {a for a in seen.attrs if a in ("src", "href", "xlink:href", "srcset") or a.startswith("on")}, seen.attrs
    assert "url(" not in seen.style and "@import" not in seen.style
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert page.count("<svg") == 4  # heat map + three interval plots; the injected <svg> is escaped
    for word in VERDICT_WORDS:
        assert word in page, word


def test_html_contains_report_content(example: dict[str, Any]) -> None:
    page = to_html(rp.read_report(example, "report"))
    assert example["release_root_digest"] in page
    assert "aime25-II-07 layer 29: " in page  # heat-map cell tooltip
    assert "byte-identical" in page and "not significant at 0.05" in page
    assert "TEST FIXTURE" in page
    face = page[page.index("<h2>Checks</h2>"):page.index("<h2>Details</h2>")]
    for c in example["checks"]:  # the face lists each check once; its summary is in the details, not twice
        assert face.count(f"<li><b>{c['name']}</b>") == 1, c["name"]
        assert page.count(html.escape(c["summary"], quote=True)) == 1, c["name"]


# --- in a browser ----------------------------------------------------------------------------------------------


def _chromium() -> str | None:
    for name in ("/usr/bin/chromium", "chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def _png_rows(data: bytes, max_rows: int) -> tuple[int, int, int, list[bytes]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) with zlib + struct."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            idat += body
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    bpp = 4 if color == 6 else 3
    raw = zlib.decompress(idat)
    stride = width * bpp
    rows: list[bytes] = []
    prev = bytearray(stride)
    for y in range(min(height, max_rows)):
        ftype, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        if ftype == 1:
            for i in range(bpp, stride):
                line[i] = (line[i] + line[i - bpp]) & 0xFF
        elif ftype == 2:
            line = bytearray((a + b) & 0xFF for a, b in zip(line, prev, strict=True))
        elif ftype == 3:
            for i in range(stride):
                left = line[i - bpp] if i >= bpp else 0
                line[i] = (line[i] + ((left + prev[i]) >> 1)) & 0xFF
        elif ftype == 4:
            for i in range(stride):
                a = line[i - bpp] if i >= bpp else 0
                b, c = prev[i], (prev[i - bpp] if i >= bpp else 0)
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 0xFF
        rows.append(bytes(line))
        prev = line
    return width, height, bpp, rows


def test_html_in_headless_chromium(example: dict[str, Any], tmp_path: Path) -> None:
    chromium = _chromium()
    if chromium is None:
        pytest.skip("chromium is not installed (Debian: apt-get install -y chromium); the HTML is not looked at in a browser")
    page = tmp_path / "report.html"
    page.write_text(to_html(rp.read_report(example, "report")))
    png = tmp_path / "shot.png"
    env = dict(os.environ, HOME=str(tmp_path))
    with tempfile.TemporaryDirectory() as profile:
        subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", f"--screenshot={png}", "--window-size=1200,1600",
                        page.as_uri()], check=True, capture_output=True, timeout=120, env=env)
    with tempfile.TemporaryDirectory() as profile:
        dom = subprocess.run([chromium, *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "--dump-dom", page.as_uri()],
                             check=True, capture_output=True, timeout=120, env=env, text=True).stdout
    for word in VERDICT_WORDS:
        assert word in dom, word
    assert "per-layer divergence" in dom and "<svg" in dom

    width, height, bpp, rows = _png_rows(png.read_bytes(), max_rows=700)
    assert (width, height) == (1200, 1600)
    colors: set[bytes] = set()
    non_white = verdict_red = total = 0
    for row in rows:
        for x in range(0, width * bpp, bpp * 2):
            px = row[x:x + 3]
            colors.add(px)
            total += 1
            non_white += px != b"\xff\xff\xff"
            verdict_red += abs(px[0] - 0xB3) < 12 and px[1] < 60 and px[2] < 60  # the FAILED panel, #b3261e
    assert len(colors) > 50, f"only {len(colors)} colours: blank page?"
    assert non_white / total > 0.05, f"{non_white / total:.1%} non-white pixels: blank page?"
    assert verdict_red > 2000, "the red FAILED verdict panel is not on screen"


def test_heatmap_shared_and_mismatched_layers() -> None:
    data = RecomputeData.model_validate({"entries": [{"id": "e", "byte_exact": False, "layers": [
        {"index": 0, "kind": "full", "keys": {"equal": True, "differing": 0}, "values": {"equal": True, "differing": 0}},
        {"index": 1, "kind": "shared"},
        {"index": 2, "kind": "full", "layout_mismatch": "stored sliding, fresh full"},
        {"index": 3, "kind": "full", "keys": {"equal": False, "differing": 5, "max_ulp": 3, "max_abs": 1e-6},
         "values": {"equal": True, "differing": 0}}]}]})
    console = Console(file=io.StringIO(), width=80, record=True)
    from kvgraft.render.html import heatmap_svg
    from kvgraft.render.terminal import heatmap_text
    from kvgraft.render.views import recompute_rows

    console.print(heatmap_text(data))
    assert "e · !0" in console.export_text()
    svg = heatmap_svg(data)
    assert "shared layer: stores no states of its own" in svg and "layout mismatch: stored sliding, fresh full" in svg
    assert recompute_rows(data)[0]["differing_layers"] == 2
