"""How many cores this process may use (its CPU affinity): the one count the hash pool, torch threads and energy use."""

from __future__ import annotations

import os


def cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - non-Linux
        return os.cpu_count() or 1
