"""What a first-time user meets: help that names things plainly, errors that say what is wrong and name the option
given, options refused before anything heavy loads, one --json/--out convention, counts that agree, tables that fit."""

from __future__ import annotations

import io
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import typer
from rich.console import Console
from test_verify_no_torch import CLI
from test_verify_no_torch import run as run_blocked
from typer.testing import CliRunner

from kvgraft import errors
from kvgraft.cli import app
from kvgraft.signing import attest

from release_factory import make_release

runner = CliRunner()
HELP_ENV = {"COLUMNS": "4000", "NO_COLOR": "1", "TERM": "dumb"}


def commands(cmd: Any, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], Any]]:
    yield path, cmd
    for name, sub in sorted(getattr(cmd, "commands", {}).items()):
        yield from commands(sub, (*path, name))


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """A format-2 release signed with one key (both signatures: the bundle and model.sig), and another key."""
    base = tmp_path_factory.mktemp("first")
    make_release(base / "rel", format_version=2)
    for name in ("a", "b"):
        assert runner.invoke(app, ["keygen", "--out", str(base / name)]).exit_code == 0
    r = runner.invoke(app, ["sign", str(base / "rel"), "--key", str(base / "a.key.pem")])
    assert r.exit_code == 0, r.output
    return base / "rel", base / "a.pub.pem", base / "b.pub.pem"


# ---------------------------------------------------------------- help


def test_help_names_values_plainly_and_every_option_says_what_it_does() -> None:
    checked = 0
    for path, cmd in commands(typer.main.get_command(app)):
        r = runner.invoke(app, [*path, "-h"], env=HELP_ENV)  # -h as well as --help
        assert r.exit_code == 0, (path, r.output)
        usage = r.output.splitlines()[0]
        assert "{" not in usage and "_" not in usage, usage  # not {release} or {plan_file}
        assert "list[" not in r.output, (path, r.output)  # not --key <list[Path]>
        for param in cmd.params:
            assert getattr(param, "help", None) or getattr(param, "hidden", False), (path, param.opts)
            checked += 1
    assert checked > 100  # every command was reached
    r = runner.invoke(app, ["verify", "--help"], env=HELP_ENV, prog_name="kvgraft")
    assert r.output.startswith("Usage: kvgraft verify [OPTIONS] RELEASE\n")
    assert re.search(r"-k, --key PEM\s", r.output) and re.search(r"--entry ID\s", r.output)
    r = runner.invoke(app, ["audit", "run", "--help"], env=HELP_ENV, prog_name="kvgraft")
    assert r.output.startswith("Usage: kvgraft audit run [OPTIONS] PLAN\n")
    assert runner.invoke(app, ["inspect", "-h"], env=HELP_ENV, prog_name="kvgraft").output.startswith(
        "Usage: kvgraft inspect [OPTIONS] RELEASE [ENTRY]\n")


def test_run_help_says_what_it_checks() -> None:
    r = runner.invoke(app, ["run", "--help"], env=HELP_ENV)
    text = " ".join(r.output.split())
    assert "as `kvgraft verify` does" not in text
    assert "Checks what opening a release checks" in text and "then the grafted entry's file" in text
    assert "`kvgraft verify` checks every file" in text


def test_json_is_a_flag_everywhere_and_out_names_the_file() -> None:
    """--json prints JSON on stdout (a flag) on every command that has it; a result file is --out FILE."""
    seen = []
    for path, cmd in commands(typer.main.get_command(app)):
        for param in cmd.params:
            if "--json" in getattr(param, "opts", ()):
                assert param.is_flag, f"kvgraft {' '.join(path)} --json takes a value"
                seen.append(path)
    assert {("audit", "recompute"), ("audit", "determinism"), ("audit", "generalization"), ("verify",)} <= set(seen)


# ---------------------------------------------------------------- errors that say what is wrong


def test_audit_sample_names_the_option_given(signed: tuple[Path, Path, Path]) -> None:
    rel = signed[0]
    r = runner.invoke(app, ["audit", "sample", str(rel), "--nonce", "n", "--size", "9"])
    assert r.exit_code == errors.EXIT_INPUT and "--size 9: expected 1 to 3" in r.stderr and "--sample" not in r.stderr


