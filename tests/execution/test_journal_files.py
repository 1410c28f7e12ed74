"""A journal path may name anything: a user's file, a device, a FIFO, a link, a huge or deeply nested file.

A file kvgraft did not write is refused untouched (never truncated, written or removed), anything but a
regular file is refused before it is opened, and every line read back is bounded in size and nesting.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from kvgraft import errors
from kvgraft.execution.journal import MAX_RESULT_LINE, Journal, header, is_journal

RUN = {"release_root_digest": "ab" * 32, "entries": ["a", "b"], "schedule": {"chunk_tokens": None}}
UNITS = {"a", "b"}


def _header(run: dict[str, object] = RUN) -> bytes:
    return json.dumps({"kind": "kvgraft-journal", "version": 1, "run": run}).encode() + b"\n"


@pytest.mark.parametrize("content", [b"my notes, no newline", b"", b'{"kind": "kvgraft-jou',
                                     b"first line\nsecond line\n", b'{"kind": "other"}\n'])
def test_a_file_kvgraft_did_not_write_is_refused_untouched(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "notes.txt"
    path.write_bytes(content)
    with pytest.raises(errors.InputError, match="not a kvgraft journal"):
        Journal.open(path, RUN, UNITS)
    assert path.read_bytes() == content
    assert not is_journal(path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["notes.txt"]  # no temporary file left


def test_a_new_journal_is_created_whole_and_an_existing_one_resumed(tmp_path: Path) -> None:
    path = tmp_path / "j.journal"
    j = Journal.open(path, RUN, UNITS)
    assert path.read_bytes() == _header() and not j.resumed and is_journal(path)
    j.record("a", {"v": 1})
    j.close()
    again = Journal.open(path, RUN, UNITS)
    assert again.resumed and again.done == {"a": {"v": 1}}
    again.remove()
    assert sorted(p.name for p in tmp_path.iterdir()) == []


def test_special_files_and_links_are_refused_before_opening(tmp_path: Path) -> None:
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    link = tmp_path / "link"
    target = tmp_path / "target"
    target.write_bytes(_header())
    link.symlink_to(target)
    for path, what in ((fifo, "not a regular file"), (tmp_path, "not a regular file"), (link, "symlink"),
                       (Path("/dev/null"), "not a regular file")):
        with pytest.raises(errors.InputError, match=what):
            Journal.open(path, RUN, UNITS)
        with pytest.raises(errors.InputError):
            header(path)
        assert not is_journal(path)
    assert Path("/dev/null").exists() and target.read_bytes() == _header()


def test_result_lines_are_bounded_in_size_nesting_and_count(tmp_path: Path) -> None:
    path = tmp_path / "j.journal"
    head = _header()
    cases = {
        b'{"unit": "a", "result": {"x": "' + b"y" * MAX_RESULT_LINE + b'"}}\n': "over 4194304 bytes",
        b'{"unit": "a", "result": {"x": ' + b"[" * 200_000 + b"]" * 200_000 + b"}}\n": "nested deeper than 64",
        b'{"unit": "a", "result": {}}\n' * 3: "more judged units than this run has",
        b'{"unit": "a", "result": {"x": ' + b"9" * 5000 + b"}}\n": "invalid journal line",
    }
    for lines, message in cases.items():
        path.write_bytes(head + lines)
        with pytest.raises(errors.InputError, match=message):
            Journal.open(path, RUN, UNITS)
        assert path.read_bytes() == head + lines  # refused: nothing cut


def test_a_user_file_given_as_journal_survives_the_command(tmp_path: Path) -> None:
    """`audit recompute --journal FILE` on a file that is not a journal: refused with one line, exit 2, before any
    model loads, and the file is still there with its bytes."""
    notes = tmp_path / "notes.txt"
    notes.write_bytes(b"the only copy of my notes")
    script = ("from kvgraft.inference import models\n"
              "def load(*a, **k): raise SystemExit('models.load was called')\n"
              "models.load = load\n"
              "from kvgraft.cli import entrypoint; entrypoint()")
    release = tmp_path / "rel"
    from release_factory import make_release

    make_release(release, entries=1, seed=1)
    limit = 2 * 2**30
    r = subprocess.run([sys.executable, "-c", script, "audit", "recompute", str(release), "--model", "x",
                        "--journal", str(notes), "--quiet"], capture_output=True, text=True, timeout=120,
                       preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (limit, limit)))
    assert notes.read_bytes() == b"the only copy of my notes"
    assert r.returncode == errors.EXIT_INPUT, r.stderr[-2000:]
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and str(notes) in lines[0] and "not a kvgraft journal" in lines[0], r.stderr


@pytest.mark.parametrize(("size", "message"), [(8 * 2**30, "a first line over"), (100 * 2**20, "a first line over"),
                                               (40 * 2**20, "no complete first line")])
def test_a_file_without_a_first_line_costs_no_memory(tmp_path: Path, size: int, message: str) -> None:
    """A file with no newline (sparse: its size is claimed, not stored) is refused holding at most a chunk of it."""
    import tracemalloc

    path = tmp_path / "huge.journal"
    with open(path, "wb") as fh:
        fh.write(b'{"kind": "kvgraft-journal"')
        fh.truncate(size)
    tracemalloc.start()
    try:
        with pytest.raises(errors.InputError, match=message):
            Journal.open(path, RUN, UNITS)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * 2**20, peak
    assert path.stat().st_size == size
