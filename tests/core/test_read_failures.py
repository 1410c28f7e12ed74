"""A read the system fails (EIO) is exit 7 with the errno's name, like a refused write; a read the input
forbids (no permission) stays exit 2. Found by the open-injection campaign (docs/reliability.md): an EIO
while `sign` listed the release's folders was exit 2, "cannot list: Input/output error"."""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from kvgraft.cli import app
from kvgraft.errors import EXIT_INPUT, EXIT_IO
from kvgraft.release import integrity

from release_factory import make_release

runner = CliRunner()


@pytest.mark.parametrize(("code", "exit_code", "tail"), [
    (errno.EIO, EXIT_IO, "cannot list: Input/output error (EIO)"),
    (errno.EACCES, EXIT_INPUT, "cannot list: Permission denied"),  # the control: the input, not the system
])
def test_a_failed_listing_names_the_folder_and_the_cause(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                         code: int, exit_code: int, tail: str) -> None:
    rel = tmp_path / "rel"
    make_release(rel, entries=2, seed=3)
    real = os.scandir

    def scandir(path: Any) -> Any:
        if Path(path) == rel / "entries":
            raise OSError(code, os.strerror(code), str(path))
        return real(path)

    monkeypatch.setattr(integrity.os, "scandir", scandir)
    r = runner.invoke(app, ["verify", str(rel)])
    assert r.exit_code == exit_code, r.output
    assert r.output.strip().splitlines() == [f"kvgraft: error: {rel / 'entries'}: {tail}"]