def test_a_missing_path_does_not_exist_and_a_file_is_not_a_folder(signed: tuple[Path, Path, Path],
                                                                  tmp_path: Path) -> None:
    for command in (["verify"], ["inspect"], ["audit", "sample", "--nonce", "n", "--size", "1"]):
        r = runner.invoke(app, [*command[:2], str(tmp_path / "nowhere"), *command[2:]])
        assert r.exit_code == errors.EXIT_INPUT and f"{tmp_path / 'nowhere'}: does not exist" in r.stderr, r.output
    r = runner.invoke(app, ["verify", str(signed[0] / "manifest.json")])
    assert r.exit_code == errors.EXIT_INPUT and f"{signed[0] / 'manifest.json'}: not a folder" in r.stderr


def test_a_wrong_key_on_a_release_one_signer_signed_gives_no_advice_about_two_signers(
        signed: tuple[Path, Path, Path]) -> None:
    rel, _, other = signed
    r = runner.invoke(app, ["verify", str(rel), "--key", str(other)])
    assert r.exit_code == errors.EXIT_FAILED and "does not verify with key" in r.stderr
    assert "for each signer" not in r.stderr  # one signer signed both; the key is just the wrong one
    # (tests/signing/test_verify_bite.py: with two signers, the key of the other one still gets the advice)


def test_sign_and_verify_count_the_same_files(signed: tuple[Path, Path, Path], tmp_path: Path) -> None:
    import shutil

    rel = Path(shutil.copytree(signed[0], tmp_path / "rel"))
    signing = runner.invoke(app, ["sign", str(rel), "--key", str(signed[1].with_name("a.key.pem"))])
    verifying = runner.invoke(app, ["verify", str(rel), "--key", str(signed[1])])
    assert signing.exit_code == 0 and verifying.exit_code == 0, (signing.output, verifying.output)
    signed_files = re.search(r"\((\d+) files,", signing.stdout)
    verified_files = re.search(r"files\s+(\d+) files,", verifying.stdout)
    assert signed_files and verified_files and signed_files.group(1) == verified_files.group(1), (
        signing.stdout, verifying.stdout)  # was 3 and 6: the statement's subjects, and every file checked


def test_the_releases_own_model_sig_named_with_oms_signature_is_the_same_one(signed: tuple[Path, Path, Path]) -> None:
    rel, public, _ = signed
    r = runner.invoke(app, ["verify", str(rel), "--key", str(public), "--oms-signature", str(rel / attest.OMS_NAME)])
    assert r.exit_code == 0 and "names another" not in r.output, r.output
    assert "model.sig verified" in r.stdout


# ---------------------------------------------------------------- refused before anything heavy loads


@pytest.mark.parametrize(("args", "says"), [
    (["run", "REL", "--entry", "rec-001", "--dtype", "float64"], "--dtype float64: expected one of"),
    (["run", "REL", "--entry", "rec-001", "--attn", "flash"], "--attn flash: expected one of"),
    (["run", "REL", "--entry", "rec-001", "--device", "tpu"], "--device tpu: expected one of"),
    (["run", "REL", "--entry", "rec-001", "-n", "-5"], "--max-new-tokens -5: expected 0 or more"),
    (["audit", "recompute", "REL", "--dtype", "float64"], "--dtype float64: expected one of"),
    (["capture", "SRC", "--out", "NEW", "--attn", "flash"], "--attn flash: expected one of"),
])
def test_bad_options_are_refused_before_torch_is_imported(signed: tuple[Path, Path, Path], tmp_path: Path,
                                                          args: list[str], says: str) -> None:
    """In an interpreter where importing torch fails: the refusal comes first (it took 14-28 s of imports)."""
    (tmp_path / "src.jsonl").write_text('{"id": "a", "text": "x"}\n')
    names = {"REL": str(signed[0]), "SRC": str(tmp_path / "src.jsonl"), "NEW": str(tmp_path / "new")}
    r = run_blocked(CLI, *[names.get(a, a) for a in args], tmp=tmp_path)
    assert r["code"] == errors.EXIT_INPUT and says in str(r["stderr"]), r["stderr"]
    assert r["torch_imported"] is False and len(str(r["stderr"]).strip().splitlines()) == 1


# ---------------------------------------------------------------- output


