"""Which library entry to graft for a query: none, an exact problem match, or the nearest by text.

- `none`: graft nothing (the baseline arm).
- `exact`: the entry whose text has the same `problems.problem_hash` as the query (score 1.0).
- `nearest`: the highest TF-IDF cosine similarity (score in [0, 1]).
- `bm25`: the highest Okapi BM25 score (unbounded; comparable only within one query).

TF-IDF and BM25 are computed here with numpy / scipy.sparse. Tokens are lowercase runs of letters
and digits. Ties go to the entry given first. `exclude` removes ids from consideration, e.g. the
query's own entry to find the nearest OTHER one. A query that shares no term with any entry gets no
selection (id None) rather than an arbitrary pick.
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections import Counter
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from typing import Any, Literal, TypedDict

import numpy as np
import scipy.sparse as sp

from kvgraft.errors import InputError
from kvgraft.generalization.problems import problem_hash

Policy = Literal["none", "exact", "nearest", "bm25"]
POLICIES: tuple[str, ...] = ("none", "exact", "nearest", "bm25")
BM25_K1 = 1.5
BM25_B = 0.75

_TOKEN = re.compile(r"[^\W_]+")


def tokenize(text: str) -> list[str]:
    return _TOKEN.findall(unicodedata.normalize("NFKC", text).casefold())


class SelectionRecord(TypedDict):
    """`Selection.as_dict`."""

    policy: str
    id: str | None
    score: float | None
    runner_up_id: str | None
    runner_up_score: float | None
    excluded: list[str]
    candidates: int


@dataclass(frozen=True)
class Selection:
    policy: str
    id: str | None  # None: nothing grafted (policy none, no exact match, or nothing similar)
    score: float | None  # None for policy none; 1.0 for an exact match; similarity otherwise
    runner_up_id: str | None  # the second best (nearest / bm25): how close the choice was
    runner_up_score: float | None
    excluded: tuple[str, ...]
    candidates: int  # entries left after exclusion

    def as_dict(self) -> SelectionRecord:
        return SelectionRecord(policy=self.policy, id=self.id, score=self.score, runner_up_id=self.runner_up_id,
                               runner_up_score=self.runner_up_score, excluded=list(self.excluded),
                               candidates=self.candidates)


class Index:
    """A library of (id, text) entries ready for `select`."""

    def __init__(self, entries: Iterable[tuple[str, str]]) -> None:
        self.ids: list[str] = []
        texts: list[str] = []
        for i, item in enumerate(entries):
            if not (isinstance(item, tuple) and len(item) == 2 and all(isinstance(x, str) for x in item)):
                raise InputError(f"library entry {i}: expected an (id, text) pair of strings")
            eid, text = item
            texts.append(text)
            self.ids.append(eid)
        if len(set(self.ids)) != len(self.ids):
            dup = next(x for x, c in Counter(self.ids).items() if c > 1)
            raise InputError(f"library entry id {dup!r} occurs more than once")
        self._position = {eid: i for i, eid in enumerate(self.ids)}
        self._hashes: dict[str, list[int]] = {}
        for i, text in enumerate(texts):
            self._hashes.setdefault(problem_hash(text), []).append(i)
        self._build(texts)

    def __len__(self) -> int:
        return len(self.ids)

    def _build(self, texts: list[str]) -> None:
        self.vocab: dict[str, int] = {}
        rows: list[int] = []
        cols: list[int] = []
        vals: list[float] = []
        for r, text in enumerate(texts):
            for term, count in Counter(tokenize(text)).items():
                rows.append(r)
                cols.append(self.vocab.setdefault(term, len(self.vocab)))
                vals.append(float(count))
        n_docs, n_terms = len(texts), len(self.vocab)
        tf = sp.csr_matrix((vals, (rows, cols)), shape=(n_docs, n_terms), dtype=np.float64)
        df = np.bincount(np.asarray(cols, dtype=np.int64), minlength=n_terms).astype(np.float64)
        # smoothed idf as in the common TF-IDF definition: ln((1 + N) / (1 + df)) + 1
        self.idf = np.log((1.0 + n_docs) / (1.0 + df)) + 1.0
        weighted = sp.csr_matrix(tf.multiply(self.idf[np.newaxis, :]))
        norms = np.sqrt(np.asarray(weighted.multiply(weighted).sum(axis=1)).ravel())
        norms[norms == 0] = 1.0
        self.tfidf = sp.csr_matrix(sp.diags(1.0 / norms) @ weighted)
        # BM25 document weights: idf * tf * (k1 + 1) / (tf + k1 * (1 - b + b * len / avglen))
        lengths = np.asarray(tf.sum(axis=1)).ravel()
        avg = float(lengths.mean()) if n_docs else 1.0
        avg = avg if avg > 0 else 1.0
        bm_idf = np.log(1.0 + (n_docs - df + 0.5) / (df + 0.5))
        coo = tf.tocoo()
        denom = coo.data + BM25_K1 * (1.0 - BM25_B + BM25_B * lengths[coo.row] / avg)
        data = bm_idf[coo.col] * coo.data * (BM25_K1 + 1.0) / denom
        self.bm25 = sp.csr_matrix((data, (coo.row, coo.col)), shape=(n_docs, n_terms))

    def _query_vector(self, text: str, *, binary: bool) -> sp.csr_matrix:
        counts = Counter(t for t in tokenize(text) if t in self.vocab)
        cols = [self.vocab[t] for t in counts]
        vals = np.asarray([1.0 if binary else float(counts[t]) for t in counts], dtype=np.float64)
        if not binary and cols:
            vals = vals * self.idf[cols]
            vals = vals / max(float(np.sqrt((vals * vals).sum())), 1e-300)
        return sp.csr_matrix((vals, ([0] * len(cols), cols)), shape=(1, len(self.vocab)))

    def scores(self, query_text: str, policy: Literal["nearest", "bm25"] = "nearest") -> np.ndarray[Any, np.dtype[np.float64]]:
        """Similarity of the query to every entry, in entry order."""
        if policy == "nearest":
            q = self._query_vector(query_text, binary=False)
            return np.asarray((self.tfidf @ q.T).toarray(), dtype=np.float64).ravel()
        if policy == "bm25":
            q = self._query_vector(query_text, binary=True)
            return np.asarray((self.bm25 @ q.T).toarray(), dtype=np.float64).ravel()
        raise InputError(f"no similarity scores for policy {policy!r}")

    def select(self, query_text: str, policy: Policy | str, *, exclude: str | Collection[str] | None = None) -> Selection:
        """The entry to graft for `query_text` under `policy`, with its score recorded."""
        if policy not in POLICIES:
            raise InputError(f"unknown selection policy {policy!r}; expected one of {', '.join(POLICIES)}")
        excluded = (exclude,) if isinstance(exclude, str) else tuple(sorted(exclude or ()))
        mask = np.ones(len(self.ids), dtype=bool)
        for eid in excluded:
            if eid in self._position:
                mask[self._position[eid]] = False
        candidates = int(mask.sum())

        def result(eid: str | None, score: float | None, rid: str | None = None, rscore: float | None = None) -> Selection:
            return Selection(str(policy), eid, score, rid, rscore, excluded, candidates)

        if policy == "none":
            return result(None, None)
        if policy == "exact":
            hits = [i for i in self._hashes.get(problem_hash(query_text), []) if mask[i]]
            return result(self.ids[hits[0]], 1.0) if hits else result(None, 0.0)
        scores = self.scores(query_text, "bm25" if policy == "bm25" else "nearest")
        scores = np.where(mask, scores, -np.inf)
        if candidates == 0:
            return result(None, 0.0)
        order = np.argsort(-scores, kind="stable")
        best = int(order[0])
        top = min(float(scores[best]), 1.0) if policy == "nearest" else float(scores[best])
        if not top > 0.0:
            return result(None, 0.0)
        second = int(order[1]) if candidates > 1 else None
        if second is None or not math.isfinite(float(scores[second])):
            return result(self.ids[best], top)
        return result(self.ids[best], top, self.ids[second], float(scores[second]))


def build_index(entries: Iterable[tuple[str, str]]) -> Index:
    return Index(entries)


def select(index: Index, query_text: str, policy: Policy | str, *, exclude: str | Collection[str] | None = None) -> Selection:
    """Module-level form of `Index.select`."""
    return index.select(query_text, policy, exclude=exclude)
