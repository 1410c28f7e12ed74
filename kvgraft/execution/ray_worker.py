"""The Ray actor of `kvgraft.execution.executor.RayExecutor`: one loaded model, many work units.

`Worker` is a plain class; the executor turns it into an actor with `ray.remote(Worker).options(...)`,
so importing this module needs no Ray. An actor is started with the model spec, device, dtype,
attention implementation and torch thread count, loads the model once in its constructor and keeps
it. `run(fn, release, unit)` applies a pure per-unit function `fn(lm, release, unit) -> result` and
returns the result with the unit's placement (kvgraft.execution.records.Outcome): which node, process
and device computed it, in which environment, and how that environment differs from the one the
release recorded.

A release reaches a worker either as a path every node sees or shipped through Ray's object store
(`--ship`: the files, its signatures among them, are written once per node under
$TMPDIR/kvgraft-ray/<root digest>), with the policy the driver verified it under (and, shipped, the
files that policy names). The worker verifies it there under that policy
(`kvgraft.signing.verify.verified`), checks it has the driver's root digest, and hands the unit
function that `VerifiedRelease`: no worker reads a release it did not verify itself.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import importlib
import os
import shutil
import socket
import tempfile
import weakref
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from kvgraft.errors import InputError, IntegrityError
from kvgraft.execution.records import Outcome, Placement, R, ReleaseHandle, Where, WorkerInfo
from kvgraft.release.records import MANIFEST, safe_path
from kvgraft.signing.policy import VerifyPolicy
from kvgraft.signing.verify import VerifiedRelease, verified

if TYPE_CHECKING:
    from kvgraft.execution.executor import ModelSpec
    from kvgraft.inference.models import LoadedModel

U = TypeVar("U")


def _ray() -> Any:
    return importlib.import_module("ray")


def torch_device_name(lm: Any) -> str:
    """'cpu' or 'cuda:N' (N as this process sees it; Ray's accelerator ids name the physical GPU)."""
    dev = lm.torch_device
    return f"{dev.type}:{dev.index}" if dev.index is not None else str(dev.type)


class Worker:
    """Loads one model and runs work units on it. Errors while loading surface on the first call."""

    def __init__(self, model: ModelSpec, index: int) -> None:
        self.index = index
        self.model_spec = model
        self.releases: dict[str, VerifiedRelease] = {}
        self._policy_dir: Path | None = None  # the keys and signatures of the driver's policy, written here
        self.error: BaseException | None = None
        self.lm: Any = None
        self.info_: WorkerInfo | None = None
        try:
            self._load()
        except Exception as exc:  # reported by info()/run() with its own type and exit code
            self.error = exc

    def _load(self) -> None:
        from kvgraft.inference import models
        from kvgraft.inference.environment import record
        from kvgraft.inference.runtime import set_threads

        conditions = self.model_spec.conditions
        if conditions.threads:
            set_threads(conditions.threads)  # for the actor's lifetime: nothing to restore
        spec = self.model_spec.spec
        # Actors on one node start together: the first converts the default model, the others wait for it.
        lock_dir = models.home()
        lock_dir.mkdir(parents=True, exist_ok=True)
        with (lock_dir / ".ray-worker-load.lock").open("w") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            models.resolve(spec)
        device, dtype, attn = conditions.load_options({})  # the driver's, every one set
        lm = self.lm = models.load(spec, device=device, dtype=dtype, attn=attn)
        environment = record(lm.device, lm.dtype, lm.attn)
        ray = _ray()
        ctx = ray.get_runtime_context()
        try:
            accel = {str(k): [str(x) for x in v] for k, v in ctx.get_accelerator_ids().items() if v}
        except AttributeError:  # older Ray
            accel = {"GPU": [str(x) for x in ray.get_gpu_ids()]}
        try:
            node_ip: str | None = str(ray.util.get_node_ip_address())
        except Exception:
            node_ip = None
        where = Where("ray", node_id=str(ctx.get_node_id()), worker=self.index, device=torch_device_name(lm),
                      model_identity=lm.identity.sha256, environment=environment, accelerator_ids=accel, node_ip=node_ip)
        self.info_ = WorkerInfo(lm.spec, lm.device, lm.dtype, lm.attn, lm.identity, lm.model.config, environment, where)

    def _check(self) -> None:
        if self.error is not None:
            raise self.error

    def info(self) -> WorkerInfo:
        """What the driver needs to stand in for the model: identity, config, device, environment, placement."""
        self._check()
        assert self.info_ is not None  # loaded, or `error` says why not
        return self.info_

    def release(self, handle: ReleaseHandle) -> VerifiedRelease:
        key = handle.root_digest
        policy = handle.policy
        if not isinstance(policy, VerifyPolicy):
            raise InputError(f"worker {self.index}: the driver sent no verification policy for release {key[:16]}…")
        slot = f"{key}:shipped" if handle.shipped is not None else f"{key}:{handle.root}"
        slot += f":{policy!r}"
        if slot in self.releases:
            return self.releases[slot]
        root: Path | str
        if handle.location is not None:
            root = handle.location  # opened here: this node's mirror and cache of the published release
        elif handle.shipped is not None:
            root = self._materialize(key, handle.shipped)
            policy = self._policy_files(policy, handle.policy_files)
        else:
            root = Path(handle.root)
            if not (root / MANIFEST).is_file():
                raise InputError(f"{root}: no release at this path on node {socket.gethostname()} (worker {self.index}); "
                                 "put the release on a path every node sees, or pass --ship")
        rel = verified(root, policy)
        if rel.manifest["root_digest"] != key:
            rel.close()
            raise IntegrityError(f"{root} on node {socket.gethostname()}: root digest {rel.manifest['root_digest']} is not "
                                 f"the driver's {key}: the nodes see different releases at this path")
        self.releases[slot] = rel
        return rel

    def close(self) -> None:
        """Close the releases this worker opened (a published release: its mirror folder removed, the node's
        cache kept within its limit)."""
        for rel in self.releases.values():
            rel.close()
        self.releases.clear()

    def _policy_files(self, policy: VerifyPolicy, files: dict[str, bytes]) -> VerifyPolicy:
        """The driver's policy with the files it names (keys, a detached OMS signature) written on this node."""
        if not files:
            return policy
        if self._policy_dir is None:  # one folder for the worker's life, removed when the worker goes
            self._policy_dir = Path(tempfile.mkdtemp(prefix="kvgraft-policy-"))
            weakref.finalize(self, shutil.rmtree, self._policy_dir, True)
        base = self._policy_dir

        def here(p: Path) -> Path:
            if str(p) not in files:
                raise InputError(f"worker {self.index}: the driver's policy names {p}, which was not shipped")
            data = files[str(p)]
            local = base / f"{hashlib.sha256(data).hexdigest()[:16]}-{Path(p).name}"  # the same file once
            if not local.is_file():
                local.write_bytes(data)
            return local

        # Each policy class has the fields it names: only those are replaced.
        if policy.keys:
            policy = replace(policy, keys=tuple(here(p) for p in policy.keys))  # type: ignore[type-var]
        if policy.oms_signature is not None:
            policy = replace(policy, oms_signature=here(policy.oms_signature))  # type: ignore[type-var]
        return policy

    def _materialize(self, key: str, ref: object) -> Path:
        """Write a shipped release once per node; later workers on the node reuse it."""
        base = Path(tempfile.gettempdir()) / "kvgraft-ray"
        target = base / key
        if (target / MANIFEST).is_file():
            return target
        base.mkdir(parents=True, exist_ok=True)
        files: dict[str, bytes] = _ray().get(ref)
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:16]}.", dir=base))
        try:
            for rel, data in files.items():
                path = safe_path(tmp, rel, "shipped file")
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
            tmp.chmod(0o755)
            try:
                os.replace(tmp, target)
            except OSError:  # another worker on this node got there first
                if not (target / MANIFEST).is_file():
                    raise
        finally:
            with contextlib.suppress(OSError):
                shutil.rmtree(tmp)
        return target

    def run(self, fn: Callable[[LoadedModel, VerifiedRelease, U], R], handle: ReleaseHandle, unit: U) -> Outcome[R]:
        """One work unit → its result and placement (environment differences vs the release's)."""
        from kvgraft.inference.environment import differences

        info = self.info()
        rel = self.release(handle)
        result = fn(self.lm, rel, unit)
        diffs = differences(rel.manifest.get("environment", {}), info.environment)
        return Outcome(result, Placement(info.where, str(rel.root), {k: list(v) for k, v in diffs.items()}))
