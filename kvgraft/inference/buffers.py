"""Reusable memory for restored caches.

Fresh memory is expensive to touch: on a 2-vCPU Intel Xeon VM, first-touch page faults on 23.6 MB cost
8-10 ms of CPU, as much as hashing it. A graft served repeatedly (the point of caching solutions)
should not pay that each time, so the destination buffers of dropped caches are kept and reused.

A region is an anonymous mapping owned by the pool; tensors are built on it with `torch.frombuffer`,
which holds a reference to the mapping, so memory stays valid for as long as any tensor uses it,
even after the pool lets go of it. A region is reused only once every tensor on it is gone
(its storage's weak reference has expired); what it held before is always fully overwritten by
the next read, which is hashed after it lands.
"""

from __future__ import annotations

import mmap
import threading
from dataclasses import dataclass
from typing import Any

import torch

MAX_REGIONS = 4
MAX_KEPT_BYTES = 1 << 30  # idle regions beyond this are let go


@dataclass
class _Region:
    memory: mmap.mmap
    user: Any = None  # StorageWeakRef of the tensor last built on it


_lock = threading.Lock()
_regions: list[_Region] = []


def _idle(region: _Region) -> bool:
    return region.user is None or bool(region.user.expired())


def take(nbytes: int) -> torch.Tensor:
    """A uint8 tensor of `nbytes`, on reused memory when an idle region is large enough."""
    from torch.multiprocessing.reductions import StorageWeakRef

    with _lock:
        fits = [r for r in _regions if _idle(r) and len(r.memory) >= nbytes]
        region = min(fits, key=lambda r: len(r.memory)) if fits else None
        if region is None:
            region = _Region(mmap.mmap(-1, max(nbytes, 1), flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS))
            _regions.append(region)
        out = torch.frombuffer(region.memory, dtype=torch.uint8, count=nbytes) if nbytes else torch.empty(0, dtype=torch.uint8)
        region.user = StorageWeakRef(out.untyped_storage()) if nbytes else None  # type: ignore[no-untyped-call]
        _trim()
        return out


def _trim() -> None:
    """Let go of idle regions, oldest first, beyond the count and byte caps (tensors in use keep theirs)."""
    idle = [r for r in _regions if _idle(r)]
    while idle and (len(_regions) > MAX_REGIONS or sum(len(r.memory) for r in idle) > MAX_KEPT_BYTES):
        _regions.remove(idle.pop(0))


def clear() -> None:
    """Drop every region the pool holds; memory is returned as the tensors on it go away."""
    with _lock:
        _regions.clear()


def held_bytes() -> int:
    with _lock:
        return sum(len(r.memory) for r in _regions)
