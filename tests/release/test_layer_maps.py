"""An entry's layer map is checked against the model config its manifest records, by default verification and by
everything that reads a record: layer i at position i, each of the model's layers once, a shared layer reading a
layer that stores states, a storing layer naming both tensors. A re-signed release whose map names layer 10^9 of a
2-layer model, or no layer at all, is refused before a byte of it is grafted."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import EXIT_INPUT, InputError
from kvgraft.release.format import Release
from kvgraft.signing import keys
from kvgraft.signing.policy import SignedWithKeys
from tests.verifying import verify_result

import rewrite
from release_factory import make_release, sign_as

runner = CliRunner()


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    folder = tmp_path_factory.mktemp("layer-maps")
    make_release(folder / "rel", entries=2, layers=2, seed=7)
    private, public = keys.write_keypair(folder / "attacker")
    return folder / "rel", private, public


def _first(change: Callable[[dict[str, Any]], None]) -> Callable[[dict[str, Any]], None]:
    return lambda m: change(m["entries"][1]["layers"])


def _set(i: int, **fields: Any) -> Callable[[list[dict[str, Any]]], None]:
    return lambda layers: layers[i].update(fields)


def _pop(i: int, key: str) -> Callable[[list[dict[str, Any]]], None]:
    return lambda layers: layers[i].pop(key)


CASES: dict[str, tuple[Callable[[list[dict[str, Any]]], None], str]] = {
    "layer 10^9": (_set(1, index=10**9), "layer 1000000000: at position 1 of the layer map"),
    "no layers": (lambda layers: layers.clear(), "0 layers, the manifest's model has 2"),
    "one layer short": (lambda layers: layers.pop(), "1 layers, the manifest's model has 2"),
    "one too many": (lambda layers: layers.append(dict(layers[1], index=2)), "3 layers, the manifest's model has 2"),
    "twice the same": (_set(1, index=0), "layer 0: at position 1"),
    "swapped": (lambda layers: layers.reverse(), "layer 1: at position 0"),
    "shared with 10^9": (_set(1, kind="shared", shared_with=10**9), "layer 1: shared with 1000000000"),
    "shared with itself": (_set(1, kind="shared", shared_with=1), "layer 1: shared with 1"),
    "shared with nothing": (_set(1, kind="shared"), "layer 1: shared with None"),
    "no values": (_pop(0, "values"), "layer 0: a full layer names no keys or no values tensor"),
    "shared with a shared layer": (lambda layers: (layers[0].update(kind="shared", shared_with=1),
                                                   layers[1].update(kind="shared", shared_with=0)),
                                   "layer 0: shared with 1"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_layer_map_the_model_cannot_hold_is_refused(built: tuple[Path, Path, Path], tmp_path: Path,
                                                      case: str) -> None:
    base, private, public = built
    rel = Path(shutil.copytree(base, tmp_path / "rel"))
    change, message = CASES[case]
    rewrite.manifest(rel, _first(change))
    sign_as(rel, private)
    with pytest.raises(InputError, match="entry 'rec-001'") as raised:
        verify_result(rel, SignedWithKeys((public,)))
    assert message in str(raised.value)
    for extra in ([], ["--entry", "rec-001"]):
        r = runner.invoke(app, ["verify", str(rel), "--key", str(public), *extra])
        assert r.exit_code == EXIT_INPUT and message in r.stderr, r.output
    with pytest.raises(InputError, match=message.split(":")[0]):
        Release.open(rel).entry("rec-001")  # every reader of a record: run, pull, the audits


def test_the_layer_maps_a_capture_writes_pass(built: tuple[Path, Path, Path]) -> None:
    base, _, _ = built
    assert runner.invoke(app, ["verify", str(base)]).exit_code == 0
    assert [layer["index"] for layer in Release.open(base).entry("rec-001")["layers"]] == [0, 1]


@pytest.mark.parametrize("format_version", [1, 2])
def test_default_verification_reads_each_byte_once(tmp_path: Path, format_version: int) -> None:
    """Every tensor's digest is checked from its file's one pass: bytes hashed are the files' bytes, none again."""
    from kvgraft.release.integrity import check_release

    root = tmp_path / "rel"
    make_release(root, entries=3, seed=9, format_version=format_version)
    checked = check_release(root)
    files = sum(p.stat().st_size for p in root.rglob("*") if p.is_file())
    assert checked.tensors == 12 and checked.tensors_rehashed == 0 and checked.bytes_hashed == files
