"""One search worker for many concurrent callers: the server's fairness.

Every caller queues its queries and waits. A single worker thread (bm25s, faiss and torch objects are
not guaranteed to be thread-safe, so searches never overlap) runs rounds: each round takes at most
``batch_queries`` queries, an equal share from every waiting request in arrival order, and searches them
together (one ``retriever.search`` call per distinct ``k``). A request of 500 queries therefore advances
a chunk per round while a one-query request that arrives behind it is answered in the next round,
instead of waiting for all 500.

Each query is searched on its own, so a caller gets the same hits as from ``retriever.search`` directly
(for BM25 exactly; a dense encoder may pad a batch differently, which can move scores in the last
float digits).
"""

from __future__ import annotations

import threading
from collections import deque
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any

from ragrl.retrieval.base import Hit, Retriever


@dataclass
class _Job:
    queries: list[str]
    k: int
    future: Future = field(default_factory=Future)
    results: list[list[Hit] | None] = field(default_factory=list)
    next: int = 0  # the first query not yet taken into a round

    def __post_init__(self) -> None:
        self.results = [None] * len(self.queries)


class SearchBatcher:
    """Searches ``retriever`` on one worker thread, in fair rounds of at most ``batch_queries`` queries."""

    def __init__(self, retriever: Retriever, batch_queries: int = 64) -> None:
        if batch_queries < 1:
            raise ValueError(f"batch_queries must be positive, got {batch_queries}")
        self.retriever = retriever
        self.batch_queries = batch_queries
        self.rounds = 0
        """Rounds run so far (a measure of how requests were interleaved)."""
        self._waiting: deque[_Job] = deque()
        self._wake = threading.Condition()
        self._closed = False
        self._worker: threading.Thread | None = None  # started by the first search (again after close)

    def submit(self, queries: list[str], k: int) -> Future:
        """Queue a search; the future resolves to one hit list per query (or the retriever's error)."""
        job = _Job(list(queries), k)
        if not job.queries:
            job.future.set_result([])
            return job.future
        with self._wake:
            if self._worker is None or not self._worker.is_alive():
                self._closed = False
                self._worker = threading.Thread(target=self._loop, name="ragrl-search", daemon=True)
                self._worker.start()
            self._waiting.append(job)
            self._wake.notify()
        return job.future

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """``submit`` and wait: the batched equivalent of ``retriever.search(queries, k)``."""
        return self.submit(queries, k).result()

    def close(self) -> None:
        """Stop the worker after the round it is in; searches still waiting fail (a later search starts
        a new worker)."""
        with self._wake:
            self._closed = True
            self._wake.notify()
        if self._worker is not None:
            self._worker.join(timeout=10)
        for job in self._waiting:
            if not job.future.done():
                job.future.set_exception(RuntimeError("the search batcher was closed"))
        self._waiting.clear()

    def _take_round(self) -> list[tuple[_Job, int, int]]:
        """Up to ``batch_queries`` queries, an equal share (at least one) from each waiting job."""
        share = max(1, self.batch_queries // len(self._waiting))
        picks, room = [], self.batch_queries
        for job in self._waiting:
            if room == 0:
                break
            take = min(share, len(job.queries) - job.next, room)
            picks.append((job, job.next, job.next + take))
            job.next += take
            room -= take
        return picks

    def _loop(self) -> None:
        while True:
            with self._wake:
                while not self._waiting and not self._closed:
                    self._wake.wait()
                if self._closed:
                    return
                picks = self._take_round()
            self._run(picks)
            with self._wake:
                self.rounds += 1
                for job in [j for j in self._waiting if j.next == len(j.queries) or j.future.done()]:
                    self._waiting.remove(job)
                    if not job.future.done():
                        job.future.set_result(job.results)

    def _run(self, picks: list[tuple[_Job, int, int]]) -> None:
        by_k: dict[int, list[tuple[_Job, int, int]]] = {}
        for pick in picks:
            by_k.setdefault(pick[0].k, []).append(pick)
        for k, group in by_k.items():
            queries = [q for job, a, b in group for q in job.queries[a:b]]
            try:
                rows: Any = self.retriever.search(queries, k)
            except Exception as e:  # noqa: BLE001 - handed to every caller of this round
                for job, _, _ in group:
                    if not job.future.done():
                        job.future.set_exception(e)
                continue
            i = 0
            for job, a, b in group:
                job.results[a:b] = rows[i : i + (b - a)]
                i += b - a
