"""Restore stored KV states into a transformers cache, verifying every byte on the way in."""

from __future__ import annotations

import os
import time
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NotRequired, TypedDict

import torch

from kvgraft.errors import InputError, IntegrityError, ModelMismatchError, short_int
from kvgraft.inference import buffers
from kvgraft.inference.environment import differences
from kvgraft.inference.environment import record as environment
from kvgraft.inference.models import LoadedModel, describe_identity_diff
from kvgraft.inference.runtime import decode, encode, eos_ids, forward, new_cache
from kvgraft.inference.tensors import split_views
from kvgraft.release.format import Release
from kvgraft.release.hashing import read_and_hash
from kvgraft.release.models import Entry, Layer, ScheduleRecord
from kvgraft.release.records import tensor_mismatch
from kvgraft.results.base import JsonObject
from kvgraft.signing.verify import VerifiedRelease


class PrefixRows(TypedDict):
    """What a prefix graft put into the cache: rows [0, tokens) of `entry`'s recorded prefill of all `of` tokens
    under `schedule` (which need not be byte-identical to a prefill of those tokens alone), and that in words."""

    entry: str
    tokens: int
    of: int
    schedule: ScheduleRecord
    rows: str


@dataclass
class Restored:
    cache: Any
    entry: Entry | None  # None: a prefix graft that found no entry (an empty cache)
    kv_bytes: int  # read and checked against their digests: the whole entry's tensors, also for a prefix graft
    seconds: float
    forced: bool
    conditions: dict[str, tuple[Any, Any]] = field(default_factory=dict)  # recorded vs now
    warnings: list[str] = field(default_factory=list)  # from the release's verification (e.g. unsigned)
    prefix: PrefixRows | None = None  # a prefix graft's rows
    # Of the states put into the cache: a prefix graft's rows [0, n) of each layer; None: all kv_bytes.
    grafted_bytes: int | None = None

    @property
    def tokens(self) -> int:
        """The prompt's tokens the cache holds."""
        return 0 if self.entry is None else self.entry["num_tokens"]

    @property
    def kv_bytes_grafted(self) -> int:
        return self.kv_bytes if self.grafted_bytes is None else self.grafted_bytes


def check_model(release: VerifiedRelease, lm: LoadedModel, *, force: bool = False) -> bool:
    """Refuse a model whose identity differs from the release's; return True when forced past it."""
    want = release.manifest["model"]["identity"]
    have = lm.identity
    if want["sha256"] == have.sha256:
        return False
    if force:
        return True
    raise ModelMismatchError(
        f"{release.root}: model identity differs ({describe_identity_diff(want, have.record())}): release "
        f"{want['sha256'][:16]}…, loaded {lm.spec} {have.sha256[:16]}…; pass --force to continue anyway")


# Each loaded model's per-layer K/V shape (heads, head_dim) and dtype, from a one-token prefill: what its cache
# holds, whatever its config calls these (Gemma's layers differ in head size); None for a layer that stores none.
_LAYER_SHAPES: weakref.WeakKeyDictionary[Any, list[tuple[int, int, torch.dtype] | None]] = weakref.WeakKeyDictionary()


def layer_shapes(lm: LoadedModel) -> list[tuple[int, int, torch.dtype] | None]:
    shapes = _LAYER_SHAPES.get(lm.model)
    if shapes is None:
        cache = new_cache(lm)
        with torch.inference_mode():
            forward(lm, cache, [0])
        shapes = [None if getattr(layer, "keys", None) is None or layer.keys.dim() != 4
                  else (int(layer.keys.shape[1]), int(layer.keys.shape[3]), layer.keys.dtype) for layer in cache.layers]
        _LAYER_SHAPES[lm.model] = shapes
    return shapes


def check_layout(lm: LoadedModel, entry: Entry, where: str) -> None:
    """Refuse, before a byte of it is read, an entry the model cannot hold: another number of layers, or a
    stored tensor whose shape is not [1, the layer's K/V heads, at most the entry's tokens, its head size].
    A re-signed record may claim any shape its (sparse) file can back; what is read then follows the
    model, not the claim."""
    shapes = layer_shapes(lm)
    layers = entry["layers"]
    if len(layers) != len(shapes):
        raise IntegrityError(f"{where}: entry {entry['id']!r} has {len(layers)} layers, the model's cache has "
                             f"{len(shapes)}")
    tokens = int(entry["num_tokens"])
    for meta, shape in zip(layers, shapes, strict=True):
        if meta["kind"] == "shared" or shape is None:
            continue
        heads, head_dim, _ = shape
        for part in ("keys", "values"):
            t = entry["tensors"][meta[part]]
            have = t["shape"]
            if len(have) != 4 or have[0] != 1 or have[1] != heads or have[3] != head_dim or not 0 <= have[2] <= tokens:
                raise IntegrityError(f"{where}: entry {entry['id']!r} layer {meta['index']} {part} "
                                     f"{meta[part]!r}: shape {[short_int(x) for x in have]}, the model holds "
                                     f"[1, {heads}, at most {tokens} tokens, {head_dim}]")


