from __future__ import annotations

import json

import pytest

from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval import Hit, HybridRetriever, load_retriever, rrf_fuse
from ragrl.retrieval.base import MANIFEST_NAME, make_fingerprint


class FixedRetriever:
    """A scripted retriever: returns the given ranking for every query."""

    def __init__(self, ranking: list[Passage], name: str) -> None:
        self.ranking, self.name = ranking, name

    @property
    def fingerprint(self) -> str:
        return make_fingerprint("fixed", {"name": self.name}, "c")

    def search(self, queries, k):
        return [[Hit(p, 1.0 / (i + 1)) for i, p in enumerate(self.ranking[:k])] for _ in queries]

    def save(self, directory):
        raise NotImplementedError


P = [Passage(f"d{i}", f"t{i}", f"text {i}") for i in range(5)]


def test_rrf_values_by_hand():
    a = FixedRetriever([P[0], P[1], P[2]], "a")
    b = FixedRetriever([P[2], P[0], P[3]], "b")
    hybrid = HybridRetriever(a, b, rrf_k=60, depth=3)
    hits = hybrid.search(["q"], k=4)[0]
    # d0: 1/61 + 1/62 ; d2: 1/63 + 1/61 ; d1: 1/62 ; d3: 1/63
    expected = [("d0", 1 / 61 + 1 / 62), ("d2", 1 / 63 + 1 / 61), ("d1", 1 / 62), ("d3", 1 / 63)]
    assert [h.passage.id for h in hits] == [e[0] for e in expected]
    for h, (_, score) in zip(hits, expected, strict=True):
        assert h.score == pytest.approx(score, abs=1e-15)
    assert len(hybrid.search(["q"], k=2)[0]) == 2


def test_rrf_ties_broken_by_best_rank_then_id():
    # d1 is rank 1 in b, d0 rank 1 in a: equal scores, equal best rank -> id order
    fused = rrf_fuse([[Hit(P[0], 9.0), Hit(P[1], 8.0)], [Hit(P[1], 5.0), Hit(P[0], 4.0)]], k=2)
    assert [h.passage.id for h in fused] == ["d0", "d1"]
    assert fused[0].score == fused[1].score == pytest.approx(1 / 61 + 1 / 62)
    # d4 (rank 2 in a only) and d3 (rank 2 in b only) tie; best rank equal -> id order d3, d4
    fused = rrf_fuse([[Hit(P[0], 1), Hit(P[4], 1)], [Hit(P[0], 1), Hit(P[3], 1)]], k=3, rrf_k=1)
    assert [h.passage.id for h in fused] == ["d0", "d3", "d4"]
    assert fused[0].score == pytest.approx(1.0)  # 1/(1+1) twice
    # rrf_k=0: d4 = 1/1, d3 = 1/1, d0 = 1/2 + 1/2 = 1: a three-way tie on score; d3 and d4 have best
    # rank 1 (then id order), d0 only best rank 2, so it comes last although its id is smallest
    fused = rrf_fuse([[Hit(P[4], 1), Hit(P[0], 1)], [Hit(P[3], 1), Hit(P[0], 1)]], k=3, rrf_k=0)
    assert [h.passage.id for h in fused] == ["d3", "d4", "d0"]
    assert [h.score for h in fused] == [1.0, 1.0, 1.0]


def test_hybrid_depth_is_max_of_k_and_depth():
    seen = []

    class Spy(FixedRetriever):
        def search(self, queries, k):
            seen.append(k)
            return super().search(queries, k)

    HybridRetriever(Spy(P, "a"), Spy(P, "b"), depth=3).search(["q"], k=2)
    HybridRetriever(Spy(P, "a"), Spy(P, "b"), depth=3).search(["q"], k=5)
    assert seen == [3, 3, 5, 5]


def test_dense_paraphrase_and_cosine(minilm_dense):
    queries = [
        "what is the tallest peak on the planet",
        "which snake-named language did Guido write",
        "biggest coral system near Queensland",
    ]
    hits = minilm_dense.search(queries, k=3)
    assert [h[0].passage.title for h in hits] == [
        "Mount Everest",
        "Python (programming language)",
        "Great Barrier Reef",
    ]
    for row in hits:
        assert all(-1.0 - 1e-5 <= h.score <= 1.0 + 1e-5 for h in row)
        assert all(a.score >= b.score for a, b in zip(row, row[1:], strict=False))
    assert minilm_dense.params["dim"] == 384
    assert minilm_dense.params["query_prefix"] == ""


