"""One value of the conditions a recompute or run sets, from the record or an option: the same from the CLI's options,
from an audit plan, and through the model spec a Ray worker is started with to the model it loads."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.audit import single
from kvgraft.cli import app
from kvgraft.execution import ray_worker
from kvgraft.execution.executor import ModelSpec, RayExecutor
from kvgraft.generalization import library
from kvgraft.inference import models, runtime
from kvgraft.inference.reapply import Conditions

CONDITIONS = ["--device", "cpu", "--dtype", "bfloat16", "--attn", "eager", "--threads", "3"]
EXPECTED = Conditions("cpu", "bfloat16", "eager", 3)


class _Stop(errors.InputError):
    """Raised by a stand-in library call once it has seen its settings: the command ends with exit code 2."""


def _settings_of(monkeypatch: pytest.MonkeyPatch, module: Any, name: str, argv: list[str]) -> Any:
    seen: list[Any] = []

    def library_call(settings: Any, **_kw: Any) -> Any:
        seen.append(settings)
        raise _Stop("seen")

    monkeypatch.setattr(module, name, library_call)
    r = CliRunner().invoke(app, argv)
    assert r.exit_code == 2 and "seen" in r.output, r.output
    return seen[0]


def test_the_cli_options_and_a_plan_give_the_same_conditions(monkeypatch: pytest.MonkeyPatch) -> None:
    recompute = _settings_of(monkeypatch, single, "recompute", ["audit", "recompute", "REL", *CONDITIONS, "--chunk", "16"])
    assert recompute.conditions == Conditions("cpu", "bfloat16", "eager", 3, chunk=16)
    generalization = _settings_of(monkeypatch, single, "generalization",
                                  ["audit", "generalization", "--library", "LIB", *CONDITIONS])
    assert generalization.conditions == EXPECTED
    build = _settings_of(monkeypatch, library, "build_from", ["library", "build", "--out", "OUT", *CONDITIONS])
    assert build.conditions == EXPECTED
    plan = Conditions.from_plan({"spec": "m", "device": "cpu", "dtype": "bfloat16", "attn": "eager"}, {"threads": 3})
    assert plan == EXPECTED
    # `audit run --device` overrides the plan's device; absent, the plan's tables decide, with kvgraft's defaults.
    assert Conditions.from_plan({"spec": "m", "device": "cuda"}, {}, "cpu") == Conditions("cpu", "float32", "sdpa")


def test_a_ray_worker_loads_what_the_driver_sets(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """The model spec a worker is started with, copied through the reduce protocol Ray's serializer uses (no bytes
    unpickled), to the model the worker loads: the thread
    count the pool gives its CPU actors (a release's recorded one, when no --threads fixed one)."""
    ex = RayExecutor(ModelSpec("m", Conditions("auto", "bfloat16", "eager")))
    conditions = ex.worker_conditions(use_gpu=False, threads=3)
    assert conditions == EXPECTED
    spec = copy.deepcopy(ModelSpec("m", conditions))
    loaded: list[tuple[str, ...]] = []
    threads: list[int] = []

    def load(spec: str, *, device: str, dtype: str, attn: str) -> Any:
        loaded.append((spec, device, dtype, attn))
        raise _Stop("loaded")

    monkeypatch.setattr(models, "home", lambda: tmp_path)
    monkeypatch.setattr(models, "resolve", lambda spec: spec)
    monkeypatch.setattr(models, "load", load)
    monkeypatch.setattr(runtime, "set_threads", threads.append)
    worker = ray_worker.Worker(spec, 0)
    assert isinstance(worker.error, _Stop)
    assert loaded == [("m", "cpu", "bfloat16", "eager")] and threads == [3]


def test_conditions_read_the_record_and_says_what_it_overrides() -> None:
    recorded = {"device": "cpu", "dtype": "float32", "attn_implementation": "sdpa", "threads": 2}
    assert Conditions().overrides(recorded) == {}
    assert Conditions("cpu", "float32", "eager", 2).overrides(recorded) == {"attn_implementation": "eager"}
    assert Conditions(threads=4).overrides(recorded) == {"threads": 4}
    assert Conditions().load_options(recorded) == ("cpu", "float32", "sdpa")
    with pytest.raises(errors.InputError, match="--dtype int8: expected one of"):
        Conditions(dtype="int8").checked()


def test_a_schedule_is_read_back_as_written_and_a_mistyped_one_refused() -> None:
    for schedule in (runtime.Schedule(), runtime.Schedule(4, False, True)):
        assert runtime.Schedule.from_dict(schedule.as_dict()) == schedule
    for odd in ({"chunk_tokens": "4"}, {"chunk_tokens": True}, {"add_special_tokens": 1},
                {"add_generation_prompt": None}):
        with pytest.raises(errors.InputError, match="chunk_tokens must be an integer or null"):
            runtime.Schedule.from_dict(odd)
