"""A bm25s index built a chunk of passages at a time, so a corpus of millions never sits in memory.

bm25s's own ``BM25.index`` takes every document's token ids as Python lists at once: for 2M passages
that is ~130M Python integers. ``build_in_chunks`` gives the same index (the same vocabulary and, term
by term, the same documents and float32 scores; column order follows the vocabulary ids, and the empty
token has a column of its own) from three passes over the passages:

1. each chunk is tokenized with ``bm25s.tokenize`` (the function queries go through), its token ids
   mapped onto one growing vocabulary, and each (document, term) pair's frequency written to a chunk
   file on disk; each term's document frequency and each document's length are counted;
2. the idf (and, for BM25L / BM25+, the non-occurrence scores) comes from bm25s's own functions over
   those counts;
3. each chunk's term frequencies become scores with bm25s's own term-frequency scorer and are placed
   straight into the index's compressed-column arrays, whose size the document frequencies give.

Memory: the vocabulary, the document lengths (8 bytes a passage) and one chunk's temporaries. The chunk
files (12 bytes a (passage, term) pair) and the two large score arrays (8 bytes a pair: 1.2 GB for the
2M synthetic passages, ~12.6 GB projected for 21M) are files in ``workdir``: each chunk's scores are
written into the mapped ``.npy`` files, flushed, and their pages given back to the kernel
(``madvise(MADV_DONTNEED)``), so the build's resident memory does not grow with them. The index keeps
them mapped; ``BM25Retriever.save`` links them into the saved index (or copies them file to file, never
through memory), and they are removed when the arrays are no longer used.
"""

from __future__ import annotations

import copy
import errno
import mmap
import os
import shutil
import tempfile
import weakref
from collections.abc import Callable, Sequence
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.store import plain_view

if TYPE_CHECKING:
    import bm25s

CHUNK = 100_000


def load_bm25s() -> Any:
    """bm25s, imported when first needed, not when ragrl is.

    bm25s runs a JAX top-k when it is imported if JAX is installed; on a GPU machine that starts JAX's
    GPU client, which takes 75% of the GPU's memory for itself, and the policy then runs out of memory.
    ragrl never uses bm25s's JAX path, so JAX stays on the CPU unless the user says otherwise. And
    bm25s imports numba when it is installed: a vLLM engine on the CPU spawns processes that import
    again the module that started them (``ragrl``'s command line), and numba's llvmlite stops them
    (vLLM 0.32's kernel scan cannot read one of its objects). Imported here, numba stays in the
    processes that search."""
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import bm25s

    return bm25s


def build_in_chunks(
    passages: Sequence[Passage],
    model: bm25s.BM25,
    *,
    stopwords: Any,
    stemmer: Any,
    chunk: int = CHUNK,
    workdir: str | Path | None = None,
    on_chunk: Callable[[], None] | None = None,
) -> bm25s.BM25:
    """Index ``passages`` (``title + "\\n" + text``) into ``model`` (its method, k1, b, delta);
    ``on_chunk()`` after each chunk of each of the two passes over the passages."""
    load_bm25s()  # its environment first
    from bm25s.scoring import (
        _build_idf_array,
        _build_nonoccurrence_array,
        _select_idf_scorer,
        _select_tfc_scorer,
    )

    n = len(passages)
    if workdir is not None:
        Path(workdir).mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="ragrl-bm25-", dir=workdir) as tmp:
        files, vocab, df, lengths = _count(passages, Path(tmp), stopwords, stemmer, chunk, on_chunk)
        if "" not in vocab:  # as bm25s's index(): the empty token scores documents without a term
            vocab[""] = len(vocab)
            df = np.append(df, 0)
        frequencies = dict(enumerate(df.tolist()))
        avg = float(lengths.mean())
        idf = _build_idf_array(frequencies, n, _select_idf_scorer(model.idf_method), model.dtype)
        nonoccurrence = None
        if model.method in model.methods_requiring_nonoccurrence:
            nonoccurrence = _build_nonoccurrence_array(
                doc_frequencies=frequencies, n_docs=n, compute_idf_fn=_select_idf_scorer(model.idf_method),
                calculate_tfc_fn=_select_tfc_scorer(model.method), l_d=avg, l_avg=avg, k1=model.k1, b=model.b,
                delta=model.delta, dtype=model.dtype,
            )  # fmt: skip
        data, indices, indptr = _scores(
            files, model, df, lengths, avg, idf, nonoccurrence, on_chunk, workdir=workdir
        )
    model.scores = {"data": data, "indices": indices, "indptr": indptr, "num_docs": n}
    model.vocab_dict = vocab
    model.unique_token_ids_set = set(vocab.values())
    model.nonoccurrence_array = nonoccurrence
    return model


