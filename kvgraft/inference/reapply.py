"""A release's recorded conditions re-applied to a run: which are set from the record, which an option overrides,
which this machine cannot set. (Results call those set "replayed", JSON key `replayed`; README's "replay" is
condition (b) of the generalization audit.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvgraft.errors import InputError
from kvgraft.inference.environment import SENSITIVE, differences
from kvgraft.inference.models import ATTNS, DTYPES, LoadedModel
from kvgraft.inference.runtime import Schedule

# What a recompute sets from the release's environment unless an option says otherwise.
REAPPLIED = ("device", "dtype", "attn_implementation", "threads", "deterministic_algorithms")


def load_options(recorded: dict[str, Any], *, device: str | None = None, dtype: str | None = None,
                 attn: str | None = None) -> tuple[str, str, str]:
    """(device, dtype, attention) to load the model with: the recorded ones unless overridden."""
    import torch

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


def schedule_override(recorded: dict[str, Any], *, chunk: int | None, one_shot: bool) -> Schedule | None:
    """The schedule `--chunk N` or `--one-shot` asks for instead of the recorded one; None: replay the record."""
    if chunk is not None and one_shot:
        raise InputError("--chunk and --one-shot exclude each other")
    if chunk is None and not one_shot:
        return None
    return Schedule.from_dict({**recorded, "chunk_tokens": chunk})


def thread_count(recorded: dict[str, Any], device: str, *, threads: int | None) -> int | None:
    """Torch threads to recompute with on a CPU: --threads, else the recorded count; None leaves them alone.

    The same on every executor: Ray actors reserve that many CPUs (num_cpus) and run with that many torch
    threads, so scale-out replays the record as a local run does; --threads is an override, recorded.
    """
    n = threads if threads is not None else recorded.get("threads")
    return n if device == "cpu" and isinstance(n, int) and not isinstance(n, bool) else None


def overrides_given(recorded: dict[str, Any], **given: Any) -> dict[str, Any]:
    """The explicit options (not None) that differ from what was recorded, under environment names."""
    names = {"device": "device", "dtype": "dtype", "attn": "attn_implementation", "threads": "threads",
             "deterministic": "deterministic_algorithms"}
    return {names[k]: v for k, v in given.items() if v is not None and v != recorded.get(names[k])}


@contextlib.contextmanager
def applied(lm: LoadedModel, recorded: dict[str, Any], overrides: dict[str, Any]) -> Iterator[None]:
    """Set the switchable conditions (attention, threads, deterministic algorithms) for the run, then restore."""
    import torch

    from kvgraft.inference.runtime import attention, threads

    def wanted(key: str) -> Any:
        return overrides.get(key, recorded.get(key))

    if not hasattr(lm.model, "parameters"):  # a description of remote workers: they set their own conditions
        yield
        return
    attn = wanted("attn_implementation")
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


def describe(recorded: dict[str, Any], current: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """Per condition: replayed (equal to the record), overridden (by an option), or not replayed (cannot be)."""
    replayed = [k for k in SENSITIVE if k not in overrides and recorded.get(k) == current.get(k)
                and (k in recorded or k in current)]
    overridden = {k: {"recorded": recorded.get(k), "used": current.get(k, v)} for k, v in overrides.items()}
    missing = {k: list(v) for k, v in differences(recorded, current).items() if k not in overrides}
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
