"""Executors: where the work units of an audit run, in-process or on a Ray cluster.

An audit is a list of work units: one per entry (recompute), one per (problem, condition)
(generalization). Each unit is a pure function `fn(lm, release, unit) -> result` of its inputs (a
result is a JSON object); an executor applies it to every unit and returns the results in unit
order, each with a `placement` record (kvgraft.execution.records.Placement): which node, process and
device computed it, that device's environment, and how that environment differs from the one the
release recorded (so drift on a mixed cluster shows per entry).

- `LocalExecutor` runs the units one after another in this process, on the model already loaded.
- `RayExecutor` keeps a pool of Ray actors (`kvgraft.execution.ray_worker.Worker`), each started with
  the model spec, device, dtype, attention implementation and torch thread count; each loads the
  model once and keeps it. One actor per GPU (num_gpus=1) when the cluster has GPUs and the device
  allows them, else one per CPU slot of `threads` CPUs (default 1 thread per actor). Units are
  dispatched as actors free up; results stream back and are put in unit order. A unit whose actor
  dies (killed actor, lost node, crashed process) is retried on another live actor, at most
  `max_retries` times; a result is kept once, so nothing is lost or counted twice. When retries run
  out, or no actor is left, `NotAuditedError` (exit code 2, "could not run") names every unit that was
  not audited: never a silent partial result. An exception raised by the unit function itself (an
  integrity error, a model mismatch) is not a fault of the cluster and is re-raised as it is.

Ray is imported only inside `RayExecutor`: the local executor needs no Ray installed.

Comparing two runs (local vs ray, 1 vs N workers, with vs without faults): the results are identical
apart from timing and placement fields. `comparable(result)` strips the keys `seconds`, `placement`,
`executor` and every key ending in `_seconds`, plus `created`, `energy`, `energy_joules` (energy is
timing-derived: measured or estimated over wall time); everything else must be equal.
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
from abc import ABC, abstractmethod
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import Any, TypeVar, cast

from pydantic import JsonValue

from kvgraft.errors import InputError, ModelMismatchError
from kvgraft.execution.records import Cluster, Failure, Outcome, Placement, R, ReleaseHandle, Where, WorkerInfo, worker_row
from kvgraft.inference.models import LoadedModel
from kvgraft.inference.reapply import DEFAULT_CONDITIONS, Conditions
from kvgraft.release.records import MANIFEST, safe_path
from kvgraft.results.base import JsonObject
from kvgraft.signing.attest import BUNDLE_NAME, OMS_NAME
from kvgraft.signing.verify import VerifiedRelease

KINDS = ("local", "ray")
U = TypeVar("U")  # a unit of work: an entry's record, a (problem, condition) task
UnitFn = Callable[[LoadedModel, VerifiedRelease, U], R]
Progress = Callable[[int, int, str], None]
OnResult = Callable[[int, R], None]  # (unit index, its result), as each one lands
# `cost` is the recompute's cost ledger: tokens per second and wall time, timing like `seconds`.
TIMING_KEYS = frozenset({"seconds", "created", "energy", "energy_joules", "cost"})
PLACEMENT_KEYS = frozenset({"placement", "executor"})
# Ray errors that mean "the worker or its node is gone", not "the unit failed": the unit is retried elsewhere.
_LOST = ("RayActorError", "WorkerCrashedError", "NodeDiedError", "ObjectLostError", "OutOfMemoryError",
         "LocalRayletDiedError", "TaskCancelledError")
PLAN_KEYS = {"kind": str, "address": str, "workers": int, "ship": bool, "threads": int, "max_retries": int}


class NotAuditedError(InputError):
    """Work units that could not be run (worker faults beyond the retry bound): exit code 2."""

    def __init__(self, message: str, missing: Sequence[str] = (), failures: Sequence[Failure] = ()) -> None:
        super().__init__(message)
        self.missing = list(missing)
        self.failures = list(failures)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (str(self), self.missing, self.failures))


def comparable(obj: Any) -> Any:
    """`obj` without timing and placement fields (see the module docstring), for comparing runs."""
    if isinstance(obj, dict):
        return {k: comparable(v) for k, v in obj.items()
                if k not in TIMING_KEYS and k not in PLACEMENT_KEYS and not k.endswith("_seconds")}
    if isinstance(obj, list):
        return [comparable(v) for v in obj]
    return obj


@dataclass(frozen=True)
class ModelSpec:
    """What every worker loads: `models.load(spec, device=, dtype=, attn=)` after `runtime.set_threads(threads)`, all
    four from `conditions`."""

    spec: str
    conditions: Conditions = DEFAULT_CONDITIONS


class _ConfigOnly:
    """Stands in for the weights on the driver of a Ray run: only the config travels."""

    def __init__(self, config: Any) -> None:
        self.config = config


def remote_model(info: WorkerInfo) -> LoadedModel:
    """A LoadedModel without weights, describing what the workers loaded (spec, identity, config, device)."""
    return LoadedModel(info.spec, cast(Any, _ConfigOnly(info.config)), cast(Any, None), info.device, info.dtype,
                       info.attn, _identity=info.identity)


def _labels(units: Sequence[object], labels: Sequence[str] | None) -> list[str]:
    if labels is not None:
        if len(labels) != len(units):
            raise ValueError("one label per unit")
        return [str(x) for x in labels]
    return [str(i) for i in range(len(units))]


class Executor(ABC):
    """Runs `fn(lm, release, unit)` for every unit; results in unit order, each with `placement`."""

    kind = ""

    @abstractmethod
    def map(self, fn: UnitFn[U, R], release: VerifiedRelease, units: Sequence[U], *, lm: LoadedModel | None = None,
            labels: Sequence[str] | None = None, progress: Progress | None = None,
            on_result: OnResult[R] | None = None) -> list[R]:
        """`progress(done, total, label)`: `label` names a unit just started (local) or just finished (ray).
        `on_result(index, result)` is called in this process once per unit, as its result lands (a journal
        records it there, so an interrupted run loses no finished unit)."""

    def fixed_threads(self) -> int | None:
        """The torch thread count the user fixed for the units (--threads, a plan's executor.threads), or None."""
        return None

    def reapply_threads(self, threads: int | None) -> None:  # noqa: B027 - most executors set no threads
        """The torch thread count CPU units must run with (a release's recorded count), unless the user
        fixed one. Ray actors are sized and started with it; in this process `reapply.applied` sets it."""

    @abstractmethod
    def environment(self, lm: LoadedModel) -> JsonObject:
        """The environment the units run in (kvgraft.inference.environment.record), for the result's `current`."""

    @abstractmethod
    def describe(self) -> JsonObject:
        """JSON-ready: kind, workers and where they run, retries and failures so far."""

    @abstractmethod
    def model(self, load: Callable[[], LoadedModel]) -> LoadedModel:
        """The model the audit is about: loaded here (local), or described from the workers (ray)."""

    def close(self) -> None:  # noqa: B027 - nothing to release by default
        """Release workers (no-op for the local executor)."""

    def __enter__(self) -> Executor:
        return self

    def __exit__(self, t: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class LocalExecutor(Executor):
    """In-process, one unit after another, on the loaded model; `threads` sets torch threads meanwhile."""

    kind = "local"

    def __init__(self, threads: int | None = None) -> None:
        if threads is not None and threads < 1:
            raise InputError(f"--threads must be >= 1, got {threads}")
        self.threads = threads

    def fixed_threads(self) -> int | None:
        return self.threads

    def _threads(self) -> contextlib.AbstractContextManager[None]:
        from kvgraft.inference.runtime import threads

        return threads(self.threads)

    def model(self, load: Callable[[], LoadedModel]) -> LoadedModel:
        return load()

    def environment(self, lm: LoadedModel) -> JsonObject:
        from kvgraft.inference.environment import record

        with self._threads():
            return record(lm.device, lm.dtype, lm.attn)

    def map(self, fn: UnitFn[U, R], release: VerifiedRelease, units: Sequence[U], *, lm: LoadedModel | None = None,
            labels: Sequence[str] | None = None, progress: Progress | None = None,
            on_result: OnResult[R] | None = None) -> list[R]:
        from kvgraft.execution.ray_worker import torch_device_name
        from kvgraft.inference.environment import differences

        if lm is None:
            raise InputError("the local executor needs a loaded model")
        names = _labels(units, labels)
        n = len(units)
        out: list[R] = []
        with self._threads():
            env = self.environment(lm)
            diffs = {k: list(v) for k, v in differences(release.manifest.get("environment", {}), env).items()}
            where = Where("local", node_id=None, worker=0, device=torch_device_name(lm), model_identity=lm.identity.sha256,
                          environment=env)
            for i, unit in enumerate(units):
                if progress:
                    progress(i, n, names[i])
                result = Outcome(fn(lm, release, unit), Placement(where, str(release.root), diffs)).placed(1)
                out.append(result)
                if on_result:
                    on_result(i, result)
            if progress and n:
                progress(n, n, names[-1])
        return out

    def describe(self) -> JsonObject:
        return {"kind": self.kind, "workers": 1, "threads": self.threads}


class RayExecutor(Executor):
    """A pool of Ray actors, each holding the loaded model; ordered results, bounded retries, placement."""

    kind = "ray"

    def __init__(self, model: ModelSpec, *, address: str | None = None, workers: int | None = None, ship: bool = False,
                 max_retries: int = 2, inflight: int = 2, init_options: JsonObject | None = None,
                 start_timeout_s: float = 600.0) -> None:
        if workers is not None and workers < 1:
            raise InputError(f"--workers must be >= 1, got {workers}")
        if max_retries < 0:
            raise InputError(f"max_retries must be >= 0, got {max_retries}")
        if inflight < 1:
            raise InputError(f"inflight must be >= 1, got {inflight}")
        if model.conditions.threads is not None and model.conditions.threads < 1:
            raise InputError(f"--threads must be >= 1, got {model.conditions.threads}")
        self.spec = model
        self.address = address
        self.workers = workers
        self.ship = ship
        self.max_retries = max_retries
        self.inflight = inflight
        self.init_options = dict(init_options or {})
        self.start_timeout_s = start_timeout_s
        self.actors: list[Any] = []
        self.infos: list[WorkerInfo] = []
        self.alive: list[bool] = []
        self.failures: list[Failure] = []
        self.retried = 0
        self._owns_ray = False
        self._shipped: dict[str, object] = {}  # root digest -> the object-store reference of its files
        self._lm: LoadedModel | None = None
        self._cluster: Cluster | None = None
        self._reapplied_threads: int | None = None  # the release's recorded count, when the user fixed none
        self._use_gpu = False

    # ------------------------------------------------------------ ray and the pool

    @staticmethod
    def ray() -> Any:
        try:
            return importlib.import_module("ray")
        except ImportError:
            raise InputError("--executor ray needs Ray: pip install 'kvgraft[ray]'") from None

    def _lost_errors(self) -> tuple[type[BaseException], ...]:
        exc = importlib.import_module("ray.exceptions")
        return tuple(c for n in _LOST if isinstance(c := getattr(exc, n, None), type))

    def start(self) -> LoadedModel:
        """Join or start Ray, start the actors, wait until each has loaded the model; idempotent."""
        if self._lm is not None:
            return self._lm
        ray = self.ray()
        if not ray.is_initialized():
            opts: JsonObject = {"include_dashboard": False, "log_to_driver": False, "logging_level": logging.WARNING,
                                    **self.init_options}
            if self.address:
                opts["address"] = self.address
            where = self.address or os.environ.get("RAY_ADDRESS") or "a new local instance"
            try:
                ray.init(**opts)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise InputError(f"cannot start or join Ray ({where}): {str(exc).splitlines()[0] if str(exc) else exc}") \
                    from None
            self._owns_ray = True
        resources = ray.cluster_resources()
        gpus, cpus = int(resources.get("GPU", 0)), int(resources.get("CPU", 0))
        device = self.spec.conditions.device
        if device == "cuda" and gpus == 0:
            raise InputError("--device cuda: the Ray cluster has no GPUs")
        use_gpu = device == "cuda" or (device == "auto" and gpus > 0)
        self._use_gpu = use_gpu
        # CPU actors run with the thread count the units must replay (a release's record), else 1 each.
        threads = self.spec.conditions.threads if self.spec.conditions.threads is not None else \
            (None if use_gpu else self._reapplied_threads or 1)
        if use_gpu:
            n = self.workers or gpus
            if n > gpus:
                raise InputError(f"--workers {n}: the Ray cluster has {gpus} GPUs (one worker per GPU)")
            options: dict[str, int] = {"num_gpus": 1, "num_cpus": threads or 1}
        else:
            slot = threads or 1
            n = self.workers or max(1, cpus // slot)
            if n * slot > cpus:
                raise InputError(f"--workers {n} with {slot} thread(s) each needs {n * slot} CPUs; the Ray cluster has {cpus}")
            options = {"num_cpus": slot, "num_gpus": 0}
        from kvgraft.execution.ray_worker import Worker

        actor_cls = ray.remote(Worker).options(max_restarts=0, max_task_retries=0, **options)
        spec = ModelSpec(self.spec.spec, self.worker_conditions(use_gpu, threads))
        self._cluster = Cluster(self.address or os.environ.get("RAY_ADDRESS"), self._owns_ray, cpus, gpus, options)
        self.actors = [actor_cls.remote(spec, i) for i in range(n)]
        self.alive = [True] * n
        try:
            self.infos = ray.get([a.info.remote() for a in self.actors], timeout=self.start_timeout_s)
        except BaseException as exc:
            self.close()
            rex = importlib.import_module("ray.exceptions")
            if isinstance(exc, rex.GetTimeoutError):
                raise InputError(f"{n} Ray workers did not load the model within {self.start_timeout_s:g} s "
                                 f"(each needs {options}; cluster has {resources})") from None
            if isinstance(exc, rex.RayTaskError) and isinstance(exc.cause, BaseException):
                raise exc.cause from None
            if isinstance(exc, self._lost_errors()):
                raise InputError(f"a Ray worker died while loading {self.spec.spec}: {_first_line(exc)}") from None
            raise
        ids = {i.identity.sha256 for i in self.infos}
        if len(ids) > 1:
            self.close()
            per = ", ".join(f"worker {i} on {w.where.hostname}: {w.identity.sha256[:16]}…"
                            for i, w in enumerate(self.infos))
            raise ModelMismatchError(f"the Ray workers loaded different models from {self.spec.spec!r}: {per}")
        self._lm = remote_model(self.infos[0])
        return self._lm

    def model(self, load: Callable[[], LoadedModel]) -> LoadedModel:
        return self.start()

    def worker_conditions(self, use_gpu: bool, threads: int | None) -> Conditions:
        """What each actor loads and sets: this executor's conditions on the device and threads the pool gives it."""
        return replace(self.spec.conditions, device="cuda" if use_gpu else "cpu", threads=threads)

    def fixed_threads(self) -> int | None:
        return self.spec.conditions.threads

    def reapply_threads(self, threads: int | None) -> None:
        """Size the CPU actors to `threads` (num_cpus) and start them with that many torch threads.

        Kept when `--threads` (the spec) fixed a count; a pool already started with another count is
        restarted, so no unit runs with a thread count that changes its bytes.
        """
        if self.spec.conditions.threads is not None or threads is None or threads == self._reapplied_threads:
            return
        if threads < 1:
            raise InputError(f"recorded thread count {threads} is not >= 1")
        started = self._lm is not None
        if started and self._use_gpu:
            return  # GPU actors: the thread count does not decide their bytes here
        self._reapplied_threads = threads
        if started:
            current = {i.threads for i in self.infos}
            if current != {threads}:
                self._stop_actors()
                self.start()

    def _stop_actors(self) -> None:
        ray = self.ray()
        self._close_releases()
        for a in self.actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(a, no_restart=True)
        self.actors, self.infos, self.alive = [], [], []
        self._lm = None

    def _close_releases(self) -> None:
        """Each live worker closes the releases it opened, before it is killed (a published release's mirror)."""
        alive = [a for a, up in zip(self.actors, self.alive, strict=False) if up]
        with contextlib.suppress(Exception):  # a worker lost or slow: its node's `kvgraft cache prune` removes the rest
            self.ray().get([a.close.remote() for a in alive], timeout=30)

    def environment(self, lm: LoadedModel) -> JsonObject:
        self.start()
        return dict(self.infos[0].environment)

    def close(self) -> None:
        """Kill the actors; shut Ray down if this executor started it."""
        if not self.actors and not self._owns_ray:
            return
        ray = self.ray()
        self._close_releases()
        for a in self.actors:
            with contextlib.suppress(Exception):  # already dead
                ray.kill(a, no_restart=True)
        self.actors = []
        self._shipped.clear()
        self._lm = None
        if self._owns_ray:
            ray.shutdown()
            self._owns_ray = False

    def kill_worker(self, index: int) -> None:
        """Kill one actor (tests, chaos drills): its in-flight units are retried on the others."""
        self.ray().kill(self.actors[index], no_restart=True)

    # ------------------------------------------------------------ releases

    def _handle(self, release: VerifiedRelease) -> ReleaseHandle:
        """What a worker needs to open the release itself and verify it under the driver's policy."""
        key = str(release.manifest["root_digest"])
        root = release.root.resolve()
        source = release.source
        if source.remote:
            # Read where it is published: each worker opens the location itself and fetches, checks and caches
            # the pieces of the entries it judges (the driver's mirror folder is on the driver's machine, and
            # shipping would fetch every piece of the release).
            return ReleaseHandle(str(root), key, release.policy, location=source.location)
        if not self.ship:
            return ReleaseHandle(str(root), key, release.policy)
        if key not in self._shipped:
            files = {MANIFEST: (root / MANIFEST).read_bytes()}
            for rel in release.release.all_files():
                files[rel] = safe_path(root, rel, "release file").read_bytes()
            for name in (BUNDLE_NAME, OMS_NAME):  # its signatures: the worker verifies them under the policy
                if (root / name).is_file():
                    files[name] = (root / name).read_bytes()
            self._shipped[key] = self.ray().put(files)
        # The files the policy names (public keys, a detached OMS signature) travel with it: nodes share no folder.
        named = {str(p): Path(p).read_bytes() for p in (*release.policy.keys, release.policy.oms_signature) if p}
        return ReleaseHandle(str(root), key, release.policy, shipped=self._shipped[key], policy_files=named)

    # ------------------------------------------------------------ the work

    def map(self, fn: UnitFn[U, R], release: VerifiedRelease, units: Sequence[U], *, lm: LoadedModel | None = None,
            labels: Sequence[str] | None = None, progress: Progress | None = None,
            on_result: OnResult[R] | None = None) -> list[R]:
        self.start()
        ray = self.ray()
        lost_errors = self._lost_errors()
        task_error = importlib.import_module("ray.exceptions").RayTaskError
        handle = self._handle(release)
        names = _labels(units, labels)
        n = len(units)
        results: list[R | None] = [None] * n
        attempts = [0] * n
        gave_up: dict[int, str] = {}
        queue: deque[int] = deque(range(n))
        pending: dict[Any, tuple[int, int]] = {}
        load = [0] * len(self.actors)
        done = 0
        if progress and n:
            progress(0, n, names[0])
        while queue or pending:
            while queue:  # fill the least-loaded live workers up to `inflight` units each
                free = [w for w in range(len(self.actors)) if self.alive[w] and load[w] < self.inflight]
                if not free:
                    break
                w = min(free, key=lambda x: (load[x], x))
                idx = queue.popleft()
                pending[self.actors[w].run.remote(fn, handle, units[idx])] = (idx, w)
                load[w] += 1
            if not pending:
                break  # units left but no live worker
            ready, _ = ray.wait(list(pending), num_returns=1)
            for ref in ready:
                idx, w = pending.pop(ref)
                load[w] -= 1
                try:
                    outcome: Outcome[R] = ray.get(ref)
                except lost_errors as exc:
                    self._lost(w, names[idx], exc)
                    attempts[idx] += 1
                    if attempts[idx] > self.max_retries:
                        gave_up[idx] = f"{type(exc).__name__}: {_first_line(exc)}"
                    else:
                        self.retried += 1
                        queue.appendleft(idx)
                    continue
                except task_error as exc:  # the unit itself failed: not a cluster fault, not retried
                    if isinstance(exc.cause, BaseException):
                        raise exc.cause from None
                    raise
                if results[idx] is None:  # kept once: a late duplicate is never counted twice
                    result = results[idx] = outcome.placed(attempts[idx] + 1)
                    done += 1
                    if on_result:
                        on_result(idx, result)
                    if progress:
                        progress(done, n, names[idx])
        missing = [i for i in range(n) if results[i] is None]
        if missing:
            why = "; ".join(f"{names[i]}: {gave_up.get(i, 'no live worker left')}" for i in missing[:20])
            more = f" and {len(missing) - 20} more" if len(missing) > 20 else ""
            raise NotAuditedError(
                f"{len(missing)} of {n} work units were NOT audited after worker failures (at most {self.max_retries} "
                f"retries each, {sum(self.alive)} of {len(self.actors)} workers left): {why}{more}",
                [names[i] for i in missing], self.failures)
        return cast(list[R], results)

    def _lost(self, w: int, label: str, exc: BaseException) -> None:
        if self.alive[w]:
            self.alive[w] = False
            with contextlib.suppress(Exception):  # an unavailable actor must not come back and compute twice
                self.ray().kill(self.actors[w], no_restart=True)
        where = self.infos[w].where if w < len(self.infos) else None
        self.failures.append(Failure(w, where.node_id if where else None, where.hostname if where else None, label,
                                     f"{type(exc).__name__}: {_first_line(exc)}"))

    def describe(self) -> JsonObject:
        workers: list[JsonValue] = [worker_row(i, info, self.alive[i] if i < len(self.alive) else False)
                                    for i, info in enumerate(self.infos)]
        envs = {repr(sorted(i.environment.items())) for i in self.infos}
        return {"kind": self.kind, **(self._cluster.as_json() if self._cluster else {}), "ship": self.ship,
                "max_retries": self.max_retries, "workers": workers,
                "nodes": len({i.where.node_id for i in self.infos}), "mixed_environments": len(envs) > 1,
                "retried_units": self.retried, "failures": [f.as_json() for f in self.failures]}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def from_options(kind: str, model: ModelSpec, *, address: str | None = None, workers: int | None = None,
                 ship: bool = False, max_retries: int = 2) -> Executor:
    """The executor the CLI options (or a plan's `executor` table) ask for."""
    if kind not in KINDS:
        raise InputError(f"--executor {kind}: expected one of {', '.join(KINDS)}")
    if kind == "local":
        extra = [o for o, v in (("--ray-address", address), ("--workers", workers), ("--ship", ship)) if v]
        if extra:
            raise InputError(f"{', '.join(extra)} need(s) --executor ray")
        return LocalExecutor(model.conditions.threads)
    return RayExecutor(model, address=address, workers=workers, ship=ship, max_retries=max_retries)


def plan_options(table: dict[str, Any] | None, overrides: dict[str, Any] | None = None) -> dict[str, Any]:
    """A plan's `[executor]` table (kind, address, workers, ship, threads, max_retries), with CLI overrides on top."""
    merged = {**(table or {}), **{k: v for k, v in (overrides or {}).items() if v is not None}}
    for key, value in merged.items():
        want = PLAN_KEYS.get(key)
        if want is None:
            raise InputError(f"executor: unknown key {key!r} (expected {', '.join(PLAN_KEYS)})")
        if not isinstance(value, want) or (want is int and isinstance(value, bool)):
            raise InputError(f"executor.{key}: expected {want.__name__}, got {value!r}")
    merged.setdefault("kind", "local")
    return merged


__all__ = ["KINDS", "Executor", "LocalExecutor", "ModelSpec", "NotAuditedError",
           "RayExecutor", "comparable", "from_options", "plan_options", "remote_model"]
