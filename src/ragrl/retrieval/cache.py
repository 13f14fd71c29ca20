"""An on-disk retrieval cache (sqlite3) for fast and exactly repeatable runs.

Hits are keyed by ``(retriever fingerprint, query, k)`` and stored with the passage id, title, text and
score, so a ``replay`` run needs no index at all. Modes:

``readwrite`` (default)  use stored hits when present, otherwise search and store them.
``record``               always search and store, overwriting what was there.
``replay``               only read; a query that is not stored is a ``RagrlError`` naming it.
``off``                  pass every call to the inner retriever; the store is not opened.

The store uses sqlite's WAL journal and a busy timeout, and one connection guarded by a lock, so it is
safe for threads of one process and for one writing process with concurrent readers.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from pathlib import Path

from ragrl.data.schema import Passage
from ragrl.errors import RagrlError
from ragrl.retrieval.base import Hit, Retriever, check_k

MODES = ("readwrite", "record", "replay", "off")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS hits (
    fingerprint TEXT NOT NULL,
    query TEXT NOT NULL,
    k INTEGER NOT NULL,
    hits TEXT NOT NULL,
    PRIMARY KEY (fingerprint, query, k)
)
"""


def _encode_hits(hits: list[Hit]) -> str:
    return json.dumps(
        [[h.passage.id, h.passage.title, h.passage.text, h.score] for h in hits], ensure_ascii=False
    )


def _decode_hits(blob: str) -> list[Hit]:
    return [Hit(Passage(pid, title, text), float(score)) for pid, title, text, score in json.loads(blob)]


class CachedRetriever:
    """Wrap a retriever with an on-disk cache.

    ``inner`` may be ``None`` in ``replay`` mode; the fingerprint then comes from ``fingerprint=`` or,
    when the store holds hits of a single retriever only, from the store itself.
    """

    def __init__(
        self,
        inner: Retriever | None,
        path: str | Path,
        mode: str = "readwrite",
        *,
        fingerprint: str | None = None,
    ) -> None:
        if mode not in MODES:
            raise RagrlError(f"unknown cache mode {mode!r} (expected one of {', '.join(MODES)})")
        if inner is None and mode != "replay":
            raise RagrlError(f"cache mode {mode!r} needs a retriever; only 'replay' works without one")
        self.inner, self.path, self.mode = inner, Path(path), mode
        self.queries_from_cache = 0
        self.queries_searched = 0
        self._lock = threading.Lock()
        self._conn: sqlite3.Connection | None = None
        if mode == "off":
            self._fingerprint = fingerprint or inner.fingerprint  # type: ignore[union-attr]
            return
        if mode == "replay" and not self.path.is_file():
            raise RagrlError(f"{self.path}: retrieval cache does not exist (cannot replay)")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._conn = sqlite3.connect(self.path, timeout=30.0, check_same_thread=False)
            self._conn.execute("PRAGMA busy_timeout = 30000")
            if mode != "replay":
                self._conn.execute("PRAGMA journal_mode = WAL")
                self._conn.execute(_SCHEMA)
                self._conn.commit()
        except sqlite3.DatabaseError as e:
            raise RagrlError(f"{self.path}: not a usable retrieval cache ({e})") from None
        if fingerprint is None and inner is not None:
            fingerprint = inner.fingerprint
        if fingerprint is None:
            fingerprint = self._only_fingerprint()
        self._fingerprint = fingerprint

    def _only_fingerprint(self) -> str:
        assert self._conn is not None
        try:
            rows = self._conn.execute("SELECT DISTINCT fingerprint FROM hits LIMIT 2").fetchall()
        except sqlite3.DatabaseError as e:
            raise RagrlError(f"{self.path}: not a usable retrieval cache ({e})") from None
        if len(rows) != 1:
            what = "no retriever" if not rows else "several retrievers"
            raise RagrlError(
                f"{self.path}: the cache holds hits of {what}; say which with the "
                "retriever's fingerprint (or its index directory)"
            )
        return rows[0][0]

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def fingerprints(self) -> list[str]:
        """Every retriever fingerprint that has hits in the store."""
        if self._conn is None:
            return []
        with self._lock:
            return [r[0] for r in self._conn.execute("SELECT DISTINCT fingerprint FROM hits")]

    def _lookup(self, queries: list[str], k: int) -> dict[str, list[Hit]]:
        assert self._conn is not None
        found: dict[str, list[Hit]] = {}
        unique = list(dict.fromkeys(queries))
        with self._lock:
            try:
                for start in range(0, len(unique), 500):
                    chunk = unique[start : start + 500]
                    marks = ",".join("?" * len(chunk))
                    rows = self._conn.execute(
                        "SELECT query, hits FROM hits WHERE fingerprint = ? AND k = ? "
                        f"AND query IN ({marks})",
                        [self._fingerprint, k, *chunk],
                    ).fetchall()
                    for query, blob in rows:
                        found[query] = _decode_hits(blob)
            except sqlite3.OperationalError as e:
                if "no such table" in str(e):
                    return found
                raise RagrlError(f"{self.path}: retrieval cache read failed ({e})") from None
        return found

    def _store(self, pairs: dict[str, list[Hit]], k: int) -> None:
        assert self._conn is not None
        rows = [(self._fingerprint, q, k, _encode_hits(h)) for q, h in pairs.items()]
        with self._lock, self._conn:
            self._conn.executemany(
                "INSERT OR REPLACE INTO hits (fingerprint, query, k, hits) VALUES (?, ?, ?, ?)", rows
            )

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        check_k(k)
        queries = list(queries)
        if not queries:
            return []
        if self.mode == "off":
            return self.inner.search(queries, k)  # type: ignore[union-attr]
        found = {} if self.mode == "record" else self._lookup(queries, k)
        missing = [q for q in dict.fromkeys(queries) if q not in found]
        if missing:
            if self.mode == "replay":
                more = f" (and {len(missing) - 1} more)" if len(missing) > 1 else ""
                raise RagrlError(
                    f"{self.path}: replay miss: query {missing[0]!r} with k={k} is not in the "
                    f"cache for retriever {self._fingerprint}{more}"
                )
            fresh = dict(zip(missing, self.inner.search(missing, k), strict=True))  # type: ignore[union-attr]
            self._store(fresh, k)
            found.update(fresh)
        self.queries_searched += len(missing)
        self.queries_from_cache += len(queries) - len(missing)
        return [found[q] for q in queries]

    def save(self, directory: str | Path) -> None:
        if self.inner is None:
            raise RagrlError("a replay-only cache has no index to save")
        self.inner.save(directory)

    def close(self) -> None:
        if self._conn is not None:
            with self._lock:
                self._conn.close()
            self._conn = None

    def __enter__(self) -> CachedRetriever:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
