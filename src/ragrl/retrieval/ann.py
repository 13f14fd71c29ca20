"""faiss index types for dense retrieval: exact (flat) and approximate (HNSW, IVF-PQ) search.

``--index-type`` picks a faiss factory string for the corpus (``default_spec``); ``--index-spec`` gives
one outright (any string ``faiss.index_factory`` reads, inner-product metric):

* ``flat``: ``Flat``, exact; 4 × dim bytes a passage, all in memory (Search-R1's e5 index: ~62 GB).
* ``hnsw``: ``HNSW32``, a graph over the full vectors: fast, about as large as flat plus the links.
* ``ivf-pq``: ``IVF{nlist},PQ{m}x4fsr``: the vectors clustered into ``nlist`` lists (a power of two
  near 4·√n, trained on a sample of ``train_size`` vectors) and their residuals compressed to ``m``
  codes of 4 bits (``m = dim / 2`` when that divides ``dim``, else ``dim``: 96 bytes for MiniLM's 384,
  192 for e5-base's 768), laid out for
  faiss's fast scan (``IndexIVFPQFastScan``, SIMD look-ups); a search visits ``nprobe`` lists.

Search-time parameters, settable at load (``ragrl serve --nprobe/--ef-search/--rerank``) and part of
the fingerprint, because they change the results (the values asked for are recorded; an ``nprobe``
above the index's lists is applied as ``nlist``): ``nprobe`` (IVF), ``ef_search`` (HNSW) and
``rerank``: a compressed index fetches ``rerank × k`` candidates and re-scores them exactly against
the full vectors kept on disk (``vectors.f32``, read by row), which recovers most of what the
compression loses while the memory stays the compressed index's. The defaults (``dim / 2`` codes,
nprobe 512, rerank 10) were chosen on MiniLM vectors of 300k synthetic passages, the hardest corpus
measured (docs/retrieval.md): twice the codes of ``dim / 4`` rank the candidates well enough that
10 × k of them suffice, and reading the candidates' rows is most of a search's time.
"""

from __future__ import annotations

import math
import random
import re
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from ragrl.console import console
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError

INDEX_TYPES = ("flat", "hnsw", "ivf-pq")
DEFAULT_NPROBE = 512
DEFAULT_EF_SEARCH = 128
DEFAULT_RERANK = 10
DEFAULT_TRAIN_SIZE = 100_000
MIN_PER_LIST = 39


