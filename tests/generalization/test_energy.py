from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from kvgraft.errors import InputError
from kvgraft.generalization import energy


def _zone(root: Path, name: str, label: str, uj: int, max_uj: int) -> Path:
    z = root / name
    z.mkdir(parents=True)
    (z / "name").write_text(label + "\n")
    (z / "energy_uj").write_text(f"{uj}\n")
    (z / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return z


def _set(zone: Path, uj: int) -> None:
    tmp = zone / "energy_uj.tmp"
    tmp.write_text(f"{uj}\n")
    os.replace(tmp, zone / "energy_uj")  # atomic: the poller never reads a half-written file


def _busy(seconds: float) -> None:
    end = time.process_time() + seconds
    x = 0
    while time.process_time() < end:
        x += 1


def test_rapl_delta_wraps() -> None:
    assert energy.rapl_delta(100, 350, 1000) == 250
    assert energy.rapl_delta(900, 50, 1000) == 150


def test_rapl_fake_sysfs(tmp_path: Path) -> None:
    p0 = _zone(tmp_path, "intel-rapl:0", "package-0", 1_000_000, 10**12)
    p1 = _zone(tmp_path, "intel-rapl:1", "package-1", 999_000_000, 1_000_000_000)
    _zone(tmp_path, "intel-rapl:0:0", "core", 5, 10**12)  # sub-zone: inside package-0, not counted again
    with energy.measure(rapl_root=tmp_path, poll_s=None) as m:
        _set(p0, 3_500_000)  # +2.5 J
        _set(p1, 1_000_000)  # wrapped: +1 J to the top, +1 J after
    r = m.result
    assert r is not None and r.method == "rapl" and not r.is_estimate
    assert r.domains == pytest.approx({"package-0": 2.5, "package-1": 2.0})
    assert r.joules == pytest.approx(4.5)
    assert r.as_dict()["is_estimate"] is False


def test_rapl_poller_catches_repeated_wraps(tmp_path: Path) -> None:
    z = _zone(tmp_path, "intel-rapl:0", "package-0", 0, 1_000_000)
    with energy.measure("rapl", rapl_root=tmp_path, poll_s=0.01) as m:
        for value in (600_000, 100_000, 700_000, 200_000):  # two wraps in the block
            _set(z, value)
            time.sleep(0.1)
    # +0.6 J, wrap +0.5 J, +0.6 J, wrap +0.5 J: one reading at each end would have seen only +0.2 J
    assert m.result is not None and m.result.joules == pytest.approx(2.2)


def test_psys_only_when_no_package(tmp_path: Path) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0", 0, 10**9)
    _zone(tmp_path, "intel-rapl:1", "psys", 0, 10**9)
    assert [d.name for d in energy.rapl_domains(tmp_path)] == ["package-0"]


def test_rapl_permission_error_falls_back(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _zone(tmp_path, "intel-rapl:0", "package-0", 0, 10**9)
    real = energy._read_int

    def denied(path: Path) -> int:
        if path.name == "energy_uj":
            raise PermissionError(13, "Permission denied")
        return real(path)

    monkeypatch.setattr(energy, "_read_int", denied)
    with energy.measure(rapl_root=tmp_path) as m:
        pass
    assert m.result is not None and m.result.method == "estimate"
    assert "not readable" in m.result.note and "ESTIMATE" in m.result.note
    with pytest.raises(InputError, match="root-only"), energy.measure("rapl", rapl_root=tmp_path):
        pass


def test_estimate_cpu_states_its_model(tmp_path: Path) -> None:
    with energy.measure(rapl_root=tmp_path / "none", n_cores=2, cpu_package_watts=100.0) as m:
        _busy(0.2)
    r = m.result
    assert r is not None and r.method == "estimate" and r.is_estimate
    assert r.constants["cpu_package_watts"] == 100.0 and r.constants["cores"] == 2.0
    assert 0.0 < r.constants["busy_fraction"] <= 1.0
    expected = 100.0 * r.seconds * r.constants["busy_fraction"]
    assert r.joules == pytest.approx(expected)
    assert r.joules == pytest.approx(100.0 * r.constants["cpu_seconds"] / 2, rel=1e-6)
    assert "ESTIMATE" in r.note and "no RAPL zones" in r.note


def test_gpu_without_pynvml(monkeypatch: pytest.MonkeyPatch) -> None:
    def no_module() -> object:
        raise ImportError("No module named 'pynvml'")

    monkeypatch.setattr(energy, "_import_pynvml", no_module)
    with energy.measure(device="gpu", gpu_board_watts=200.0) as m:
        time.sleep(0.05)
    r = m.result
    assert r is not None and r.method == "estimate" and r.device == "gpu"
    assert r.joules == pytest.approx(200.0 * r.seconds) and "pynvml is not installed" in r.note
    with pytest.raises(InputError, match="pynvml"), energy.measure("nvml", device="gpu"):
        pass


def test_nvml_with_a_fake_module(monkeypatch: pytest.MonkeyPatch) -> None:
    readings = iter([1_000, 5_500])  # mJ

    class FakeNvml:
        shutdown = 0

        @staticmethod
        def nvmlInit() -> None:
            pass

        @classmethod
        def nvmlShutdown(cls) -> None:
            cls.shutdown += 1

        @staticmethod
        def nvmlDeviceGetCount() -> int:
            return 1

        @staticmethod
        def nvmlDeviceGetHandleByIndex(i: int) -> str:
            return f"h{i}"

        @staticmethod
        def nvmlDeviceGetTotalEnergyConsumption(h: str) -> int:
            return next(readings)

    monkeypatch.setattr(energy, "_import_pynvml", lambda: FakeNvml)
    with energy.measure(device="gpu") as m:
        pass
    assert m.result is not None and m.result.method == "nvml"
    assert m.result.joules == pytest.approx(4.5) and m.result.domains == {"gpu0": pytest.approx(4.5)}
    assert FakeNvml.shutdown == 1


def test_bad_arguments() -> None:
    with pytest.raises(InputError):
        energy.measure("joulemeter")  # type: ignore[arg-type]
    with pytest.raises(InputError):
        energy.measure(device="tpu")  # type: ignore[arg-type]
