"""The strict reader's fast paths against their references: the byte-level nesting depth against a walk
of the parsed tree (check_tree's), and the C-speed duplicate-key check against the per-pair loop."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from kvgraft._internal import jsonio
from kvgraft.errors import InputError

# Strings full of what the byte-level scan must skip: brackets, quotes, backslashes, escapes, non-ASCII.
_PIECES = ['[', ']', '{', '}', '"', '\\', '\\"', '\\\\', '"]', '[\\', 'é', '\u2028', '\U0001f600', 'a', ' ', '\n']


def _string(rng: random.Random) -> str:
    return "".join(rng.choice(_PIECES) for _ in range(rng.randrange(0, 6)))


def _tree(rng: random.Random, depth: int) -> Any:
    if depth <= 0 or rng.random() < 0.2:
        return rng.choice([_string(rng), rng.randrange(-5, 10**6), 1.5, True, None])
    if rng.random() < 0.5:
        return [_tree(rng, depth - 1) for _ in range(rng.randrange(0, 4))]
    return {_string(rng) + str(i): _tree(rng, depth - 1) for i in range(rng.randrange(0, 4))}


def _reference_depth(x: Any) -> int:
    if isinstance(x, dict):
        return 1 + max(map(_reference_depth, x.values()), default=0)
    if isinstance(x, list):
        return 1 + max(map(_reference_depth, x), default=0)
    return 0


@pytest.mark.parametrize("seed", range(4))
def test_nesting_depth_is_the_parsed_trees_depth(seed: int) -> None:
    rng = random.Random(seed)
    for _ in range(500):
        doc = _tree(rng, rng.randrange(0, 12))
        for text in (json.dumps(doc), json.dumps(doc, ensure_ascii=False, indent=rng.choice([None, 1]))):
            raw = text.encode()
            want = _reference_depth(doc)
            assert jsonio.nesting_depth(raw, limit=64) == want, text
            if want:
                assert jsonio.nesting_depth(raw, limit=want - 1) == want  # limit + 1: deeper than the limit


def test_the_depth_bound_holds_on_the_fast_path_and_on_the_reference() -> None:
    deep = '{"s": "[[[[", "t": ' + "[" * 65 + '"]]]"' + "]" * 65 + "}"
    with pytest.raises(InputError, match="nested deeper than 64"):
        jsonio.loads_strict(deep.encode(), "where")  # bytes without surrogate escapes: nesting_depth
    with pytest.raises(InputError, match="nested deeper than 64"):
        jsonio.loads_strict(deep, "where")  # text: check_tree
    shallow = '{"s": "' + "[" * 200 + '\\"' + "{" * 200 + '", "t": ' + "[" * 63 + "1" + "]" * 63 + "}"
    assert jsonio.loads_strict(shallow.encode(), "where") is not None  # brackets inside a string are text
    assert jsonio.loads_strict(shallow, "where") is not None


@pytest.mark.parametrize(("text", "key"), [('{"a": 1, "b": 2, "a": 3}', "a"),
                                           ('{"x": [{"k": 1, "j": 2, "k": 2}]}', "k"),
                                           ('{"\\u00e9": 1, "é": 2}', "é")])
def test_duplicate_keys_are_named(text: str, key: str) -> None:
    with pytest.raises(InputError, match=f"duplicate key '{key}'"):
        jsonio.loads_strict(text.encode(), "where")
