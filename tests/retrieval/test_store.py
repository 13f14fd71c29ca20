"""``PassageStore``: an index's passages on disk, read by position, never all parsed at load."""

from __future__ import annotations

import json

import numpy as np
import pytest

from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.bm25 import BM25Retriever
from ragrl.retrieval.store import CORPUS_NAME, OFFSETS_NAME, PassageStore

PASSAGES = [
    Passage("p1", "Thaesukren", "Thaesukren was directed by Olvana Brisk in 1931."),
    Passage("p2", "Olvana Brisk", "Olvana Brisk was born in Kestrel Bay."),
    Passage("p3", "Zürich – Straße", "Ünïcödé text: ß, 東京, emoji 🎬 (offsets are bytes)."),
    Passage("p4", "Kestrel Bay", "Kestrel Bay is a harbour town."),
]


def test_written_passages_read_back_by_position_slice_and_iteration(tmp_path):
    assert PassageStore.write(tmp_path, iter(PASSAGES)) == 4  # any iterable, streamed
    store = PassageStore.open(tmp_path)
    assert len(store) == 4
    assert store[0] == PASSAGES[0] and store[2] == PASSAGES[2] and store[-1] == PASSAGES[3]
    assert store[1:3] == PASSAGES[1:3]
    assert list(store) == PASSAGES
    with pytest.raises(IndexError):
        store[4]
    # the interchange format is unchanged: canonical {id, contents} lines
    first = json.loads((tmp_path / CORPUS_NAME).read_text(encoding="utf-8").splitlines()[0])
    assert first == {"id": "p1", "contents": "Thaesukren\nThaesukren was directed by Olvana Brisk in 1931."}
    offsets = np.load(tmp_path / OFFSETS_NAME)
    assert offsets[0] == 0 and offsets[-1] == (tmp_path / CORPUS_NAME).stat().st_size and len(offsets) == 5
    # read through a plain view of the mapped file (each index of an np.memmap runs Python code)
    assert type(store._offsets) is np.ndarray and isinstance(store._offsets.base, np.memmap)


def test_an_index_written_before_the_offsets_existed_opens_and_gets_them(tmp_path):
    PassageStore.write(tmp_path, PASSAGES)
    (tmp_path / OFFSETS_NAME).unlink()
    # a hand-edited corpus: blank lines, the {id, title, text} form
    lines = (tmp_path / CORPUS_NAME).read_text(encoding="utf-8").splitlines()
    lines[1] = json.dumps(
        {"id": "p2", "title": "Olvana Brisk", "text": "Olvana Brisk was born in Kestrel Bay."}
    )
    (tmp_path / CORPUS_NAME).write_text("\n" + "\n\n".join(lines) + "\n", encoding="utf-8")
    assert list(PassageStore.open(tmp_path)) == PASSAGES
    assert (tmp_path / OFFSETS_NAME).is_file()  # saved for the next load
    # offsets of another file (the corpus replaced, same passages plus one) are rebuilt, not trusted
    PassageStore.write(tmp_path / "other", [*PASSAGES, Passage("p5", "T", "x")])
    (tmp_path / CORPUS_NAME).write_bytes((tmp_path / "other" / CORPUS_NAME).read_bytes())
    assert len(PassageStore.open(tmp_path)) == 5


def test_a_truncated_corpus_or_another_count_is_an_error_not_a_smaller_corpus(tmp_path):
    PassageStore.write(tmp_path, PASSAGES)
    path = tmp_path / CORPUS_NAME
    with pytest.raises(RagrlError, match=r"built over 3"):
        PassageStore.open(tmp_path, expected=3)
    path.write_bytes(path.read_bytes()[:-20])  # the last line cut while it was written
    with pytest.raises(RagrlError, match=rf"{CORPUS_NAME}: truncated"):
        PassageStore.open(tmp_path)
    (tmp_path / CORPUS_NAME).unlink()
    with pytest.raises(RagrlError, match=f"missing {CORPUS_NAME}"):
        PassageStore.open(tmp_path)


def test_a_loaded_bm25_index_reads_only_the_passages_it_returns(tmp_path, monkeypatch):
    built = BM25Retriever.build(PASSAGES)
    built.save(tmp_path)
    loaded = BM25Retriever.load(tmp_path)
    assert isinstance(loaded.passages, PassageStore) and len(loaded) == 4
    parsed = []
    parse = PassageStore._parse
    monkeypatch.setattr(PassageStore, "_parse", lambda self, raw, i: parsed.append(i) or parse(self, raw, i))
    (hits,) = loaded.search(["where was Olvana Brisk born"], k=2)
    assert [h.id for h in hits] == [h.id for h in built.search(["where was Olvana Brisk born"], k=2)[0]]
    assert [h.score for h in hits] == pytest.approx(
        [h.score for h in built.search(["where was Olvana Brisk born"], k=2)[0]]
    )
    assert sorted(parsed) == sorted(int(h.id[1:]) - 1 for h in hits)  # two lines parsed, not four
    # saving a loaded index onto its own directory keeps its passages and its (memory-mapped) scores
    loaded.save(tmp_path)
    assert list(BM25Retriever.load(tmp_path).passages) == PASSAGES
    again = BM25Retriever.load(tmp_path).search(["where was Olvana Brisk born"], k=2)
    assert [[h.id for h in r] for r in again] == [[h.id for h in hits]]
    assert loaded.search(["where was Olvana Brisk born"], k=2)[0][0].score == pytest.approx(hits[0].score)


def test_offsets_of_a_same_size_file_with_other_lines_are_an_error_not_wrong_passages(tmp_path):
    PassageStore.write(tmp_path, PASSAGES)
    path = tmp_path / CORPUS_NAME
    lines = path.read_bytes().splitlines(keepends=True)
    assert len(lines[0]) != len(lines[1])
    path.write_bytes(lines[1] + lines[0] + b"".join(lines[2:]))  # same size, other line boundaries
    store = PassageStore.open(tmp_path)
    with pytest.raises(
        RagrlError, match=rf"passage 1 does not start and end on a line .* delete {OFFSETS_NAME}"
    ):
        store[1]


def test_titles_contents_cannot_carry_come_back_whole_and_a_replaced_file_does_not_leak_in(tmp_path):
    odd = [
        Passage("q1", '"Heroes" (album)', "An album."),
        Passage("q2", "Two\nlines", "Text."),
        *PASSAGES[:2],
    ]
    PassageStore.write(tmp_path, odd)
    store = PassageStore.open(tmp_path)
    assert list(store) == odd
    lines = (tmp_path / CORPUS_NAME).read_text(encoding="utf-8").splitlines()
    assert set(json.loads(lines[0])) == {"id", "title", "text"} and set(json.loads(lines[2])) == {
        "id",
        "contents",
    }
    # the path replaced under an open store (a rebuild in place): the store reads the file it opened
    PassageStore.write(tmp_path / "other", PASSAGES)
    (tmp_path / "other" / CORPUS_NAME).replace(tmp_path / CORPUS_NAME)
    assert list(store) == odd
    PassageStore.write(tmp_path / "copy", store)  # linked from the path only if it is still its file
    assert list(PassageStore.open(tmp_path / "copy")) == odd
