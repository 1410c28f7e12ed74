"""A plan's `[release]` sets the capture layout of the release it builds from records (`sliding_layers`)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.release.format import Release

from release_factory import records_plan

runner = CliRunner()
TEXT = " ".join(["the cat sat on the mat"] * 12)  # past the tiny Gemma 3's window


def _stores(plan: Path) -> set[str]:
    res = runner.invoke(app, ["audit", "run", str(plan), "--quiet"])
    assert res.exit_code == 0, res.output
    (entry,) = Release.open(plan.parent / "out" / "release").entries
    return {m["stores"] for m in entry["layers"] if m["kind"] == "sliding"}


def test_a_plan_asks_for_every_position_or_the_window(tiny_dir: Callable[[str], Path], tmp_path: Path) -> None:
    for layout in ("all", "window"):
        (tmp_path / layout).mkdir()
        plan = records_plan(tmp_path / layout, layout, tiny_dir("gemma3"), [TEXT],
                            f'sliding_layers = "{layout}"\n[checks.verify]\n')
        assert _stores(plan) == {layout}
    (tmp_path / "default").mkdir()
    assert _stores(records_plan(tmp_path / "default", "default", tiny_dir("gemma3"), [TEXT], "[checks.verify]\n")) == {
        "window"}
    (tmp_path / "bad").mkdir()
    bad = records_plan(tmp_path / "bad", "bad", tiny_dir("gemma3"), [TEXT], 'sliding_layers = "every"\n[checks.verify]\n')
    res = runner.invoke(app, ["audit", "run", str(bad), "--quiet"])
    assert res.exit_code == 2 and "sliding_layers" in res.output, res.output


def test_the_gemma_plan_is_valid_and_keeps_every_position() -> None:
    from kvgraft.audit import plan

    p = plan.load(Path(__file__).resolve().parents[2] / "audit" / "gemma.toml")
    assert p.doc["model"]["spec"] == "gemma3-270m" and p.doc["release"]["sliding_layers"] == "all"
    assert p.resolve(p.doc["release"]["records"]).is_file() and p.doc["checks"]["determinism"]["length"] > 512
