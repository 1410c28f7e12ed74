"""Every value of a plan is checked before anything it names is read or any model loads: nesting, integers and
numbers (bounded, finite), the output folder (not empty, not a pseudo file system, not the audited release) and
the files it names. Each refusal is one line, exit 2, no traceback; the model loader is never reached."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kvgraft.audit import plan
from kvgraft.errors import EXIT_INPUT, InputError

from release_factory import make_release

# The CLI in a child process whose model loader refuses (reaching it means a value was not checked first) and
# whose address space is bounded: a blow-up is a failed test, not a dead machine.
CHILD = ("from kvgraft.inference import models\n"
         "def load(*a, **k): raise SystemExit('models.load was called')\n"
         "models.load = load\n"
         "from kvgraft.cli import entrypoint; entrypoint()")
MEMORY = 2 * 2**30


def _plan(folder: Path, body: str, *, head: str = "") -> Path:
    path = folder / "plan.toml"
    path.write_text(f'format = "kvgraft-audit-plan"\nformat_version = 1\nname = "p"\n{head}\n'
                    f'[model]\nspec = "synthetic/none"\n[release]\npath = "rel"\n{body}\n')
    return path


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("plans")
    make_release(folder / "rel", entries=1, seed=4)
    return folder


def _run(path: Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", CHILD, "audit", "run", str(path), "--quiet"], capture_output=True,
                          text=True, timeout=60, cwd=cwd,
                          preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_AS, (MEMORY, MEMORY)))


BAD: dict[str, tuple[str, str, str]] = {  # name: (head, body, what the one line says)
    "deep array": ("", "[checks.verify]\n[checks.claims]\nfile = " + "[" * 100_000 + "]" * 100_000,
                   "nested deeper than 64"),
    "deep inline table": ("", "[executor]\nx = " + "{a = " * 5_000 + "1" + "}" * 5_000, "nested deeper than 64"),
    "deep table headers": ("", "[executor." + ".".join(["a"] * 5_000) + "]\nx = 1", "nested deeper than 64"),
    "prefix 10^18": ("", "[checks.recompute]\nprefix = 1000000000000000000",
                     "checks.recompute.prefix: 1000000000000000000 is beyond the integers"),
    "executor 10^18": ("", "[executor]\nthreads = -1000000000000000000", "executor.threads"),
    "length 10^12": ("", "[checks.determinism]\nlength = 1000000000000", "checks.determinism.length"),
    "max_minutes nan": ("", "[checks.verify]\n[limits]\nmax_minutes = nan", "limits.max_minutes: nan is not a finite"),
    "temperature inf": ("", "[checks.generalization]\ntemperature = inf", "inf is not a finite number"),
    "preamble too long": ("", "[checks.generalization]\npreamble = \"" + "x" * 16_385 + "\"",
                          "checks.generalization.preamble"),
    "a date": ("", "[executor]\nwhen = 1979-05-27", "a TOML date value"),
    "out empty": ('out = ""', "[checks.verify]", "$.out: '' should be non-empty"),
    "out /proc": ('out = "/proc/sys/x"', "[checks.verify]", "a pseudo file system"),
    "out /dev": ('out = "/dev/shm-nope/x"', "[checks.verify]", "a pseudo file system"),
    "out the release": ('out = "rel"', "[checks.verify]", "the audited release"),
    "out inside the release": ('out = "rel/reports"', "[checks.verify]", "the audited release"),
    "key /dev/zero": ("", '[checks.verify]\n[signing]\nkey = "/dev/zero"', "signing.key names no regular file"),
    "key missing": ("", '[checks.verify]\n[signing]\nkey = "nothing.pem"', "signing.key names nothing"),
    "key not a key": ("", '[checks.verify]\n[signing]\nkey = "rel/manifest.json"', "not a PEM private key"),
    "claims missing": ("", "[checks.claims]\nfile = \"nothing.toml\"", "checks.claims.file names nothing"),
    "release missing": ("", "", ""),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_a_bad_plan_value_is_refused_before_any_model_loads(folder: Path, tmp_path: Path, case: str) -> None:
    head, body, message = BAD[case]
    if case == "release missing":
        path = tmp_path / "plan.toml"
        path.write_text('format = "kvgraft-audit-plan"\nformat_version = 1\nname = "p"\n[model]\nspec = "x"\n'
                        '[release]\npath = "no-such-release"\n[checks.verify]\n')
        message = "does not exist (the plan's release)"
    else:
        path = _plan(folder, body, head=head)
    before = sorted(os.listdir(folder / "rel"))
    t0 = time.perf_counter()
    r = _run(path, cwd=folder)
    assert r.returncode == EXIT_INPUT, (r.returncode, r.stderr[-3000:])
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("kvgraft: error: ") and message in lines[0], r.stderr[-3000:]
    assert time.perf_counter() - t0 < 20
    assert sorted(os.listdir(folder / "rel")) == before  # nothing written into the release


def test_a_plan_within_the_bounds_loads(folder: Path) -> None:
    path = _plan(folder, "[checks.recompute]\nprefix = 131072\n[checks.determinism]\nlength = 131072\n"
                         "[limits]\nmax_minutes = 1e7\n[executor]\nthreads = 9007199254740991")
    doc = plan.load(path).doc
    assert doc["checks"]["recompute"]["prefix"] == 131072 and doc["limits"]["max_minutes"] == 1e7
    for bad in ("[checks.recompute]\nprefix = 131073", "[checks.determinism]\nlength = 131073",
                "[executor]\nthreads = 9007199254740992", "[limits]\nmax_minutes = 10000001"):
        with pytest.raises(InputError):
            plan.load(_plan(folder, bad))


def test_a_plan_whose_model_does_not_load_leaves_no_output_folder(folder: Path) -> None:
    path = _plan(folder, "[checks.verify]", head='out = "fresh-out"')
    r = _run(path, cwd=folder)
    assert "models.load was called" in r.stderr  # every value passed: the model was the first thing to fail
    assert not (folder / "fresh-out").exists()
