"""The one inference runtime: schedule, cache, prefill, forward, decode, tokenization, threads, the cache's layer map."""

from __future__ import annotations

import contextlib
import functools
import time
import weakref
from collections.abc import Callable, Collection, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import torch

from kvgraft._internal.cores import cores
from kvgraft.errors import InputError
from kvgraft.inference.models import LoadedModel
from kvgraft.release.models import Entry, Layer, ScheduleRecord, Source
from kvgraft.release.records import source_record
from kvgraft.results.base import JsonObject


@dataclass(frozen=True)
class Schedule:
    """How a prefix is prefilled. Byte-exactness holds only under the same schedule."""

    chunk_tokens: int | None = None  # None: one forward pass over the whole prefix
    add_special_tokens: bool = True
    add_generation_prompt: bool = False

    def as_dict(self) -> ScheduleRecord:
        return {"mode": "one-shot" if self.chunk_tokens is None else "chunked",
                "chunk_tokens": self.chunk_tokens, "batch_size": 1,
                "add_special_tokens": self.add_special_tokens,
                "add_generation_prompt": self.add_generation_prompt}

    @classmethod
    def from_dict(cls, d: ScheduleRecord | JsonObject) -> Schedule:
        """The schedule a record states (a manifest's, a result's); a member of the wrong type is refused."""
        chunk = d.get("chunk_tokens")
        special, prompt = d.get("add_special_tokens", True), d.get("add_generation_prompt", False)
        if (chunk is not None and (not isinstance(chunk, int) or isinstance(chunk, bool))) \
                or not isinstance(special, bool) or not isinstance(prompt, bool):
            raise InputError(f"schedule {d!r}: chunk_tokens must be an integer or null, add_special_tokens and "
                             "add_generation_prompt true or false")
        return cls(chunk, special, prompt)


def cache_kw(lm: LoadedModel) -> str:
    """transformers 5.2x renamed `past_key_values` to `cache`; pass whichever the model takes."""
    import inspect

    return "cache" if "cache" in inspect.signature(lm.model.forward).parameters else "past_key_values"


def new_cache(lm: LoadedModel, every: Collection[int] = ()) -> Any:
    """An empty `DynamicCache` with the model's layer types, as `DynamicCache(config=...)` builds it.

    The sliding-window layers whose index is in `every` also keep every position they see (a release
    that stores sliding layers in full: `every_position_layers`); they attend exactly as the model's.
    The per-layer plan is read from the config once per model: deriving it took half a millisecond,
    a third of a graft's bookkeeping. tests/inference/test_cache_plan.py checks the result against transformers'.
    """
    from transformers.cache_utils import (
        DYNAMIC_LAYER_TYPE_MAPPING,
        Cache,
        DynamicCache,
        DynamicSlidingWindowLayer,
        get_layer_types_and_kwargs,
    )

    plan = _PLANS.get(lm.model)
    if plan is None:
        types, kwargs = get_layer_types_and_kwargs(lm.model.config.get_text_config(decoder=True))
        plan = [(DYNAMIC_LAYER_TYPE_MAPPING[t], kw) for t, kw in zip(types, kwargs, strict=True)]
        _PLANS[lm.model] = plan
    keeping = _every_position_layer() if every else None
    layers = [(keeping if keeping is not None and i in every and cls is DynamicSlidingWindowLayer else cls)(**kw)
              for i, (cls, kw) in enumerate(plan)]
    cache = DynamicCache.__new__(DynamicCache)
    Cache.__init__(cache, layers=layers, offloading=False, offload_only_non_sliding=False)
    return cache


@functools.cache
def _every_position_layer() -> type:
    """transformers' sliding-window layer, which also keeps every position it is given.

    Its `update` is the parent's (the same keys and values returned to attention, the same window
    kept, the same mask sizes), so the computation is the model's own; the positions it would drop
    are kept beside it, as the rows attention computed: what a release that stores sliding layers in
    full records.
    """
    from transformers.cache_utils import DynamicSlidingWindowLayer

    class EveryPositionSlidingLayer(DynamicSlidingWindowLayer):  # type: ignore[no-untyped-call]
        def __init__(self, sliding_window: int, **kwargs: Any) -> None:
            super().__init__(sliding_window, **kwargs)
            self.every: tuple[torch.Tensor, torch.Tensor] | None = None

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any,
                   **kwargs: Any) -> tuple[torch.Tensor, torch.Tensor]:
            out: tuple[torch.Tensor, torch.Tensor] = super().update(key_states, value_states, *args, **kwargs)
            if self.every is None:
                self.every = (key_states, value_states)
            else:
                self.every = (torch.cat([self.every[0], key_states], dim=-2),
                              torch.cat([self.every[1], value_states], dim=-2))
            return out

    return EveryPositionSlidingLayer


