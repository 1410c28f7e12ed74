"""The audit journal (kvgraft.execution.journal): judged units read back once each, a torn tail dropped, another run refused."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from kvgraft import errors
from kvgraft.execution.journal import Journal, header

RUN = {"release_root_digest": "ab" * 32, "entries": ["a", "b", "c"], "schedule": {"chunk_tokens": None}}


def test_units_are_read_back_once_and_a_torn_tail_is_dropped(tmp_path: Path) -> None:
    path = tmp_path / "j.journal"
    j = Journal.open(path, RUN, {"a", "b", "c"})
    assert j.done == {} and header(path) == RUN
    j.record("a", {"kl": math.inf, "v": 1})  # a non-finite float reads back
    j.record("a", {"v": 2})  # a late duplicate: the first one is kept
    j.close()
    with path.open("ab") as fh:
        fh.write(b'{"unit": "b", "res')  # killed mid-write
    j = Journal.open(path, RUN, {"a", "b", "c"})
    assert j.done == {"a": {"kl": math.inf, "v": 1}}
    j.record("b", {"v": 3})  # appended after the cut, not after the torn bytes
    j.close()
    assert Journal.open(path, RUN, {"a", "b", "c"}).done == {"a": {"kl": math.inf, "v": 1}, "b": {"v": 3}}


def test_a_journal_of_another_run_or_unit_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "j.journal"
    Journal.open(path, RUN, {"a", "b", "c"}).record("c", {"v": 1})
    with pytest.raises(errors.InputError, match=r"another run \(run\.schedule\.chunk_tokens differs\)"):
        Journal.open(path, {**RUN, "schedule": {"chunk_tokens": 4}}, {"a", "b", "c"})
    with pytest.raises(errors.InputError, match=r"j\.journal:2: not a judged unit of this run"):
        Journal.open(path, RUN, {"a", "b"})  # "c" is no unit of this run
    path.write_bytes(path.read_bytes() + b"not json\n")
    with pytest.raises(errors.InputError, match=r"j\.journal:3: invalid journal line"):
        Journal.open(path, RUN, {"a", "b", "c"})
    (tmp_path / "other").write_text('{"kind": "something"}\n')
    with pytest.raises(errors.InputError, match="not a kvgraft journal"):
        Journal.open(tmp_path / "other", RUN, {"a"})


def test_a_list_unit_reads_back_as_the_tuple_recorded_and_never_as_an_entry_id(tmp_path: Path) -> None:
    """A unit judged after the entries (a prefix graft: ["prefix", 16, ID]) is written as a JSON list and read
    back as the tuple, apart from the entry whose id is its text; a list of anything but strings and integers
    is no unit."""
    path = tmp_path / "j.journal"
    graft = ("prefix", 16, "a")
    units = {"a", graft, '["prefix", 16, "a"]'}
    j = Journal.open(path, RUN, units)
    j.record(graft, {"v": 1})
    j.record("a", {"v": 2})
    j.close()
    assert Journal.open(path, RUN, units).done == {graft: {"v": 1}, "a": {"v": 2}}
    for odd in (b'["prefix", 16.0, "a"]', b'["prefix", true, "a"]', b'[["prefix"], 16, "a"]', b'{"u": 1}',
                b'["prefix", 16, "a", null]'):
        path.write_bytes(path.read_bytes().splitlines(keepends=True)[0] + b'{"unit": ' + odd + b', "result": {}}\n')
        with pytest.raises(errors.InputError, match=r"j\.journal:2: not a judged unit of this run"):
            Journal.open(path, RUN, units)  # 16.0 == 16 in Python: only the type rule refuses it


# A journal as kvgraft has always written it (header, then one line per judged unit), byte for byte: an audit
# interrupted under an earlier kvgraft resumes from it, and lines appended now are written the same way.
WRITTEN = (b'{"kind": "kvgraft-journal", "version": 1, "run": {"release_root_digest": "' + b"ab" * 32
           + b'", "entries": ["a", "b", "c"], "schedule": {"chunk_tokens": null}}}\n'
           b'{"unit": "a", "result": {"kl": Infinity, "v": 1, "placement": {"worker": 0, "attempt": 1}}}\n'
           b'{"unit": ["prefix", 16, "b"], "result": {"v": 2}}\n')


def test_a_journal_written_earlier_resumes_and_grows_the_same_way(tmp_path: Path) -> None:
    path = tmp_path / "j.journal"
    path.write_bytes(WRITTEN)
    units = {"a", "b", "c", ("prefix", 16, "b"), ("prefix", 16, "c")}
    j = Journal.open(path, RUN, units)
    assert j.resumed and header(path) == RUN
    assert j.done == {"a": {"kl": math.inf, "v": 1, "placement": {"worker": 0, "attempt": 1}},
                      ("prefix", 16, "b"): {"v": 2}}
    j.record("c", {"v": 3, "shape": (1, 2)})
    j.record(("prefix", 16, "c"), {"v": 4})
    j.close()
    assert path.read_bytes() == WRITTEN + b'{"unit": "c", "result": {"v": 3, "shape": [1, 2]}}\n' \
        b'{"unit": ["prefix", 16, "c"], "result": {"v": 4}}\n'
    fresh = tmp_path / "new.journal"
    Journal.open(fresh, RUN, units).close()
    assert fresh.read_bytes() == WRITTEN.split(b"\n")[0] + b"\n"  # a new journal's header is the same bytes
