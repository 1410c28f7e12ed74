"""What an executor publishes of where its units ran (kvgraft.execution.records): the members, in the order, that
audit results have always held; a local run records no node address, a Ray worker always does (None when unknown)."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from kvgraft.execution.records import Cluster, Failure, Outcome, Placement, Where, WorkerInfo, worker_row
from kvgraft.inference.models import Identity

PLACEMENT = ["executor", "node_id", "hostname", "pid", "worker", "device", "device_name", "accelerator_ids",
             "model_identity", "environment"]
ENV = {"device": "cpu", "device_name": "a cpu", "threads": 2}


def test_a_placement_holds_the_members_results_have_always_held() -> None:
    local = Where("local", node_id=None, worker=0, device="cpu", model_identity="m" * 64, environment=ENV)
    placed = Outcome({"v": 1}, Placement(local, "/r", {"threads": [1, 2]})).placed(1)
    p = placed["placement"]
    assert isinstance(p, dict)
    assert list(p) == [*PLACEMENT, "release_root", "environment_differences", "attempt"]
    assert p["hostname"] == socket.gethostname() and p["pid"] == os.getpid() and p["device_name"] == "a cpu"
    assert (p["accelerator_ids"], p["environment_differences"], p["attempt"]) == ({}, {"threads": [1, 2]}, 1)
    ray = Where("ray", node_id="n1", worker=1, device="cuda:0", model_identity="m" * 64, environment=ENV,
                accelerator_ids={"GPU": ["3"]})
    p = Outcome({"v": 1}, Placement(ray, "/r", {})).placed(3)["placement"]
    assert isinstance(p, dict)
    assert list(p) == [*PLACEMENT, "node_ip", "release_root", "environment_differences", "attempt"]
    assert (p["node_ip"], p["accelerator_ids"], p["attempt"]) == (None, {"GPU": ["3"]}, 3)


def test_a_pool_is_described_as_before() -> None:
    where = Where("ray", node_id="n1", worker=0, device="cpu", model_identity="m" * 64, environment=ENV, node_ip="10.0.0.1")
    info = WorkerInfo("spec", "cpu", "float32", "sdpa", Identity("a", "b", "c", "d", 1, 2), object(), ENV, where)
    assert worker_row(0, info, True) == {
        "worker": 0, "alive": True, "node_id": "n1", "node_ip": "10.0.0.1", "hostname": socket.gethostname(),
        "pid": os.getpid(), "device": "cpu", "device_name": "a cpu", "accelerator_ids": {}, "threads": 2}
    assert list(Failure(1, "n1", "h", "e3", "RayActorError: gone").as_json()) == \
        ["worker", "node_id", "hostname", "unit", "error"]
    assert Cluster(None, True, 8, 0, {"num_cpus": 2, "num_gpus": 0}).as_json() == {
        "address": None, "started_here": True, "resources": {"CPU": 8, "GPU": 0},
        "worker_resources": {"num_cpus": 2, "num_gpus": 0}}


def test_a_shipped_policy_names_the_files_written_on_the_worker() -> None:
    """The keys and detached signature a policy names travel as bytes; the worker's policy names its own copies,
    whatever the policy's kind (one that checks no signature may still name an OpenSSF model signing file)."""
    from kvgraft.execution.ray_worker import Worker
    from kvgraft.signing.policy import SignatureNotChecked, SignedWithKeys

    worker = Worker.__new__(Worker)  # writing the policy's files needs no model
    worker.index, worker._policy_dir = 0, None
    key, sig = Path("/driver/k.pub"), Path("/driver/model.sig")
    files = {str(key): b"KEY", str(sig): b"SIG"}
    unchecked = worker._policy_files(SignatureNotChecked(oms_signature=sig), files)
    assert isinstance(unchecked, SignatureNotChecked) and unchecked.oms_signature is not None
    assert unchecked.oms_signature.read_bytes() == b"SIG" and unchecked.oms_signature != sig
    keyed = worker._policy_files(SignedWithKeys((key,), oms_signature=sig), files)
    assert isinstance(keyed, SignedWithKeys) and [p.read_bytes() for p in keyed.keys] == [b"KEY"]
    assert keyed.oms_signature == unchecked.oms_signature  # the same bytes: one file