def _count(
    passages: Sequence[Passage],
    folder: Path,
    stopwords: Any,
    stemmer: Any,
    chunk: int,
    on_chunk: Callable[[], None] | None,
) -> tuple[list[Path], dict[str, int], np.ndarray, np.ndarray]:
    """Pass 1: chunk files of each (document, term) pair's term frequency, the vocabulary, document
    frequencies, lengths."""
    vocab: dict[str, int] = {}
    df = np.zeros(0, dtype=np.int64)
    lengths = np.zeros(len(passages), dtype=np.int64)
    files = []
    for j, start in enumerate(range(0, len(passages), chunk)):
        end = min(start + chunk, len(passages))
        texts = [p.contents for p in passages[start:end]]
        tokens = load_bm25s().tokenize(texts, stopwords=stopwords, stemmer=stemmer, show_progress=False)
        local = np.empty(len(tokens.vocab), dtype=np.int64)
        for token, i in tokens.vocab.items():
            local[i] = vocab.setdefault(token, len(vocab))
        sizes = np.fromiter((len(d) for d in tokens.ids), dtype=np.int64, count=len(tokens.ids))
        ids = local[np.fromiter(chain.from_iterable(tokens.ids), dtype=np.int64, count=int(sizes.sum()))]
        lengths[start:end] = sizes
        docs = np.repeat(np.arange(end - start, dtype=np.int64), sizes)
        pairs, tf = np.unique(docs * len(vocab) + ids, return_counts=True)  # each (document, term) once
        doc, term = pairs // len(vocab), pairs % len(vocab)
        df = np.pad(df, (0, len(vocab) - len(df)))
        df += np.bincount(term, minlength=len(vocab))
        path = folder / f"chunk-{j:05d}.npz"
        np.savez(
            path, doc=doc.astype(np.int32), term=term.astype(np.int32), tf=tf.astype(np.int32), start=start
        )
        files.append(path)
        if on_chunk is not None:
            on_chunk()
    return files, vocab, df, lengths


_FILES: dict[int, tuple[Path, int, int]] = {}
"""``id(array) -> (path, st_dev, st_ino)``: arrays that map the whole of a ``.npy`` file, read-only."""


def remember_file(array: np.ndarray, path: str | Path) -> np.ndarray:
    """Note that ``array`` maps the whole of the ``.npy`` file ``path`` (read-only), so saving it can link
    that file instead of writing the array again; forgotten when the array is garbage."""
    st = os.stat(path)
    _FILES[id(array)] = (Path(path), st.st_dev, st.st_ino)
    weakref.finalize(array, _FILES.pop, id(array), None)
    return array


def backing_file(array: np.ndarray) -> Path | None:
    """The file ``array`` maps whole, if it was noted and that path still names the same file (an index
    rebuilt since, by rename, is another file: then None)."""
    entry = _FILES.get(id(array))
    if entry is None:
        return None
    path, dev, ino = entry
    try:
        st = os.stat(path)
    except OSError:
        return None
    return path if (st.st_dev, st.st_ino) == (dev, ino) else None


def disk_arrays(
    workdir: str | Path | None, specs: dict[str, tuple[Any, int]]
) -> tuple[Path, dict[str, np.memmap]]:
    """A fresh folder of ``workdir`` and, in it, ``.npy`` files of the given dtypes and lengths, their
    space reserved on disk (a full disk is an error here, not a crash while they fill), mapped for
    writing."""
    folder = Path(tempfile.mkdtemp(prefix="ragrl-bm25-scores-", dir=workdir))
    size = sum(np.dtype(d).itemsize * k for d, k in specs.values())
    arrays = {}
    try:
        for name, (dtype, n) in specs.items():
            path = folder / f"{name}.npy"
            arrays[name] = np.lib.format.open_memmap(path, mode="w+", dtype=dtype, shape=(n,))
            _reserve(path)
    except OSError as e:
        shutil.rmtree(folder, ignore_errors=True)
        full = e.errno in (errno.ENOSPC, errno.EDQUOT)
        raise RagrlError(
            f"{folder}: {'no room for' if full else 'could not write'} BM25's score arrays "
            f"({size:,} bytes): {e.strerror or e}"
        ) from None
    return folder, arrays


def _reserve(path: Path) -> None:
    """Allocate the file's blocks now, where the platform can (a file system without it, or a platform
    without ``posix_fallocate``, fills it as it goes)."""
    fallocate = getattr(os, "posix_fallocate", None)
    if fallocate is None:
        return
    with path.open("r+b") as f:
        try:
            fallocate(f.fileno(), 0, path.stat().st_size)
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EINVAL, errno.ENOSYS):
                raise


def seal(folder: Path, arrays: dict[str, np.memmap]) -> dict[str, np.ndarray]:
    """The filled arrays flushed and mapped again read-only (nothing can write to a file a saved index
    links); ``folder`` is removed once all of them are garbage (at exit at the latest)."""
    give_back(*arrays.values())
    sealed = {
        name: remember_file(
            plain_view(np.load(folder / f"{name}.npy", mmap_mode="r")), folder / f"{name}.npy"
        )
        for name in arrays
    }
    remaining = [len(sealed)]

    def release() -> None:
        remaining[0] -= 1
        if not remaining[0]:
            shutil.rmtree(folder, ignore_errors=True)

    for array in sealed.values():
        weakref.finalize(array, release)
    return sealed


