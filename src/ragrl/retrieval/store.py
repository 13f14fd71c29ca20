"""Passages on disk, read by position on demand: an index directory's corpus, never all in memory.

An index directory keeps its passages in ``corpus.jsonl`` (the interchange format, one canonical
``{id, contents}`` record a line) and, beside it, ``corpus.offsets.npy``: the byte offset where each
passage's line starts, then the file's size (``int64``, ``n + 1`` values). ``PassageStore`` maps the
offsets and reads passage ``i``'s line (one ``pread``) only when it is asked for, so a loaded index
costs 8 bytes a passage in memory, not a Python object a passage: 21M Wikipedia passages are ~13 GB
as ``Passage`` objects and 168 MB of offsets. What was read stays in the kernel's page cache, not in
the process.

Writing streams: ``PassageStore.write(directory, passages)`` takes any iterable, holds one line at a
time and writes both files atomically (temporary files renamed into place). An index directory written
before the offsets existed still opens: the offsets are rebuilt in one pass over the file and saved.

A truncated ``corpus.jsonl`` (its last line cut, no final newline) or offsets that do not describe the
file (another length, another size) are a ``RagrlError`` naming the file, never a smaller corpus.
"""

from __future__ import annotations

import json
import os
import weakref
from array import array
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, overload

import numpy as np

from ragrl.data.io import atomic_write, same_file, save_open_file
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError

CORPUS_NAME = "corpus.jsonl"
OFFSETS_NAME = "corpus.offsets.npy"


def plain_view(array: np.ndarray) -> np.ndarray:
    """``array`` as a plain ``ndarray`` over the same memory. Every index or slice of an ``np.memmap``
    runs its Python ``__getitem__`` and ``__array_finalize__``. A search slices BM25's score arrays once
    for each query term (with views, a search of the 6,119-passage sample took 16-20% less time) and a
    loaded index reads two offsets a hit (the view made its search about 2% faster, two alternated
    runs; benchmarks/retrieval_throughput.py, docs/performance.md). The view keeps the mapping alive
    through ``.base``."""
    return array.view(np.ndarray) if isinstance(array, np.memmap) else array