def default_spec(index_type: str, n: int, dim: int, train_size: int | None = None) -> str:
    """The faiss factory string of ``index_type`` for ``n`` vectors of ``dim`` dimensions, sized so
    that ``train_size`` training vectors (``None``: ``auto_train_size``) train it."""
    if index_type == "flat":
        return "Flat"
    if index_type == "hnsw":
        return "HNSW32"
    if index_type == "ivf-pq":
        nlist = max(1, 2 ** round(math.log2(max(1.0, 4 * math.sqrt(n)))))
        sample = min(n, train_size if train_size is not None else auto_train_size(n, nlist))
        while nlist > 1 and nlist * MIN_PER_LIST > sample:  # faiss wants ~39 training vectors a list
            nlist //= 2
        m = next(m for m in (dim // 2, dim) if m >= 1 and dim % m == 0)
        return f"IVF{nlist},PQ{m}x4fsr"  # 16 centroids a sub-quantizer: any sample that trains the lists
    raise RagrlError(f"unknown index type {index_type!r} (expected one of {', '.join(INDEX_TYPES)})")


def auto_train_size(n: int, nlist: int) -> int:
    """The training sample when none is given: 64 vectors a list (faiss asks for 39 to 256), at
    least ``DEFAULT_TRAIN_SIZE``, at most the corpus (2M passages, IVF4096: 262,144 vectors)."""
    return min(n, max(DEFAULT_TRAIN_SIZE, 64 * nlist))


def nlist_of(spec: str) -> int:
    found = re.search(r"IVF(\d+)", spec)
    return int(found[1]) if found else 0


def compressed(spec: str) -> bool:
    """Whether the index stores compressed codes (PQ, SQ, RQ, LSQ, ...): exact re-ranking then pays."""
    return re.search(r"(^|[,_])(O?PQ|SQ|RQ|LSQ|PRQ|PLSQ|LSH)", spec) is not None


def new_index(faiss: Any, spec: str, dim: int) -> Any:
    try:
        return faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    except RuntimeError as e:
        raise RagrlError(f"--index-spec {spec!r}: faiss cannot build it ({_faiss_message(e)})") from None


def _faiss_message(e: BaseException) -> str:
    """faiss's ``Error in <function> at <file>:<line>: <what>``, kept to ``<what>``."""
    first = str(e).strip().splitlines()[0] if str(e).strip() else "rejected"
    what = re.search(r" at \S+:\d+: (.*)", first)
    return what[1] if what else first


def _clusterings(faiss: Any, index: Any) -> list[tuple[str, int, Any]]:
    """``(what, k, ClusteringParameters)`` of each k-means the index's training runs: an IVF's lists and
    a product quantizer's sub-quantizers (an OPQ rotation's own quantizer is not looked into)."""
    ivf = faiss.try_extract_index_ivf(index)  # None: not an IVF index
    ivf = faiss.downcast_index(ivf) if ivf is not None else None
    found = [(f"each of its {ivf.nlist} lists", ivf.nlist, ivf.cp)] if ivf is not None else []
    pq = getattr(ivf if ivf is not None else faiss.downcast_index(index), "pq", None)
    if pq is not None and hasattr(pq, "cp"):
        found.append((f"each of the {pq.ksub} centroids of its {pq.M} PQ sub-quantizers", pq.ksub, pq.cp))
    return found


def _one_sample_warning(faiss: Any, index: Any, spec: str, n: int) -> None:
    """faiss warns from C++ once a k-means (for a PQ: once per sub-quantizer, 16 lines and more) when
    its sample is under 39 vectors a centroid; ragrl says it once, in its own words, and quiets faiss's.
    A sample smaller than a k-means' centroids is faiss's error, which the caller reports."""
    clusterings = _clusterings(faiss, index)
    fails = any(n < k for _, k, _ in clusterings)  # faiss's error follows: no warning before it
    for what, k, cp in clusterings:
        wanted = k * cp.min_points_per_centroid
        if not fails and n < wanted:
            console.print(
                f"warning: {spec}: trained on {n:,} vectors where faiss asks for {wanted:,} "
                f"({cp.min_points_per_centroid} for {what}); its recall may suffer: train on more "
                "(--train-size, a larger corpus) or choose a smaller index (--index-spec)"
            )
        cp.min_points_per_centroid = 1  # the only effect of this floor is faiss's warning


def train_sample(n: int, size: int, seed: int = 0) -> np.ndarray:
    """The sorted rows a compressed index is trained on: all of them, or ``size`` drawn at random."""
    if size >= n:
        return np.arange(n)
    return np.sort(np.random.default_rng(seed).choice(n, size=size, replace=False))


def build_from_shards(
    faiss: Any,
    spec: str,
    dim: int,
    shards: list[Callable[[], np.ndarray]],
    *,
    total: int,
    train_size: int | None = None,
) -> tuple[Any, int | None]:
    """A faiss index of ``spec`` filled shard by shard (each shard a function that reads it, so only one
    is in memory at a time), and the number of vectors it was trained on: a sample of ``train_size``
    (``None``: ``auto_train_size``) when the index needs training, else ``None``."""
    index = new_index(faiss, spec, dim)
    trained_on = None
    if not index.is_trained:
        rows = train_sample(total, train_size or auto_train_size(total, nlist_of(spec)))
        sample, start = np.empty((len(rows), dim), dtype=np.float32), 0  # filled in place: held once
        for read in shards:
            block = read()
            end = start + block.shape[0]
            lo, hi = np.searchsorted(rows, (start, end))  # the sorted sample's rows in this shard
            sample[lo:hi] = block[rows[lo:hi] - start]
            start = end
        if start != total:
            raise RagrlError(f"{spec}: the shards hold {start:,} vectors, expected {total:,}")
        _one_sample_warning(faiss, index, spec, len(rows))
        try:
            index.train(sample)
        except RuntimeError as e:
            raise RagrlError(
                f"{spec}: faiss cannot train it on {len(rows):,} vectors ({_faiss_message(e)}); give a "
                "larger --train-size or a smaller index (--index-spec)"
            ) from None
        del sample  # before the index fills
        trained_on = len(rows)
    for read in shards:
        index.add(read())
    return index, trained_on


def set_search_params(faiss: Any, index: Any, *, nprobe: int | None, ef_search: int | None) -> None:
    """``nprobe`` on an IVF index, ``efSearch`` on an HNSW one (also an IVF's HNSW quantizer)."""
    space = faiss.ParameterSpace()  # the values are checked by search_params
    if nprobe is not None:
        ivf = faiss.try_extract_index_ivf(index)
        # more lists than there are visit them all, but faiss 1.15's fast-scan IVF by residual then finds
        # the wrong neighbours (recall@10 0.03 on the real samples' IVF256 at nprobe 512): capped at nlist
        space.set_index_parameter(index, "nprobe", min(nprobe, ivf.nlist) if ivf is not None else nprobe)
    if ef_search is not None:
        space.set_index_parameter(index, "efSearch", ef_search)


def search_params(spec: str, nprobe: int | None, ef_search: int | None, rerank: int | None) -> dict[str, Any]:
    """The search-time parameters that apply to ``spec``, with their defaults filled in."""
    out: dict[str, Any] = {}
    if spec.startswith("IVF") or ",IVF" in spec:
        out["nprobe"] = DEFAULT_NPROBE if nprobe is None else nprobe
    if "HNSW" in spec:
        out["ef_search"] = DEFAULT_EF_SEARCH if ef_search is None else ef_search
    if compressed(spec):
        out["rerank"] = DEFAULT_RERANK if rerank is None else rerank
    for name, value in out.items():
        if not isinstance(value, int) or value < (0 if name == "rerank" else 1):
            raise RagrlError(f"{name} must be a positive integer, got {value!r}")
    return out


def exact_top_k(blocks: Any, queries: np.ndarray, k: int) -> np.ndarray:
    """The ids of each query's ``k`` best inner products over ``(first_row, block)`` blocks (exact;
    which of several rows tied at the ``k``-th score is kept is not fixed)."""
    best_ids = np.full((len(queries), 0), -1, dtype=np.int64)
    best_scores = np.full((len(queries), 0), -np.inf, dtype=np.float32)
    for start, block in blocks:
        scores = queries @ block.T
        ids = np.broadcast_to(np.arange(start, start + block.shape[0]), scores.shape)
        scores = np.concatenate([best_scores, scores], axis=1)
        ids = np.concatenate([best_ids, ids], axis=1)
        if scores.shape[1] > k:  # each row's k best first, then only those sorted
            part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
            scores, ids = np.take_along_axis(scores, part, axis=1), np.take_along_axis(ids, part, axis=1)
        keep = np.lexsort((ids, -scores), axis=1)[:, :k]
        best_scores = np.take_along_axis(scores, keep, axis=1)
        best_ids = np.take_along_axis(ids, keep, axis=1)
    return best_ids


def recall_at(approx: list[list[int]], exact: np.ndarray, k: int) -> float:
    """The mean share of each query's exact top ``k`` that its approximate top ``k`` holds."""
    shares = [
        len(set(a[:k]) & set(e[:k].tolist())) / min(k, len(e)) for a, e in zip(approx, exact, strict=True)
    ]
    return float(np.mean(shares)) if shares else 0.0


def probe_queries(passages: Sequence[Passage], n: int, words: int = 20, seed: int = 0) -> list[str]:
    """``n`` query-like texts for recall and speed checks: the first sentence (at most ``words``
    words) of passages drawn at random."""
    rows = random.Random(seed).sample(range(len(passages)), min(n, len(passages)))
    return [" ".join(passages[i].text.split(".")[0].split()[:words]) for i in rows]
