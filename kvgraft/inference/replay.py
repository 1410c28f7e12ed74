"""The conditions a recompute or a run replays (device, dtype, attention, threads, schedule) as one value, no torch.

A `Replay` says what an option (or a plan's table) sets instead of the release's record; None replays the
record. The CLI builds one from its options, an audit plan from its `[model]` and `[executor]` tables, and a
Ray worker is started from one (`payload`, `from_payload`): the three read the same fields the same way.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from kvgraft.errors import InputError
from kvgraft.inference.models import ATTNS, DTYPES, check_options

if TYPE_CHECKING:
    from kvgraft.inference.runtime import Schedule

# Environment names of the conditions an option can override.
_RECORDED_AS = {"device": "device", "dtype": "dtype", "attn": "attn_implementation", "threads": "threads"}


@dataclass(frozen=True)
class Replay:
    """Device, dtype, attention kernel, torch threads, prefill chunk or one-shot: each None (False) replays the record."""

    device: str | None = None
    dtype: str | None = None
    attn: str | None = None
    threads: int | None = None
    chunk: int | None = None
    one_shot: bool = False

    def checked(self) -> Replay:
        """This value, once its names are ones kvgraft can load (no torch imported: a typo costs nothing)."""
        check_options(device=self.device, dtype=self.dtype, attn=self.attn)
        return self

    @classmethod
    def from_plan(cls, model: dict[str, Any], executor: dict[str, Any], device: str | None = None) -> Replay:
        """What `audit run` loads: the plan's `[model]` table (`device` overriding its device), `[executor]`'s threads."""
        return cls(device or model.get("device", "auto"), model.get("dtype", "float32"), model.get("attn", "sdpa"),
                   executor.get("threads"))

    def payload(self) -> dict[str, Any]:
        """What a Ray worker is started with (JSON-ready): `from_payload` gives this value back."""
        return asdict(self)

    @classmethod
    def from_payload(cls, payload: dict[str, Any]) -> Replay:
        unknown = sorted(set(payload) - set(cls.__dataclass_fields__))
        if unknown:
            raise InputError(f"replay conditions: unknown keys {', '.join(unknown)}")
        return cls(**payload)

    def load_options(self, recorded: dict[str, Any]) -> tuple[str, str, str]:
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

    def schedule(self, recorded: dict[str, Any]) -> Schedule | None:
        """The schedule `--chunk N` or `--one-shot` asks for instead of the recorded one; None: replay the record."""
        if self.chunk is not None and self.one_shot:
            raise InputError("--chunk and --one-shot exclude each other")
        if self.chunk is None and not self.one_shot:
            return None
        from kvgraft.inference.runtime import Schedule

        return Schedule.from_dict({**recorded, "chunk_tokens": self.chunk})

    def thread_count(self, recorded: dict[str, Any], device: str) -> int | None:
        """Torch threads to recompute with on a CPU: the ones set here, else the recorded count; None leaves them alone.

        The same on every executor: Ray actors reserve that many CPUs (num_cpus) and run with that many torch
        threads, so scale-out replays the record as a local run does; --threads is an override, recorded.
        """
        n = self.threads if self.threads is not None else recorded.get("threads")
        return n if device == "cpu" and isinstance(n, int) and not isinstance(n, bool) else None

    def overrides(self, recorded: dict[str, Any]) -> dict[str, Any]:
        """The conditions set here (not None) that differ from the record, under environment names."""
        return {name: v for k, name in _RECORDED_AS.items() if (v := getattr(self, k)) is not None and v != recorded.get(name)}


# What a model is loaded with when nothing says otherwise (`kvgraft capture`, a plan's [model] table).
DEFAULT_REPLAY = Replay("auto", "float32", "sdpa")
