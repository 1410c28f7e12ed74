"""Load a causal LM by spec and fingerprint exactly what was loaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue

from kvgraft._internal.digest import digest_json
from kvgraft.errors import InputError
from kvgraft.inference import presets
from kvgraft.inference.presets import home
from kvgraft.release import models as release_models
from kvgraft.release.hashing import pool
from kvgraft.results.base import JsonObject

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
DTYPES = ("float32", "bfloat16", "float16")
ATTNS = ("eager", "sdpa")
DEVICES = ("auto", "cpu", "cuda")
# Config keys that describe the container or the run, not the model.
_CONFIG_VOLATILE = {
    "transformers_version", "_name_or_path", "_commit_hash", "quantization_config", "dtype",
    "torch_dtype", "_attn_implementation", "attn_implementation", "_attn_implementation_autoset",
    "use_cache", "output_attentions", "output_hidden_states", "return_dict",
}


@dataclass
class Identity:
    """Fingerprint of weights, tokenizer and config; `sha256` binds all three."""

    sha256: str
    weights_sha256: str
    tokenizer_sha256: str
    config_sha256: str
    num_tensors: int
    num_parameters: int

    def as_dict(self) -> JsonObject:
        return release_models.as_json(self.record())

    def record(self) -> release_models.Identity:
        """As a manifest records it."""
        return {"sha256": self.sha256, "weights_sha256": self.weights_sha256, "tokenizer_sha256": self.tokenizer_sha256,
                "config_sha256": self.config_sha256, "num_tensors": self.num_tensors,
                "num_parameters": self.num_parameters}


@dataclass
class LoadedModel:
    spec: str
    model: PreTrainedModel
    tokenizer: PreTrainedTokenizerBase
    device: str
    dtype: str
    attn: str
    _identity: Identity | None = field(default=None, repr=False)

    @property
    def identity(self) -> Identity:
        if self._identity is None:
            self._identity = fingerprint(self.model, self.tokenizer)
        return self._identity

    @property
    def torch_device(self) -> torch.device:
        return next(self.model.parameters()).device


def ensure_smollm2(progress: Any = None) -> Path:
    """The default model's converted folder (converted once)."""
    return presets.ensure(presets.PRESETS[DEFAULT_MODEL], progress)


def resolve(spec: str, progress: Any = None) -> str:
    """A model spec as the folder (or hub id) transformers loads: a preset converted once, a `.gguf` file
    converted once, a model folder, or a hub id (owner/name)."""
    if spec in presets.PRESETS:
        return str(presets.ensure(presets.PRESETS[spec], progress))
    path = Path(spec)
    if spec.endswith(".gguf") and path.is_file():
        return str(presets.ensure_gguf(path, progress))
    if path.is_dir():
        return spec
    if path.exists() or spec.startswith((".", "/", "~")) or spec.endswith(".gguf"):
        what = "no such file" if not path.exists() else "not a model folder or a .gguf file"
        raise InputError(f"{spec}: {what}")
    if spec.count("/") != 1:
        # A bare name is a preset misspelt far more often than a hub id: refused at once, not after the
        # hub's retries offline.
        raise InputError(f"{spec}: not a model kvgraft knows: expected a preset ({', '.join(presets.PRESETS)}), "
                         "a model folder, a .gguf file or a hub id (owner/name); `kvgraft models` lists the presets")
    return spec  # a hub id; transformers honours HF_HUB_OFFLINE


def for_release(recorded: release_models.ModelRecord | JsonObject, given: str | None, *, force: bool = False) -> str:
    """The model to load for a release whose manifest records `recorded` (its `model`): `given`, else the
    one it records. Decided before anything loads: a preset other than the recorded preset is refused
    (unless forced), saying which model the release needs and how to get it."""
    from kvgraft.errors import ModelMismatchError

    spec = str(recorded.get("spec") or "")
    identity = recorded.get("identity")
    ident = str((identity.get("sha256") if isinstance(identity, dict) else None) or "")[:16]
    need = f"model {spec!r} (identity {ident}…)"
    if given is None:
        if spec in presets.PRESETS or Path(spec).is_dir() or (spec.count("/") == 1 and not spec.startswith((".", "/"))):
            return spec
        raise InputError(f"the release was captured with {need}, not a preset or a folder here: name a model "
                         "with that identity with --model")
    if not force and given != spec and given in presets.PRESETS and spec in presets.PRESETS:
        how = "" if presets.installed(presets.PRESETS[spec]) else f" ({presets.install_line(presets.PRESETS[spec])})"
        raise ModelMismatchError(f"the release was captured with {need}, not {given}: run with --model {spec} or "
                                 f"without --model{how}; --force to go on anyway")
    return given


