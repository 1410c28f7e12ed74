"""What travels between an executor and its workers, and what a result says about where its units ran.

A Ray actor is started with a `ModelSpec` (kvgraft.execution.executor), answers `WorkerInfo`, is handed a
`ReleaseHandle` with each unit and returns an `Outcome`: Ray pickles each of these whole (a transformers
config, a verification policy and an object-store reference among them), so they are frozen dataclasses,
not JSON. What an audit's result publishes of them (a unit's `placement`, a failure, the executor's
description) is written by their `as_json`, member for member the JSON these results have always held.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import JsonValue

from kvgraft.inference.models import Identity
from kvgraft.results.base import JsonObject
from kvgraft.signing.policy import VerifyPolicy

R = TypeVar("R", bound=JsonObject)  # a unit's result: a JSON object its unit function defines


@dataclass(frozen=True)
class Where:
    """Where work runs: node, host, process, device and that device's environment (recorded per unit)."""

    executor: str
    node_id: str | None
    worker: int
    device: str
    model_identity: str
    environment: JsonObject
    accelerator_ids: dict[str, list[str]] = field(default_factory=dict)
    node_ip: str | None = None  # a Ray worker's node (None when Ray cannot say); a local run records none
    hostname: str = field(default_factory=socket.gethostname)
    pid: int = field(default_factory=os.getpid)

    def as_json(self) -> JsonObject:
        out: JsonObject = {
            "executor": self.executor, "node_id": self.node_id, "hostname": self.hostname, "pid": self.pid,
            "worker": self.worker, "device": self.device, "device_name": self.environment.get("device_name"),
            "accelerator_ids": {k: list(v) for k, v in self.accelerator_ids.items()},
            "model_identity": self.model_identity, "environment": self.environment}
        if self.executor == "ray":
            out["node_ip"] = self.node_ip
        return out


@dataclass(frozen=True)
class Placement:
    """A unit's `placement`: where it ran, the release it read, how the environment differs from the release's
    record (name: [recorded, current]) and which attempt gave the result kept."""

    where: Where
    release_root: str
    environment_differences: dict[str, list[JsonValue]]
    attempt: int = 1

    def as_json(self) -> JsonObject:
        return {**self.where.as_json(), "release_root": self.release_root,
                "environment_differences": {k: list(v) for k, v in self.environment_differences.items()},
                "attempt": self.attempt}


@dataclass(frozen=True)
class Outcome(Generic[R]):
    """A unit's result as a worker returns it, its placement beside it (the driver numbers the attempt)."""

    result: R
    placement: Placement

    def placed(self, attempt: int) -> R:
        """The result with its `placement` member, as the audit publishes it."""
        self.result["placement"] = Placement(self.placement.where, self.placement.release_root,
                                             self.placement.environment_differences, attempt).as_json()
        return self.result


@dataclass(frozen=True)
class WorkerInfo:
    """What a worker reports once it has loaded the model: what the driver needs to stand in for it."""

    spec: str
    device: str
    dtype: str
    attn: str
    identity: Identity
    config: object  # the model's transformers config: the driver reads the architecture from it
    environment: JsonObject
    where: Where

    @property
    def threads(self) -> int | None:
        t = self.environment.get("threads")
        return t if isinstance(t, int) else None


@dataclass(frozen=True)
class ReleaseHandle:
    """What a worker needs to open the release itself and verify it under the driver's policy (the policy
    travels, never an opened release: each worker holds a verified release of its own)."""

    root: str
    root_digest: str
    policy: VerifyPolicy
    location: str | None = None  # a published release: each worker opens it there
    shipped: object | None = None  # --ship: a Ray object reference to the release's files (name -> bytes)
    policy_files: dict[str, bytes] = field(default_factory=dict)  # shipped: the files the policy names


@dataclass(frozen=True)
class Failure:
    """A worker lost while it held a unit (the unit is retried elsewhere, or reported not audited)."""

    worker: int
    node_id: str | None
    hostname: str | None
    unit: str
    error: str

    def as_json(self) -> JsonObject:
        return {"worker": self.worker, "node_id": self.node_id, "hostname": self.hostname, "unit": self.unit,
                "error": self.error}


@dataclass(frozen=True)
class Cluster:
    """The Ray cluster a pool runs on, as the executor's description names it."""

    address: str | None
    started_here: bool
    cpus: int
    gpus: int
    worker_resources: dict[str, int]

    def as_json(self) -> JsonObject:
        return {"address": self.address, "started_here": self.started_here,
                "resources": {"CPU": self.cpus, "GPU": self.gpus}, "worker_resources": dict(self.worker_resources)}


def worker_row(index: int, info: WorkerInfo, alive: bool) -> JsonObject:
    """A worker as the executor's description lists it."""
    w = info.where
    return {"worker": index, "alive": alive, "node_id": w.node_id, "node_ip": w.node_ip, "hostname": w.hostname,
            "pid": w.pid, "device": w.device, "device_name": w.environment.get("device_name"),
            "accelerator_ids": {k: list(v) for k, v in w.accelerator_ids.items()}, "threads": info.threads}


__all__ = ["Cluster", "Failure", "Outcome", "Placement", "ReleaseHandle", "Where", "WorkerInfo", "worker_row"]
