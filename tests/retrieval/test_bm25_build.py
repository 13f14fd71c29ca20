"""The chunked BM25 build equals bm25s's own index: the same vocabulary and, term by term, the same
documents and scores (float32), for every BM25 variant; so its searches are bm25s's."""

from __future__ import annotations

import errno
import gc
import os
import shutil
from pathlib import Path

import bm25s
import numpy as np
import pytest

from ragrl.errors import RagrlError
from ragrl.retrieval.bm25 import METHODS, BM25Retriever, _make_stemmer
from ragrl.retrieval.bm25_build import backing_file, build_in_chunks, disk_arrays, give_back, seal
from ragrl.synth.scale import synthetic_corpus

PASSAGES = [*synthetic_corpus(2500, seed=4, words=40, vocabulary=3000, topics=50)]
PASSAGES[7] = type(PASSAGES[7])("s7", "", "of the and")  # only stopwords: no term at all


def columns(model: bm25s.BM25) -> dict[str, tuple[list[int], list[float]]]:
    s = model.scores
    out = {}
    for token, i in model.vocab_dict.items():
        if i + 1 >= len(s["indptr"]):  # bm25s's index() adds "" past its last column: no documents
            out[token] = ([], [])
            continue
        lo, hi = s["indptr"][i], s["indptr"][i + 1]
        out[token] = (s["indices"][lo:hi].tolist(), s["data"][lo:hi].tolist())
    return out


