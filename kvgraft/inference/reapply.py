"""A release's recorded conditions re-applied to a run: which are set from the record, which an option overrides,
which this machine cannot set. (Results call those set "replayed", JSON key `replayed`; README's "replay" is
condition (b) of the generalization audit.)

`Conditions` says what an option (or a plan's table) sets instead of the record; None sets the recorded one.
The CLI builds one from its options, an audit plan from its `[model]` and `[executor]` tables, and a Ray
worker is started with one (in kvgraft.execution.executor.ModelSpec, pickled whole): the three read the same
fields the same way. Importing
this module imports no torch: a command checks its options with it before anything heavy loads.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from kvgraft.errors import InputError
from kvgraft.inference.environment import SENSITIVE, differences
from kvgraft.inference.models import ATTNS, DTYPES, LoadedModel, check_options
from kvgraft.release.models import ScheduleRecord
from kvgraft.results.base import JsonObject

if TYPE_CHECKING:
    from kvgraft.inference.runtime import Schedule

# What a recompute sets from the release's environment unless an option says otherwise.
REAPPLIED = ("device", "dtype", "attn_implementation", "threads", "deterministic_algorithms")


# Environment names of the conditions an option can override.
_RECORDED_AS = {"device": "device", "dtype": "dtype", "attn": "attn_implementation", "threads": "threads"}


@dataclass(frozen=True)
class Conditions:
    """Device, dtype, attention kernel, torch threads, prefill chunk or one-shot: each None (False) sets the recorded one."""

    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    threads: int | None = None
    chunk: int | None = None
    one_shot: bool = False

    def checked(self) -> Conditions:
        """This value, once its names are ones kvgraft can load (no torch imported: a typo costs nothing)."""
        check_options(device=self.device, dtype=self.dtype, attn=self.attn)
        return self

    @classmethod
    def from_plan(cls, model: dict[str, Any], executor: dict[str, Any], device: str | None = None) -> Conditions:
        """What `audit run` loads: the plan's `[model]` table (`device` overriding its device), `[executor]`'s threads."""
        return cls(device or model.get("device", "auto"), model.get("dtype", "float32"), model.get("attn", "sdpa"),
                   executor.get("threads"))

    def load_options(self, recorded: JsonObject) -> tuple[str, str, str]:
        """(device, dtype, attention) to load the model with: the recorded ones unless set here."""
        import torch

        device, dtype, attn = self.device, self.dtype, self.attn
        if device is None:
            device = "cuda" if recorded.get("device") == "cuda" and torch.cuda.is_available() else "cpu"
        if dtype is None:
            dtype = str(recorded.get("dtype"))
            if dtype not in DTYPES:
                raise InputError(f"recorded dtype {dtype!r} is not one kvgraft can load ({', '.join(DTYPES)}); pass --dtype")
        if attn is None:
            # An engine's own kernel (e.g. vLLM's "vllm:CPU_ATTN") cannot be replayed here: recompute with
            # transformers' default kernel; the result lists attn_implementation as not replayed.
            attn = str(recorded.get("attn_implementation"))
            if attn not in ATTNS:
                attn = "sdpa"
        return device, dtype, attn

    def schedule(self, recorded: ScheduleRecord | JsonObject) -> Schedule | None:
        """The schedule `--chunk N` or `--one-shot` asks for instead of the recorded one; None: replay the record."""
        if self.chunk is not None and self.one_shot:
            raise InputError("--chunk and --one-shot exclude each other")
        if self.chunk is None and not self.one_shot:
            return None
        from kvgraft.inference.runtime import Schedule

        return dataclasses.replace(Schedule.from_dict(recorded), chunk_tokens=self.chunk)

    def thread_count(self, recorded: JsonObject, device: str) -> int | None:
        """Torch threads to recompute with on a CPU: the ones set here, else the recorded count; None leaves them alone.

        The same on every executor: Ray actors reserve that many CPUs (num_cpus) and run with that many torch
        threads, so scale-out replays the record as a local run does; --threads is an override, recorded.
        """
        n = self.threads if self.threads is not None else recorded.get("threads")
        return n if device == "cpu" and isinstance(n, int) and not isinstance(n, bool) else None

    def overrides(self, recorded: JsonObject) -> JsonObject:
        """The conditions set here (not None) that differ from the record, under environment names."""
        return {name: v for k, name in _RECORDED_AS.items() if (v := getattr(self, k)) is not None and v != recorded.get(name)}


# What a model is loaded with when nothing says otherwise (`kvgraft capture`, a plan's [model] table).
DEFAULT_CONDITIONS = Conditions("auto", "float32", "sdpa")


@contextlib.contextmanager
def applied(lm: LoadedModel, recorded: JsonObject, overrides: JsonObject) -> Iterator[None]:
    """Set the switchable conditions (attention, threads, deterministic algorithms) for the run, then restore."""
    import torch

    from kvgraft.inference.runtime import attention, threads

    def wanted(key: str) -> JsonValue:
        return overrides.get(key, recorded.get(key))

    if not hasattr(lm.model, "parameters"):  # a description of remote workers: they set their own conditions
        yield
        return
    kernel = wanted("attn_implementation")
    attn = kernel if isinstance(kernel, str) else None
    n = wanted("threads")
    det = wanted("deterministic_algorithms")
    before_det = torch.are_deterministic_algorithms_enabled()
    with contextlib.ExitStack() as stack:
        if attn in ATTNS:
            stack.enter_context(attention(lm, attn))
        if isinstance(n, int) and not isinstance(n, bool) and n >= 1 and lm.torch_device.type == "cpu":
            stack.enter_context(threads(n))
        if isinstance(det, bool) and det != before_det:
            torch.use_deterministic_algorithms(det)
            stack.callback(torch.use_deterministic_algorithms, before_det)
        yield


def describe(recorded: JsonObject, current: JsonObject, overrides: JsonObject) -> JsonObject:
    """Per condition: replayed (equal to the record), overridden (by an option), or not replayed (cannot be)."""
    replayed: list[JsonValue] = [k for k in SENSITIVE if k not in overrides and recorded.get(k) == current.get(k)
                and (k in recorded or k in current)]
    overridden: JsonObject = {k: {"recorded": recorded.get(k), "used": current.get(k, v)} for k, v in overrides.items()}
    missing: JsonObject = {k: list(v) for k, v in differences(recorded, current).items() if k not in overrides}
    return {"replayed": replayed, "overridden": overridden, "not_replayed": missing}


def summary(described: dict[str, Any]) -> str:
    """`describe`'s result in one line: what was overridden and what could not be replayed, with both values."""
    parts = []
    if described["overridden"]:
        parts.append("overridden: " + ", ".join(f"{k} {v['recorded']!r} -> {v['used']!r}"
                                                 for k, v in sorted(described["overridden"].items())))
    if described["not_replayed"]:
        parts.append("not replayed: " + ", ".join(f"{k} {v[0]!r} -> {v[1]!r}"
                                                  for k, v in sorted(described["not_replayed"].items())))
    return "; ".join(parts) if parts else "every recorded condition replayed"