def test_inspects_entries_table_stays_a_table_at_80_columns() -> None:
    from kvgraft.cli.inspection import entries_renderable
    from kvgraft.results.inspect import Page, Row

    preview = "Natalia sold clips to 48 of her friends in April, and then…"
    rows = [Row(id=f"gsm8k-train-{i:05d}", num_tokens=1234, bytes=12_345_678, tensor_bytes=12_000_000,
                source_kind="messages", preview=preview) for i in range(3)]
    doc = Page(offset=0, shown=3, total=7473, rows=rows)

    def shown(width: int) -> list[str]:
        console = Console(width=width, file=io.StringIO(), color_system=None)
        console.print(entries_renderable(doc, rows, console))
        return console.file.getvalue().splitlines()  # type: ignore[attr-defined]

    lines = shown(80)
    assert max(len(x) for x in lines) <= 80
    assert any("┃ id" in x and "first words" in x for x in lines)
    rowlines = [x for x in lines if "gsm8k-train-" in x]
    assert len(rowlines) == 3 and all("12,345,678" in x and "Natalia sold" in x and "…" in x for x in rowlines)
    assert any(preview in x for x in shown(200))  # wide enough: the preview whole
    narrow = shown(40)  # too narrow for a useful preview column: one paragraph per entry, nothing cut
    assert not any("┃" in x for x in narrow) and "".join(narrow).count("first words") == 3


def test_the_first_gguf_conversion_shows_one_line_not_transformers_bar(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capfd: pytest.CaptureFixture[str]) -> None:
    """transformers converts the GGUF tensor by tensor under its own tqdm bar (272 steps for SmolLM2), which
    its progress switch does not silence, then loads the weights under another bar; kvgraft says one line
    instead. Faked: no 30 s conversion here."""
    import transformers
    from transformers import modeling_gguf_pytorch_utils as reader
    from transformers.utils import logging as hf_logging

    from kvgraft.errors import InputError
    from kvgraft.inference import models, presets

    class Stop(Exception):
        pass

    def converting(*_a: Any, **_k: Any) -> Any:
        for _ in reader.tqdm(range(272), desc="Converting and de-quantizing GGUF tensors..."):
            pass
        for _ in hf_logging.tqdm(range(272), desc="Loading weights"):
            pass
        raise Stop  # the conversion itself is not what is tested

    real = reader.tqdm
    hf_logging.enable_progress_bar()  # as a fresh process has it (models.load elsewhere in this test run turns it off)
    with pytest.raises(Stop):
        converting()  # the positive control: the bars, as transformers draws them
    err = capfd.readouterr().err
    assert "Converting and de-quantizing" in err and "Loading weights" in err
    monkeypatch.setenv("KVGRAFT_HOME", str(tmp_path))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(presets, "part_paths", lambda _p: [gguf])
    monkeypatch.setattr(presets, "file_sha256", lambda _p: presets.PRESETS[models.DEFAULT_MODEL].sha256)
    monkeypatch.setattr(transformers.AutoTokenizer, "from_pretrained", lambda *a, **k: None)
    monkeypatch.setattr(transformers.AutoModelForCausalLM, "from_pretrained", converting)
    said: list[str] = []
    with pytest.raises(InputError, match="cannot convert from GGUF: Stop"):  # a failed conversion: exit 2
        models.ensure_smollm2(progress=said.append)
    err = capfd.readouterr().err
    assert "Converting" not in err and "Loading weights" not in err and "272" not in err, err
    assert len(said) == 1 and said[0].startswith("converting SmolLM2-135M-Instruct from GGUF")
    assert reader.tqdm is real and hf_logging.is_progress_bar_enabled()  # put back as they were


# ---------------------------------------------------------------- --json prints, --out writes


def test_audit_recompute_json_prints_and_out_writes(tiny_lm: Callable[[str], Any], tiny_dir: Callable[[str], Path],
                                                    tmp_path: Path) -> None:
    from kvgraft.inference import capture

    rel = tmp_path / "rel"
    capture.capture(tiny_lm("llama"), [("t", {"id": "a", "text": "the cat sat on the mat"})], rel, probe_tokens=2)
    out = tmp_path / "r.json"
    r = runner.invoke(app, ["audit", "recompute", str(rel), "--model", str(tiny_dir("llama")), "--device", "cpu",
                            "--json", "--out", str(out)])
    assert r.exit_code == 0, r.output
    printed = json.loads(r.stdout)
    assert printed["kind"] == "kvgraft-recompute-result" and json.loads(out.read_text())["entries"] == printed["entries"]