def read_entry_tensors(verified: VerifiedRelease, entry: Entry,
                       meanwhile: Callable[[dict[str, torch.Tensor]], object] | None = None,
                       ) -> tuple[dict[str, torch.Tensor], int]:
    """Read an entry's tensors into one buffer and check each against its SHA-256 in the same pass.

    The header check and the tensor reads use one open file, so the layout checked is the layout read.
    `meanwhile(tensors)` runs on this thread while other threads read and hash (the tensors are views
    of a buffer still being filled); whatever it builds must not be used unless this returns.
    """
    release = verified.release
    path = release.entry_file(entry)
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise IntegrityError(f"{path}: entry {entry['id']!r}: cannot read: {exc.strerror}") from None
    try:
        layout = release.tensor_layout(entry, fd)
        infos = sorted(layout.values(), key=lambda info: info.start)
        total = sum(info.end - info.start for info in infos)
        buf = buffers.take(total)
        tensors: dict[str, torch.Tensor] = {}

        def during() -> None:  # views need only shapes, not bytes: made while the bytes arrive
            views = split_views(buf, [(info.dtype, info.shape) for info in infos])
            tensors.update((info.name, view) for info, view in zip(infos, views, strict=True))
            if meanwhile is not None:
                meanwhile(tensors)

        digests = read_and_hash(fd, [(info.start, info.end) for info in infos], buf.numpy().data, during)
    except EOFError as exc:  # the file shrank after its size was checked
        raise IntegrityError(f"{path}: entry {entry['id']!r}: {exc}") from None
    finally:
        os.close(fd)
    for info, actual in zip(infos, digests, strict=True):
        expected = entry["tensors"][info.name]["sha256"]
        if actual != expected:
            raise IntegrityError(tensor_mismatch(f"{path}: entry {entry['id']!r}", info.name, info.start, info.end,
                                                 actual, expected))
    return tensors, total


def window_of(entry: Entry, meta: Layer, k: torch.Tensor, v: torch.Tensor,
              where: str) -> tuple[torch.Tensor, torch.Tensor]:
    """A sliding layer's states as transformers keeps them (its last sliding_window - 1 positions),
    from what the release says it stores: the window itself, or every position (then cut here)."""
    cum, n, keep = int(meta["cumulative_length"]), int(k.shape[-2]), int(meta["sliding_window"]) - 1
    stores = meta.get("stores", "window")
    at = f"{where}: entry {entry['id']!r} layer {meta['index']}"
    if stores == "all":
        if n != cum or meta.get("positions", [0, cum]) != [0, cum]:
            raise IntegrityError(f"{at}: stores every position but holds {n} of {cum} (positions {meta.get('positions')})")
        return (k[:, :, -keep:, :], v[:, :, -keep:, :]) if n > keep else (k, v)
    if n > keep or meta.get("positions", [cum - n, cum]) != [cum - n, cum]:
        raise IntegrityError(f"{at}: stores its window of {keep} positions but holds {n} "
                             f"(positions {meta.get('positions')}, {cum} seen)")
    return k, v


