"""`KvgraftConnector`: a vLLM KV connector (KVConnectorBase_V1) that serves only verified releases.

Started the vLLM way::

    --kv-transfer-config '{"kv_connector": "KvgraftConnector", "kv_connector_module_path": "kvgraft.vllm.connector",
                           "kv_role": "kv_both", "kv_load_failure_policy": "recompute",
                           "kv_connector_extra_config": {"release": "RELEASE/", "key": "signer.pub.pem"}}'

`release` is one folder or a list of folders (or locations a release is published at: http(s)://, hf://,
s3://, read as `kvgraft.remote` reads them, each entry fetched and checked when first grafted); `key`
(optional) a PEM public key every release must be signed with. At start-up, each release goes through
`kvgraft.signing.verify.verified` (the one verification
every consumer uses: signature, statement, manifest; no entry byte is read), and the scheduler
computes the served model's identity once (`kvgraft.inference.models.fingerprint` of the folder vLLM loads, in
the dtype vLLM serves) and compares it with each release's. A request whose prompt token ids start with a whole
entry and go on gets all of that entry's rows; one that starts with a block-aligned prefix of some entry's token
ids gets that prefix's KV (the longest one any release offers, found by chained block hashes:
`Release.longest_prefix`, one lookup per prompt block; at least one prompt token is left for vLLM to compute);
vLLM computes the rest. An entry's record is checked for compatibility when it first matches; its bytes are
read when grafted, and each tensor's SHA-256 is checked before any of its bytes are written into vLLM's cache.
The grafted rows are rows [0, n) of the entry's recorded prefill of all its tokens (the log line says so): a
prefix of a one-shot prefill, which need not be byte-identical to a prefill of the n tokens alone.

Sliding-window and KV-shared layers (docs/vllm.md): the connector supports vLLM's hybrid KV cache manager
(`SupportsHMA`), places each layer through the engine's KV-cache groups, writes a sliding layer's rows only into
the blocks vLLM holds for it, grafts a layer stored as its window only whole (and not with vLLM's prefix cache
on), and leaves KV-shared layers to read their producer's grafted cache. With several groups a graft is an
asynchronous load: vLLM takes failures back per request, not per block, then.

Anything that fails (signature, digest, model identity, layout, dtype, a layer's kind, window or producer)
leaves the request to a normal prefill, with one log line naming release, entry, tensor and reason. A failure
found while grafting (a file changed after start-up) is reported to vLLM as a failed load: with
`"kv_load_failure_policy": "recompute"` vLLM recomputes it.

Layout: the paged cache's layout is the attention backend's. It is not assumed: on first use the
connector has the backend write a probe (distinct numbers) through its own `do_kv_cache_update` into a
scratch block and reads back where every key and value element landed; a probe that does not come
back as a one-to-one map (a quantized cache, say) refuses grafting. The CPU backend, for one, stores a
block's keys transposed.

A request can opt out with `SamplingParams(extra_args={"kv_transfer_params": {"kvgraft": "off"}})`.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1,
    KVConnectorMetadata,
    KVConnectorRole,
    SupportsHMA,
)

from kvgraft._internal.jsonio import load_file
from kvgraft.errors import Error as KvgraftError
from kvgraft.release import models as release_models
from kvgraft.release.format import Release
from kvgraft.release.models import Entry, Header, Identity, Layer
from kvgraft.release.records import new_entry, source_record, token_ids_digest
from kvgraft.signing.policy import SignatureNotChecked, verify_policy
from kvgraft.signing.verify import VerifiedRelease, verified

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

# Under vLLM's logger so that the line shows wherever vLLM's own log lines do.
log = logging.getLogger("vllm.kvgraft")
_LAYER_INDEX = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_TENSOR_IN = re.compile(r"tensor '([^']+)'")


def refusal(release: str, entry: str, tensor: str, reason: str) -> str:
    """The one log line for a graft not made (tests and users grep for it)."""
    return f"kvgraft: graft refused: release={release} entry={entry} tensor={tensor} reason={reason}; served by prefill"


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:120] or "request"


def _groups(block_ids: Any) -> tuple[tuple[int, ...], ...]:
    """A request's block ids per KV-cache group, as vLLM's scheduler output holds them."""
    return tuple(tuple(int(b) for b in group) for group in block_ids)


def _first_line(text: str) -> str:
    return " ".join(str(text).split())[:400]


@dataclass(frozen=True)
class GraftLoad:
    """One request's graft, as the scheduler sends it to the worker."""

    req_id: str
    release: int  # index into the configured releases
    entry_id: str
    start: int  # first token to write (tokens before it are in vLLM's own prefix cache)
    end: int  # one past the last token to write (block-aligned, or the whole entry)
    block_ids: tuple[tuple[int, ...], ...]  # per KV-cache group (vLLM's hybrid KV cache manager)
    entry_digest: str = ""  # the record the scheduler matched: the worker grafts that record or nothing
    # vLLM takes a failed load back per block only with one KV-cache group; with several (sliding-window
    # models) the graft is an asynchronous load, whose failure is reported per request (failed_recving).
    asynchronous: bool = False


@dataclass(frozen=True)
class CaptureSave:
    """One request whose whole prompt is computed in this step: its KV is captured after the step."""

    req_id: str
    token_ids: tuple[int, ...]
    block_ids: tuple[tuple[int, ...], ...]  # per KV-cache group


