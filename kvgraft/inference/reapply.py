"""A release's recorded conditions re-applied to a run: which are set from the record, which an option overrides,
which this machine cannot set. (Results call those set "replayed", JSON key `replayed`; README's "replay" is
condition (b) of the generalization audit.)"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from kvgraft.inference.environment import SENSITIVE, differences
from kvgraft.inference.models import ATTNS, LoadedModel

# What a recompute sets from the release's environment unless an option says otherwise.
REAPPLIED = ("device", "dtype", "attn_implementation", "threads", "deterministic_algorithms")


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