def build_cache(lm: LoadedModel, entry: Entry, tensors: dict[str, torch.Tensor], where: str) -> Any:
    """A fresh cache of the model's own layer types, filled with the stored states."""
    from transformers.cache_utils import DummyLayer, DynamicLayer, DynamicSlidingWindowLayer

    cache = new_cache(lm)
    if len(cache.layers) != len(entry["layers"]):
        raise IntegrityError(f"{where}: entry {entry['id']!r} has {len(entry['layers'])} layers, "
                             f"the model's cache has {len(cache.layers)}")
    device = lm.torch_device
    move = device.type != "cpu"  # stored tensors are read into CPU memory; .to() costs 4 us even as a no-op
    layers: list[Any] = list(cache.layers)
    for meta, layer in zip(entry["layers"], layers, strict=True):
        i, kind = meta["index"], meta["kind"]
        expect: Any = {"shared": DummyLayer, "sliding": DynamicSlidingWindowLayer, "full": DynamicLayer}[kind]
        if type(layer) is not expect:
            raise IntegrityError(f"{where}: entry {entry['id']!r} layer {i}: stored as {kind}, "
                                 f"the model expects {type(layer).__name__}")
        if kind == "shared":
            continue
        k, v = tensors[meta["keys"]], tensors[meta["values"]]
        if move:
            k, v = k.to(device), v.to(device)
        # What `lazy_initialization` sets, without the two empty placeholder tensors it builds
        # (10 us a layer); tests/inference/test_cache_plan.py checks the layer state against a prefilled one.
        layer.device, layer.keys, layer.values, layer.is_initialized = k.device, k, v, True
        if kind == "sliding":
            if move:
                layer._sliding_window_tensor = layer._sliding_window_tensor.to(k.device)
            if int(layer.sliding_window) != meta["sliding_window"]:
                raise IntegrityError(f"{where}: entry {entry['id']!r} layer {i}: sliding window "
                                     f"{meta['sliding_window']}, the model's is {layer.sliding_window}")
            k, v = window_of(entry, meta, k, v, where)
            layer.keys, layer.values = k, v
            # Without the cumulative length the mask is built as if the layer were empty.
            layer.cumulative_length = meta["cumulative_length"]
    return cache


def restore(checked: VerifiedRelease, entry_id: str, lm: LoadedModel, *, force: bool = False) -> Restored:
    """Graft one entry of a verified release, its bytes checked as they are read; refuses a different model
    unless forced (recorded).

    The release went through `kvgraft.signing.verify.verified` under its policy (what opening checks, as
    `kvgraft verify` does): nothing is grafted from a release that verify refuses.
    """
    rel = checked.release
    forced = check_model(checked, lm, force=force)
    entry = rel.entry(entry_id)
    t0 = time.perf_counter()
    built: list[Any] = []

    def build(tensors: dict[str, torch.Tensor]) -> None:
        built.append(build_cache(lm, entry, tensors, str(rel.root)))
        built.append(differences(rel.manifest["environment"], environment(lm.device, lm.dtype, lm.attn)))

    # On the CPU the cache holds views of the buffer, so it is built while the bytes are still being
    # read and hashed, and returned only once every digest has matched. On another device building
    # it copies the bytes, which must wait until they are verified.
    on_cpu = lm.torch_device.type == "cpu"
    check_layout(lm, entry, str(rel.root))
    tensors, nbytes = read_entry_tensors(checked, entry, build if on_cpu else None)
    if not on_cpu:
        build(tensors)
    cache, conditions = built
    seconds = time.perf_counter() - t0
    return Restored(cache, entry, nbytes, seconds, forced, conditions, list(checked.warnings))


def prefix_refusal(entry: Entry) -> str | None:
    """Why no prefix of `entry` can be grafted (a layer that does not hold every position), or None."""
    total = entry["num_tokens"]
    for meta in entry["layers"]:
        if meta["kind"] == "shared":
            continue
        stores = meta.get("stores", "all" if meta["kind"] == "full" else "window")
        positions = meta.get("positions", [0, total])
        if stores != "all" or positions != [0, total]:
            held = f"[{positions[0]}, {positions[1]})" if isinstance(positions, list) and len(positions) == 2 \
                else str(positions)
            return (f"layer {meta['index']}: stored as {meta['kind']} (positions {held}, {stores}); "
                    "a prefix graft needs every layer to hold every position")
    return None


def check_prefix_usable(release: Release) -> None:
    """Refuse, before a model loads, a prefix graft from a release none of whose entries holds every position
    of every layer (a sliding-window layout stored as its window): unusable input, not damaged bytes."""
    why = None
    for entry in release.iter_entries():
        why = prefix_refusal(entry)
        if why is None:
            return
    if why is not None:
        raise InputError(f"{release.root}: no entry can serve a prefix graft: {why} (capture with "
                         "--sliding-layers all)")


