"""Bad input: one line naming what and where, a distinct exit code, no traceback, nothing partial left."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.inference import capture

from release_factory import as_format_1, flat_manifest

runner = CliRunner()


@pytest.fixture()
def release(tiny_dir: Callable[[str], Path], tmp_path: Path) -> tuple[Path, Path]:
    model = tiny_dir("llama")
    src = tmp_path / "src.jsonl"
    src.write_text("\n".join(json.dumps({"id": f"e{i}", "text": f"Problem {i}: Mia has {i} apples."})
                             for i in range(3)) + "\n")
    res = runner.invoke(app, ["capture", str(src), "--out", str(tmp_path / "rel"), "--model", str(model), "--probe", "2"])
    assert res.exit_code == 0, res.output
    return tmp_path / "rel", model


def _run(rel: Path, model: Path, *extra: str) -> Any:
    return runner.invoke(app, ["run", str(rel), "--entry", "e1", "--prompt", " Answer:", "-n", "3",
                               "--model", str(model), *extra])


def _one_line_error(res: Any) -> str:
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, res.stderr
    assert "Traceback" not in res.output
    return lines[0]


def _manifest(rel: Path) -> dict[str, Any]:
    """The records as one document, either layout (capture writes format 2)."""
    return flat_manifest(rel)


def _v1_manifest(rel: Path) -> dict[str, Any]:
    """The release rewritten in the single-manifest layout, for the tests that edit manifest.json."""
    return as_format_1(rel)


def test_good_release_runs(release: tuple[Path, Path]) -> None:
    res = _run(*release)
    assert res.exit_code == 0, res.output
    assert "tokens restored from the graft" in res.stdout


def test_missing_file(release: tuple[Path, Path]) -> None:
    rel, model = release
    f = rel / _manifest(rel)["entries"][1]["file"]
    f.unlink()
    res = _run(rel, model)
    assert res.exit_code == errors.EXIT_FAILED
    line = _one_line_error(res)
    assert str(f) in line and "'e1'" in line and "missing" in line


def test_truncated_file(release: tuple[Path, Path]) -> None:
    rel, model = release
    f = rel / _manifest(rel)["entries"][1]["file"]
    data = f.read_bytes()
    f.write_bytes(data[: len(data) - 7])
    res = _run(rel, model)
    assert res.exit_code == errors.EXIT_FAILED
    line = _one_line_error(res)
    assert str(f) in line and "'e1'" in line


def test_altered_tensor_byte_names_tensor_and_digests(release: tuple[Path, Path]) -> None:
    rel, model = release
    entry = _manifest(rel)["entries"][1]
    name = "layer.2.values"
    start, end = entry["tensors"][name]["byte_range"]
    f = rel / entry["file"]
    data = bytearray(f.read_bytes())
    data[start + 5] ^= 0x01
    f.write_bytes(bytes(data))
    res = _run(rel, model)
    assert res.exit_code == errors.EXIT_FAILED
    line = _one_line_error(res)
    assert f"'{name}'" in line and f"[{start}, {end})" in line
    assert entry["tensors"][name]["sha256"] in line  # the expected digest
    assert str(f) in line


def _refusal(release: tuple[Path, Path], manifest: Callable[[Path], dict[str, Any]],
             edit: Callable[[dict[str, Any]], object]) -> tuple[int, str]:
    """`kvgraft run` on the release once `edit` has changed its manifest (as `manifest` reads it): exit code, error line."""
    rel, model = release
    m = manifest(rel)
    edit(m)
    (rel / "manifest.json").write_text(json.dumps(m))
    res = _run(rel, model)
    return res.exit_code, _one_line_error(res)


def test_schema_failure_names_json_path(release: tuple[Path, Path]) -> None:
    code, line = _refusal(release, _v1_manifest, lambda m: m["entries"][0].update(num_tokens="many"))
    assert code == errors.EXIT_INPUT
    assert "$.entries[0].num_tokens" in line


def test_unknown_format_version_refused(release: tuple[Path, Path]) -> None:
    code, line = _refusal(release, _manifest, lambda m: m.update(format_version=99))
    assert code == errors.EXIT_INPUT
    assert "format version 99 is not supported" in line


def test_duplicate_keys_refused(release: tuple[Path, Path]) -> None:
    rel, model = release
    text = (rel / "manifest.json").read_text()
    (rel / "manifest.json").write_text(text.replace('"format": ', '"format": "x", "format": ', 1))
    res = _run(rel, model)
    assert res.exit_code == errors.EXIT_INPUT
    assert "duplicate key 'format'" in _one_line_error(res)


def test_edited_manifest_breaks_root_digest(release: tuple[Path, Path]) -> None:
    code, line = _refusal(release, _v1_manifest, lambda m: m["entries"][0].update(answer="42"))
    assert code == errors.EXIT_FAILED
    assert "digest" in line


def test_verbose_shows_traceback(release: tuple[Path, Path]) -> None:
    rel, model = release
    (rel / _manifest(rel)["entries"][1]["file"]).unlink()
    res = runner.invoke(app, ["--verbose", "run", str(rel), "--entry", "e1", "--model", str(model)])
    assert res.exit_code == errors.EXIT_FAILED
    assert "Traceback" in res.stderr


def test_existing_release_refused_without_overwrite(release: tuple[Path, Path], tmp_path: Path) -> None:
    rel, model = release
    before = (rel / "manifest.json").read_bytes()
    src = tmp_path / "other.jsonl"
    src.write_text('{"id": "x", "text": "Other text entirely."}\n')
    res = runner.invoke(app, ["capture", str(src), "--out", str(rel), "--model", str(model)])
    assert res.exit_code == errors.EXIT_EXISTS
    assert "--overwrite" in _one_line_error(res)
    assert (rel / "manifest.json").read_bytes() == before
    res = runner.invoke(app, ["capture", str(src), "--out", str(rel), "--model", str(model), "--overwrite"])
    assert res.exit_code == 0, res.output
    assert [e["id"] for e in _manifest(rel)["entries"]] == ["x"]


def test_interrupted_capture_leaves_nothing(tiny_lm: Callable[[str], Any], tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    lm = tiny_lm("llama")
    real = capture.capture_entry
    calls = {"n": 0}

    def dies_on_second(*args: Any, **kwargs: Any) -> Any:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(capture, "capture_entry", dies_on_second)
    recs = [(f"s:{i}", {"id": f"r{i}", "text": f"record {i}"}) for i in range(3)]
    with pytest.raises(KeyboardInterrupt):
        capture.capture(lm, recs, tmp_path / "out" / "rel")
    assert list((tmp_path / "out").iterdir()) == []


def test_bad_source_line_is_named(tmp_path: Path, tiny_dir: Callable[[str], Path]) -> None:
    src = tmp_path / "src.jsonl"
    src.write_text('{"id": "a", "text": "ok"}\n{"id": "b", "text": \n')
    res = runner.invoke(app, ["capture", str(src), "--out", str(tmp_path / "r"), "--model", str(tiny_dir("llama"))])
    assert res.exit_code == errors.EXIT_INPUT
    assert f"{src}:2" in _one_line_error(res)
    assert not (tmp_path / "r").exists()


@pytest.mark.parametrize("answer", [["4"], {"value": 4}, True])
def test_an_answer_a_record_cannot_hold_is_named_at_its_line(tmp_path: Path, tiny_dir: Callable[[str], Path],
                                                              answer: Any) -> None:
    """An entry's answer is a string, a number or null: another is refused naming the source line, before the
    model runs, not after every entry was captured (the manifest's schema would refuse it only then)."""
    src = tmp_path / "src.jsonl"
    src.write_text(json.dumps({"id": "a", "text": "ok", "answer": 4}) + "\n"
                   + json.dumps({"id": "b", "text": "ok", "answer": answer}) + "\n")
    res = runner.invoke(app, ["capture", str(src), "--out", str(tmp_path / "r"), "--model", str(tiny_dir("llama"))])
    assert res.exit_code == errors.EXIT_INPUT, res.output
    line = _one_line_error(res)
    assert f"{src}:2" in line and '"answer" must be a string, a number or null' in line
    assert not (tmp_path / "r").exists()


def test_wrong_model_refused_then_forced(release: tuple[Path, Path], tmp_path: Path) -> None:
    import tiny

    rel, _ = release
    other = tiny.build("llama", tmp_path / "llama-seed1", seed=1)  # same architecture, other weights
    res = _run(rel, other)
    assert res.exit_code == errors.EXIT_MODEL
    line = _one_line_error(res)
    want = _manifest(rel)["model"]["identity"]["sha256"]
    assert want[:16] in line and "weights" in line and "--force" in line
    res = _run(rel, other, "--force", "--json")
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout)["ledger"]["forced_model"] is True


def test_written_manifest_is_schema_valid(release: tuple[Path, Path]) -> None:
    from kvgraft.schema import CACHE_INDEX_SHARD, CACHE_MANIFEST, CACHE_MANIFEST_V2, validate

    rel, _ = release
    written = json.loads((rel / "manifest.json").read_text())
    validate(written, CACHE_MANIFEST_V2, "test")
    for shard in written["index"]["shards"]:
        validate(json.loads((rel / shard["file"]).read_text()), CACHE_INDEX_SHARD, shard["file"])
    m = _manifest(rel)
    validate(as_format_1(rel), CACHE_MANIFEST, "test")  # the same records in the format-1 layout
    env = m["environment"]
    for key in ("python", "torch", "transformers", "device_name", "dtype", "attn_implementation", "threads",
                "deterministic_algorithms"):
        assert key in env
    assert m["schedule"] == {"mode": "one-shot", "chunk_tokens": None, "batch_size": 1, "add_special_tokens": True,
                             "add_generation_prompt": False}