@dataclass
class KvgraftMetadata(KVConnectorMetadata):  # type: ignore[misc]
    loads: list[GraftLoad] = field(default_factory=list)
    saves: list[CaptureSave] = field(default_factory=list)


@dataclass(frozen=True)
class ServedLayer:
    """What vLLM keeps for one attention layer: its KV-cache group (whose block table it uses) and that
    group's spec. `window`: the tokens a query attends to, itself included (None: full attention);
    `window_blocks_only`: the group keeps only the window's blocks (vLLM's hybrid KV cache manager),
    other blocks of the request are its null block."""

    group: int
    window: int | None
    window_blocks_only: bool
    kv_heads: int
    head_size: int


NULL_BLOCK = 0  # vLLM's BlockPool takes block 0 as the null block: never a request's data


def served_layers(kv_cache_config: Any) -> dict[int, ServedLayer]:
    """Layer index -> what vLLM keeps for it, from the engine's KV-cache groups. A layer that reads
    another layer's cache (KV sharing) is in no group and so not here."""
    from vllm.v1.kv_cache_interface import SlidingWindowSpec

    out: dict[int, ServedLayer] = {}
    for g, group in enumerate(kv_cache_config.kv_cache_groups):
        spec = group.kv_cache_spec
        window = getattr(spec, "sliding_window", None)
        for name in group.layer_names:
            if (m := _LAYER_INDEX.search(name)) is not None:
                out[int(m.group(1))] = ServedLayer(g, int(window) if window else None, isinstance(spec, SlidingWindowSpec),
                                                   int(spec.num_kv_heads), int(spec.head_size))
    return out


def stored_rows(meta: Layer, total: int) -> tuple[int, int]:
    """The token positions [a, b) a stored layer holds: every position, or a sliding layer's window."""
    a, b = (int(x) for x in meta.get("positions", [0, total]))
    return a, b


@dataclass
class _Refused:
    reason: str
    tensor: str
    opened: Release | None  # its manifest when it could be read, to name the entry a request would have used


def served_identity(folder: str, dtype: torch.dtype) -> Identity:
    """kvgraft's identity of the model folder vLLM loads, in the dtype vLLM serves it in."""
    from kvgraft.inference import models

    name = str(dtype).removeprefix("torch.")
    lm = models.load(folder, device="cpu", dtype=name)
    try:
        return lm.identity.record()
    finally:
        del lm