def save_model(model: bm25s.BM25, folder: Path) -> None:
    """bm25s's ``save`` into ``folder``, except that score arrays already in files (a chunked build's,
    a loaded index's mapped ones) are linked into it, or copied file to file when a link cannot be
    made, rather than written again through this process's memory. The model itself is not touched
    (a search running meanwhile sees its arrays)."""
    names = {"data": "data.csc.index.npy", "indices": "indices.csc.index.npy"}
    on_disk = {key: backing_file(model.scores[key]) for key in names}
    on_disk = {key: path for key, path in on_disk.items() if path is not None}
    shadow = copy.copy(model)
    shadow.scores = {**model.scores, **{key: model.scores[key][:0] for key in on_disk}}
    shadow.save(str(folder), show_progress=False)
    for key, source in on_disk.items():
        target = folder / names[key]
        target.unlink()
        try:
            os.link(source, target)
        except OSError:  # another file system, or links not allowed
            shutil.copyfile(source, target)


def give_back(*arrays: np.ndarray) -> None:
    """Write the arrays' dirty pages to their files and drop them from this process's resident memory
    (the data stays in the file; a later read maps it in again)."""
    for array in arrays:
        if isinstance(array, np.memmap) and array.size:
            array.flush()
            handle = getattr(array, "_mmap", None)
            if handle is not None:
                handle.madvise(mmap.MADV_DONTNEED)


def _scores(
    files: list[Path], model: bm25s.BM25, df: np.ndarray, lengths: np.ndarray, avg: float,
    idf: np.ndarray, nonoccurrence: np.ndarray | None, on_chunk: Callable[[], None] | None,
    *, workdir: str | Path | None = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:  # fmt: skip
    """Pass 3: every (document, term) score in compressed-column order (a term's documents ascending),
    written chunk by chunk into ``.npy`` files mapped from ``workdir``."""
    vocab_size = len(df)
    indptr = np.zeros(vocab_size + 1, dtype=np.int64)
    np.cumsum(df, out=indptr[1:])
    int_dtype = np.int32 if indptr[-1] < 2**31 else np.int64
    pairs = int(indptr[-1])
    folder = None
    if pairs:
        folder, arrays = disk_arrays(
            workdir, {"data": (model.dtype, pairs), "indices": (model.int_dtype, pairs)}
        )
        data, indices = arrays["data"], arrays["indices"]
    else:  # every passage empty: nothing to map
        arrays = {}
        data, indices = np.empty(0, dtype=model.dtype), np.empty(0, dtype=model.int_dtype)
    try:
        _fill(files, model, lengths, avg, idf, nonoccurrence, on_chunk, indptr, data, indices)
    except BaseException:  # a failed or interrupted build leaves no full-size files behind
        del data, indices, arrays
        if folder is not None:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    if folder is not None:
        sealed = seal(folder, {"data": data, "indices": indices})
        data, indices = sealed["data"], sealed["indices"]
    return data, indices, indptr.astype(int_dtype)


def _fill(
    files: list[Path], model: bm25s.BM25, lengths: np.ndarray, avg: float, idf: np.ndarray,
    nonoccurrence: np.ndarray | None, on_chunk: Callable[[], None] | None, indptr: np.ndarray,
    data: np.ndarray, indices: np.ndarray,
) -> None:  # fmt: skip
    """Each chunk's scores into their places in ``data`` / ``indices``, then handed back to the kernel."""
    from bm25s.scoring import _select_tfc_scorer

    vocab_size = len(indptr) - 1
    position = indptr[:-1].copy()
    tfc = _select_tfc_scorer(model.method)
    for path in files:
        with np.load(path) as f:
            doc = f["doc"].astype(np.int64) + int(f["start"])
            term, tf = f["term"].astype(np.int64), f["tf"]
        scores = idf[term] * tfc(
            tf_array=tf.astype(model.dtype),
            l_d=lengths[doc],
            l_avg=avg,
            k1=model.k1,
            b=model.b,
            delta=model.delta,
        )
        if nonoccurrence is not None:
            scores = scores - nonoccurrence[term]
        order = np.lexsort((doc, term))  # by term, then document
        doc, term, scores = doc[order], term[order], scores[order]
        counts = np.bincount(term, minlength=vocab_size)
        first = np.cumsum(counts) - counts  # where each term's run starts in this chunk
        target = position[term] + np.arange(len(term)) - first[term]
        data[target] = scores
        indices[target] = doc
        position += counts
        give_back(data, indices)
        if on_chunk is not None:
            on_chunk()
