"""Retrievers behind one protocol: BM25 (bm25s), dense (sentence-transformers + faiss), hybrid (RRF),
an on-disk cache with record/replay, and an HTTP client for Search-R1-compatible servers (``ragrl serve``).
See docs/retrieval.md."""

from ragrl.retrieval.base import Hit, Retriever, corpus_hash, load_retriever
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.retrieval.cache import CachedRetriever
from ragrl.retrieval.dense import DenseRetriever
from ragrl.retrieval.http import HttpRetriever
from ragrl.retrieval.hybrid import HybridRetriever, rrf_fuse

__all__ = [
    "BM25Retriever",
    "CachedRetriever",
    "DenseRetriever",
    "Hit",
    "HttpRetriever",
    "HybridRetriever",
    "Retriever",
    "corpus_hash",
    "load_retriever",
    "rrf_fuse",
]
