"""Energy of a block of work: measured by RAPL (CPU) or NVML (GPU) where readable, else estimated.

    with measure() as m:
        work()
    m.result.joules, m.result.method   # "rapl" | "nvml" | "estimate"

RAPL counters (/sys/class/powercap/intel-rapl:N/energy_uj) cover the whole CPU package, every
process on it, not just this one; they wrap at max_energy_range_uj, which is corrected for, and a
background thread samples them every `poll_s` seconds so that a long block cannot wrap twice
unseen. Since Linux 5.10 energy_uj is readable by root only; a permission error falls back (auto)
or raises (method="rapl"). NVML's total-energy counter (Volta or newer) covers the whole board.

An estimate is a model, not a measurement, and says so: its constants are recorded with it.
  CPU: ESTIMATE_CPU_PACKAGE_WATTS × wall seconds × busy fraction, where busy fraction = this
       process's CPU seconds / (wall seconds × cores it may run on).
  GPU: ESTIMATE_GPU_BOARD_WATTS × wall seconds × ESTIMATE_GPU_UTILIZATION.
"""

from __future__ import annotations

import importlib
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any, Literal, TypedDict

from kvgraft._internal.cores import cores
from kvgraft.errors import InputError

RAPL_ROOT = Path("/sys/class/powercap")
ESTIMATE_CPU_PACKAGE_WATTS = 65.0  # assumed package power with every core busy (a typical desktop/server TDP)
ESTIMATE_GPU_BOARD_WATTS = 300.0  # assumed board power of a busy data-centre GPU
ESTIMATE_GPU_UTILIZATION = 1.0  # assumed busy for the whole block: an upper-end estimate
RAPL_POLL_S = 30.0

Method = Literal["auto", "rapl", "nvml", "estimate"]
Device = Literal["cpu", "gpu"]


class EnergyRecord(TypedDict):
    """`EnergyResult.as_dict`: its fields, `is_estimate` and `watts`."""

    method: str
    joules: float
    seconds: float
    device: str
    constants: dict[str, float]
    domains: dict[str, float]
    note: str
    is_estimate: bool
    watts: float


@dataclass(frozen=True)
class EnergyResult:
    method: str  # "rapl" | "nvml" | "estimate"
    joules: float
    seconds: float  # wall time of the block
    device: str  # "cpu" | "gpu"
    constants: dict[str, float] = field(default_factory=dict)  # the model's constants and inputs (estimate)
    domains: dict[str, float] = field(default_factory=dict)  # joules per RAPL package / GPU
    note: str = ""

    @property
    def is_estimate(self) -> bool:
        return self.method == "estimate"

    @property
    def watts(self) -> float:
        return self.joules / self.seconds if self.seconds > 0 else 0.0

    def as_dict(self) -> EnergyRecord:
        return EnergyRecord(method=self.method, joules=self.joules, seconds=self.seconds, device=self.device,
                            constants=dict(self.constants), domains=dict(self.domains), note=self.note,
                            is_estimate=self.is_estimate, watts=self.watts)


# ---------------------------------------------------------------- RAPL


@dataclass(frozen=True)
class RaplDomain:
    path: Path
    name: str
    max_range_uj: int


def _read_int(path: Path) -> int:
    return int(path.read_text().strip())


def rapl_domains(root: Path = RAPL_ROOT) -> list[RaplDomain]:
    """Top-level RAPL zones (packages; psys only when there is no package zone, as it contains them).

    Sub-zones (intel-rapl:0:0 core, dram, ...) are inside their package and are not counted again.
    Raises PermissionError / OSError when a counter exists but cannot be read.
    """
    try:
        zones = sorted(p for p in root.glob("intel-rapl:*") if re.fullmatch(r"intel-rapl:\d+", p.name))
    except OSError:
        return []
    found: list[RaplDomain] = []
    for z in zones:
        if not (z / "energy_uj").exists():
            continue
        try:
            name = (z / "name").read_text().strip()
        except OSError:
            name = z.name
        max_range = _read_int(z / "max_energy_range_uj")
        _read_int(z / "energy_uj")  # readable? (PermissionError for non-root on Linux >= 5.10)
        found.append(RaplDomain(z, name, max_range))
    packages = [d for d in found if not d.name.startswith("psys")]
    return packages or found


