"""A bounded load test of ``ragrl serve`` on 127.0.0.1: 20 clients x 200 small requests while a 21st
client keeps sending 512-query requests and a 26 MB request arrives. Asserts 0 errors, answers
identical to in-process search, a 413 for the oversized body, and the small requests' p99 under load.
Slow: ``make reliability``."""

from __future__ import annotations

import json
import socket
import statistics
import subprocess
import sys
import threading
import time

import pytest

httpx = pytest.importorskip("httpx")
pytest.importorskip("uvicorn")

from ragrl.data.io import read_examples  # noqa: E402
from ragrl.retrieval.base import load_retriever  # noqa: E402

CLIENTS, REQUESTS = 20, 200
P99_BOUND_S = 1.0


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _expected(retriever, queries: list[str], k: int) -> list[list[dict]]:
    return [
        [
            {
                "document": {"id": h.passage.id, "contents": h.passage.contents, "title": h.passage.title,
                             "text": h.passage.text},
                "score": float(h.score),
            }
            for h in row
        ]
        for row in retriever.search(queries, k)
    ]  # fmt: skip


@pytest.mark.slow
def test_server_under_concurrent_load(world_dir):
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    server = subprocess.Popen(
        [sys.executable, "-m", "ragrl", "serve", str(world_dir / "bm25"), "--port", str(port)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the server did not start within 60 s"
            time.sleep(0.2)

        local = load_retriever(world_dir / "bm25")
        examples, _ = read_examples(world_dir / "test.jsonl")
        questions = [ex.question for ex in examples]
        latencies: list[float] = []
        big_latencies: list[float] = []
        errors: list[str] = []
        mismatches: list[int] = []
        done = threading.Event()

        def small_client(c: int) -> None:
            with httpx.Client(timeout=30) as client:
                for r in range(REQUESTS):
                    i = (c * REQUESTS + r) % len(questions)
                    queries, k = questions[i : i + 1 + r % 3], 1 + r % 5
                    t = time.perf_counter()
                    try:
                        resp = client.post(f"{url}/retrieve", json={"queries": queries, "topk": k})
                    except httpx.HTTPError as e:
                        errors.append(repr(e))
                        continue
                    latencies.append(time.perf_counter() - t)
                    if resp.status_code != 200:
                        errors.append(f"{resp.status_code}: {resp.text[:200]}")
                    elif resp.json()["result"] != _expected(local, queries, k):
                        mismatches.append(i)

        def big_client() -> None:
            queries = (questions * 6)[:512]
            with httpx.Client(timeout=60) as client:
                while not done.is_set():
                    t = time.perf_counter()
                    try:
                        resp = client.post(f"{url}/retrieve", json={"queries": queries, "topk": 10})
                    except httpx.HTTPError as e:
                        errors.append(f"big: {e!r}")
                        continue
                    big_latencies.append(time.perf_counter() - t)
                    if resp.status_code != 200:
                        errors.append(f"big {resp.status_code}")

        t0 = time.perf_counter()
        big = threading.Thread(target=big_client)
        big.start()
        threads = [threading.Thread(target=small_client, args=(c,)) for c in range(CLIENTS)]
        for t in threads:
            t.start()
        oversized = json.dumps({"queries": ["x" * 1000] * 26_000}).encode()  # 26 MB
        t = time.perf_counter()
        refused = httpx.post(
            f"{url}/retrieve", content=oversized, headers={"content-type": "application/json"}, timeout=60
        )
        refused_s = time.perf_counter() - t
        for t in threads:
            t.join()
        elapsed = time.perf_counter() - t0
        done.set()
        big.join()
    finally:
        server.terminate()
        server.wait(timeout=30)

    latencies.sort()
    p50, p99 = statistics.median(latencies), latencies[int(0.99 * (len(latencies) - 1))]
    print(
        f"\nload: {len(latencies)} small requests from {CLIENTS} clients in {elapsed:.1f} s "
        f"({len(latencies) / elapsed:.0f} requests/s), p50 {1000 * p50:.0f} ms, p99 {1000 * p99:.0f} ms; "
        f"{len(big_latencies)} requests of 512 queries alongside "
        f"(median {statistics.median(big_latencies):.2f} s); "
        f"26 MB body refused with {refused.status_code} in {refused_s:.2f} s; {len(errors)} errors, "
        f"{len(mismatches)} answers differing from in-process search"
    )
    assert errors == [] and mismatches == []
    assert len(latencies) == CLIENTS * REQUESTS
    assert refused.status_code == 413
    assert p99 < P99_BOUND_S
