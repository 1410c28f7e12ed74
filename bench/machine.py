"""What the benchmarks share about the machine they run on."""

from __future__ import annotations

import os


def busy_seconds() -> float:
    """CPU seconds all processes have used (all CPUs), from /proc/stat; 0.0 where it is unreadable."""
    try:
        with open("/proc/stat") as fh:
            fields = [int(x) for x in fh.readline().split()[1:]]
    except OSError:
        return 0.0
    idle = fields[3] + (fields[4] if len(fields) > 4 else 0)
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")
