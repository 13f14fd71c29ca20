"""Passage embeddings on disk: encoded in shards that survive a crash, read back by row.

``encode_shards(encoder, passages, folder, ...)`` encodes the corpus ``shard_size`` passages at a time.
Each shard is a raw ``float32`` file (``shard-00000.f32``) and a small record (``shard-00000.json``:
its rows, dimension, encoder settings and a sha256 of its passages' ids and contents), both written
atomically, the record last. A build that was killed is run again with the same command: every shard
whose record matches its passages and whose file has its full size is kept, the rest encoded again
(``ragrl index`` prints how many were kept). A shard of other passages or another encoder is never
reused.

``VectorFile`` is the shards joined into one ``vectors.f32`` (``[n, dim]`` float32, row ``i`` =
passage ``i``) that an index keeps for exact re-ranking and recall checks. ``take`` reads each row
straight into its place with ``os.preadv``, ``blocks`` reads with ``os.pread``, so the rows a search
touched sit in the kernel's page cache, not in the process's memory. (A read-only memory map made the
search of its day ~1.4× as fast on 300k passages, but each fault maps a whole
large page-cache folio: one gather of 3,200 rows over 2M passages held 1.5 GB of mapped pages, and
``ragrl serve`` peaked at 3.35 GB. Gathering a few rows between hand-backs of the pages bounded that,
and was then slower than ``pread``.)

``HashingEncoder`` is a cheap deterministic encoder for scale runs (``--model hashing:384``): each word
(lower-cased, alphanumeric) hashed to a signed coordinate, summed, L2-normalised. It is a lexical
embedding, far weaker than MiniLM; it exists so a 2M-passage build runs in minutes on a laptop CPU.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import weakref
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from ragrl.data.io import atomic_write, save_open_file
from ragrl.data.schema import Passage
from ragrl.errors import RagrlError

VECTORS_NAME = "vectors.f32"
HASHING_PREFIX = "hashing:"


def shard_digest(passages: Sequence[Passage]) -> str:
    h = hashlib.sha256()
    for p in passages:
        h.update(f"{p.id}\t{p.contents}\n".encode())
    return h.hexdigest()


def encode_shards(
    encode: Callable[[list[str]], np.ndarray],
    passages: Sequence[Passage],
    folder: Path,
    *,
    settings: dict[str, Any],
    shard_size: int = 50_000,
    texts: Callable[[Passage], str] = lambda p: p.contents,
    on_shard: Callable[[], None] | None = None,
) -> tuple[list[Path], int]:
    """Encode ``passages`` into ``folder`` shard by shard, keeping the shards a killed build finished;
    returns the shard files in order and how many were kept. ``settings`` (encoder, prefixes,
    normalisation) must match a kept shard's; ``on_shard()`` after each shard, kept or encoded."""
    if shard_size < 1:
        raise RagrlError(f"shard_size must be >= 1, got {shard_size}")
    folder.mkdir(parents=True, exist_ok=True)
    files, kept = [], 0
    count = (len(passages) + shard_size - 1) // shard_size
    for j in range(count):
        rows = passages[j * shard_size : (j + 1) * shard_size]
        path, record_path = folder / f"shard-{j:05d}.f32", folder / f"shard-{j:05d}.json"
        digest = shard_digest(rows)
        record = _read_record(record_path)
        done = (
            record is not None
            and record.get("digest") == digest
            and record.get("settings") == settings
            and path.is_file()
            and path.stat().st_size == len(rows) * int(record.get("dim", -1)) * 4
        )
        if not done:
            record_path.unlink(missing_ok=True)
            emb = np.ascontiguousarray(encode([texts(p) for p in rows]), dtype=np.float32)
            if emb.shape[0] != len(rows) or emb.ndim != 2:
                raise RagrlError(
                    f"{path}: the encoder ({settings.get('model')}) returned {emb.shape} embeddings for "
                    f"{len(rows)} passages"
                )
            atomic_write(path, lambda f, e=emb: f.write(e.tobytes()))
            record = {"rows": len(rows), "dim": int(emb.shape[1]), "digest": digest, "settings": settings}
            atomic_write(record_path, lambda f, r=record: f.write(json.dumps(r, sort_keys=True)), "w")
        kept += int(done)
        files.append(path)
        if on_shard is not None:
            on_shard()
    return files, kept


def _read_record(path: Path) -> dict[str, Any] | None:
    try:
        record = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) else None


def shard_dim(folder: Path) -> int:
    record = _read_record(folder / "shard-00000.json")
    if record is None:
        raise RagrlError(f"{folder}: no encoded shard")
    return int(record["dim"])


def read_shard(path: Path, dim: int) -> np.ndarray:
    block = np.fromfile(path, dtype=np.float32)
    if block.size % dim:
        raise RagrlError(
            f"{path}: {block.size} floats, not whole {dim}-dimensional vectors; delete it to re-encode"
        )
    return block.reshape(-1, dim)


def join_shards(files: list[Path], dim: int, out: Path) -> int:
    """The shards copied, in order, into one ``vectors.f32``; returns the rows."""
    rows = 0

    def write(f: Any) -> None:
        nonlocal rows
        for path in files:
            block = read_shard(path, dim)
            f.write(block.tobytes())
            rows += block.shape[0]

    atomic_write(out, write)
    return rows


