"""A sample of bench/crash_campaign.py's kills (the full campaign: `make crash-campaign`, docs/reliability.md).

Each scenario kills the real command with SIGKILL at points spread over its runtime and checks what is left at
the output path. The control beside it: the same checks report a broken artifact as a failure.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import crash_campaign


def _held(tally: crash_campaign.Tally) -> None:
    assert tally.kills > 0 and tally.held == tally.kills and tally.cleared and not tally.failures, tally


def test_sign_killed_at_spread_points_leaves_a_release_that_verifies(tmp_path: Path) -> None:
    _held(crash_campaign.sign_scenario(tmp_path, 2))


def test_keygen_killed_at_spread_points_leaves_a_whole_pair(tmp_path: Path) -> None:
    _held(crash_campaign.keygen_scenario(tmp_path, 2))


def test_the_checks_report_a_broken_artifact(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: when the kill leaves a key pair that does not match, the campaign says so."""
    real = crash_campaign.run

    def run_then_break(args: list[str], kill_at: float | None = None) -> tuple[int | None, float]:
        out = real(args, kill_at)
        if kill_at is not None:
            Path(f"{tmp_path / 'k'}.pub.pem").write_bytes(b"not a key\n")
        return out

    monkeypatch.setattr(crash_campaign, "run", run_then_break)
    tally = crash_campaign.keygen_scenario(tmp_path, 1)
    assert tally.held == 0 and tally.failures


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return crash_campaign._tiny_model(tmp_path_factory.mktemp("model"))


@pytest.mark.slow
def test_capture_and_a_journaled_audit_killed_at_spread_points(tmp_path: Path, model: Path) -> None:
    (tmp_path / "c").mkdir()
    (tmp_path / "a").mkdir()
    _held(crash_campaign.capture_scenario(tmp_path / "c", 2, model))
    _held(crash_campaign.audit_scenario(tmp_path / "a", 2, model))


@pytest.mark.slow  # each run loads a model: ten runs, about two minutes on two busy cores
def test_library_build_and_audit_run_killed_at_spread_points(tmp_path: Path, model: Path) -> None:
    (tmp_path / "l").mkdir()
    (tmp_path / "r").mkdir()
    _held(crash_campaign.library_scenario(tmp_path / "l", 2, model))
    _held(crash_campaign.audit_run_scenario(tmp_path / "r", 2, model))


def _tear_largest(folder: Path) -> None:
    """Cut the release's largest file in half: what a writer that replaced it in place would leave."""
    largest = max((f for f in folder.rglob("*") if f.is_file()), key=lambda f: f.stat().st_size)
    largest.write_bytes(largest.read_bytes()[: largest.stat().st_size // 2])


@pytest.mark.slow
@pytest.mark.parametrize("name", ["library", "report"])
def test_the_library_and_report_checks_report_a_broken_artifact(tmp_path: Path, model: Path, name: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: a torn library release, or a torn report.json at the report's path, is reported."""
    real = crash_campaign.run

    def run_then_break(args: list[str], kill_at: float | None = None) -> tuple[int | None, float]:
        out = real(args, kill_at)
        if kill_at is not None and name == "library":
            _tear_largest(tmp_path / "library")
        elif kill_at is not None:
            (tmp_path / "run" / "report.json").write_bytes(b'{"format": "kvgraft-audit-rep')
        return out

    monkeypatch.setattr(crash_campaign, "run", run_then_break)
    scenario = crash_campaign.library_scenario if name == "library" else crash_campaign.audit_run_scenario
    tally = scenario(tmp_path, 1, model)
    assert tally.held == 0 and tally.failures, tally


def test_a_half_pair_after_a_complete_keygen_is_reported(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The one partial state the kills may leave (a private key without its public key, the kill between
    keygen's two writes) is admitted after a kill, never after a complete run; the control: it is reported."""
    real = crash_campaign.run

    def run_then_drop(args: list[str], kill_at: float | None = None) -> tuple[int | None, float]:
        out = real(args, kill_at)
        Path(f"{tmp_path / 'k'}.pub.pem").unlink(missing_ok=True)
        return out

    monkeypatch.setattr(crash_campaign, "run", run_then_drop)
    tally = crash_campaign.keygen_scenario(tmp_path, 1)
    assert tally.held == 1 and tally.admitted == 1 and not tally.cleared and tally.failures