def prefix_entry(entry: Entry, tensors: dict[str, torch.Tensor], n: int,
                 where: str) -> tuple[Entry, dict[str, torch.Tensor]]:
    """The first n tokens of an entry whose layers all hold every position: its record cut to n
    tokens and views of rows [0, n) of its verified tensors. A sliding layer stored as its window is
    refused (it holds the last positions of all T tokens, not those of the first n); one stored in
    full is cut, and build_cache keeps the prefix's own window."""
    if not 0 < n <= entry["num_tokens"]:
        raise IntegrityError(f"{where}: entry {entry['id']!r}: a prefix of {n} tokens of {entry['num_tokens']}")
    refused = prefix_refusal(entry)
    if refused:
        raise InputError(f"{where}: entry {entry['id']!r} {refused}")
    cut = entry.copy()
    layers: list[Layer] = []
    out: dict[str, torch.Tensor] = {}
    for meta in entry["layers"]:
        cut_meta = meta.copy()
        layers.append(cut_meta)
        if meta["kind"] == "shared":
            continue
        cut_meta["positions"] = [0, n]
        if meta["kind"] == "sliding":
            cut_meta["cumulative_length"] = n
        for part in ("keys", "values"):
            name = meta["keys"] if part == "keys" else meta["values"]
            out[name] = tensors[name][:, :, :n, :]
    cut["num_tokens"], cut["token_ids"], cut["layers"] = n, entry["token_ids"][:n], layers
    return cut, out


def prefix_rows(schedule: ScheduleRecord | JsonObject, n: int, total: int) -> str:
    """What a prefix graft's rows are, in words (one sentence for the graft, `kvgraft run` and the audit)."""
    how = "one-shot" if schedule.get("chunk_tokens") is None else f"chunked ({schedule['chunk_tokens']} tokens)"
    return f"rows [0, {n}) of a {how} prefill of all {total} tokens"


def restore_prefix(checked: VerifiedRelease, token_ids: list[int], lm: LoadedModel, *,
                   force: bool = False) -> Restored | None:
    """Graft the longest block-aligned prefix of `token_ids` that some entry starts with (at least one
    token is left to prefill); None when no entry starts with the first block (a miss).

    Found by chained block hashes (Release.longest_prefix); the entry's bytes are read and verified
    whole, as `restore` does, and rows [0, n) of its layers are grafted. The schedule that produced
    those rows is recorded in `Restored.prefix`.
    """
    rel = checked.release
    hit = rel.longest_prefix(list(token_ids[:-1]))
    if hit is None:
        return None
    entry, n = hit
    forced = check_model(checked, lm, force=force)
    t0 = time.perf_counter()
    check_layout(lm, entry, str(rel.root))
    tensors, nbytes = read_entry_tensors(checked, entry)
    cut, views = prefix_entry(entry, tensors, n, str(rel.root))
    cache = build_cache(lm, cut, views, str(rel.root))
    conditions = differences(rel.manifest["environment"], environment(lm.device, lm.dtype, lm.attn))
    sched = rel.manifest["schedule"]
    prefix: PrefixRows = {"entry": entry["id"], "tokens": n, "of": entry["num_tokens"], "schedule": sched.copy(),
              "rows": prefix_rows(sched, n, int(entry["num_tokens"]))}
    grafted = sum(v.numel() * v.element_size() for v in views.values())
    return Restored(cache, cut, nbytes, time.perf_counter() - t0, forced, conditions,
                    list(checked.warnings), prefix, grafted)


def free_buffers() -> None:
    """Let go of the memory kept from dropped caches for reuse by later restores."""
    buffers.clear()


def load_cache(release: VerifiedRelease, entry_id: str, lm: LoadedModel, *, force: bool = False) -> Any:
    """A transformers Cache holding the entry's verified states, ready for generation (see `restore`)."""
    return restore(release, entry_id, lm, force=force).cache


class Ledger(TypedDict):
    """What one graft cost and under which conditions it ran (`kvgraft run`, `run --json`'s `ledger`)."""

    restored_tokens: int
    prompt_tokens: int
    decode_tokens: int
    kv_bytes_verified: int  # a prefix graft reads and verifies the whole entry
    kv_bytes_grafted: int  # and grafts rows [0, n) of it
    restore_seconds: float
    prefill_seconds: float
    decode_seconds: float
    forced_model: bool
    conditions_differing: dict[str, list[Any]]  # condition -> [recorded, now]
    conditions: JsonObject  # kvgraft.inference.reapply.describe
    verification_warnings: list[str]
    prefix: NotRequired[PrefixRows | None]  # run --prefix: what was grafted; None: no entry starts the prompt


@dataclass
class Continuation:
    token_ids: list[int]
    text: str
    ledger: Ledger


def model_for(release: VerifiedRelease, spec: str | None = None, *, device: str | None = None,
              dtype: str | None = None, attn: str | None = None, force: bool = False, progress: Any = None) -> LoadedModel:
    """Load `spec` (default: the model the release records, `models.for_release`; another identity only when
    forced) the way the release was recorded: its dtype and attention kernel unless given (and its device where
    this machine has it), as `audit recompute` does (`kvgraft.inference.reapply.Conditions.load_options`)."""
    from kvgraft.inference import models
    from kvgraft.inference.reapply import Conditions

    spec = models.for_release(release.manifest["model"], spec, force=force)
    dev, dt, at = Conditions(device, dtype, attn).load_options(release.manifest["environment"])
    return models.load(spec, device=dev, dtype=dt, attn=at, progress=progress)


