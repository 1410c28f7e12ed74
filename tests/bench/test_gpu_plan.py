"""The GPU check's plan (bench/gpu_plan.py) on an injected clock: no step starts unless its estimate fits,
the reserved steps keep their time, a step past its estimate is cut at the budget, and the library's
storage is chosen from what was measured. No torch, no sleeping: fast."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("gpu_plan", ROOT / "bench" / "gpu_plan.py")
assert _spec and _spec.loader
gp = sys.modules.setdefault("gpu_plan", importlib.util.module_from_spec(_spec))  # dataclasses look their module up
_spec.loader.exec_module(gp)


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def step(clock: Clock, name: str, estimate: float, takes: float | None = None, **kw: Any) -> Any:
    """A step estimated at `estimate` s that takes `takes` s (its estimate by default) of the clock."""
    def run(left: float) -> None:
        clock.now += estimate if takes is None else takes
    return gp.Step(name, lambda left: (estimate, "test"), run, **kw)


def test_no_step_starts_unless_it_fits_and_the_run_ends_inside_the_budget() -> None:
    clock = Clock()
    budget = gp.Budget(100, clock=clock, spent=10, margin=5)  # 10 s gone before the plan (install, imports)
    steps = [step(clock, "a", 30), step(clock, "b", 30, takes=20), step(clock, "c", 40), step(clock, "d", 25),
             step(clock, "e", 11)]
    records = gp.Plan(steps, budget, log=lambda line: None).run()
    assert [r["status"] for r in records] == ["done", "done", "skipped", "done", "skipped"]
    for r in records:
        if r["status"] == "done":
            assert r["start"] + r["estimate"] <= 100 - 5
    # c: 40 s asked at 60 s with 35 left (the stop's 5 s kept); e: 11 asked at 85 with 10 left.
    assert records[2]["why"] == "35 s of the budget left, needs about 40 s"
    assert records[4]["why"] == "10 s of the budget left, needs about 11 s"
    assert budget.elapsed() == 85 <= 100


def test_reserved_steps_keep_their_time_and_dependents_of_a_skipped_step_are_skipped() -> None:
    clock = Clock()
    budget = gp.Budget(100, clock=clock, margin=5)

    def fails(left: float) -> None:
        raise RuntimeError("out of memory\nsecond line")

    steps = [step(clock, "tiny 1", 20), step(clock, "tiny 2", 20), step(clock, "tiny 3", 20),
             step(clock, "build", 30, reserved=True), gp.Step("identity", lambda left: (1, "test"), fails,
                                                              needs=("build",), reserved=True),
             step(clock, "length", 10, needs=("identity",), reserved=True), step(clock, "cleanup", 0, always=True)]
    records = gp.Plan(steps, budget, log=lambda line: None).run()
    status = {r["step"]: r["status"] for r in records}
    # tiny 3 would leave 35 s for build + identity + length (41 s): skipped, and says why.
    assert status == {"tiny 1": "done", "tiny 2": "done", "tiny 3": "skipped", "build": "done", "identity": "error",
                      "length": "skipped", "cleanup": "done"}
    assert records[2]["why"] == "55 s of the budget left, needs about 20 s + 41 s kept for the 12B-class steps"
    assert records[4]["why"] == "RuntimeError: out of memory"
    assert records[5]["why"] == "needs identity, which did not finish"


def test_describe_projects_what_the_run_does_when_each_step_takes_its_estimate() -> None:
    def make(clock: Clock) -> list[Any]:
        return [step(clock, "a", 30), step(clock, "b", 50), step(clock, "c", 20, needs=("b",)),
                step(clock, "d", 10, reserved=True), step(clock, "e", 5)]

    clock = Clock()
    budget = gp.Budget(90, clock=clock, spent=3, margin=5)
    rows = gp.describe(make(clock), budget)
    assert clock.now == 1000.0  # describing runs nothing
    records = gp.Plan(make(clock), budget, log=lambda line: None).run()
    assert [r["runs"] for r in rows] == [r["status"] == "done" for r in records] == [True, False, False, True, True]
    assert [r["start"] for r in rows] == [r["start"] for r in records] == [3, 33, 33, 33, 43]
    table = gp.plan_table(rows, 90)
    assert "| 2 | b | 50.0 | 33 | skipped | test |" in table and "| 5 | e | 5.0 | 43 | yes | test |" in table


def test_a_step_past_its_estimate_is_cut_at_the_budget_and_nothing_starts_after() -> None:
    clock = Clock()
    budget = gp.Budget(60, clock=clock, margin=5)
    cut: list[tuple[str, float]] = []
    plan: Any = None

    def on_deadline(rec: dict[str, Any]) -> None:
        cut.append((rec["step"], budget.elapsed()))

    def overruns(left: float) -> None:  # estimated at 10 s; runs until the hard stop has cut it
        while not cut:
            clock.now += 0.5
            gp.check(plan, on_deadline)

    plan = gp.Plan([step(clock, "a", 20), gp.Step("b", lambda left: (10, "test"), overruns), step(clock, "c", 1)],
                   budget, log=lambda line: None)
    records = plan.run()
    assert cut == [("b", 55.0)]  # the budget less the margin the stop needs to write and leave
    assert records[2]["status"] == "skipped"  # the process has left by then; here the plan skips it itself


def test_the_watch_waits_on_the_clock_and_cuts_only_a_running_step() -> None:
    clock = Clock()
    budget = gp.Budget(30, clock=clock, margin=5)
    plan = gp.Plan([], budget, log=lambda line: None)
    plan.current = {"step": "x"}
    cut: list[float] = []

    def sleep(seconds: float) -> None:
        assert 0 < seconds <= 1
        clock.now += seconds

    gp.watch(plan, lambda rec: cut.append(budget.elapsed()), sleep=sleep)
    assert cut == [25.0]
    plan.current, plan.finished = None, True  # between steps, or after the last: nothing to cut
    gp.watch(plan, lambda rec: cut.append(-1.0), sleep=sleep)
    assert cut == [25.0]


def _row(folder: str, room: float, rate: float | None = 1e9, fs: str = "ext4") -> dict[str, Any]:
    row = {"folder": folder, "filesystem": fs, "free": room, "room": room}
    return {**row, "write_bps": rate} if rate else row


def test_storage_choice_adapts_to_the_room_measured() -> None:
    entry = int(0.6e9)
    shm, disk = _row("/dev/shm", 64e9, fs="tmpfs"), _row("/work", 40e9)
    # Room for all 49 entries (33.3 GB with 10% + 1 GB) in /dev/shm: chosen.
    chose = gp.choose_storage([shm, disk], entry, 49, 8)
    assert chose["folder"] == "/dev/shm" and chose["entries"] == 49 and "chose /dev/shm" in chose["said"]
    # A container's 64 MB /dev/shm: the disk, which has room for all.
    chose = gp.choose_storage([_row("/dev/shm", 64e6, fs="tmpfs"), disk], entry, 49, 8)
    assert chose["folder"] == "/work" and chose["entries"] == 49
    # Neither has room for all: the most room, the library cut to what fits there, said so.
    chose = gp.choose_storage([_row("/dev/shm", 10e9, fs="tmpfs"), _row("/work", 20e9)], entry, 49, 8)
    assert chose["folder"] == "/work" and chose["entries"] == int((20e9 - 1e9) / 1.1 // entry) == 28
    assert "the library cut to 28 entries" in chose["said"]
    # A folder whose write failed is not chosen; under the minimum anywhere: none.
    chose = gp.choose_storage([_row("/dev/shm", 64e9, rate=None), _row("/work", 4e9)], entry, 49, 8)
    assert chose["folder"] is None and chose["entries"] == 0 and "(e) skipped" in chose["said"]


def test_measure_folder_reads_room_and_write_rate(tmp_path: Path) -> None:
    row = gp.measure_folder(tmp_path, probe_bytes=1 << 20)
    assert row["room"] > 0 and row["write_bps"] > 0 and row["filesystem"] and "error" not in row
    assert list(tmp_path.iterdir()) == []  # the probe file is removed
    missing = gp.measure_folder(tmp_path / "absent")
    assert missing["room"] == 0 and missing["error"].startswith("FileNotFoundError")


@pytest.mark.parametrize("spent", [0.0, 12.5])
def test_budget_counts_what_was_spent_before_it(spent: float) -> None:
    clock = Clock()
    budget = gp.Budget(50, clock=clock, spent=spent, margin=5)
    clock.now += 10
    assert budget.elapsed() == 10 + spent and budget.left() == 40 - spent
    assert budget.over() is (40 - spent <= 5)
