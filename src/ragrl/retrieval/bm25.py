"""BM25 on bm25s: English stopwords and Snowball (PyStemmer) stemming by default.

Zero-score rule: a hit is returned only if its score is > 0. bm25s itself fills the top-k with
arbitrary zero-score passages when a query shares no term with the corpus (for example a query made
only of stopwords or unknown words); ragrl drops those, so such a query gets fewer than ``k`` hits,
possibly none. (With ``method="bm25l"`` or ``"bm25+"`` every passage gets a positive score as soon as
the query has one known term, so the lists are full then.) Equal scores are ordered by corpus position.

Scores are bm25s's own (``BM25.get_scores_from_ids``); ragrl only picks the top-k among the
positive-score passages, which is also faster than ``BM25.retrieve`` (benchmarks/retrieval_throughput.py).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

if TYPE_CHECKING:
    import bm25s

from ragrl.console import progress_bar
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.base import (
    MANIFEST_NAME,
    Hit,
    check_k,
    corpus_hash,
    load_corpus,
    make_fingerprint,
    read_manifest,
    register_index_type,
    require_files,
    save_corpus,
    write_manifest,
)
from ragrl.retrieval.bm25_build import (
    CHUNK,
    build_in_chunks,
    load_bm25s,
    remember_file,
    save_model,
)
from ragrl.retrieval.store import own_copy, plain_view

METHODS = ("lucene", "robertson", "atire", "bm25l", "bm25+")
_BM25S_DIR = "bm25s"
_CHUNK = 64  # queries per task when n_threads > 1


def _make_stemmer(enabled: bool, language: str = "english"):
    if not enabled:
        return None
    import Stemmer

    return Stemmer.Stemmer(language)


@register_index_type("bm25")
class BM25Retriever:
    """Sparse retrieval over ``title + "\\n" + text`` with bm25s.

    Build with ``BM25Retriever.build(passages)``; ``n_threads`` (0 = in the calling thread) only
    changes speed, never results, and is not part of the fingerprint.
    """

    kind = "bm25"

    def __init__(
        self,
        model: bm25s.BM25,
        passages: list[Passage],
        *,
        method: str = "lucene",
        k1: float = 1.5,
        b: float = 0.75,
        delta: float = 0.5,
        stemmer: bool = True,
        stopwords: str | None = "en",
        n_threads: int = 0,
        corpus_digest: str | None = None,
    ) -> None:
        self._model = model
        self.passages = passages
        self.method, self.k1, self.b, self.delta = method, float(k1), float(b), float(delta)
        self.stemmer, self.stopwords = bool(stemmer), stopwords
        self.n_threads = n_threads
        self._stemmer = _make_stemmer(self.stemmer)
        self._stopwords: Any = stopwords if stopwords else []
        self.corpus_hash = corpus_digest or corpus_hash(passages)
        self._fingerprint = make_fingerprint(self.kind, self.params, self.corpus_hash)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def build(
        cls,
        passages: list[Passage],
        *,
        method: str = "lucene",
        k1: float = 1.5,
        b: float = 0.75,
        delta: float = 0.5,
        stemmer: bool = True,
        stopwords: str | None = "en",
        n_threads: int = 0,
        show_progress: bool = False,
        workdir: str | Path | None = None,
    ) -> BM25Retriever:
        """Index ``passages`` a chunk at a time (``ragrl.retrieval.bm25_build``); its chunk files go to a
        temporary folder in ``workdir`` (the system's when ``None``)."""
        if method not in METHODS:
            raise RagrlError(f"unknown BM25 method {method!r} (expected one of {', '.join(METHODS)})")
        if not passages:
            raise RagrlError("cannot build a BM25 index from an empty corpus")
        model = load_bm25s().BM25(method=method, k1=k1, b=b, delta=delta)
        chunks = 2 * ((len(passages) + CHUNK - 1) // CHUNK)  # two passes over the passages
        with progress_bar(disable=not show_progress) as bar:
            task = bar.add_task(f"indexing {len(passages):,} passages with BM25", total=chunks)
            build_in_chunks(
                passages, model, stopwords=stopwords or [], stemmer=_make_stemmer(stemmer), workdir=workdir,
                on_chunk=lambda: bar.advance(task),
            )  # fmt: skip
        return cls(
            model,
            own_copy(passages),
            method=method,
            k1=k1,
            b=b,
            delta=delta,
            stemmer=stemmer,
            stopwords=stopwords,
            n_threads=n_threads,
        )

    @property
    def params(self) -> dict[str, Any]:
        params: dict[str, Any] = {
            "method": self.method,
            "k1": self.k1,
            "b": self.b,
            "stemmer": "english" if self.stemmer else None,
            "stopwords": self.stopwords,
        }
        if self.method in ("bm25l", "bm25+"):
            params["delta"] = self.delta
        return params

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def __len__(self) -> int:
        return len(self.passages)

    def __repr__(self) -> str:
        return f"BM25Retriever({len(self.passages)} passages, {self.params})"

    # -- search -------------------------------------------------------------------------------
    def tokenize(self, queries: list[str]) -> list[list[str]]:
        """The exact query tokens used by ``search`` (lower-cased, stopwords removed, stemmed)."""
        return load_bm25s().tokenize(
            queries, stopwords=self._stopwords, stemmer=self._stemmer, return_ids=False, show_progress=False
        )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        if not queries:
            return []
        tokens = self.tokenize(list(queries))
        depth = min(k, len(self.passages))
        if self.n_threads > 1 and len(tokens) > 2 * _CHUNK:
            from concurrent.futures import ThreadPoolExecutor

            chunks = [tokens[i : i + _CHUNK] for i in range(0, len(tokens), _CHUNK)]
            with ThreadPoolExecutor(self.n_threads) as pool:
                parts = pool.map(lambda chunk: self._search_tokens(chunk, depth), chunks)
                return [hits for part in parts for hits in part]
        return self._search_tokens(tokens, depth)

    def _search_tokens(self, tokens: list[list[str]], k: int) -> list[list[Hit]]:
        """The hot path. Scores come from bm25s (``get_scores_from_ids``); the top-k is taken among
        positive-score passages only, which is both the zero-score rule and cheaper than a partition
        over the whole corpus. Equal scores are ordered by corpus position (deterministic)."""
        model, passages = self._model, self.passages
        flatnonzero, lexsort = np.flatnonzero, np.lexsort
        out: list[list[Hit]] = []
        for query in tokens:
            ids = model.get_tokens_ids(query)
            if not ids:
                out.append([])
                continue
            scores = model.get_scores_from_ids(ids)
            cand = flatnonzero(scores > 0)
            cand_scores = scores[cand]
            if cand.size > k:
                kth = np.partition(cand_scores, cand.size - k)[cand.size - k]
                above = flatnonzero(cand_scores > kth)
                ties = flatnonzero(cand_scores == kth)[: k - above.size]
                keep = np.concatenate((above, ties))
                cand, cand_scores = cand[keep], cand_scores[keep]
            order = lexsort((cand, -cand_scores))
            out.append(
                [
                    Hit(passages[i], s)
                    for i, s in zip(cand[order].tolist(), cand_scores[order].tolist(), strict=True)
                ]
            )
        return out

    # -- persistence --------------------------------------------------------------------------
    def save(self, directory: str | Path) -> None:
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        (d / MANIFEST_NAME).unlink(missing_ok=True)  # written last: a save cut short leaves no index
        # bm25s writes into a fresh folder whose files then replace the old ones by rename: a loaded
        # index maps its score arrays, and writing over a mapped file would truncate what it reads
        # (this retriever's own, or a server's)
        target, fresh = d / _BM25S_DIR, d / f".{_BM25S_DIR}.{os.getpid()}.tmp"
        shutil.rmtree(fresh, ignore_errors=True)
        save_model(self._model, fresh)  # score arrays already in files are linked, not copied
        target.mkdir(exist_ok=True)
        names = {f.name for f in fresh.iterdir()}
        for f in target.iterdir():
            if f.name not in names:  # a file of another variant (BM25L's non-occurrence scores)
                f.unlink()
        for name in names:
            os.replace(fresh / name, target / name)
            (fresh / name).unlink(missing_ok=True)  # rename does nothing when both name one linked file
        fresh.rmdir()
        save_corpus(d, self.passages)
        write_manifest(
            d, self.kind, self.params, self.corpus_hash, self.fingerprint, num_passages=len(self.passages)
        )

    @classmethod
    def load(cls, directory: str | Path, *, n_threads: int = 0) -> BM25Retriever:
        d = Path(directory)
        manifest = read_manifest(d)
        if manifest["type"] != cls.kind:
            raise RagrlError(f"{d}: is a {manifest['type']!r} index, not a bm25 index")
        require_files(d, _BM25S_DIR + "/params.index.json", _BM25S_DIR + "/vocab.index.json")
        params = manifest["params"]
        try:
            # the score arrays memory-mapped: a search reads only its terms' columns
            model = load_bm25s().BM25.load(str(d / _BM25S_DIR), show_progress=False, mmap=True)
        except (OSError, ValueError, KeyError, EOFError) as e:  # a truncated .npy, a broken json
            raise RagrlError(
                f"{d}: the bm25s index files are damaged ({type(e).__name__}: {e}); "
                "rebuild it with `ragrl index`"
            ) from None
        for key in ("data", "indices"):  # mapped whole: a later save links them
            array, path = model.scores[key], os.path.abspath(d / _BM25S_DIR / f"{key}.csc.index.npy")
            whole = isinstance(array, np.memmap) and os.path.abspath(array.filename or "") == path
            model.scores[key] = plain_view(array)
            if whole:
                remember_file(model.scores[key], path)
        model.scores["indptr"] = plain_view(model.scores["indptr"])  # indexed twice a query as well
        passages = load_corpus(d, manifest.get("num_passages"))
        n_docs = int(model.scores["num_docs"])
        if n_docs != len(passages):
            raise RagrlError(
                f"{d}: the bm25s index has {n_docs} documents but corpus.jsonl has "
                f"{len(passages)} passages; rebuild the index"
            )
        return cls(
            model,
            passages,
            method=params.get("method", "lucene"),
            k1=params.get("k1", 1.5),
            b=params.get("b", 0.75),
            delta=params.get("delta", 0.5),
            stemmer=params.get("stemmer") is not None,
            stopwords=params.get("stopwords"),
            n_threads=n_threads,
            corpus_digest=manifest["corpus_hash"],
        )
