"""The GPU check's plan: its steps in order, each started only when its estimate fits the budget left.

The budget counts from the start of bench/gpu_check.sh (the wheel install and the imports included).
A step starts only when the seconds left cover its estimate plus, for a step that is not `reserved`,
the estimates of the reserved steps after it (the 12B-class model's build, identity and lengths come
before the optional parts). A step whose `needs` did not finish is skipped and says which. `always`
steps (the probe, removing the library) run regardless: they take about a second. Estimates are
functions, so that a step's estimate can use what earlier steps measured. `watch` is the hard stop:
a step that overruns its estimate is cut at the budget, the results written first.

No torch here: tests/bench/test_gpu_check.py runs the plan with an injected clock.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Seconds kept at the end of the budget for the hard stop to write the results and leave.
STOP_MARGIN = 5.0


class Budget:
    """Seconds left of the run, on `clock` (time.monotonic; a test passes its own); `spent`: seconds
    already gone when it was made (the shell script's install and this process's imports). A step
    must end `margin` seconds before the budget: the hard stop's time to write and leave."""

    def __init__(self, seconds: float, clock: Callable[[], float] = time.monotonic, spent: float = 0.0,
                 margin: float = STOP_MARGIN) -> None:
        self.clock = clock
        self.start = clock() - spent
        self.seconds = seconds
        self.margin = margin

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        return self.seconds - self.elapsed()

    def over(self) -> bool:
        """Past the point where only the hard stop's margin is left."""
        return self.left() <= self.margin


@dataclass
class Step:
    """`estimate(left)`: seconds and how they were derived, given the seconds the step may use (a step that
    sizes itself to the time, like the library, uses it; most ignore it)."""

    name: str
    estimate: Callable[[float], tuple[float, str]]
    run: Callable[[float], Any]  # given the same seconds as the estimate
    needs: tuple[str, ...] = ()
    reserved: bool = False
    always: bool = False
    blocked: Callable[[], str] = lambda: ""  # a reason known before it starts not to run it (no room)


