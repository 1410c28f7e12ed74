"""Everything about the run that can change KV bytes, recorded with every result."""

from __future__ import annotations

import os
import platform
import sys
from functools import lru_cache
from pathlib import Path

from pydantic import JsonValue

from kvgraft import __version__
from kvgraft.results.base import JsonObject


@lru_cache(maxsize=1)
def cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# CPU features that select different kernels (and so different rounding) in the same torch wheel.
_ISA = ("avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "avx512_fp16", "amx_bf16", "amx_int8",
        "amx_tile", "avx_vnni", "asimd", "sve", "sve2")


@lru_cache(maxsize=1)
def cpu_isa() -> str:
    """The kernel-relevant instruction set extensions of this CPU, sorted and space-separated."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                have = set(line.split(":", 1)[1].split())
                return " ".join(sorted(f for f in _ISA if f in have))
    except OSError:
        pass
    return ""


def record(device: str, dtype: str, attn: str) -> JsonObject:
    import torch
    import transformers

    env: JsonObject = {
        "python": platform.python_version(),
        "torch": str(torch.__version__),  # TorchVersion is a str subclass canonical JSON refuses
        "transformers": str(transformers.__version__),
        "kvgraft": __version__,
        "platform": f"{sys.platform}-{platform.machine()}",
        "device": device,
        "device_name": torch.cuda.get_device_name() if device == "cuda" else cpu_name(),
        "cpu_isa": cpu_isa(),
        "dtype": dtype,
        "attn_implementation": attn,
        "threads": torch.get_num_threads(),
        "interop_threads": torch.get_num_interop_threads(),
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "mkldnn": bool(torch.backends.mkldnn.is_available()),  # type: ignore[no-untyped-call]
    }
    if device == "cuda":
        env.update({
            "cuda": torch.version.cuda,
            "cudnn": torch.backends.cudnn.version(),  # type: ignore[no-untyped-call]
            "cudnn_deterministic": torch.backends.cudnn.deterministic,
            "cudnn_benchmark": torch.backends.cudnn.benchmark,
            "matmul_allow_tf32": torch.backends.cuda.matmul.allow_tf32,
        })
    return env


# Keys whose difference can change KV bytes; compared between a release and a rerun.
SENSITIVE = ("device", "device_name", "cpu_isa", "dtype", "attn_implementation", "threads", "torch", "transformers",
             "deterministic_algorithms", "cuda", "cudnn", "matmul_allow_tf32")
# Recorded only by newer versions: a record without them says nothing either way.
_LATER = ("cpu_isa",)


def differences(recorded: JsonObject, current: JsonObject) -> dict[str, tuple[JsonValue, JsonValue]]:
    """The conditions that can change KV bytes and differ: name -> (recorded, current)."""
    return {k: (recorded.get(k), current.get(k)) for k in SENSITIVE
            if recorded.get(k) != current.get(k) and not (k in _LATER and k not in recorded)}