def run(checked: VerifiedRelease, entry_id: str | None, lm: LoadedModel, prompt: str, *,
        max_new_tokens: int = 64, force: bool = False, attn: str | None = None, dtype: str | None = None,
        prefix: bool = False) -> Continuation:
    """Graft, prefill the prompt after the grafted prefix, decode greedily; account for every token.

    With `prefix` (and no `entry_id`) the prompt is the whole text: tokenized as the release's
    schedule tokenizes a record, the longest block-aligned prefix of it that an entry starts with is
    grafted (`restore_prefix`) and the rest prefilled; on a miss the whole prompt is prefilled. The
    ledger's `prefix` says what was grafted and the schedule of its rows (None on a miss).

    The continuation runs with the release's recorded attention kernel unless `attn` says otherwise (a
    kernel transformers cannot run, e.g. an engine's own, leaves the model's); the dtype is the loaded
    model's (`model_for` loads the recorded one); `dtype` names one chosen instead of the recorded one, so
    that it counts as overridden, and must be the model's. The ledger's `conditions` says, as `audit
    recompute` does, which recorded conditions were replayed, which were overridden and which differ here.
    """
    from kvgraft.inference import reapply
    from kvgraft.inference.models import ATTNS
    from kvgraft.inference.reapply import Conditions
    from kvgraft.inference.runtime import attention

    recorded = checked.release.manifest["environment"]
    kernel = attn if attn is not None else recorded.get("attn_implementation")
    if kernel not in ATTNS:
        kernel = lm.attn
    if dtype is not None and dtype != lm.dtype:
        raise InputError(f"dtype {dtype} was asked for, but the model was loaded in {lm.dtype}")
    overrides = Conditions(dtype=dtype, attn=attn).overrides(recorded)
    if prefix == (entry_id is not None):
        raise InputError("name an entry to graft (--entry), or graft the prompt's longest prefix (--prefix): one of them")
    with attention(lm, str(kernel)):
        if prefix:
            whole = encode(lm, prompt, add_special_tokens=bool(checked.release.manifest["schedule"].get("add_special_tokens")))
            if not whole:
                raise InputError("--prefix: the prompt is empty; a prefix graft needs the prompt it starts")
            hit = restore_prefix(checked, whole, lm, force=force)
            restored = hit if hit is not None else Restored(new_cache(lm), None, 0, 0.0, False, {},
                                                            list(checked.warnings))
            ids = whole[restored.tokens:]
        else:
            assert entry_id is not None
            restored = restore(checked, entry_id, lm, force=force)
            ids = encode(lm, prompt) if prompt else []
        t0 = time.perf_counter()
        if ids:
            logits = forward(lm, restored.cache, ids)[-1]
        else:
            # Nothing to prefill: the next token comes from the stored argmax, then decode continues.
            logits = torch.zeros(lm.model.config.get_text_config().vocab_size)
            assert restored.entry is not None  # a miss leaves the whole prompt to prefill
            logits[restored.entry["next_token"]["argmax"]] = 1.0
        t1 = time.perf_counter()
        out = decode(lm, restored.cache, logits, max_new_tokens=max_new_tokens, eos=eos_ids(lm)).token_ids
        t2 = time.perf_counter()
        conditions = reapply.describe(recorded, environment(lm.device, lm.dtype, lm.attn), overrides)
    ledger: Ledger = {
        "restored_tokens": restored.tokens, "prompt_tokens": len(ids), "decode_tokens": len(out),
        # Apart: a prefix graft reads and verifies the whole entry, and grafts rows [0, n) of it.
        "kv_bytes_verified": restored.kv_bytes, "kv_bytes_grafted": restored.kv_bytes_grafted,
        "restore_seconds": restored.seconds,
        "prefill_seconds": t1 - t0, "decode_seconds": t2 - t1, "forced_model": restored.forced,
        "conditions_differing": {k: list(v) for k, v in restored.conditions.items()},
        "conditions": conditions,
        "verification_warnings": restored.warnings,
    }
    if prefix:
        ledger["prefix"] = restored.prefix  # None: no entry starts with the prompt's first block
    return Continuation(out, str(lm.tokenizer.decode(out, skip_special_tokens=True)), ledger)