def rapl_delta(start_uj: int, end_uj: int, max_range_uj: int) -> int:
    """Energy between two readings of one counter, allowing for a single wrap at max_range_uj."""
    return end_uj - start_uj if end_uj >= start_uj else end_uj + max_range_uj - start_uj


class _RaplMeter:
    def __init__(self, domains: list[RaplDomain], poll_s: float | None) -> None:
        self.domains = domains
        self.lock = threading.Lock()
        self.last = {d.path: _read_int(d.path / "energy_uj") for d in domains}
        self.acc = dict.fromkeys(self.last, 0)
        self.stop = threading.Event()
        self.thread: threading.Thread | None = None
        if poll_s is not None and poll_s > 0:
            self.thread = threading.Thread(target=self._poll, args=(poll_s,), name="kvgraft-rapl", daemon=True)
            self.thread.start()

    def sample(self) -> None:
        with self.lock:
            for d in self.domains:
                now = _read_int(d.path / "energy_uj")
                self.acc[d.path] += rapl_delta(self.last[d.path], now, d.max_range_uj)
                self.last[d.path] = now

    def _poll(self, poll_s: float) -> None:
        while not self.stop.wait(poll_s):
            try:
                self.sample()
            except (OSError, ValueError):  # pragma: no cover - a counter vanishing mid-run; the final sample reports it
                return

    def finish(self) -> dict[str, float]:
        self.stop.set()
        if self.thread is not None:
            self.thread.join()
        self.sample()
        names: dict[str, float] = {}
        for d in self.domains:
            key = d.name if d.name not in names else f"{d.name}:{d.path.name}"
            names[key] = self.acc[d.path] / 1e6
        return names


# ---------------------------------------------------------------- NVML


def _import_pynvml() -> Any:
    return importlib.import_module("pynvml")