class PassageStore(Sequence[Passage]):
    """The passages of an index directory, read by position from its ``corpus.jsonl`` (one ``pread`` each)."""

    def __init__(self, path: Path, offsets: np.ndarray) -> None:
        self.path = path
        self._offsets = plain_view(offsets)  # read twice a passage
        self._fd = os.open(path, os.O_RDONLY)
        self._closer = weakref.finalize(self, os.close, self._fd)  # closed with the store

    # -- reading ---------------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self._offsets) - 1

    @overload
    def __getitem__(self, i: int) -> Passage: ...

    @overload
    def __getitem__(self, i: slice) -> list[Passage]: ...

    def __getitem__(self, i: int | slice) -> Passage | list[Passage]:
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"passage {i} of {n}")
        start, end = int(self._offsets[i]), int(self._offsets[i + 1])
        # one positioned read, the byte before included: the page cache holds what was read, not this
        # process (a memory map's pages would count in its resident memory)
        before = 1 if start else 0
        raw = os.pread(self._fd, end - start + before, start - before)
        if before and raw[:1] != b"\n":
            raw = b""  # not the start of a line
        raw = raw[before:]
        if not raw.endswith(b"\n"):
            raise RagrlError(
                f"{self.path}: passage {i} does not start and end on a line (bytes {start}-{end}); the "
                f"file changed after its offsets were written: delete {OFFSETS_NAME} beside it"
            )
        return self._parse(raw, i)

    def __iter__(self) -> Iterator[Passage]:
        """Every passage in order, from the file this store opened (not whatever its path holds now)."""
        for i in range(len(self)):
            yield self[i]

    def _parse(self, raw: bytes, i: int) -> Passage:
        try:
            record = json.loads(raw)
            if "contents" in record:
                return Passage.from_contents(str(record["id"]), str(record["contents"]))
            return Passage(str(record["id"]), str(record.get("title", "")), str(record["text"]))
        except (ValueError, KeyError, TypeError) as e:
            raise RagrlError(
                f"{self.path}: passage {i} (byte {int(self._offsets[i])}) is not a corpus record ({e}); "
                "rebuild the index with `ragrl index`"
            ) from None

    def _save_as(self, d: Path) -> None:
        """This store's two files in ``d``: the corpus linked (else copied) as it is, its offsets saved."""
        if same_file(self._fd, d / CORPUS_NAME):
            return
        save_open_file(self._fd, self.path, int(self._offsets[-1]), d / CORPUS_NAME)
        _save_offsets(d / OFFSETS_NAME, np.asarray(self._offsets), tolerate=False)

    def close(self) -> None:
        self._closer()

    def __repr__(self) -> str:
        return f"PassageStore({len(self)} passages, {self.path})"

    # -- opening and writing ----------------------------------------------------------------------
    @classmethod
    def open(cls, directory: str | Path, expected: int | None = None) -> PassageStore:
        """The store of ``directory`` (its offsets rebuilt and saved when missing or stale);
        ``expected``: the number of passages the index holds (its manifest's), checked."""
        d = Path(directory)
        path = d / CORPUS_NAME
        if not path.is_file():
            raise RagrlError(f"{d}: incomplete index, missing {CORPUS_NAME}")
        size = path.stat().st_size
        if size and _last_byte(path) != b"\n":
            raise RagrlError(
                f"{path}: truncated (the last line has no newline: the file was cut while it was "
                "written); rebuild the index with `ragrl index`"
            )
        offsets = _read_offsets(d / OFFSETS_NAME, size)
        if offsets is None:
            offsets = _scan_offsets(path)
            _save_offsets(d / OFFSETS_NAME, offsets)
        store = cls(path, offsets)
        if expected is not None and len(store) != expected:
            store.close()
            raise RagrlError(
                f"{path}: {len(store)} passages, but the index was built over {expected}; rebuild the index"
            )
        return store

    @staticmethod
    def write(directory: str | Path, passages: Iterable[Passage]) -> int:
        """Write ``corpus.jsonl`` and its offsets into ``directory``, streaming; returns the count.
        A store's own files are linked (or copied) as they are; writing a store onto its own files is
        allowed (an open store keeps reading the file it opened)."""
        d = Path(directory)
        d.mkdir(parents=True, exist_ok=True)
        if isinstance(passages, PassageStore):
            passages._save_as(d)
            return len(passages)
        offsets = array("q", [0])

        def write(f: Any) -> None:
            for p in passages:
                line = (json.dumps(p.to_corpus_record(), ensure_ascii=False) + "\n").encode("utf-8")
                f.write(line)
                offsets.append(offsets[-1] + len(line))

        atomic_write(d / CORPUS_NAME, write)  # then its offsets: a kill between leaves stale ones, rebuilt
        _save_offsets(d / OFFSETS_NAME, np.frombuffer(offsets, dtype=np.int64), tolerate=False)
        return len(offsets) - 1


def _last_byte(path: Path) -> bytes:
    with path.open("rb") as f:
        f.seek(-1, os.SEEK_END)
        return f.read(1)


def _read_offsets(path: Path, size: int) -> np.ndarray | None:
    """The saved offsets, memory-mapped, when they describe a file of ``size`` bytes; else ``None``."""
    if not path.is_file():
        return None
    try:
        offsets = np.load(path, mmap_mode="r")
    except (OSError, ValueError, EOFError):
        return None  # a damaged offsets file is rebuilt, as a missing one
    if offsets.ndim != 1 or offsets.dtype != np.int64 or len(offsets) < 1 or int(offsets[-1]) != size:
        return None
    return offsets


def _scan_offsets(path: Path) -> np.ndarray:
    """The start of every non-blank line, then the file's size, in one pass."""
    offsets = array("q")
    position = 0
    with path.open("rb") as f:
        for raw in f:
            if raw.strip():
                offsets.append(position)
            position += len(raw)
    offsets.append(position)
    return np.frombuffer(offsets, dtype=np.int64)


def _save_offsets(path: Path, offsets: np.ndarray, *, tolerate: bool = True) -> None:
    """Saved atomically. Rebuilt offsets (``tolerate``) that cannot be saved (a read-only index
    directory) stay in this process's memory; a writer's failure (a full disk) is raised."""
    try:
        atomic_write(path, lambda f: np.save(f, np.asarray(offsets, dtype=np.int64)))
    except OSError:
        if not tolerate:
            raise


def own_copy(passages: Sequence[Passage]) -> Sequence[Passage]:
    """What a retriever keeps of the passages it was built on: a store as it is (on disk, read-only),
    anything else copied into a list (the caller may change its own afterwards)."""
    return passages if isinstance(passages, PassageStore) else list(passages)