class VectorFile:
    """``vectors.f32``: row ``i`` is passage ``i``'s embedding, read from the file on demand."""

    def __init__(self, path: Path, dim: int, rows: int) -> None:
        size = path.stat().st_size if path.is_file() else -1
        if size != rows * dim * 4:
            raise RagrlError(
                f"{path}: {size} bytes, expected {rows} vectors of {dim} float32 ({rows * dim * 4} bytes); "
                "rebuild the index with `ragrl index`"
            )
        self.path, self.dim, self.rows = path.resolve(), dim, rows
        self._fd = os.open(path, os.O_RDONLY)
        self._closer = weakref.finalize(self, os.close, self._fd)  # closed with the object
        self._row_bytes = dim * 4

    @property
    def fd(self) -> int:
        """The open file (it outlives a build folder removed under it)."""
        if not self._closer.alive:
            raise RagrlError(f"{self.path}: the vector file is closed")
        return self._fd

    def _read(self, size: int, offset: int) -> bytes:
        raw = os.pread(self.fd, size, offset)
        if len(raw) != size:
            raise RagrlError(
                f"{self.path}: {len(raw)} bytes at byte {offset}, expected {size} (the file shrank)"
            )
        return raw

    def take(self, ids: np.ndarray) -> np.ndarray:
        """The rows ``ids`` (any order, repeats allowed), as a ``[len(ids), dim]`` array."""
        ids = np.asarray(ids, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.rows):
            bad = int(ids.min() if ids.min() < 0 else ids.max())
            raise RagrlError(f"{self.path}: no row {bad} (the file holds rows 0 to {self.rows - 1})")
        out = np.empty((len(ids), self.dim), dtype=np.float32)
        size = self._row_bytes
        fd = os.dup(self.fd)  # this take's own for all its reads: a close() once it holds it changes nothing
        try:
            for j, i in enumerate(ids.tolist()):  # straight into the row (benchmarks/vector_reads.py)
                got = os.preadv(fd, [out[j]], i * size)
                if got != size:
                    raise RagrlError(
                        f"{self.path}: {got} bytes at byte {i * size}, expected {size} (the file shrank)"
                    )
        finally:
            os.close(fd)
        return out

    def blocks(self, block_rows: int = 65_536):
        """``(first_row, block)`` over the whole file, in order (exact search, recall checks)."""
        for start in range(0, self.rows, block_rows):
            n = min(block_rows, self.rows - start)
            raw = self._read(n * self._row_bytes, start * self._row_bytes)
            yield start, np.frombuffer(raw, dtype=np.float32).reshape(n, self.dim)

    def save_as(self, target: Path) -> None:
        """This file at ``target`` (``ragrl.data.io.save_open_file``: linked, else copied)."""
        save_open_file(self.fd, self.path, self.rows * self._row_bytes, target)

    def close(self) -> None:
        self._closer()

    def __getstate__(self) -> dict:
        raise TypeError(f"a VectorFile ({self.path}) holds an open file and cannot be pickled")


_WORD = re.compile(r"[0-9a-z]+")


class HashingEncoder:
    """Words hashed to signed coordinates of a ``dim``-dimensional vector (see the module docstring);
    the subset of sentence-transformers' ``encode`` that ragrl calls."""

    def __init__(self, dim: int) -> None:
        if dim < 8:
            raise RagrlError(f"hashing encoder: the dimension must be >= 8, got {dim}")
        self.dim = dim
        self._cache: dict[str, tuple[int, float]] = {}

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim

    def _slot(self, word: str) -> tuple[int, float]:
        slot = self._cache.get(word)
        if slot is None:
            h = int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")
            slot = self._cache[word] = (h % self.dim, 1.0 if (h >> 63) & 1 else -1.0)
            if len(self._cache) > 1_000_000:
                self._cache.clear()
        return slot

    def encode(self, texts: list[str], *, normalize_embeddings: bool = True, **_: Any) -> np.ndarray:
        rows, cols, signs = [], [], []
        for row, text in enumerate(texts):
            slots = [self._slot(word) for word in _WORD.findall(text.lower())]
            rows.extend([row] * len(slots))
            cols.extend(c for c, _ in slots)
            signs.extend(s for _, s in slots)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        np.add.at(
            out, (np.array(rows, dtype=np.int64), np.array(cols, dtype=np.int64)), np.array(signs, np.float32)
        )
        if normalize_embeddings:
            norms = np.linalg.norm(out, axis=1, keepdims=True)
            out /= np.where(norms > 0, norms, 1.0)
        return out


def hashing_dim(model: str | Path | None) -> int | None:
    """``384`` for ``"hashing:384"``; ``None`` for any other model argument."""
    text = str(model) if model is not None else ""
    if not text.startswith(HASHING_PREFIX):
        return None
    try:
        return int(text[len(HASHING_PREFIX) :])
    except ValueError:
        raise RagrlError(f"{text!r}: the hashing encoder is 'hashing:DIM', e.g. 'hashing:384'") from None