def test_dense_save_load_and_dim_mismatch(minilm_dense, tmp_path):
    faiss = pytest.importorskip("faiss")
    minilm_dense.save(tmp_path / "dense")
    loaded = load_retriever(tmp_path / "dense", device="cpu")
    assert loaded.fingerprint == minilm_dense.fingerprint
    q = ["mountain in the Himalayas", "German capital"]
    got, want = loaded.search(q, k=3), minilm_dense.search(q, k=3)
    assert [[h.passage for h in r] for r in got] == [[h.passage for h in r] for r in want]
    for r1, r2 in zip(got, want, strict=True):
        assert [h.score for h in r1] == pytest.approx([h.score for h in r2], abs=1e-5)
    # replace the index with one of another dimension: a clear error, not a bare assert
    index = faiss.IndexFlatIP(128)
    index.add(__import__("numpy").zeros((len(minilm_dense.passages), 128), dtype="float32"))
    faiss.write_index(index, str(tmp_path / "dense" / "faiss.index"))
    with pytest.raises(RagrlError, match=r"dimension mismatch.*384-dimensional.*128-dimensional"):
        load_retriever(tmp_path / "dense", device="cpu")


def test_dense_max_length_cuts_passages_and_queries_and_is_kept(minilm_dense, toy_passages, tmp_path):
    from ragrl.retrieval.dense import DenseRetriever

    short = DenseRetriever.build(toy_passages, device="cpu", show_progress=False, max_length=8)
    assert short.params["max_length"] == 8 and "max_length" not in minilm_dense.params
    assert short.fingerprint != minilm_dense.fingerprint  # other embeddings, another cache key
    tokenizer = minilm_dense.encoder.tokenizer
    long_text = next(p.contents for p in toy_passages if len(tokenizer(p.contents)["input_ids"]) > 12)
    cut = tokenizer.decode(tokenizer(long_text)["input_ids"][1:7])  # the 6 tokens that fit beside CLS/SEP
    (a, b) = short.encode_queries([long_text, cut])
    assert float(a @ b) == pytest.approx(1.0, abs=1e-4)  # only the first tokens count
    (full,) = minilm_dense.encode_queries([long_text])
    assert float(a @ full) < 0.999  # the whole text embeds otherwise
    short.save(tmp_path / "short")
    loaded = load_retriever(tmp_path / "short", device="cpu")
    assert loaded.encoder.max_seq_length == 8 and loaded.fingerprint == short.fingerprint
    with pytest.raises(RagrlError, match="max_length must be >= 1"):
        DenseRetriever.build(toy_passages, device="cpu", show_progress=False, max_length=0)
    with pytest.raises(RagrlError, match="max_length 1024 is more than the encoder's 512 positions"):
        DenseRetriever.build(toy_passages, device="cpu", show_progress=False, max_length=1024)


def test_dense_model_must_be_local_dir(tmp_path, toy_passages):
    pytest.importorskip("faiss")
    from ragrl.retrieval.dense import DenseRetriever

    with pytest.raises(RagrlError, match="never downloads"):
        DenseRetriever.build(toy_passages, model="intfloat/e5-base-v2", device="cpu")


def test_hybrid_bm25_dense_save_load(toy_bm25, minilm_dense, tmp_path):
    hybrid = HybridRetriever(toy_bm25, minilm_dense, depth=6)
    q = ["tallest mountain", "capital of France"]
    before = hybrid.search(q, k=3)
    assert [r[0].passage.title for r in before] == ["Mount Everest", "Paris"]
    hybrid.save(tmp_path / "h")
    manifest = json.loads((tmp_path / "h" / MANIFEST_NAME).read_text())
    assert manifest["component_dirs"] == ["a", "b"]
    loaded = load_retriever(tmp_path / "h", device="cpu")
    assert isinstance(loaded, HybridRetriever)
    assert loaded.fingerprint == hybrid.fingerprint
    after = loaded.search(q, k=3)
    assert [[h.passage.id for h in r] for r in after] == [[h.passage.id for h in r] for r in before]
