from __future__ import annotations

import pytest

from ragrl.data.schema import Passage
from ragrl.retrieval.bm25 import BM25Retriever

HIPPO = "corpus/OSU-NLP-Group__HippoRAG/2wikimultihopqa_corpus.json"


@pytest.fixture(scope="session")
def toy_passages() -> list[Passage]:
    return [
        Passage.make("Paris", "Paris is the capital and largest city of France, on the river Seine."),
        Passage.make(
            "Python (programming language)",
            "Python is a programming language created by Guido van Rossum in 1991.",
        ),
        Passage.make(
            "Mount Everest", "Mount Everest is Earth's highest mountain above sea level, in the Himalayas."
        ),
        Passage.make("Berlin", "Berlin is the capital and largest city of Germany."),
        Passage.make(
            "Great Barrier Reef",
            "The Great Barrier Reef is the world's largest coral reef system, "
            "off the coast of Queensland, Australia.",
        ),
        Passage.make(
            "Amazon River",
            "The Amazon River in South America is the largest river by discharge "
            "volume of water in the world.",
        ),
    ]


@pytest.fixture(scope="session")
def toy_bm25(toy_passages) -> BM25Retriever:
    return BM25Retriever.build(toy_passages)


@pytest.fixture(scope="session")
def hippo_passages(shared_data):
    from ragrl.data.io import read_corpus

    passages, _ = read_corpus(shared_data / HIPPO)
    return passages


@pytest.fixture(scope="session")
def hippo_bm25(hippo_passages) -> BM25Retriever:
    return BM25Retriever.build(hippo_passages)


@pytest.fixture(scope="session")
def minilm_dense(toy_passages):
    pytest.importorskip("faiss")
    from ragrl.retrieval.dense import DenseRetriever

    return DenseRetriever.build(toy_passages, device="cpu", show_progress=False)
