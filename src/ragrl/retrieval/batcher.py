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
from concurrent.futures import Future, InvalidStateError
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
    started: bool = False  # taken into a round at least once (its future is running)
    in_flight: int = 0  # rounds holding some of its queries that have not finished

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
        self._search = threading.Lock()  # searches never overlap, even while a closed worker finishes
        self._generation = 0  # the current worker's; close() ends it, the next search starts another
        self._worker: threading.Thread | None = None

    def submit(self, queries: list[str], k: int) -> Future:
        """Queue a search; the future resolves to one hit list per query (or the retriever's error)."""
        job = _Job(list(queries), k)
        if not job.queries:
            job.future.set_result([])
            return job.future
        with self._wake:
            if self._worker is None:
                worker = threading.Thread(
                    target=self._loop, args=(self._generation,), name="ragrl-search", daemon=True
                )
                worker.start()  # before it is recorded: a failed start leaves no phantom worker
                self._worker = worker
            self._waiting.append(job)
            self._wake.notify_all()
        return job.future

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """``submit`` and wait: the batched equivalent of ``retriever.search(queries, k)``."""
        return self.submit(queries, k).result()

    def close(self, timeout: float = 10.0) -> None:
        """End the worker after the round it is in; the searches still waiting fail. A later search
        starts a new worker."""
        with self._wake:
            worker, self._worker = self._worker, None
            self._generation += 1
            self._wake.notify_all()
        if worker is not None:
            worker.join(timeout=timeout)

    def _takeable(self) -> list[_Job]:
        """Waiting jobs with queries not yet taken into a round; a job whose caller gave up (its future
        cancelled) is dropped when first seen (call with ``_wake`` held)."""
        for job in [j for j in self._waiting if not j.started]:
            job.started = True
            if not job.future.set_running_or_notify_cancel():
                self._waiting.remove(job)
        return [j for j in self._waiting if j.next < len(j.queries) and not j.future.done()]

    def _take_round(self, jobs: list[_Job]) -> list[tuple[_Job, int, int]]:
        """Up to ``batch_queries`` queries, an equal share (at least one) from each of ``jobs``."""
        share = max(1, self.batch_queries // len(jobs))
        picks, room = [], self.batch_queries
        for job in jobs:
            if room == 0:
                break
            take = min(share, len(job.queries) - job.next, room)
            picks.append((job, job.next, job.next + take))
            job.next += take
            job.in_flight += 1
            room -= take
        return picks

    def _loop(self, generation: int) -> None:
        try:
            while True:
                with self._wake:
                    while not (jobs := self._takeable()) and generation == self._generation:
                        self._wake.wait()  # nothing to take (or only queries another worker holds)
                    if generation != self._generation:
                        if self._worker is None:  # closed, no newer worker: nobody will serve these
                            self._fail_waiting(RuntimeError("the search batcher was closed"))
                        return
                    picks = self._take_round(jobs)
                self._run(picks)
                with self._wake:
                    self.rounds += 1
                    for job, _, _ in picks:
                        job.in_flight -= 1
                    complete = [
                        j for j in self._waiting
                        if j.future.done() or (j.next == len(j.queries) and not j.in_flight)
                    ]  # fmt: skip
                    for job in complete:
                        self._waiting.remove(job)
                        _settle(job.future, result=job.results)
                    self._wake.notify_all()  # a worker waiting on jobs this round held may go on
        except BaseException as e:  # never leave a caller waiting on a dead worker
            with self._wake:
                current = self._worker is threading.current_thread()
                if current:
                    self._worker = None
                if current or self._worker is None:  # a closed worker leaves a newer one its jobs
                    self._fail_waiting(e)
            raise

    def _fail_waiting(self, error: BaseException) -> None:
        """Fail every waiting job (call with ``_wake`` held)."""
        for job in self._waiting:
            _settle(job.future, error=error)
        self._waiting.clear()

    def _run(self, picks: list[tuple[_Job, int, int]]) -> None:
        by_k: dict[int, list[tuple[_Job, int, int]]] = {}
        for pick in picks:
            by_k.setdefault(pick[0].k, []).append(pick)
        for k, group in by_k.items():
            queries = [q for job, a, b in group for q in job.queries[a:b]]
            try:
                with self._search:
                    rows: Any = self.retriever.search(queries, k)
                if len(rows) != len(queries):
                    raise RuntimeError(
                        f"the retriever answered {len(rows)} hit lists for {len(queries)} queries"
                    )
            except Exception as e:  # noqa: BLE001 - handed to the callers of this round
                for job, _, _ in group:
                    _settle(job.future, error=e)
                continue
            i = 0
            for job, a, b in group:
                job.results[a:b] = rows[i : i + (b - a)]
                i += b - a


def _settle(future: Future, *, result: Any = None, error: BaseException | None = None) -> None:
    """Resolve ``future`` unless it already is (a caller may cancel a queued search at any moment)."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