@dataclass
class Plan:
    steps: list[Step]
    budget: Budget
    log: Callable[[str], None] = print
    after: Callable[[], None] = lambda: None  # after every step: write what was measured so far
    records: list[dict[str, Any]] = field(default_factory=list)
    current: dict[str, Any] | None = None
    finished: bool = False

    def reserve_after(self, index: int, left: float) -> float:
        """The estimates of the reserved steps after `index`: what a step that is not reserved leaves them."""
        if self.steps[index].reserved:
            return 0.0
        return sum(s.estimate(left)[0] for s in self.steps[index + 1:] if s.reserved)

    def run(self) -> list[dict[str, Any]]:
        """Each step in order: skipped (why), done or error (the exception's first line); one record each."""
        done: set[str] = set()
        for i, step in enumerate(self.steps):
            reserve = self.reserve_after(i, self.budget.left() - self.budget.margin)
            left = self.budget.left() - self.budget.margin - reserve
            need, basis = step.estimate(left)
            rec: dict[str, Any] = {"step": step.name, "estimate": need, "basis": basis, "start": self.budget.elapsed()}
            self.records.append(rec)
            missing = [n for n in step.needs if n not in done]
            if missing or step.blocked():
                rec["status"] = "skipped"
                rec["why"] = step.blocked() or f"needs {', '.join(missing)}, which did not finish"
            elif not step.always and need > left:
                rec["status"] = "skipped"
                rec["why"] = (f"{left + reserve:.0f} s of the budget left, needs about {need:.0f} s"
                              + (f" + {reserve:.0f} s kept for the 12B-class steps" if reserve else ""))
            else:
                self.current = rec
                try:
                    step.run(left)
                    rec["status"] = "done"
                    done.add(step.name)
                except Exception as exc:  # recorded, and the run goes on: one failure must not cost the lease
                    rec["status"] = "error"
                    rec["why"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
                finally:
                    self.current = None
                rec["seconds"] = self.budget.elapsed() - rec["start"]
            self.log(f"[{self.budget.elapsed():.0f} s] {step.name}: {rec['status']}"
                     + (f" in {rec['seconds']:.1f} s (estimate {need:.0f} s)" if "seconds" in rec else "")
                     + (f": {rec['why']}" if "why" in rec else ""))
            self.after()
        self.finished = True
        return self.records


def describe(steps: list[Step], budget: Budget) -> list[dict[str, Any]]:
    """The plan before running: each step's estimate and basis, its projected start if every earlier
    step takes its estimate, and whether it would run then."""
    rows, at, done = [], budget.elapsed(), set()
    for i, step in enumerate(steps):
        room = budget.seconds - budget.margin - at
        reserve = 0.0 if step.reserved else sum(s.estimate(room)[0] for s in steps[i + 1:] if s.reserved)
        need, basis = step.estimate(room - reserve)
        ok = all(n in done for n in step.needs) and not step.blocked() and (step.always or need <= room - reserve)
        rows.append({"step": step.name, "estimate": need, "basis": basis, "start": at, "runs": ok})
        if ok:
            done.add(step.name)
            at += need
    return rows


def plan_table(rows: list[dict[str, Any]], budget: float) -> str:
    lines = [f"Plan (budget {budget:.0f} s from the script's start; projected starts if each step takes its estimate):",
             "| # | step | estimate s | projected start s | runs | basis |", "|---|---|---|---|---|---|"]
    for i, r in enumerate(rows, 1):
        lines.append(f"| {i} | {r['step']} | {r['estimate']:.1f} | {r['start']:.0f} | "
                     f"{'yes' if r['runs'] else 'skipped'} | {r['basis']} |")
    return "\n".join(lines)


def check(plan: Plan, on_deadline: Callable[[dict[str, Any]], None]) -> bool:
    """Once only the budget's margin is left and a step is running: `on_deadline(its record)` (which writes
    the results and ends the process; a test's returns), and True. Between steps nothing is cut: a step
    that does not fit is skipped by the plan itself."""
    rec = plan.current
    if plan.budget.over() and rec is not None:
        on_deadline(rec)
        return True
    return False


def watch(plan: Plan, on_deadline: Callable[[dict[str, Any]], None], sleep: Callable[[float], None] = time.sleep) -> None:
    """`check` about every second (more often near the end) until the plan finishes or a step is cut."""
    while not plan.finished and not check(plan, on_deadline):
        sleep(min(max(plan.budget.left() - plan.budget.margin, 0.05), 1.0))


def start_watch(plan: Plan, on_deadline: Callable[[dict[str, Any]], None]) -> threading.Thread:
    thread = threading.Thread(target=watch, args=(plan, on_deadline), name="gpu-check-budget", daemon=True)
    thread.start()
    return thread


def mem_available() -> int:
    """MemAvailable of /proc/meminfo in bytes (0 when unreadable)."""
    with contextlib.suppress(OSError, ValueError, IndexError):
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    return 0


def fs_type(path: Path) -> str:
    """The file system `path` lies on (/proc/mounts: the longest mount point above it), or ''."""
    best, kind = "", ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/mounts").read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and str(path.resolve()).startswith(parts[1]) and len(parts[1]) >= len(best):
                best, kind = parts[1], parts[2]
    return kind


def measure_folder(folder: Path, probe_bytes: int = 64 << 20) -> dict[str, Any]:
    """Free bytes, file system and write rate (one write of up to `probe_bytes`, fsync'd, as the writer
    syncs) of `folder`. tmpfs holds its files in memory: its room is also bounded by the memory
    available less 16 GB kept for the process."""
    row: dict[str, Any] = {"folder": str(folder)}
    try:
        free = shutil.disk_usage(folder).free
    except OSError as exc:
        return {**row, "room": 0, "error": f"{type(exc).__name__}: {exc}"}
    row.update(filesystem=fs_type(folder), free=free, room=free)
    if row["filesystem"] == "tmpfs":
        row["room"] = min(free, max(0, mem_available() - int(16e9)))
    size = min(probe_bytes, row["room"] // 2)
    if size >= 1 << 20:
        path = folder / f".kvgraft-write-probe-{os.getpid()}"
        data = os.urandom(size)
        try:
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            row["write_bps"] = size / (time.perf_counter() - t0)
        except OSError as exc:
            row["error"] = f"{type(exc).__name__}: {exc}"
        finally:
            path.unlink(missing_ok=True)
    return row


def choose_storage(measured: list[dict[str, Any]], entry_bytes: int, entries: int, min_entries: int) -> dict[str, Any]:
    """The library's folder: the first of `measured` with room for all `entries` (+10%, + 1 GB), else the
    one with the most room, the library cut to the entries that fit there; None when under `min_entries`
    fit anywhere. `said`: every folder's room and the choice, in words."""
    def fit(row: dict[str, Any]) -> int:
        return 0 if "write_bps" not in row else max(0, int((row["room"] - 1e9) / 1.1 // max(entry_bytes, 1)))

    seen = "; ".join(f"{r['folder']}: " + (r["error"] if "error" in r else
                     f"{r['room'] / 1e9:.1f} GB room ({r['filesystem'] or 'file system unknown'}"
                     + (f", writes {r['write_bps'] / 1e9:.2f} GB/s" if "write_bps" in r else "") + ")") for r in measured)
    need = f"{entries} entries of {entry_bytes / 1e9:.3g} GB need {entries * entry_bytes * 1.1 / 1e9 + 1:.1f} GB"
    whole = [r for r in measured if fit(r) >= entries]
    if whole:
        return {**whole[0], "entries": entries, "said": f"{need}; {seen}: chose {whole[0]['folder']}"}
    best = max(measured, key=fit, default=None)
    if best is None or fit(best) < min_entries:
        return {"folder": None, "entries": 0, "said": f"{need}; {seen}: no room for {min_entries} entries, (e) skipped"}
    return {**best, "entries": fit(best), "said": f"{need}; {seen}: chose {best['folder']}, the library cut to "
            f"{fit(best)} entries"}