@pytest.mark.parametrize("method", METHODS)
def test_chunked_build_is_bm25s_index(method):
    stemmer = _make_stemmer(True)
    reference = bm25s.BM25(method=method)
    reference.index(
        bm25s.tokenize([p.contents for p in PASSAGES], stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    chunked = build_in_chunks(PASSAGES, bm25s.BM25(method=method), stopwords="en", stemmer=stemmer, chunk=600)
    assert chunked.scores["num_docs"] == 2500 and set(chunked.vocab_dict) == set(reference.vocab_dict)
    ref, got = columns(reference), columns(chunked)
    for token in ref:
        assert got[token][0] == ref[token][0], token
        np.testing.assert_allclose(got[token][1], ref[token][1], rtol=1e-6, err_msg=token)
    if method in ("bm25l", "bm25+"):
        columns_ = len(reference.nonoccurrence_array)
        ref_no = {
            t: reference.nonoccurrence_array[i] for t, i in reference.vocab_dict.items() if i < columns_
        }
        got_no = {t: chunked.nonoccurrence_array[chunked.vocab_dict[t]] for t in ref_no}
        assert got_no == pytest.approx(ref_no)


def test_a_retriever_built_in_chunks_searches_like_bm25s(tmp_path):
    retriever = BM25Retriever.build(PASSAGES)
    assert retriever.search(["?? !!", "of the"], 3) == [[], []]  # no term, so no passage
    assert BM25Retriever.build(PASSAGES, method="bm25+").search(["?? !!"], 3) == [[]]  # not every passage
    queries = [" ".join(p.text.split()[:6]) for p in PASSAGES[::250]]
    reference = bm25s.BM25()
    stemmer = _make_stemmer(True)
    reference.index(
        bm25s.tokenize([p.contents for p in PASSAGES], stopwords="en", stemmer=stemmer, show_progress=False),
        show_progress=False,
    )
    for query, hits in zip(queries, retriever.search(queries, 5), strict=True):
        tokens = bm25s.tokenize(
            [query], stopwords="en", stemmer=stemmer, return_ids=False, show_progress=False
        )[0]
        scores = reference.get_scores(tokens)
        best = np.lexsort((np.arange(len(scores)), -scores))[:5]
        assert [h.id for h in hits] == [PASSAGES[i].id for i in best]
        assert [h.score for h in hits] == pytest.approx(scores[best].tolist(), rel=1e-6)
    retriever.save(tmp_path)  # bm25s's own files: its loader reads them
    assert bm25s.BM25.load(str(tmp_path / "bm25s")).scores["num_docs"] == 2500


def _rss_mb() -> float:
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the resident set from /proc")
def test_score_arrays_fill_files_not_memory(tmp_path):
    folder, arrays = disk_arrays(tmp_path, {"data": (np.float32, 50_000_000)})  # 200 MB, space reserved
    data = arrays["data"]
    assert os.stat(data.filename).st_blocks * 512 >= data.nbytes  # reserved: a full disk fails here
    before = _rss_mb()
    data[::1024] = 1.0  # touch every page, as a chunk's scores land all over the array
    touched = _rss_mb()
    give_back(data)
    assert touched - before > 150  # the pages were resident ...
    assert _rss_mb() - before < 20  # ... and are given back to the kernel
    sealed = seal(folder, arrays)["data"]
    assert not sealed.flags.writeable and float(sealed[1024 * 7]) == 1.0  # read back from the file
    assert backing_file(sealed) == folder / "data.npy"
    del data, arrays, sealed
    gc.collect()
    assert not folder.exists()  # the scratch files go with the arrays


def test_no_room_for_the_arrays_is_an_error_not_a_crash(tmp_path, monkeypatch):
    def fallocate_failing(code):  # noqa: ANN202
        def fallocate(fd, offset, length):  # noqa: ANN202
            raise OSError(code, os.strerror(code))

        return fallocate

    monkeypatch.setattr(os, "posix_fallocate", fallocate_failing(errno.ENOSPC))
    with pytest.raises(RagrlError, match=r"no room for BM25's score arrays .*No space left on device"):
        disk_arrays(tmp_path, {"data": (np.float32, 1000)})
    assert not any(tmp_path.iterdir())
    # a file system that cannot reserve blocks fills them as it goes: the build goes on
    monkeypatch.setattr(os, "posix_fallocate", fallocate_failing(errno.EOPNOTSUPP))
    folder, arrays = disk_arrays(tmp_path, {"data": (np.float32, 1000)})
    assert arrays["data"].shape == (1000,)
    del arrays
    shutil.rmtree(folder)


def test_an_interrupted_build_leaves_no_score_files(tmp_path):
    chunks = []

    def stop_in_pass_three() -> None:
        chunks.append(1)
        if len(chunks) > 5:  # 5 chunks of 500 counted; the first chunk of pass 3 is scored
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        build_in_chunks(PASSAGES, bm25s.BM25(), stopwords="en", stemmer=_make_stemmer(True), chunk=500,
                        workdir=tmp_path, on_chunk=stop_in_pass_three)  # fmt: skip
    gc.collect()
    assert not any(tmp_path.iterdir())


def test_a_saved_index_links_the_built_score_files(tmp_path, monkeypatch):
    retriever = BM25Retriever.build(PASSAGES, workdir=tmp_path / "work")
    data = retriever._model.scores["data"]
    assert not data.flags.writeable and backing_file(data).is_relative_to(tmp_path / "work")
    retriever.save(tmp_path / "index")
    saved = tmp_path / "index" / "bm25s" / "data.csc.index.npy"
    assert os.stat(saved).st_ino == os.stat(backing_file(data)).st_ino  # linked, not written again
    loaded = BM25Retriever.load(tmp_path / "index")
    # plain views of the mappings: slicing an np.memmap runs Python code for every query term
    for model in (retriever._model, loaded._model):
        assert all(type(model.scores[key]) is np.ndarray for key in ("data", "indices", "indptr"))
    loaded_indices = backing_file(loaded._model.scores["indices"])
    assert loaded_indices == tmp_path / "index" / "bm25s" / "indices.csc.index.npy"
    queries = [" ".join(p.text.split()[:6]) for p in PASSAGES[::500]]
    assert loaded.search(queries, 5) == retriever.search(queries, 5)
    np.testing.assert_array_equal(np.load(saved), np.asarray(data))
    # a loaded index's mapped files are linked too (a hybrid's components, an index saved elsewhere)
    loaded.save(tmp_path / "again")
    again = tmp_path / "again" / "bm25s" / "indices.csc.index.npy"
    assert os.stat(again).st_ino == os.stat(tmp_path / "index" / "bm25s" / "indices.csc.index.npy").st_ino
    assert BM25Retriever.load(tmp_path / "again").search(queries, 5) == retriever.search(queries, 5)
    # where no link can be made, the file is copied (never written through memory), the same bytes
    monkeypatch.setattr(os, "link", lambda a, b: (_ for _ in ()).throw(OSError(18, "cross-device link")))
    loaded.save(tmp_path / "copied")
    copied = tmp_path / "copied" / "bm25s" / "data.csc.index.npy"
    assert os.stat(copied).st_ino != os.stat(saved).st_ino and copied.read_bytes() == saved.read_bytes()
    monkeypatch.undo()
    # an index rebuilt by rename under a loaded one is another file: it is not linked in its place
    BM25Retriever.build(PASSAGES[:2000]).save(tmp_path / "index")
    assert backing_file(loaded._model.scores["data"]) is None
    loaded.save(tmp_path / "stale")
    assert BM25Retriever.load(tmp_path / "stale").search(queries, 5) == retriever.search(queries, 5)
    del retriever, data
    gc.collect()
    assert not any((tmp_path / "work").iterdir())  # the build's scratch files are gone, the index stays
    assert BM25Retriever.load(tmp_path / "again").search(queries, 5) == loaded.search(queries, 5)