def every_position_layers(entry: Entry) -> frozenset[int]:
    """The sliding-window layers an entry's record says are stored with every position (`stores: all`)."""
    return frozenset(int(m["index"]) for m in entry["layers"] if m["kind"] == "sliding" and m.get("stores") == "all")


_PLANS: weakref.WeakKeyDictionary[Any, list[tuple[Any, dict[str, Any]]]] = weakref.WeakKeyDictionary()


@torch.inference_mode()
def prefill(lm: LoadedModel, ids: list[int], schedule: Schedule, cache: Any = None) -> tuple[Any, torch.Tensor]:
    """Run the prefix through the model under `schedule`; return (cache, last-position logits)."""
    cache = new_cache(lm) if cache is None else cache
    x = torch.tensor([ids], dtype=torch.long, device=lm.torch_device)
    step = schedule.chunk_tokens or len(ids)
    logits: torch.Tensor | None = None
    for at in range(0, len(ids), step):
        out = lm.model(input_ids=x[:, at : at + step], use_cache=True, logits_to_keep=1, **{cache_kw(lm): cache})
        logits = out.logits[0, -1]
    assert logits is not None
    return cache, logits


def set_threads(n: int) -> int:
    """The one torch thread setter: use `n` threads (0: one per core); return the count before."""
    before = torch.get_num_threads()
    torch.set_num_threads(n or cores())
    return before


@contextlib.contextmanager
def attention(lm: LoadedModel, attn: str) -> Iterator[None]:
    """Run with another attention implementation, restored afterwards (the model is shared)."""
    before = lm.attn
    if attn == before:
        yield
        return
    lm.model.set_attn_implementation(attn)
    lm.attn = attn
    try:
        yield
    finally:
        lm.model.set_attn_implementation(before)
        lm.attn = before


@contextlib.contextmanager
def threads(n: int | None) -> Iterator[None]:
    """Run with `n` torch threads (0: one per core; None: leave them), restored afterwards."""
    if n is None:
        yield
        return
    before = set_threads(n)
    try:
        yield
    finally:
        set_threads(before)


@torch.inference_mode()
def padded_batch_row(lm: LoadedModel, ids: list[int], pad: int = 16, *, every: Collection[int] = (),
                     ) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """KV of `ids` computed as row 0 of a batch of 4, left-padded by `pad` (the other rows are full).

    Positions and mask come from the padding, so the row is the same computation in another batch
    shape. Each layer keeps its last positions, which are the row's own tokens (also for sliding layers;
    those in `every` keep every position, of which the row's are the last: new_cache).
    """
    n = len(ids)
    back = ids[::-1]
    others = [[back[(k + j) % n] for j in range(n + pad)] for k in (1, 2, 3)]
    rows = [[0] * pad + ids, *others]
    mask = torch.tensor([[0] * pad + [1] * n] + [[1] * (n + pad)] * 3, device=lm.torch_device)
    x = torch.tensor(rows, dtype=torch.long, device=lm.torch_device)
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    cache = new_cache(lm, every)
    out = lm.model(input_ids=x, attention_mask=mask, position_ids=pos, use_cache=True, logits_to_keep=1,
                   **{cache_kw(lm): cache})
    _, tensors = layer_map(lm, cache)
    row = {name: t[0:1, :, t.shape[-2] - min(n, t.shape[-2]):, :].contiguous() for name, t in tensors.items()}
    return row, out.logits[0, -1]


@torch.inference_mode()
def forward(lm: LoadedModel, cache: Any, ids: list[int]) -> torch.Tensor:
    """Feed `ids` after what the cache holds; return logits for every fed position."""
    x = torch.tensor([ids], dtype=torch.long, device=lm.torch_device)
    out = lm.model(input_ids=x, use_cache=True, **{cache_kw(lm): cache})
    logits: torch.Tensor = out.logits[0]
    return logits


@dataclass
class Decoded:
    token_ids: list[int]
    text: str
    stop: str  # "eos" | "stop" (the caller's rule) | "max_new_tokens"
    seconds: float


def _pick(logits: torch.Tensor, temperature: float, generator: torch.Generator | None) -> int:
    if temperature <= 0.0:
        return int(torch.argmax(logits).item())
    probs = torch.softmax(logits.to(torch.float64) / temperature, dim=-1)
    return int(torch.multinomial(probs, 1, generator=generator).item())