def check_options(*, device: str | None = None, dtype: str | None = None, attn: str | None = None) -> None:
    """Refuse a device, dtype or attention kernel kvgraft cannot load (None: not given). Imports no torch:
    a command calls it first, so a typo is refused at once, not after seconds of loading."""
    for option, value, known in (("--device", device, DEVICES), ("--dtype", dtype, DTYPES), ("--attn", attn, ATTNS)):
        if value is not None and value not in known:
            raise InputError(f"{option} {value}: expected one of {', '.join(known)}")


def pick_device(device: str) -> str:
    import torch

    check_options(device=device)
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device is available")
    return device


def load(spec: str = DEFAULT_MODEL, *, device: str = "auto", dtype: str = "float32",
         attn: str = "sdpa", progress: Any = None) -> LoadedModel:
    """Load a causal LM from a preset (`smollm2-135m`, `gemma3-270m`), a `.gguf` file, a local folder or a hub id."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # kvgraft draws its own progress; theirs would interleave
    check_options(dtype=dtype, attn=attn)
    dev = pick_device(device)
    where = resolve(spec, progress)
    try:
        tok = AutoTokenizer.from_pretrained(where)
        model = AutoModelForCausalLM.from_pretrained(where, dtype=getattr(torch, dtype), attn_implementation=attn)
    except (InputError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # OSError, ValueError, KeyError...: transformers' ways of saying it cannot load this
        first = (str(exc).splitlines() or [""])[0]
        raise InputError(f"{spec}: cannot load model: {type(exc).__name__}: {first}") from None
    model.to(dev)  # type: ignore[arg-type]
    model.eval()  # type: ignore[no-untyped-call]
    return LoadedModel(spec, model, tok, dev, dtype, attn)


def wrap(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, spec: str) -> LoadedModel:
    """Describe an already-loaded model (tests, notebooks)."""
    model.eval()  # type: ignore[no-untyped-call]
    dev = next(model.parameters()).device.type
    dtype = str(next(model.parameters()).dtype).removeprefix("torch.")
    attn = str(getattr(model.config, "_attn_implementation", None) or "sdpa")
    return LoadedModel(spec, model, tokenizer, dev, dtype, attn)


def _tensor_record(name: str, t: torch.Tensor) -> JsonObject:
    from kvgraft.inference.tensors import tensor_sha256

    shape: list[JsonValue] = [int(n) for n in t.shape]
    return {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": shape, "sha256": tensor_sha256(t)}


def fingerprint(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase) -> Identity:
    """SHA-256 identity of what is loaded, independent of the file it came from.

    weights: canonical JSON of [{name, dtype, shape, sha256(raw bytes)}] sorted by name;
    tokenizer: the backend tokenizer JSON (vocabulary, merges, added tokens) in canonical form,
    special tokens and chat template; config: the model config minus run/container keys.
    """
    state = model.state_dict()
    names = sorted(state)
    futures = [pool().submit(_tensor_record, n, state[n]) for n in names]
    records = [f.result() for f in futures]
    weights = digest_json(records)
    backend = getattr(tokenizer, "backend_tokenizer", None)
    tok_obj = {  # made plain JSON by _jsonable before it is hashed
        "backend": json.loads(backend.to_str()) if backend is not None else None,
        "vocab": None if backend is not None else sorted(tokenizer.get_vocab().items()),
        "special_tokens": {k: str(v) for k, v in sorted(tokenizer.special_tokens_map.items())},
        "chat_template": getattr(tokenizer, "chat_template", None),
    }
    tok_digest = digest_json(_jsonable(tok_obj))
    cfg = {k: v for k, v in model.config.to_dict().items() if k not in _CONFIG_VOLATILE}
    # The class a folder names for loading says nothing about the computation; kept as null (not
    # dropped) so that identities from folders without it, like the reference releases', stay equal.
    cfg["architectures"] = None
    cfg_digest = digest_json(_jsonable(cfg))
    parts = {"weights_sha256": weights, "tokenizer_sha256": tok_digest, "config_sha256": cfg_digest}
    # A tied embedding is one tensor under two names: its parameters counted once.
    storages = {(state[n].untyped_storage().data_ptr(), state[n].storage_offset(), tuple(state[n].shape)): state[n]
                for n in names}
    return Identity(sha256=digest_json(parts), num_tensors=len(names),
                    num_parameters=sum(int(t.numel()) for t in storages.values()), **parts)


def _jsonable(obj: Any) -> Any:
    # Round-trip through json with a str fallback so canonical JSON sees only plain types;
    # floats stay floats (RFC 8785 has one spelling for each).
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


def describe_identity_diff(a: release_models.Identity, b: release_models.Identity) -> str:
    parts = [k.removesuffix("_sha256") for k in ("weights_sha256", "tokenizer_sha256", "config_sha256")
             if a.get(k) != b.get(k)]
    return ", ".join(parts) or "identity digest"


__all__ = ["DEFAULT_MODEL", "Identity", "LoadedModel", "fingerprint", "home", "load", "wrap"]