class _NvmlMeter:
    def __init__(self) -> None:
        self.nvml: Any = _import_pynvml()
        self.nvml.nvmlInit()
        try:
            count = int(self.nvml.nvmlDeviceGetCount())
            if count == 0:
                raise RuntimeError("NVML sees no GPU")
            self.handles = [self.nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
            self.start = [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]  # mJ
        except BaseException:
            self.nvml.nvmlShutdown()
            raise

    def finish(self) -> dict[str, float]:
        try:
            end = [int(self.nvml.nvmlDeviceGetTotalEnergyConsumption(h)) for h in self.handles]
        finally:
            self.nvml.nvmlShutdown()
        return {f"gpu{i}": (e - s) / 1e3 for i, (s, e) in enumerate(zip(self.start, end, strict=True))}


# ---------------------------------------------------------------- the context manager


class measure:  # lower-case: used like a function, `with measure() as m:`
    """Measure the energy of the `with` block; the result is in `.result` after the block ends.

    method: "auto" tries RAPL (device cpu) or NVML (device gpu) and falls back to an estimate,
    recording why in `note`; "rapl" / "nvml" raise InputError when the counter cannot be read.
    """

    def __init__(
        self,
        method: Method = "auto",
        *,
        device: Device = "cpu",
        rapl_root: Path = RAPL_ROOT,
        poll_s: float | None = RAPL_POLL_S,
        cpu_package_watts: float = ESTIMATE_CPU_PACKAGE_WATTS,
        gpu_board_watts: float = ESTIMATE_GPU_BOARD_WATTS,
        gpu_utilization: float = ESTIMATE_GPU_UTILIZATION,
        n_cores: int | None = None,
    ) -> None:
        if method not in ("auto", "rapl", "nvml", "estimate"):
            raise InputError(f"unknown energy method {method!r}")
        if device not in ("cpu", "gpu"):
            raise InputError(f"unknown device {device!r}; expected cpu or gpu")
        self.method = method
        self.device = device
        self.rapl_root = rapl_root
        self.poll_s = poll_s
        self.cpu_package_watts = cpu_package_watts
        self.gpu_board_watts = gpu_board_watts
        self.gpu_utilization = gpu_utilization
        self.n_cores = n_cores if n_cores is not None else cores()
        self.result: EnergyResult | None = None
        self._meter: _RaplMeter | _NvmlMeter | None = None
        self._fallback_note = ""
        self._t0 = 0.0
        self._cpu0 = 0.0

    def _open_rapl(self) -> _RaplMeter:
        try:
            domains = rapl_domains(self.rapl_root)
            if not domains:
                raise FileNotFoundError(f"no RAPL zones under {self.rapl_root}")
            return _RaplMeter(domains, self.poll_s)
        except PermissionError as exc:
            raise InputError(f"RAPL counters are not readable ({exc.strerror or exc}); root-only on Linux >= 5.10") from None
        except (OSError, ValueError) as exc:
            raise InputError(f"RAPL unavailable: {exc}") from None

    def _open_nvml(self) -> _NvmlMeter:
        try:
            return _NvmlMeter()
        except ImportError:
            raise InputError("NVML unavailable: pynvml is not installed") from None
        except Exception as exc:  # pynvml raises its own NVMLError types
            raise InputError(f"NVML energy counter unavailable: {exc}") from None

    def __enter__(self) -> measure:
        chosen = self.method
        if chosen in ("auto", "rapl") and (self.device == "cpu" or chosen == "rapl"):
            try:
                self._meter = self._open_rapl()
            except InputError as exc:
                if chosen == "rapl":
                    raise
                self._fallback_note = f"measured nothing: {exc}"
        elif chosen in ("auto", "nvml"):
            try:
                self._meter = self._open_nvml()
            except InputError as exc:
                if chosen == "nvml":
                    raise
                self._fallback_note = f"measured nothing: {exc}"
        self._t0 = time.perf_counter()
        self._cpu0 = time.process_time()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        seconds = time.perf_counter() - self._t0
        cpu_seconds = time.process_time() - self._cpu0
        meter, self._meter = self._meter, None
        if isinstance(meter, _RaplMeter):
            domains = meter.finish()
            note = "RAPL package counters: whole CPU package, every process on it"
            self.result = EnergyResult("rapl", sum(domains.values()), seconds, "cpu", {}, domains, note)
        elif isinstance(meter, _NvmlMeter):
            domains = meter.finish()
            note = "NVML total energy counter: whole board(s), every process on them"
            self.result = EnergyResult("nvml", sum(domains.values()), seconds, "gpu", {}, domains, note)
        else:
            self.result = self._estimate(seconds, cpu_seconds)

    def _estimate(self, seconds: float, cpu_seconds: float) -> EnergyResult:
        prefix = f"{self._fallback_note}; " if self._fallback_note else ""
        if self.device == "gpu":
            joules = self.gpu_board_watts * seconds * self.gpu_utilization
            constants = {"gpu_board_watts": self.gpu_board_watts, "gpu_utilization_assumed": self.gpu_utilization}
            model = "ESTIMATE, not a measurement: gpu_board_watts × wall seconds × gpu_utilization_assumed"
        else:
            busy = min(1.0, cpu_seconds / (seconds * self.n_cores)) if seconds > 0 and self.n_cores > 0 else 0.0
            joules = self.cpu_package_watts * seconds * busy
            constants = {
                "cpu_package_watts": self.cpu_package_watts,
                "cores": float(self.n_cores),
                "cpu_seconds": cpu_seconds,
                "busy_fraction": busy,
            }
            model = (
                "ESTIMATE, not a measurement: cpu_package_watts × wall seconds × busy_fraction "
                "(this process's CPU seconds / (wall seconds × cores)); idle and uncore power are not counted"
            )
        return EnergyResult("estimate", joules, seconds, self.device, constants, {}, prefix + model)
