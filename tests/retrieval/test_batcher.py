import threading

import pytest

from ragrl.retrieval.batcher import SearchBatcher

QUERIES = ["capital of Germany", "highest mountain", "the of and", "largest river in the world"]


class _Recording:
    """A retriever that records each search call's queries and can hold the first call at a gate."""

    def __init__(self, inner, gate: threading.Event | None = None):
        self.inner, self.gate, self.calls = inner, gate, []
        self.entered = threading.Event()  # set when the first search is inside (held at the gate)

    def search(self, queries, k):
        if self.gate is not None and not self.calls:
            self.entered.set()
            self.gate.wait(timeout=10)
        self.calls.append(list(queries))
        return self.inner.search(queries, k)


def test_results_equal_direct_search_whatever_the_rounds(toy_bm25):
    batcher = SearchBatcher(toy_bm25, batch_queries=3)
    queries = QUERIES * 5
    assert batcher.search(queries, 2) == toy_bm25.search(queries, 2)
    assert batcher.rounds == 7  # 20 queries, 3 per round
    futures = [batcher.submit([q], k) for q in QUERIES for k in (1, 3)]
    assert [f.result() for f in futures] == [toy_bm25.search([q], k) for q in QUERIES for k in (1, 3)]
    assert batcher.search([], 3) == []
    batcher.close()
    assert batcher.search(QUERIES[:1], 1) == toy_bm25.search(QUERIES[:1], 1)  # a new worker
    batcher.close()


def test_a_big_request_cannot_starve_a_small_one(toy_bm25):
    gate = threading.Event()
    retriever = _Recording(toy_bm25, gate)
    batcher = SearchBatcher(retriever, batch_queries=8)
    big = batcher.submit(QUERIES * 50, 2)  # 200 queries: 25 rounds alone
    small = batcher.submit(["coral reef"], 2)
    gate.set()
    assert small.result(timeout=10) == toy_bm25.search(["coral reef"], 2)
    assert big.result(timeout=10) == toy_bm25.search(QUERIES * 50, 2)
    # the small request rode in the first or second round (of 26), beside a share of the big one
    rounds = [i for i, call in enumerate(retriever.calls) if "coral reef" in call]
    assert rounds in ([0], [1]) and len(retriever.calls) >= 26
    assert sum(len(c) for c in retriever.calls) == 201
    batcher.close()


def test_a_failing_search_fails_its_callers_and_the_worker_goes_on(toy_bm25):
    class Flaky:
        def search(self, queries, k):
            if "boom" in queries:
                raise RuntimeError("index on fire")
            return toy_bm25.search(queries, k)

    batcher = SearchBatcher(Flaky(), batch_queries=4)
    with pytest.raises(RuntimeError, match="index on fire"):
        batcher.search(["boom"], 2)
    assert batcher.search(QUERIES, 2) == toy_bm25.search(QUERIES, 2)
    batcher.close()
    with pytest.raises(ValueError, match="batch_queries must be positive"):
        SearchBatcher(toy_bm25, batch_queries=0)


def test_close_during_a_round_never_strands_a_search(toy_bm25):
    gate = threading.Event()
    batcher = SearchBatcher(_Recording(toy_bm25, gate), batch_queries=4)
    first = batcher.submit(QUERIES * 3, 2)  # its first round is held at the gate
    closing = threading.Thread(target=batcher.close, kwargs={"timeout": 0.2})
    closing.start()
    closing.join()  # close gave up waiting: the old worker is still inside its round
    late = batcher.submit(["coral reef"], 2)  # a new worker serves it
    gate.set()
    assert late.result(timeout=10) == toy_bm25.search(["coral reef"], 2)
    # the closed worker finished its round and left the rest to the new worker, or failed it
    try:
        assert first.result(timeout=10) == toy_bm25.search(QUERIES * 3, 2)
    except RuntimeError as e:
        assert "closed" in str(e)
    batcher.close()


def test_a_cancelled_search_is_dropped_and_a_short_answer_fails_the_round(toy_bm25):
    gate = threading.Event()
    batcher = SearchBatcher(_Recording(toy_bm25, gate), batch_queries=4)
    held = batcher.submit(QUERIES, 2)
    assert batcher.retriever.entered.wait(timeout=10)  # the worker is inside its first round
    cancelled = batcher.submit(["coral reef"], 2)
    assert cancelled.cancel()  # still queued: a caller that gave up
    gate.set()
    assert held.result(timeout=10) == toy_bm25.search(QUERIES, 2)
    assert all("coral reef" not in call for call in batcher.retriever.calls)
    batcher.close()

    class Short:
        def search(self, queries, k):
            return toy_bm25.search(queries, k)[:-1]

    short = SearchBatcher(Short())
    with pytest.raises(RuntimeError, match="answered 1 hit lists for 2 queries"):
        short.search(QUERIES[:2], 2)
    short.close()