@torch.inference_mode()
def decode(lm: LoadedModel, cache: Any, first_logits: torch.Tensor, *, max_new_tokens: int, temperature: float = 0.0,
           generator: torch.Generator | None = None, eos: Iterable[int] = (),
           stop: Callable[[str], bool] | None = None) -> Decoded:
    """Decode from `first_logits`, extending `cache`: greedy (temperature 0) or sampled from `generator`.

    Stops at an EOS token, at `max_new_tokens`, or once `stop(text so far)` is true. The last token is
    not fed back. The same logits, settings and generator state always give the same tokens.
    """
    t0 = time.perf_counter()
    stop_ids = set(eos)
    out: list[int] = []
    logits = first_logits
    why = "max_new_tokens"
    while len(out) < max_new_tokens:
        tok = _pick(logits, temperature, generator)
        out.append(tok)
        if tok in stop_ids:
            why = "eos"
            break
        if stop is not None and stop(str(lm.tokenizer.decode(out, skip_special_tokens=True))):
            why = "stop"
            break
        if len(out) == max_new_tokens:
            break
        logits = forward(lm, cache, [tok])[-1]
    return Decoded(out, str(lm.tokenizer.decode(out, skip_special_tokens=True)), why, time.perf_counter() - t0)


def eos_ids(lm: LoadedModel) -> list[int]:
    """The one end-of-sequence rule: every EOS id the tokenizer names (one id, a list of them, or none)."""
    eos = lm.tokenizer.eos_token_id
    if isinstance(eos, int):
        return [eos]
    if isinstance(eos, (list, tuple)):
        return [int(e) for e in eos]
    return []


def layer_map(lm: LoadedModel, cache: Any) -> tuple[list[Layer], dict[str, torch.Tensor]]:
    """Describe each cache layer and collect its tensors exactly as the cache holds them."""
    from transformers.cache_utils import DummyLayer, DynamicLayer, DynamicSlidingWindowLayer

    modes = getattr(lm.model.config.get_text_config(), "kv_sharing_modes", None)
    layer_types = getattr(lm.model.config.get_text_config(), "layer_types", None)
    layers: list[Layer] = []
    tensors: dict[str, torch.Tensor] = {}
    for i, layer in enumerate(cache.layers):
        if isinstance(layer, DummyLayer):
            layers.append({"index": i, "kind": "shared", "shared_with": _producer(i, modes, layer_types)})
            continue
        every = getattr(layer, "every", None)  # a sliding layer that kept every position (new_cache(every=...))
        keys, values = every if every is not None else (layer.keys, layer.values)
        kname, vname = f"layer.{i}.keys", f"layer.{i}.values"
        tensors[kname], tensors[vname] = keys, values
        n = int(keys.shape[-2])
        meta: Layer
        if isinstance(layer, DynamicSlidingWindowLayer):
            cum = int(layer.cumulative_length)
            # transformers keeps the window (its last sliding_window - 1 positions): recorded as such,
            # or every position [0, cum) where the cache kept them
            meta = {"index": i, "keys": kname, "values": vname, "kind": "sliding",
                    "sliding_window": int(layer.sliding_window), "cumulative_length": cum, "positions": [cum - n, cum],
                    "stores": "all" if every is not None else "window"}
        elif type(layer) is DynamicLayer:
            meta = {"index": i, "keys": kname, "values": vname, "kind": "full", "positions": [0, n], "stores": "all"}
        else:
            raise InputError(f"layer {i}: cache layer type {type(layer).__name__} is not supported")
        layers.append(meta)
    return layers, tensors


def _producer(i: int, modes: list[str | None] | None, layer_types: list[str] | None) -> int:
    """The layer whose K/V a KV-shared layer reads: the last 'store' layer of its type."""
    if not modes or not layer_types:
        raise InputError(f"layer {i}: a shared cache layer in a model without kv_sharing_modes")
    for j in range(i - 1, -1, -1):
        if modes[j] == "store" and layer_types[j] == layer_types[i]:
            return j
    raise InputError(f"layer {i}: no producer layer found for this KV-shared layer")


def encode(lm: LoadedModel, text: str, *, add_special_tokens: bool = False) -> list[int]:
    """The one text-to-token-ids call: `text` as the model's tokenizer splits it."""
    return [int(t) for t in lm.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"]]


def tokenize(lm: LoadedModel, rec: JsonObject, schedule: Schedule, where: str) -> tuple[list[int], Source]:
    tok = lm.tokenizer
    if "text" in rec and isinstance(rec["text"], str):
        ids = encode(lm, rec["text"], add_special_tokens=schedule.add_special_tokens)
        source = source_record("text", rec["text"])
    elif "messages" in rec and isinstance(rec["messages"], list):
        if not getattr(tok, "chat_template", None):
            raise InputError(f"{where}: record has messages but the tokenizer has no chat template")
        messages: Any = rec["messages"]  # the tokenizer's template checks what a message holds
        out: Any = tok.apply_chat_template(messages, tokenize=True,
                                      add_generation_prompt=schedule.add_generation_prompt)
        ids = out["input_ids"] if not isinstance(out, list) else out
        source = source_record("messages", rec["messages"])
    else:
        raise InputError(f'{where}: a record needs "text" (string) or "messages" (list)')
    ids = [int(t) for t in ids]
    if not ids:
        raise InputError(f"{where}: record tokenizes to zero tokens")
    return ids, source
