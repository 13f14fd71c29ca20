from __future__ import annotations

import sqlite3

import pytest

from ragrl.errors import RagrlError
from ragrl.retrieval import CachedRetriever

QUERIES = ["capital of Germany", "highest mountain", "the of and", "capital of Germany"]


def test_record_then_replay_without_index(toy_bm25, tmp_path):
    db = tmp_path / "cache.sqlite"
    want = toy_bm25.search(QUERIES, k=3)
    with CachedRetriever(toy_bm25, db, "record") as rec:
        assert rec.search(QUERIES, k=3) == want
    # replay with no inner retriever at all: fingerprint taken from the store
    with CachedRetriever(None, db, "replay") as rep:
        got = rep.search(QUERIES, k=3)
        assert got == want  # passages (id, title, text) and float scores round-trip exactly
        assert rep.fingerprint == toy_bm25.fingerprint
        with pytest.raises(RagrlError, match=r"replay miss: query 'never asked' with k=3"):
            rep.search(["highest mountain", "never asked"], k=3)
        with pytest.raises(RagrlError, match="replay miss"):
            rep.search(["highest mountain"], k=2)  # k is part of the key


def test_readwrite_uses_cache(toy_bm25, tmp_path, counting_retriever):
    db = tmp_path / "c.sqlite"
    inner = counting_retriever(toy_bm25)
    cached = CachedRetriever(inner, db)
    first = cached.search(QUERIES, k=2)
    assert inner.calls == [["capital of Germany", "highest mountain", "the of and"]]  # deduplicated
    second = cached.search(QUERIES + ["Seine"], k=2)
    assert inner.calls[-1] == ["Seine"]
    assert second[:4] == first
    assert cached.queries_from_cache == 5 and cached.queries_searched == 4  # a repeat counts as cached
    cached.close()


def test_record_overwrites_and_off_bypasses(toy_bm25, tmp_path, counting_retriever):
    db = tmp_path / "c.sqlite"
    inner = counting_retriever(toy_bm25)
    CachedRetriever(inner, db).search(["highest mountain"], k=2)
    CachedRetriever(inner, db, "record").search(["highest mountain"], k=2)
    assert len(inner.calls) == 2
    off = CachedRetriever(inner, tmp_path / "unused.sqlite", "off")
    off.search(["highest mountain"], k=2)
    assert len(inner.calls) == 3 and not (tmp_path / "unused.sqlite").exists()
    rows = sqlite3.connect(db).execute("SELECT COUNT(*) FROM hits").fetchone()[0]
    assert rows == 1


def test_fingerprint_separates_retrievers(toy_bm25, tmp_path):
    from ragrl.retrieval import BM25Retriever

    other = BM25Retriever.build(toy_bm25.passages, k1=0.9, b=0.4)
    db = tmp_path / "c.sqlite"
    CachedRetriever(toy_bm25, db).search(["river"], k=2)
    CachedRetriever(other, db).search(["river"], k=2)
    with pytest.raises(RagrlError, match="several retrievers"):
        CachedRetriever(None, db, "replay")
    rep = CachedRetriever(None, db, "replay", fingerprint=other.fingerprint)
    assert rep.search(["river"], k=2) == other.search(["river"], k=2)


def test_bad_modes(toy_bm25, tmp_path):
    with pytest.raises(RagrlError, match="unknown cache mode"):
        CachedRetriever(toy_bm25, tmp_path / "c", "write")
    with pytest.raises(RagrlError, match="needs a retriever"):
        CachedRetriever(None, tmp_path / "c", "readwrite")
    with pytest.raises(RagrlError, match="does not exist"):
        CachedRetriever(None, tmp_path / "missing.sqlite", "replay")
    (tmp_path / "junk").write_text("not a database" * 100)
    with pytest.raises(RagrlError, match="not a usable retrieval cache"):
        CachedRetriever(toy_bm25, tmp_path / "junk")


def test_threads_share_one_cache(toy_bm25, tmp_path):
    from concurrent.futures import ThreadPoolExecutor

    cached = CachedRetriever(toy_bm25, tmp_path / "c.sqlite")
    queries = [f"capital {i}" for i in range(40)]
    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda q: cached.search([q], k=2)[0], queries))
    assert results == [toy_bm25.search([q], k=2)[0] for q in queries]
