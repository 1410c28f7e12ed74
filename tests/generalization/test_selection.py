from __future__ import annotations

import numpy as np
import pytest

from kvgraft.errors import InputError
from kvgraft.generalization.problems import synthetic
from kvgraft.generalization.selection import Index, build_index, select, tokenize

LIB = [
    ("ducks", "Janet's ducks lay 16 eggs per day and she sells the eggs at the market."),
    ("train", "A train travels 60 km per hour for 3 hours. How far does the train go?"),
    ("apples", "Mia has 12 apples. She gives 5 apples to Sam. How many apples are left?"),
    ("ducks-copy", "JANET'S ducks  lay 16 eggs per day and she sells the eggs at the market."),
]


def test_tokenize() -> None:
    assert tokenize("Janet’s DUCKS lay 16-eggs!") == ["janet", "s", "ducks", "lay", "16", "eggs"]


def test_none_and_exact() -> None:
    index = build_index(LIB)
    assert len(index) == 4
    s = index.select("anything", "none")
    assert s.id is None and s.score is None and s.policy == "none"
    q = "janet's ducks lay 16 eggs per day and she sells the eggs at the market."
    s = index.select(q, "exact")
    assert s.id == "ducks" and s.score == 1.0
    s = index.select(q, "exact", exclude="ducks")
    assert s.id == "ducks-copy" and s.excluded == ("ducks",) and s.candidates == 3
    s = index.select("Janet's ducks lay 17 eggs per day", "exact")
    assert s.id is None and s.score == 0.0


def test_nearest_tfidf_matches_a_dense_reference() -> None:
    index = Index(LIB)
    q = "How far does a car go at 50 km per hour for 2 hours?"
    s = select(index, q, "nearest")
    assert s.id == "train" and 0.0 < s.score < 1.0  # type: ignore[operator]
    # dense recomputation of the same TF-IDF definition
    docs = [tokenize(t) for _, t in LIB]
    vocab = sorted({w for d in docs for w in d})
    tf = np.array([[d.count(w) for w in vocab] for d in docs], dtype=float)
    idf = np.log((1 + len(docs)) / (1 + (tf > 0).sum(axis=0))) + 1
    x = tf * idf
    x /= np.linalg.norm(x, axis=1, keepdims=True)
    qv = np.array([tokenize(q).count(w) for w in vocab], dtype=float) * idf
    qv /= np.linalg.norm(qv)
    np.testing.assert_allclose(index.scores(q, "nearest"), x @ qv, atol=1e-12)
    assert s.score == pytest.approx(float((x @ qv).max()))
    assert s.runner_up_id is not None and s.runner_up_score is not None and s.runner_up_score <= s.score  # type: ignore[operator]


def test_nearest_other_entry_and_self() -> None:
    index = Index(LIB)
    own = LIB[0][1]
    assert index.select(own, "nearest").score == pytest.approx(1.0)
    other = index.select(own, "nearest", exclude="ducks")
    assert other.id == "ducks-copy"
    both = index.select(own, "nearest", exclude={"ducks", "ducks-copy"})
    assert both.id not in {"ducks", "ducks-copy"} and both.excluded == ("ducks", "ducks-copy")


def test_no_shared_terms_selects_nothing() -> None:
    index = Index(LIB)
    for policy in ("nearest", "bm25"):
        s = index.select("zebra quantum", policy)
        assert s.id is None and s.score == 0.0
    everything = index.select(LIB[1][1], "nearest", exclude=[i for i, _ in LIB])
    assert everything.id is None and everything.candidates == 0


def test_bm25_ranks_relevant_first() -> None:
    index = Index(LIB)
    s = index.select("apples given to Sam", "bm25")
    assert s.id == "apples" and s.score is not None and s.score > 0
    scores = index.scores("apples given to Sam", "bm25")
    assert scores[2] == scores.max() and scores[1] == 0.0


def test_synthetic_library_self_retrieval() -> None:
    probs = synthetic(40, seed=5)
    index = Index([(p.id, p.problem) for p in probs])
    for p in probs[:10]:
        assert index.select(p.problem, "exact").id == p.id
        assert index.select(p.problem, "nearest").id == p.id
        assert index.select(p.problem, "nearest", exclude=p.id).id != p.id


def test_bad_input() -> None:
    with pytest.raises(InputError, match="more than once"):
        Index([("a", "x"), ("a", "y")])
    with pytest.raises(InputError, match="pair"):
        Index([("a", 1)])  # type: ignore[list-item]
    with pytest.raises(InputError, match="policy"):
        Index(LIB).select("q", "random")
    empty = Index([])
    assert empty.select("anything", "nearest").id is None
