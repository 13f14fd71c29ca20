from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval import BM25Retriever, Hit, Retriever, load_retriever
from ragrl.retrieval.base import MANIFEST_NAME, corpus_hash


def test_known_best_hit(toy_bm25):
    hits = toy_bm25.search(["Who created the Python programming language?"], k=3)[0]
    assert hits[0].passage.title == "Python (programming language)"
    assert isinstance(hits[0], Hit) and hits[0].id == hits[0].passage.id
    assert all(a.score >= b.score for a, b in zip(hits, hits[1:], strict=False))
    assert isinstance(toy_bm25, Retriever)


def test_batch_matches_single_queries(toy_bm25):
    queries = ["capital of Germany", "highest mountain", "coral reef Australia"]
    batch = toy_bm25.search(queries, k=2)
    assert [h[0].passage.title for h in batch] == ["Berlin", "Mount Everest", "Great Barrier Reef"]
    for q, hits in zip(queries, batch, strict=True):
        assert toy_bm25.search([q], k=2)[0] == hits


def test_stemming_matches_inflections(toy_bm25):
    # "mountains" only matches "mountain" through the stemmer
    assert toy_bm25.search(["mountains"], k=1)[0][0].passage.title == "Mount Everest"
    plain = BM25Retriever.build(toy_bm25.passages, stemmer=False)
    assert plain.search(["mountains"], k=1) == [[]]
    assert plain.fingerprint != toy_bm25.fingerprint


def test_zero_score_rule(toy_bm25):
    # stopwords only, unknown words only, empty: bm25s would return arbitrary zero-score passages
    out = toy_bm25.search(["the of and is", "zzyzx qwertyuiop", ""], k=3)
    assert out == [[], [], []]
    # one known word in a single passage: exactly one hit although k=5
    hits = toy_bm25.search(["Seine"], k=5)[0]
    assert [h.passage.title for h in hits] == ["Paris"]
    assert all(h.score > 0 for h in hits)


def test_k_larger_than_corpus_and_invalid_k(toy_bm25, toy_passages):
    hits = toy_bm25.search(["largest city river world capital"], k=100)[0]
    assert 0 < len(hits) <= len(toy_passages)
    assert toy_bm25.search([], k=3) == []
    with pytest.raises(RagrlError, match="k must be a positive integer"):
        toy_bm25.search(["x"], k=0)


def test_save_load_identical(toy_bm25, tmp_path):
    toy_bm25.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / MANIFEST_NAME).read_text())
    assert manifest["type"] == "bm25" and manifest["params"]["method"] == "lucene"
    assert manifest["corpus_hash"] == corpus_hash(toy_bm25.passages)
    loaded = load_retriever(tmp_path / "idx")
    assert isinstance(loaded, BM25Retriever)
    assert loaded.fingerprint == toy_bm25.fingerprint
    queries = ["capital city", "programming language 1991", "river", "the"]
    assert loaded.search(queries, k=4) == toy_bm25.search(queries, k=4)


def test_corpus_hash_order_independent(toy_passages):
    assert corpus_hash(toy_passages) == corpus_hash(list(reversed(toy_passages)))
    changed = [*toy_passages[:-1], Passage.make("Amazon River", "changed")]
    assert corpus_hash(changed) != corpus_hash(toy_passages)


def test_bad_params():
    with pytest.raises(RagrlError, match="unknown BM25 method"):
        BM25Retriever.build([Passage.make("a", "b c")], method="okapi")
    with pytest.raises(RagrlError, match="empty corpus"):
        BM25Retriever.build([])


def test_bad_index_dirs(tmp_path, toy_bm25):
    with pytest.raises(RagrlError, match="does not exist"):
        load_retriever(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(RagrlError, match=r"empty.*retriever.json is missing"):
        load_retriever(tmp_path / "empty")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / MANIFEST_NAME).write_text("{not json")
    with pytest.raises(RagrlError, match="invalid JSON"):
        load_retriever(tmp_path / "bad")
    (tmp_path / "bad" / MANIFEST_NAME).write_text(
        json.dumps({"type": "splade", "params": {}, "corpus_hash": "x"})
    )
    with pytest.raises(RagrlError, match="unknown retriever type 'splade'"):
        load_retriever(tmp_path / "bad")
    toy_bm25.save(tmp_path / "partial")
    (tmp_path / "partial" / "corpus.jsonl").unlink()
    with pytest.raises(RagrlError, match=r"partial: incomplete index, missing corpus.jsonl"):
        load_retriever(tmp_path / "partial")


def test_real_corpus_title_query_first(hippo_bm25, hippo_passages):
    assert len(hippo_passages) == 6119
    # a query made of a passage title's exact words retrieves that passage first
    by_title = {p.title: p for p in hippo_passages}
    titles = ["Teutberga", "Theodred II (Bishop of Elmham)"]
    hits = hippo_bm25.search(titles, k=5)
    for title, row in zip(titles, hits, strict=True):
        assert row[0].passage == by_title[title]


def test_real_corpus_question(hippo_bm25):
    hits = hippo_bm25.search(["Who was the queen of Lotharingia by marriage to Lothair II?"], k=5)[0]
    assert hits[0].passage.title == "Teutberga"
    assert len(hits) == 5


def test_threads_and_ties_deterministic(hippo_passages):
    queries = [f"film director born {y}" for y in range(1900, 1990)] + ["Lothair", "the"]
    single = BM25Retriever.build(hippo_passages[:2000])
    threaded = BM25Retriever.build(hippo_passages[:2000], n_threads=2)
    assert threaded.search(queries, k=7) == single.search(queries, k=7)
    # equal scores come in corpus order
    twins = [Passage.make(f"t{i}", "identical words here") for i in range(4)]
    hits = BM25Retriever.build([*twins, Passage.make("x", "other")]).search(["identical"], k=3)[0]
    assert [h.passage.title for h in hits] == ["t0", "t1", "t2"]


@pytest.mark.parametrize(("preset", "expected"), [(None, "cpu"), ("cuda", "cuda")])
def test_bm25_keeps_jax_off_the_gpu_unless_the_user_chose(preset, expected):
    # bm25s runs a JAX top-k on import when JAX is installed; on a GPU machine JAX's GPU client would
    # take 75% of the GPU's memory and the policy ran out of memory (seen on an H100 with ragrl sft).
    env = {k: v for k, v in os.environ.items() if k != "JAX_PLATFORMS"}
    if preset is not None:
        env["JAX_PLATFORMS"] = preset
    code = (
        "import os, sys, ragrl.cli; from ragrl.retrieval.bm25 import BM25Retriever; "
        "print('bm25s' in sys.modules); "
        "from ragrl.retrieval.bm25_build import load_bm25s; load_bm25s(); print(os.environ['JAX_PLATFORMS'])"
    )
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    # bm25s (and the numba it brings, which stops a vLLM CPU engine's spawned processes) is imported
    # when an index is built or loaded, not with ragrl's command line
    assert out.stdout.split() == ["False", expected]