class KvgraftConnector(KVConnectorBase_V1, SupportsHMA):  # type: ignore[misc]
    """See the module docstring."""

    def __init__(self, vllm_config: VllmConfig, role: KVConnectorRole, kv_cache_config: KVCacheConfig | None = None):
        super().__init__(vllm_config=vllm_config, role=role, kv_cache_config=kv_cache_config)
        extra = dict(self._kv_transfer_config.kv_connector_extra_config or {})
        roots = extra.get("release")
        if isinstance(roots, str):
            roots = [roots]
        if not isinstance(roots, list) or not roots or not all(isinstance(r, str) for r in roots):
            raise ValueError('KvgraftConnector: kv_connector_extra_config needs "release": a folder or a list of folders')
        key = extra.get("key")
        self._policy = verify_policy(key=Path(key) if key else None, require_signature=bool(key))
        self._block_size = int(vllm_config.cache_config.block_size)
        model_config = vllm_config.model_config
        self._model_dir = str(model_config.model)
        self._dtype: torch.dtype = model_config.dtype
        hf = model_config.hf_text_config
        self._num_layers = int(model_config.get_num_layers(vllm_config.parallel_config))
        self._kv_heads = int(model_config.get_num_kv_heads(vllm_config.parallel_config))
        self._head_dim = int(model_config.get_head_size())
        sliding = getattr(hf, "sliding_window", None) is not None or any(
            t != "full_attention" for t in (getattr(hf, "layer_types", None) or []))
        if kv_cache_config is not None:
            self._served = served_layers(kv_cache_config)
        else:  # no groups given: one group, full attention, what the model config says
            self._served = {i: ServedLayer(0, None, False, self._kv_heads, self._head_dim)
                            for i in range(self._num_layers)}
        # Without the engine's groups a sliding-window model's layers are not known: refused.
        self._groups_unknown = kv_cache_config is None and sliding
        self._prefix_caching = bool(vllm_config.cache_config.enable_prefix_caching)
        self._cache_dtype = str(vllm_config.cache_config.cache_dtype)
        capture = extra.get("capture")
        self._capture: Path | None = Path(capture) if isinstance(capture, str) and capture else None
        if self._capture is not None and not self._kv_transfer_config.is_kv_producer:
            raise ValueError('KvgraftConnector: "capture" needs kv_role kv_producer or kv_both')
        self._vllm_config = vllm_config
        self._identity: Identity | None = None
        self._saving: dict[str, tuple[int, ...]] = {}  # scheduler: req id -> prompt, staged by the worker
        self._layers: dict[int, Any] = {}  # worker: attention layers by index, seen in start_load_kv
        self._attn_by_index: dict[int, Any] = {}  # worker: every attention layer (KV-shared ones included)
        self._layer_names = ({n for g in kv_cache_config.kv_cache_groups for n in g.layer_names}
                             if kv_cache_config is not None else None)
        self._roots = [str(r) for r in roots]
        self._releases: dict[int, VerifiedRelease] = {}  # each verified under self._policy, here at start-up
        self._refused: dict[int, _Refused] = {}
        self._named: list[VerifiedRelease] = []  # refused releases, opened only to name entries in log lines
        for i, root in enumerate(self._roots):
            try:
                self._releases[i] = verified(root, self._policy)
            except KvgraftError as exc:
                self._refuse_release(i, exc.diagnostics())  # named by the location given
        # Scheduler: which entries were found compatible; worker: what it grafted and what failed.
        self._compatible: dict[tuple[int, str], bool] = {}
        self._said: set[tuple[int, str, int]] = set()  # (release, entry, n) refused for a window layer, logged once
        # req id -> (release, entry, start, end, the entry record's digest)
        self._pending: dict[str, tuple[int, str, int, int, str]] = {}
        self._need_load: dict[str, tuple[int, str, int, int, str]] = {}
        self._async_loads: list[GraftLoad] = []  # scheduler: loads whose blocks are allocated, for the next meta
        self._grafted_reqs: dict[str, tuple[int, str]] = {}  # scheduler: request -> (release, entry) grafted
        self._failed_reqs: set[str] = set()  # scheduler: requests whose graft failed: prefilled from then on
        self._async = kv_cache_config is not None and len(kv_cache_config.kv_cache_groups) > 1
        self._recv_done: set[str] = set()  # worker: asynchronous loads finished, and those that failed
        self._recv_failed: set[str] = set()
        self._load_errors: set[int] = set()
        self._maps: dict[tuple[Any, ...], tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.grafted: list[tuple[str, str, int]] = []  # (req id, entry id, tokens) for logs and tests
        if role == KVConnectorRole.SCHEDULER:
            self._check_releases()
            if self._capture is not None and self._identity is None:
                self._identity = served_identity(self._model_dir, self._dtype)

    def shutdown(self) -> None:
        """vLLM's end of the connector: close every release it opened (a published one: its mirror folder removed,
        the cache kept within its limit)."""
        for rel in [*self._releases.values(), *self._named]:
            rel.close()
        self._releases.clear()
        self._named.clear()

    # ------------------------------------------------------------------------------------ start-up

    def _refuse_release(self, i: int, reason: str, tensor: str | None = None, opened: Release | None = None) -> None:
        tensor = tensor or (m.group(1) if (m := _TENSOR_IN.search(reason)) else "-")
        if opened is None:
            # Refused under the connector's policy: verified again checking no signature (the statement, when
            # there is one, still against the manifest), only to name the entry a request would have used. No
            # byte of it is served.
            try:
                named = verified(self._roots[i], SignatureNotChecked())
                self._named.append(named)
                opened = named.release
            except KvgraftError:
                opened = None
        if (dropped := self._releases.pop(i, None)) is not None:
            self._named.append(dropped)  # its release still names entries; closed at shutdown
        self._refused[i] = _Refused(_first_line(reason), tensor, opened)
        entry = "*"
        if m := re.search(r"entry '([^']+)'", reason):
            entry = m.group(1)
        line = refusal(self._roots[i], entry, tensor, _first_line(reason))
        # The scheduler decides and says so; the worker verified the same bytes and only records it.
        log.log(logging.WARNING if self.role == KVConnectorRole.SCHEDULER else logging.DEBUG, line)

    def _check_releases(self) -> None:
        """Model identity (computed once); each release's prefix index (index bytes, no entry bytes)."""
        if not self._releases:
            return
        try:
            have: Identity | None = served_identity(self._model_dir, self._dtype)
            why = ""
        except (KvgraftError, OSError, ValueError) as exc:
            have, why = None, f"cannot compute the served model's identity: {_first_line(str(exc))}"
        self._identity = have
        from kvgraft.inference.models import describe_identity_diff

        for i, rel in list(self._releases.items()):
            want = rel.manifest["model"]["identity"]
            if have is None:
                self._refuse_release(i, why, "-", rel.release)
                continue
            if want["sha256"] != have["sha256"]:
                self._refuse_release(
                    i, f"model identity differs ({describe_identity_diff(want, have)}): release "
                       f"{want['sha256'][:16]}…, served {self._model_dir} {have['sha256'][:16]}…", "-", rel.release)
                continue
            try:
                rel.release.prefix_table()
            except KvgraftError as exc:
                self._refuse_release(i, rel.source.name(exc).diagnostics(), "-", rel.release)
        log.info("kvgraft: serving %d entries from %d of %d verified releases (model identity %s…)",
                 sum(r.release.num_entries for r in self._releases.values()), len(self._releases), len(self._roots),
                 have["sha256"][:16] if have else "?")

    def _match(self, prompt: list[int]) -> tuple[int, Entry, int] | None:
        """(release, entry, n): the longest prefix of the prompt some compatible entry holds: block-aligned
        (the prefix index), or the whole entry when the prompt starts with all of it. An entry that
        cannot be grafted is named in one log line (once per entry and length) and not used."""
        found: list[tuple[int, int, Entry]] = []
        for i, rel in self._releases.items():
            try:
                hit = rel.release.longest_prefix(prompt, self._block_size)
            except KvgraftError as exc:
                log.warning(refusal(self._roots[i], "-", "-", _first_line(rel.source.name(exc).diagnostics())))
                continue
            if hit is not None:
                entry, n = hit
                total = int(entry["num_tokens"])
                if n < total <= len(prompt) and prompt[:total] == entry["token_ids"]:
                    n = total  # the whole entry: every row it holds
                found.append((n, i, entry))
        for n, i, entry in sorted(found, key=lambda f: (-f[0], f[1])):
            key = (i, entry["id"])
            if key not in self._compatible:
                problem = self._incompatible(entry)
                self._compatible[key] = problem is None
                if problem is not None:
                    log.warning(refusal(self._roots[i], entry["id"], problem[0], problem[1]))
            if not self._compatible[key]:
                continue
            short = self._window_short(entry, n)
            if short is not None:
                if (i, entry["id"], n) not in self._said:
                    self._said.add((i, entry["id"], n))
                    log.warning(refusal(self._roots[i], entry["id"], short[0], short[1]))
                continue
            return i, entry, n
        return None

    def _incompatible(self, entry: Entry) -> tuple[str, str] | None:
        """(tensor, reason) when this entry cannot be grafted into the served model's cache."""
        if self._cache_dtype != "auto":
            return "-", f"vLLM's cache dtype is {self._cache_dtype}; only an unquantized cache is grafted"
        if self._groups_unknown:
            return "-", "the served model has sliding-window layers and vLLM gave no KV-cache groups to place them"
        layers = entry["layers"]
        if len(layers) != self._num_layers:
            return "-", f"{len(layers)} layers stored, the served model has {self._num_layers}"
        want_dtype = str(self._dtype).removeprefix("torch.")
        total = int(entry["num_tokens"])
        for meta in layers:
            i, kind = int(meta["index"]), meta["kind"]
            served = self._served.get(i)
            if kind == "shared":
                if served is not None:
                    return "-", (f"layer {i} is stored as reading layer {meta.get('shared_with')}'s cache; vLLM keeps "
                                 "a cache of its own for it")
                continue
            if served is None:
                return meta["keys"], f"layer {i} is stored; vLLM keeps no cache of its own for it (it reads another layer's)"
            what = "full attention" if served.window is None else f"a sliding window of {served.window}"
            if (kind == "full" and served.window is not None) or (kind == "sliding" and served.window is None):
                return meta["keys"], f"layer {i} is stored as {kind}; vLLM serves it with {what}"
            a, b = stored_rows(meta, total)
            if kind == "sliding":
                if int(meta["sliding_window"]) != served.window:
                    return meta["keys"], (f"layer {i} is stored with a sliding window of {meta['sliding_window']}; "
                                          f"vLLM serves it with {what}")
                if (a, b) != (0, total):
                    if meta.get("stores") != "window" or b != total or b - a != min(total, served.window - 1):
                        return meta["keys"], (f"layer {i}: positions [{a}, {b}) of {total} are neither every position "
                                              "nor its window")
                    if self._prefix_caching:
                        return meta["keys"], (f"layer {i} stores only its window (positions [{a}, {b})); vLLM's prefix cache "
                                              "would keep blocks with rows the release does not hold (capture with "
                                              "--sliding-layers all, or serve with prefix caching off)")
            elif (a, b) != (0, total):
                return meta["keys"], f"layer {i}: full attention stored with positions [{a}, {b}) of {total}"
            for part in ("keys", "values"):
                t = entry["tensors"][meta[part]]
                shape = [1, served.kv_heads, b - a, served.head_size]
                if t["dtype"] != want_dtype or t["shape"] != shape:
                    return meta[part], (f"stored {t['dtype']} {t['shape']}, vLLM's cache takes {want_dtype} {shape}")
        return None

    def _window_short(self, entry: Entry, n: int) -> tuple[str, str] | None:
        """(tensor, reason) when a layer stored as its window lacks rows a graft of the first n tokens needs:
        the window before token n, [n - window + 1, n), where the layer holds the window before the entry's end."""
        total = int(entry["num_tokens"])
        for meta in entry["layers"]:
            if meta["kind"] != "sliding":
                continue
            a, _ = stored_rows(meta, total)
            need = max(0, n - int(meta["sliding_window"]) + 1)
            if need < a:
                return meta["keys"], (f"layer {meta['index']} stores only its window (positions [{a}, {total})); a graft of "
                                      f"the first {n} tokens needs positions [{need}, {n}) (a prefix graft needs "
                                      "--sliding-layers all)")
        return None

    # ------------------------------------------------------------------------------------ scheduler

    def get_num_new_matched_tokens(self, request: Request, num_computed_tokens: int) -> tuple[int, bool]:
        params = getattr(request, "kv_transfer_params", None) or {}
        if params.get("kvgraft") == "off":
            return 0, False
        if request.request_id in self._failed_reqs:  # its graft failed: vLLM computes it
            return 0, False
        prompt = [int(t) for t in request.prompt_token_ids or []]
        # At least one prompt token is left for vLLM to compute (it yields the first logits).
        match = self._match(prompt[:-1])
        if match is not None:
            i, entry, end = match
            if end <= num_computed_tokens:
                return 0, False
            self._pending[request.request_id] = (i, entry["id"], num_computed_tokens, end, entry["digest"])
            return end - num_computed_tokens, self._async
        for i, refused in self._refused.items():  # a prompt a refused release would have served
            if refused.opened is None:
                continue
            try:
                hit = refused.opened.longest_prefix(prompt[:-1], self._block_size)
            except KvgraftError:
                continue
            if hit is not None:
                log.warning(refusal(self._roots[i], hit[0]["id"], refused.tensor, refused.reason))
                return 0, False
        return 0, False

    def update_state_after_alloc(self, request: Request, blocks: KVCacheBlocks, num_external_tokens: int) -> None:
        pending = self._pending.pop(request.request_id, None)
        if pending is None or num_external_tokens <= 0:
            return
        self._grafted_reqs[request.request_id] = (pending[0], pending[1])
        if self._async:  # the request waits for this load: its blocks are allocated now, it is scheduled later
            i, eid, start, end, digest = pending
            self._async_loads.append(GraftLoad(request.request_id, i, eid, start, end,
                                               _groups(blocks.get_block_ids()), digest, asynchronous=True))
        else:
            self._need_load[request.request_id] = pending

    def build_connector_meta(self, scheduler_output: SchedulerOutput) -> KvgraftMetadata:
        meta = KvgraftMetadata()
        for new in scheduler_output.scheduled_new_reqs:
            load = self._need_load.pop(new.req_id, None)
            if load is not None:
                i, eid, start, end, digest = load
                meta.loads.append(GraftLoad(new.req_id, i, eid, start, end, _groups(new.block_ids), digest))
        # A graft for a request not scheduled as new (preempted before its first step) is dropped: vLLM
        # then computes those tokens itself.
        self._need_load.clear()
        meta.loads.extend(self._async_loads)
        self._async_loads = []
        if self._capture is not None:
            for new in scheduler_output.scheduled_new_reqs:
                prompt = tuple(int(t) for t in (new.prompt_token_ids or []))
                params = new.sampling_params
                extra = (getattr(params, "extra_args", None) or {}).get("kv_transfer_params") or {}
                if not prompt or extra.get("kvgraft") == "off" or new.req_id in self._grafted_reqs:
                    continue
                scheduled = int(scheduler_output.num_scheduled_tokens.get(new.req_id, 0))
                if new.num_computed_tokens != 0 or scheduled < len(prompt):
                    log.warning("kvgraft: not captured: request %s: its prompt of %d tokens is prefilled in parts "
                                "(%d from a cache, %d in this step); only whole one-step prefills are captured",
                                new.req_id, len(prompt), new.num_computed_tokens, scheduled)
                    continue
                meta.saves.append(CaptureSave(new.req_id, prompt, _groups(new.block_ids)))
                self._saving[new.req_id] = prompt
        return meta

    def update_connector_output(self, connector_output: Any) -> None:
        """A failed asynchronous graft: the request is prefilled, and the entry (changed since start-up) is not
        grafted again."""
        for req_id in getattr(connector_output, "failed_recving", None) or ():
            self._failed_reqs.add(req_id)
            if (used := self._grafted_reqs.get(req_id)) is not None:
                self._compatible[used] = False

    def request_finished_all_groups(self, request: Request,
                                    block_ids: tuple[list[int], ...]) -> tuple[bool, dict[str, Any] | None]:
        return self.request_finished(request, [])

    def request_finished(self, request: Request, block_ids: list[int]) -> tuple[bool, dict[str, Any] | None]:
        self._pending.pop(request.request_id, None)
        self._grafted_reqs.pop(request.request_id, None)
        self._failed_reqs.discard(request.request_id)
        prompt = self._saving.pop(request.request_id, None)
        if prompt is not None and self._capture is not None:
            try:
                self._write_release(request, prompt)
            except (KvgraftError, OSError, ValueError, KeyError) as exc:
                log.warning("kvgraft: not captured: request %s: %s", request.request_id, _first_line(str(exc)))
        return False, None

    def _write_release(self, request: Request, prompt: tuple[int, ...]) -> None:
        """Turn the worker's staged KV of a finished request into a release `capture/<entry id>/`."""
        from safetensors import safe_open

        from kvgraft._internal.digest import sha256_hex
        from kvgraft.inference.environment import record
        from kvgraft.inference.runtime import Schedule
        from kvgraft.release.format import ReleaseWriter

        assert self._capture is not None and self._identity is not None
        staged = self._capture / ".staging" / f"{_safe(request.request_id)}"
        info = load_file(staged.with_suffix(".json"))
        tensors: dict[str, torch.Tensor] = {}
        with safe_open(str(staged.with_suffix(".safetensors")), framework="pt") as fh:  # our own file: no pickle
            for name in fh.keys():  # noqa: SIM118 (safe_open is not a mapping)
                tensors[name] = fh.get_tensor(name)
        out_ids = [int(t) for t in request.output_token_ids]
        params = request.sampling_params
        greedy = params is not None and float(params.temperature) == 0.0
        ids = list(prompt)
        eid = f"vllm-{token_ids_digest(ids)[:16]}"
        text = str(self._tokenizer().decode(ids, skip_special_tokens=False))
        # vLLM gives a KV connector no logits: the token is the one vLLM sampled, the digest is of no bytes.
        entry = new_entry(eid, ids, source_record("text", text), info["layers"],
                          {"logits_sha256": sha256_hex(b""), "argmax": out_ids[0] if (greedy and out_ids) else 0,
                           "dtype": release_models.dtype(str(self._dtype).removeprefix("torch."))})
        entry["meta"] = {"captured_by": "vllm", "request_id": request.request_id, "greedy": greedy,
                         "next_token": "vLLM exposes no logits to a KV connector: logits_sha256 is the digest of no "
                                       "bytes; argmax is vLLM's first sampled token when sampling was greedy"}
        if greedy and out_ids:
            entry["probe"] = {"token_ids": out_ids[:8]}
        hf = self._vllm_config.model_config.hf_config
        dtype = str(self._dtype).removeprefix("torch.")
        env = record("cpu" if str(self._vllm_config.device_config.device) == "cpu" else "cuda", dtype,
                     f"vllm:{info['backend']}")
        import vllm

        env["engine"] = {"name": "vllm", "version": str(vllm.__version__), "block_size": self._block_size,
                         "attention_backend": info["backend"], "kv_layout": info["layout"]}
        header: Header = {
            "model": {"spec": self._model_dir, "architecture": (getattr(hf, "architectures", None) or ["?"])[0],
                      "model_type": str(hf.model_type), "num_hidden_layers": self._num_layers,
                      "identity": self._identity},
            "schedule": Schedule().as_dict(),
            "environment": env,
        }
        out = self._capture / eid
        if out.exists():
            log.info("kvgraft: not captured again: %s exists", out)
            return
        writer = ReleaseWriter(out)
        try:
            writer.add_entry(entry, tensors)
            writer.finish(header)
        except BaseException:
            writer.abort()
            raise
        finally:
            for suffix in (".json", ".safetensors"):
                staged.with_suffix(suffix).unlink(missing_ok=True)
        log.info("kvgraft: captured release=%s entry=%s tokens=%d", out, eid, len(ids))

    def _tokenizer(self) -> Any:
        from transformers import AutoTokenizer

        if getattr(self, "_tok", None) is None:
            self._tok = AutoTokenizer.from_pretrained(self._model_dir)
        return self._tok

    # ------------------------------------------------------------------------------------ worker

    def start_load_kv(self, forward_context: ForwardContext, **kwargs: Any) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvgraftMetadata) or not (meta.loads or meta.saves):
            return
        layers: dict[int, Any] = {}
        self._attn_by_index = {int(m.group(1)): layer for name, layer in forward_context.no_compile_layers.items()
                               if (m := _LAYER_INDEX.search(name)) is not None}
        for name, layer in forward_context.no_compile_layers.items():
            if getattr(layer, "kv_cache", None) is None or (self._layer_names is not None and name not in self._layer_names):
                continue
            m = _LAYER_INDEX.search(name)
            if m is None:
                continue
            layers[int(m.group(1))] = layer
        self._layers = layers
        for load in meta.loads:
            self._graft(load, layers)
            if load.asynchronous:
                self._recv_done.add(load.req_id)

    def _fail(self, load: GraftLoad, tensor: str, reason: str) -> None:
        log.warning(refusal(self._roots[load.release], load.entry_id, tensor, _first_line(reason)))
        if load.asynchronous:
            self._recv_failed.add(load.req_id)
            return
        self._load_errors.update(self._touched(load))

    def _graft(self, load: GraftLoad, layers: dict[int, Any]) -> None:
        from kvgraft.inference.graft import read_entry_tensors

        rel = self._releases.get(load.release)
        if rel is None:
            self._fail(load, "-", "the release was not verified by this worker")
            return
        missing = sorted(set(self._served) - set(layers))
        if missing:
            self._fail(load, "-", f"vLLM's attention layers {missing[:4]} have no cache here")
            return
        t0 = time.perf_counter()
        try:
            entry = rel.release.entry(load.entry_id)
            if load.entry_digest and entry["digest"] != load.entry_digest:
                self._fail(load, "-", f"the entry record is {entry['digest'][:16]}… here, the scheduler matched "
                                      f"{load.entry_digest[:16]}… (the release changed between them)")
                return
            # Every tensor's bytes are hashed as they are read; nothing is returned unless all match.
            tensors, _ = read_entry_tensors(rel, entry)
        except KvgraftError as exc:
            said = rel.source.name(exc).diagnostics()  # a release read from elsewhere: named by its URL
            self._fail(load, m.group(1) if (m := _TENSOR_IN.search(said)) else "-", said)
            return
        t1 = time.perf_counter()
        shared = self._check_shared(entry, load)
        if shared is not None:
            self._fail(load, "-", shared)
            return
        total = int(entry["num_tokens"])
        for meta in entry["layers"]:
            if meta["kind"] == "shared":  # vLLM's layer reads its producer's cache, grafted there
                continue
            layer = layers[meta["index"]]
            kv = layer.kv_cache
            try:
                pos_k, pos_v, inv = self._layout(layer, kv)
            except ValueError as exc:
                self._fail(load, meta["keys"], f"cannot map the attention backend's KV layout: {exc}")
                return
            n_block = int(pos_k.shape[0])
            a, _ = stored_rows(meta, total)
            lo = max(load.start, a)  # a window layer: the rows it holds, all that attention reads from here on
            blocks = load.block_ids[self._served[meta["index"]].group]
            t = torch.arange(lo, load.end)
            held = torch.tensor(blocks, dtype=torch.long)[t // n_block]
            t, held = t[held != NULL_BLOCK], held[held != NULL_BLOCK]  # blocks outside the window are vLLM's null block
            rows = t.numel()
            run = bool(rows) and int(t[-1]) - int(t[0]) == rows - 1
            # One run of rows (the usual case: null blocks lead) is a view of the verified tensor, not a copy.
            at: Any = slice(int(t[0]) - a, int(t[-1]) + 1 - a) if run else t - a
            k_src = tensors[meta["keys"]][0, :, at, :].permute(1, 0, 2)  # [T, H, C]
            v_src = tensors[meta["values"]][0, :, at, :].permute(1, 0, 2)
            if run and int(t[0]) % n_block == 0 and rows % n_block == 0:
                # Whole blocks: each block's content is one gather through the probed map, then one row copy.
                nb = rows // n_block
                combined = torch.cat([k_src.reshape(nb, -1), v_src.reshape(nb, -1)], dim=1)
                kv.view(kv.shape[0], -1).index_copy_(0, held[::n_block].contiguous(),
                                                     combined.index_select(1, inv).to(kv.dtype))
                continue
            base = (held * (kv.numel() // kv.shape[0])).view(-1, 1, 1)
            flat = kv.view(-1)
            for src, pos in ((k_src, pos_k), (v_src, pos_v)):
                flat[(base + pos[t % n_block]).reshape(-1)] = src.reshape(-1).to(kv.dtype)
        written = len(self._touched(load))
        with self._lock:
            self.grafted.append((load.req_id, load.entry_id, load.end - load.start))
        t2 = time.perf_counter()
        log.info("kvgraft: grafted release=%s entry=%s tokens=[%d, %d) of %d (rows of the entry's recorded %s prefill "
                 "of all %d tokens) into %d blocks of vLLM's cache (read and hashed %.1f ms, written %.1f ms)",
                 self._roots[load.release],
                 load.entry_id, load.start, load.end, entry["num_tokens"], rel.manifest["schedule"]["mode"],
                 entry["num_tokens"], written, (t1 - t0) * 1e3, (t2 - t1) * 1e3)

    def _touched(self, load: GraftLoad) -> list[int]:
        """The blocks (of every KV-cache group, vLLM's null block left out) that hold tokens [start, end)."""
        first, last = load.start // self._block_size, (load.end - 1) // self._block_size
        return [b for group in load.block_ids for b in group[first:last + 1] if b != NULL_BLOCK]

    def _producer(self, i: int) -> int | None:
        """The layer whose cache vLLM runs layer i with (kv_sharing_target_layer_name), None for its own."""
        target = getattr(self._attn_by_index.get(i), "kv_sharing_target_layer_name", None)
        m = _LAYER_INDEX.search(str(target or ""))
        return int(m.group(1)) if m is not None else None

    def _check_shared(self, entry: Entry, load: GraftLoad) -> str | None:
        """Why the entry's KV-shared layers do not read what vLLM's do, or None: each stored as reading layer j
        must be one vLLM runs with layer j's cache."""
        for meta in entry["layers"]:
            if meta["kind"] != "shared":
                continue
            producer = self._producer(int(meta["index"]))
            if producer != int(meta["shared_with"]):
                return (f"layer {meta['index']} is stored as reading layer {meta['shared_with']}'s cache; vLLM's reads "
                        f"{'layer ' + str(producer) if producer is not None else 'its own'}")
        return None

    def _layout(self, layer: Any, kv: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Where the backend puts key and value element [token-in-block, head, dim] inside one block.

        Returns (key positions [N, H, C], value positions [N, H, C], and their inverse: for each place
        in a block, the index into the block's keys then values, each flattened as [N, H, C]).

        Measured with the backend's own writer on a scratch block; a result that is not one-to-one
        raises ValueError.
        """
        sig = (type(layer.impl).__name__, tuple(kv.shape), kv.dtype, tuple(kv.stride()))
        if sig in self._maps:
            return self._maps[sig]
        if not kv.is_contiguous():
            raise ValueError(f"the cache tensor {tuple(kv.shape)} is not contiguous")
        if kv.dtype != torch.float32 and kv.dtype not in (torch.bfloat16, torch.float16):
            raise ValueError(f"cache dtype {kv.dtype}")
        if not hasattr(layer.impl, "do_kv_cache_update"):
            raise ValueError(f"{type(layer.impl).__name__} has no do_kv_cache_update to probe")
        # Probe in float32 values that every dtype here holds exactly: one pass per 8-bit digit.
        scratch_shape = (2, *kv.shape[1:])  # two blocks: the probe writes block 1, block 0 must stay untouched
        block_numel = kv.numel() // kv.shape[0]
        n_heads, head = self._kv_heads, self._head_dim
        n_block = block_numel // (2 * n_heads * head)
        if n_block * 2 * n_heads * head != block_numel:
            raise ValueError(f"a block of {block_numel} elements is not 2 x heads {n_heads} x dim {head} x tokens")
        count = n_block * n_heads * head
        ids = torch.arange(1, 2 * count + 1, dtype=torch.long)
        found = torch.zeros(block_numel, dtype=torch.long)
        slots = torch.arange(n_block, 2 * n_block, dtype=torch.long)
        for digit in range(3):  # 3 x 8 bits: up to 16.7 M element ids
            vals = ((ids >> (8 * digit)) & 255).to(kv.dtype)
            scratch = torch.full(scratch_shape, -1.0, dtype=kv.dtype)
            key = vals[:count].view(n_block, n_heads, head)
            value = vals[count:].view(n_block, n_heads, head)
            layer.impl.do_kv_cache_update(layer, key.contiguous(), value.contiguous(), scratch, slots)
            block0, block1 = scratch.view(2, -1)[0], scratch.view(2, -1)[1]
            if bool((block0 != -1).any()) or bool((block1 < 0).any()):
                raise ValueError("the probe wrote outside its block or left elements unwritten")
            found |= block1.round().to(torch.long) << (8 * digit)
        order = torch.full((2 * count + 1,), -1, dtype=torch.long)
        if bool((found < 1).any()) or bool((found > 2 * count).any()):
            raise ValueError("the probe came back with values it did not write")
        order[found] = torch.arange(block_numel, dtype=torch.long)
        if bool((order[1:] < 0).any()):
            raise ValueError("the probe is not one-to-one (two elements share a place)")
        pos_k = order[1:count + 1].view(n_block, n_heads, head)
        pos_v = order[count + 1:].view(n_block, n_heads, head)
        inv = torch.empty(block_numel, dtype=torch.long)
        inv[order[1:]] = torch.arange(2 * count, dtype=torch.long)
        self._maps[sig] = (pos_k, pos_v, inv)
        log.info("kvgraft: %s cache layout probed: block of %d tokens, key[token 0, head 0, dim 1] at +%d, "
                 "key[token 1, head 0, dim 0] at +%d", type(layer.impl).__name__, n_block, int(pos_k[0, 0, 1]),
                 int(pos_k[1, 0, 0]))
        return pos_k, pos_v, inv

    def wait_for_layer_load(self, layer_name: str) -> None:
        return None

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor, attn_metadata: Any, **kwargs: Any) -> None:
        return None

    def wait_for_save(self) -> None:
        meta = self._get_connector_metadata()
        if not isinstance(meta, KvgraftMetadata) or not meta.saves or self._capture is None:
            return
        for save in meta.saves:
            try:
                self._stage(save)
            except (ValueError, OSError, KeyError) as exc:
                log.warning("kvgraft: not captured: request %s: %s", save.req_id, _first_line(str(exc)))

    def _stage(self, save: CaptureSave) -> None:
        """Copy a prompt's KV out of the paged cache as [1, heads, tokens, dim] per layer (kvgraft's layout)."""
        from safetensors.torch import save_file

        assert self._capture is not None
        missing = sorted(set(self._served) - set(self._layers))
        if missing:
            raise ValueError(f"vLLM's attention layers {missing[:4]} have no cache here")
        tensors: dict[str, torch.Tensor] = {}
        layers_meta: list[Layer] = []
        n = len(save.token_ids)
        backend = layout = ""
        for i in range(self._num_layers):
            served = self._served.get(i)
            if served is None:  # reads another layer's cache (KV sharing): stored once, at its producer
                producer = self._producer(i)
                if producer is None:
                    raise ValueError(f"layer {i} has no cache of its own and names no layer whose cache it reads")
                layers_meta.append({"index": i, "kind": "shared", "shared_with": producer})
                continue
            layer = self._layers[i]
            kv = layer.kv_cache
            pos_k, pos_v, _ = self._layout(layer, kv)
            n_block = int(pos_k.shape[0])
            nb = -(-n // n_block)
            blocks = save.block_ids[served.group][:nb]
            if NULL_BLOCK in blocks:  # the whole prompt is computed in this step: every block is still held
                raise ValueError(f"layer {i}: vLLM holds {sum(b != NULL_BLOCK for b in blocks)} of the prompt's {nb} blocks")
            rows = kv.view(kv.shape[0], -1).index_select(0, torch.tensor(blocks, dtype=torch.long))
            count = pos_k.numel()
            combined = rows.index_select(1, torch.cat([pos_k.reshape(-1), pos_v.reshape(-1)]))  # [nb, keys | values]
            for part, half in (("keys", combined[:, :count]), ("values", combined[:, count:])):
                got = half.reshape(nb * n_block, served.kv_heads, served.head_size)[:n]
                tensors[f"layer.{i}.{part}"] = got.permute(1, 0, 2).unsqueeze(0).contiguous()
            meta: Layer = {"index": i, "keys": f"layer.{i}.keys", "values": f"layer.{i}.values",
                           "kind": "full", "positions": [0, n], "stores": "all"}
            if served.window is not None:  # every position, as `kvgraft capture --sliding-layers all` records it
                meta["kind"], meta["sliding_window"], meta["cumulative_length"] = "sliding", served.window, n
            layers_meta.append(meta)
            get_name = getattr(getattr(layer, "attn_backend", None), "get_name", None)
            backend = str(get_name()) if callable(get_name) else type(layer.impl).__name__
            layout = (f"probed through {type(layer.impl).__name__}.do_kv_cache_update: cache {list(kv.shape)} "
                      f"{str(kv.dtype).removeprefix('torch.')}; key[token 0, head 0, dim 1] at +{int(pos_k[0, 0, 1])}, "
                      f"key[token 1, head 0, dim 0] at +{int(pos_k[1, 0, 0])} within a block")
        staged = self._capture / ".staging" / _safe(save.req_id)
        staged.parent.mkdir(parents=True, exist_ok=True)
        save_file(tensors, str(staged.with_suffix(".safetensors")))
        staged.with_suffix(".json").write_text(json.dumps({"layers": layers_meta, "backend": backend, "layout": layout}))

    def get_finished(self, finished_req_ids: set[str]) -> tuple[set[str] | None, set[str] | None]:
        done, self._recv_done = self._recv_done, set()
        self._recv_failed -= done
        return None, done or None

    def get_transfer_results(self, finished_req_ids: set[str]) -> Any:
        from vllm.distributed.kv_transfer.kv_connector.v1.base import KVConnectorTransferResults

        done, failed = self._recv_done, self._recv_failed
        self._recv_done, self._recv_failed = set(), set()
        return KVConnectorTransferResults(finished_recving=set(done), failed_recving=failed & done)

    def get_block_ids_with_load_errors(self) -> set[int]:
        errors, self._load_errors = self._load_errors, set()
        return errors


__all__ = ["CaptureSave", "GraftLoad", "KvgraftConnector", "KvgraftMetadata", "refusal", "served_identity"]
